"""amapreduce: Agentic MapReduce for wide search.

`amapreduce.ask(question, model=...)` answers a question with a table (`RunResult.to_pandas()`),
`amapreduce.run_decision(decision, ...)` runs a decision you wrote, `amapreduce.enrich(df, columns=[...])`
adds columns to a list you have (`amapreduce.api`, `amapreduce.enrich_api`); a finished run's folder reads
back as one `RunRecord`. `__all__` is that user API and nothing else; each call is one
`amapreduce.session.Session` (`RunOptions` in, one `RunOutcome` out), which, like the engine's own parts,
is importable from its module for plugging in your own parts. Heavy names are imported lazily on first
access so that `import amapreduce` (and `amapreduce --help`) stays fast.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from amapreduce._version import __version__
from amapreduce.errors import (
    AmapreduceError,
    BatchTimeout,
    ConfigError,
    DecisionError,
    RunCancelled,
    RunError,
    SolverError,
    ToolCallFailed,
    ToolCallRefused,
    ToolError,
    UserError,
)

# A library prints nothing of its own accord: without a handler, Python's last resort writes every
# warning of ours to stderr (in a notebook, a script). The command line shows them (`cli.app.main`).
logging.getLogger(__name__).addHandler(logging.NullHandler())

# name -> module that defines it; imported on first attribute access.
_LAZY: dict[str, str] = {
    "Decision": "amapreduce.decision.model",
    "RunRecord": "amapreduce.session.record",
    "RunResult": "amapreduce.api",
    "RunStatus": "amapreduce.mapreduce.result",
    "RunUsage": "amapreduce.api",
    "Table": "amapreduce.table.table",
    "ask": "amapreduce.api",
    "ask_async": "amapreduce.api",
    "enrich": "amapreduce.enrich_api",
    "enrich_async": "amapreduce.enrich_api",
    "load_decision": "amapreduce.decision.model",
    "run_decision": "amapreduce.api",
    "run_decision_async": "amapreduce.api",
}

__all__ = [
    "AmapreduceError",
    "BatchTimeout",
    "ConfigError",
    "Decision",
    "DecisionError",
    "RunCancelled",
    "RunError",
    "RunRecord",
    "RunResult",
    "RunStatus",
    "RunUsage",
    "SolverError",
    "Table",
    "ToolCallFailed",
    "ToolCallRefused",
    "ToolError",
    "UserError",
    "__version__",
    "ask",
    "ask_async",
    "enrich",
    "enrich_async",
    "load_decision",
    "run_decision",
    "run_decision_async",
]
"""The user's API (docs/reference/python.md lists it; a test holds the two together): the calls, what
they take and return, and the errors they raise. The parts to build on (`amapreduce.session.Session`,
`amapreduce.mapreduce.engine.MapReduceEngine`, `amapreduce.mapreduce.solver.SmolagentsSolver`, the
`mapreduce` tool, priors) are importable from their modules."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'amapreduce' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
