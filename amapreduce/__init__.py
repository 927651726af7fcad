"""amapreduce: Agentic MapReduce for wide search.

The public API is listed in `__all__` and tested. Heavy names are imported lazily on first
access so that `import amapreduce` (and `amapreduce --help`) stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from amapreduce.errors import (
    AmapreduceError,
    BatchTimeout,
    ConfigError,
    DecisionError,
    RunCancelled,
    RunError,
    SolverError,
    ToolCallRefused,
    UserError,
)

__version__ = "0.1.0"

# name -> module that defines it; imported on first attribute access.
_LAZY: dict[str, str] = {}

__all__ = [
    "AmapreduceError",
    "BatchTimeout",
    "ConfigError",
    "DecisionError",
    "RunCancelled",
    "RunError",
    "SolverError",
    "ToolCallRefused",
    "UserError",
    "__version__",
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
