"""One-shot calls to the memory model (any smolagents `Model`): system + user text in, text out."""

from __future__ import annotations

from typing import Any

__all__ = ["ask"]


def ask(model: Any, system: str, user: str) -> str:
    """Send one system and one user message to `model` and return the reply's text.

    Raises:
        RunError: the model returned no text.
    """
    from smolagents.models import ChatMessage, MessageRole

    from amapreduce.errors import RunError

    messages = [
        ChatMessage(role=MessageRole.SYSTEM, content=[{"type": "text", "text": system}]),
        ChatMessage(role=MessageRole.USER, content=[{"type": "text", "text": user}]),
    ]
    reply = model.generate(messages)
    content = reply.content
    if isinstance(content, list):
        content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    if not content or not str(content).strip():
        raise RunError(f"memory model {getattr(model, 'model_id', model)!r} returned an empty reply.")
    return str(content)
