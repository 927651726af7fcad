"""One prompt in, the reply's text out: the single-completion call every one-shot user shares.

The memory's projection and distillation, the evaluation judges and the focused page extraction
each ask a model one question and read back plain text. They differ only in what they do with
that text or with a failure, so building the messages and reading the reply is done here once.

Errors are translated once, below this helper: a model from the factory (`ManagedModel`) turns
provider failures into `ModelCallError` after its retries, and raises `BudgetExceeded` when the
budget is spent. `complete` passes every exception through unchanged, so each caller keeps its
own policy (the memory and the page extraction fall back and report the error as raised, the
judge stops the evaluation).
"""

from __future__ import annotations

from smolagents.models import ChatMessage, MessageRole, Model

from amapreduce.llm.messages import message_text

__all__ = ["complete"]


def complete(model: Model, prompt: str, *, system: str | None = None) -> str:
    """Send `prompt` as one user message (after `system`, when given) and return the reply's text.

    Returns:
        The reply's text, its parts joined by newlines when the reply came as parts; `""` when
        the reply has no text.

    Raises:
        Exception: whatever `model.generate` raises, unchanged.
    """
    messages = [ChatMessage(role=MessageRole.USER, content=[{"type": "text", "text": prompt}])]
    if system is not None:
        messages.insert(0, ChatMessage(role=MessageRole.SYSTEM, content=[{"type": "text", "text": system}]))
    return message_text(model.generate(messages))
