"""Prompts of the memory model (projection Φ, contrastive refinement, merge), after paper App. D.7–D.8.

The text lives in `prompts/memory.yaml` with the project's other prompts; this module exposes
each template under its constant name, loaded on first use (nothing is read at import time).
They are filled with `str.format`: the inputs are task text and hint text, never templates, so
there is nothing to inject into.
"""

from __future__ import annotations

from amapreduce.prompts import load_prompts

__all__ = [
    "COMPARE_SYSTEM",
    "COMPARE_USER",
    "FULL_POOL_SUFFIX",
    "MERGE_SYSTEM",
    "MERGE_USER",
    "OPERATION_FORMAT",
    "PROJECT_SYSTEM",
    "PROJECT_USER",
    "SUCCESS_SYSTEM",
    "SUCCESS_USER",
]


def __getattr__(name: str) -> str:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return load_prompts("memory")[name.lower()]
