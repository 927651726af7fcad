"""Reading chat messages without a provider: their plain text and a cheap token estimate.

These live in the model layer, not with the simulated models, because product code needs them
too: `ManagedModel` estimates a call's tokens for the rate limiter before it is sent, and
counts a reply that came back without usage; the simulated models use the same two helpers to
report usage, so both sides count alike.
"""

from __future__ import annotations

from typing import Any

from smolagents.models import ChatMessage

__all__ = ["estimate_tokens", "message_text"]


def message_text(message: ChatMessage | dict[str, Any]) -> str:
    """The plain text of a message, whether its content is a string or a list of parts."""
    content = message.get("content") if isinstance(message, dict) else message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))


def estimate_tokens(text: str) -> int:
    """A cheap, deterministic token estimate (about 4 characters per token)."""
    return (len(text) + 3) // 4
