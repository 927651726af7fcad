"""Reading chat messages without a provider: their plain text, a cheap token estimate, and
the messages with every registered secret masked.

These live in the model layer, not with the simulated models, because product code needs them
too: `ManagedModel` estimates a call's tokens for the rate limiter before it is sent, and
counts a reply that came back without usage; the simulated models use the same two helpers to
report usage, so both sides count alike. `ManagedModel` also sends every call's messages through
`without_secrets`: whatever prompt was built from whatever text (a retry prompt quoting an
error, a tool's observation), no configured key leaves the process in a request body.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from smolagents.models import ChatMessage

from amapreduce.trace import redact_secrets

__all__ = ["estimate_tokens", "message_text", "without_secrets"]

M = TypeVar("M", ChatMessage, dict[str, Any])


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


def _masked_content(content: Any) -> Any:
    """`content` (text, or a list of parts) with secrets masked; the same object when none occurs."""
    if isinstance(content, str):
        return redact_secrets(content)
    if not isinstance(content, list):
        return content
    parts = [_masked_part(part) for part in content]
    return content if all(new is old for new, old in zip(parts, content, strict=True)) else parts


def _masked_part(part: Any) -> Any:
    """A text part with secrets masked (a copy); the same object when it has none or is no text part."""
    text = part.get("text") if isinstance(part, dict) else None
    if isinstance(text, str):
        masked = redact_secrets(text)
        if masked is not text:
            return {**part, "text": masked}
    return part


def without_secrets(messages: list[M]) -> list[M]:
    """`messages` with every registered secret (`trace.register_secrets`) masked in their text.

    A message without one is passed on as it is (the same object), so the common case copies
    nothing; a message with one is copied, never changed in place (it belongs to the agent's memory).
    """
    out: list[M] = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else message.content
        masked = _masked_content(content)
        if masked is content:
            out.append(message)
        elif isinstance(message, dict):
            out.append({**message, "content": masked})
        else:
            out.append(dataclasses.replace(message, content=masked))
    return out
