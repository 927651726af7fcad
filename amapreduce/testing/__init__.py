"""Test helpers shipped with the package: a loopback OpenAI-compatible server for simulated models."""
