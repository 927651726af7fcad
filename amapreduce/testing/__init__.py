"""Test helpers shipped with the package: simulated models and a loopback OpenAI-compatible server.

They are the only home of simulated (scripted) models and of their price rule, so product code
cannot reach them: only `demo`, the tests and the benchmarks import this package.
"""
