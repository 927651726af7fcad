"""Prompts of the memory model (projection Φ, contrastive refinement, merge), after paper App. D.7–D.8.

The text lives in `prompts/memory.yaml` with the project's other prompts and is loaded on first
use (nothing is read at import time). Templates are filled with `str.format`: the inputs are task
text and hint text, never templates, so there is nothing to inject into.
"""

from __future__ import annotations

from amapreduce.prompts import load_prompts

__all__ = ["memory_prompt"]


def memory_prompt(name: str) -> str:
    """The template `name` of `prompts/memory.yaml` (e.g. `project_system`, `merge_user`)."""
    return load_prompts("memory")[name]
