"""The offline demo: a simulated model (not an LLM) over the bundled sandbox atlas.

`run_demo` answers a sandbox task through the whole pipeline — manager agent, `mapreduce` tool,
engine, search sub-agents, reducer, run directory — with no network and no API key, and scores
the table against the sandbox gold, then commits the run to a demo memory. See
`amapreduce.demo.model` for what the simulated model does, `amapreduce.demo.memory_model` for the
simulated memory model, `amapreduce.demo.hints` for the batching hints both read and write,
`amapreduce.demo.benchmark` for the sandbox benchmark's models in `eval run`, and
`amapreduce.demo.faults` for fault injection.
"""

from __future__ import annotations

__all__: list[str] = []
