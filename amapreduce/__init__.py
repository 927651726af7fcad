"""amapreduce: Agentic MapReduce for wide search.

`amapreduce.ask(question, model=...)` answers a question with a table (`RunResult.to_pandas()`),
`amapreduce.run_decision(decision, ...)` runs a decision you wrote, `amapreduce.enrich(df, columns=[...])`
adds columns to a list you have (`amapreduce.api`, `amapreduce.enrich_api`); each is one
`Session` (`RunOptions` in, one `RunOutcome` out), which is exported for plugging in your own parts, and
so are the engine's own parts, for building on them. The public API is listed in `__all__` and tested. Heavy names are imported lazily on first
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
    "BatchPlan": "amapreduce.mapreduce.batching",
    "BatchRequest": "amapreduce.mapreduce.solver",
    "BatchSolver": "amapreduce.mapreduce.solver",
    "Decision": "amapreduce.decision.model",
    "EngineConfig": "amapreduce.mapreduce.engine",
    "MapReduceEngine": "amapreduce.mapreduce.engine",
    "MapReduceResult": "amapreduce.mapreduce.result",
    "MapReduceTool": "amapreduce.agents.mapreduce_tool",
    "NoPrior": "amapreduce.mapreduce.prior",
    "Prior": "amapreduce.mapreduce.prior",
    "PriorProvider": "amapreduce.mapreduce.prior",
    "PriorRequest": "amapreduce.mapreduce.prior",
    "RunResult": "amapreduce.api",
    "RunKind": "amapreduce.session.journal",
    "RunOptions": "amapreduce.session.session",
    "RunOutcome": "amapreduce.session.outcome",
    "RunStatus": "amapreduce.mapreduce.result",
    "RunUsage": "amapreduce.api",
    "Session": "amapreduce.session.session",
    "SmolagentsSolver": "amapreduce.mapreduce.solver",
    "SolverReply": "amapreduce.mapreduce.solver",
    "Table": "amapreduce.table.table",
    "Usage": "amapreduce.llm.usage",
    "ask": "amapreduce.api",
    "ask_async": "amapreduce.api",
    "enrich": "amapreduce.enrich_api",
    "enrich_async": "amapreduce.enrich_api",
    "load_decision": "amapreduce.decision.model",
    "plan_batches": "amapreduce.mapreduce.batching",
    "run_decision": "amapreduce.api",
    "run_decision_async": "amapreduce.api",
}

__all__ = [
    "AmapreduceError",
    "BatchPlan",
    "BatchRequest",
    "BatchSolver",
    "BatchTimeout",
    "ConfigError",
    "Decision",
    "DecisionError",
    "EngineConfig",
    "MapReduceEngine",
    "MapReduceResult",
    "MapReduceTool",
    "NoPrior",
    "Prior",
    "PriorProvider",
    "PriorRequest",
    "RunCancelled",
    "RunError",
    "RunKind",
    "RunOptions",
    "RunOutcome",
    "RunResult",
    "RunStatus",
    "RunUsage",
    "Session",
    "SmolagentsSolver",
    "SolverError",
    "SolverReply",
    "Table",
    "ToolCallFailed",
    "ToolCallRefused",
    "ToolError",
    "Usage",
    "UserError",
    "__version__",
    "ask",
    "ask_async",
    "enrich",
    "enrich_async",
    "load_decision",
    "plan_batches",
    "run_decision",
    "run_decision_async",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'amapreduce' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
