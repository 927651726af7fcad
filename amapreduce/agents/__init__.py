"""Agents: the manager (plans and delegates) and the search sub-agents (look things up)."""
