"""One-shot calls to the memory model (any smolagents `Model`): system + user text in, text out.

The call itself is the model layer's `complete`; the memory adds one rule of its own: an empty
reply is an error (the projection and distillation fall back and report it), not an empty answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amapreduce.errors import RunError
from amapreduce.llm.complete import complete

if TYPE_CHECKING:
    from smolagents import Model

__all__ = ["ask"]


def ask(model: Model, system: str, user: str) -> str:
    """Send one system and one user message to `model` and return the reply's text.

    Raises:
        RunError: the model returned no text.
    """
    text = complete(model, user, system=system)
    if not text.strip():
        raise RunError(f"memory model {getattr(model, 'model_id', model)!r} returned an empty reply.")
    return text
