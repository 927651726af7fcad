"""The MapReduce engine: batching, parallel sub-agents, reduce in code, delta patch."""
