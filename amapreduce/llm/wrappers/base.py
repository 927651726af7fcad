"""The wrapper model every layer of the model stack is, and the log one call's layers share.

A `WrapperModel` is a smolagents `Model` whose `generate` does its one thing around the model it
wraps (pydantic-ai's `WrapperModel` habit), so any layer can wrap a scripted model in a test and
any stack is a chain of them. Layers that must agree about one call (how many HTTP attempts it
made, what waited before each retry, its priced usage) write to the call's `CallLog`, which the
outermost layer that asks for it opens for the call and every layer below sees in its context.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from smolagents.models import ChatMessage, Model

from amapreduce.llm.messages import estimate_tokens, message_text
from amapreduce.llm.usage import Usage

__all__ = ["CallLog", "WrapperModel", "call_log", "innermost", "layer_of", "open_call", "reply_usage"]

W = TypeVar("W", bound="WrapperModel")


class WrapperModel(Model):
    """A model that delegates to `wrapped`; a layer overrides `generate` (and `has_room_for`)."""

    def __init__(self, wrapped: Model) -> None:
        super().__init__(model_id=wrapped.model_id)
        self.wrapped = wrapped

    def generate(
        self,
        messages: list[ChatMessage],
        stop_sequences: list[str] | None = None,
        response_format: dict[str, str] | None = None,
        tools_to_call_from: list[Any] | None = None,
        **kwargs: Any,
    ) -> ChatMessage:
        return self.wrapped.generate(messages, stop_sequences=stop_sequences, response_format=response_format,
                                     tools_to_call_from=tools_to_call_from, **kwargs)

    def has_room_for(self, usage: Usage) -> bool:
        """Whether optional work of about `usage` may start now, as far as this layer and those
        below it know (a layer with a limit of its own adds it; the client below has none)."""
        below = getattr(self.wrapped, "has_room_for", None)
        return True if below is None else bool(below(usage))


def layer_of(model: Model, kind: type[W]) -> W:
    """The first layer of type `kind` in the stack `model` heads.

    Raises:
        LookupError: the stack has no such layer.
    """
    while isinstance(model, WrapperModel):
        if isinstance(model, kind):
            return model
        model = model.wrapped
    raise LookupError(f"the model stack has no {kind.__name__}")


def innermost(model: Model) -> Model:
    """The model at the bottom of the stack `model` heads: the provider's client."""
    while isinstance(model, WrapperModel):
        model = model.wrapped
    return model


@dataclass
class CallLog:
    """What one `generate` did across its HTTP attempts, shared by the layers of one call."""

    attempts: int = 0
    """HTTP attempts sent (the first and each retry)."""
    error: BaseException | None = None
    """The last failed attempt's error."""
    waits: list[dict[str, Any]] = field(default_factory=list)
    """One per retry: why (`kind`), what the server asked (`retry_after_s`, None if nothing), the
    retry loop's backoff (`delay_s`) and how long the call really waited before sending again
    (`waited_s`: the backoff plus any wait for the breaker and the limiter, and the scheduler's
    delay; None when the retry was never sent), for the `model_call` event's `retry_waits`: what
    shows whether a retry waited longer than its `Retry-After` asked (`benchmarks/bench_oracle.py`)."""
    waited_retry_after: bool = False
    """Whether the retry about to be sent waited a `Retry-After` of its own (the limiter then
    skips the deferral that same `Retry-After` set: `ratelimit.WindowGate.acquire`)."""
    failed_at: float | None = None
    """`time.monotonic()` of the last failure whose retry is not sent yet."""
    usage: Usage | None = None
    """The call's usage as the meter charged it (priced), once it has a reply."""
    estimate: int | None = None
    """The prompt's token estimate (counted once per call, see `prompt_tokens`)."""

    def prompt_tokens(self, messages: list[ChatMessage]) -> int:
        """The estimated prompt tokens of `messages`, counted on the first ask of the call."""
        if self.estimate is None:
            self.estimate = sum(estimate_tokens(message_text(m)) for m in messages)
        return self.estimate

    def sending(self) -> None:
        """An HTTP attempt is sent now: counted, and a retry's real wait noted."""
        if self.failed_at is not None:
            self.waits[-1]["waited_s"] = round(time.monotonic() - self.failed_at, 6)
            self.failed_at = None
        self.attempts += 1


_log: ContextVar[CallLog | None] = ContextVar("amapreduce_call_log", default=None)


@contextlib.contextmanager
def open_call() -> Iterator[CallLog]:
    """A new log for the call starting now in this context (closed when it returns): what the
    outermost layer that reads a call's log opens, so a stack wrapping another keeps its own."""
    opened = CallLog()
    token = _log.set(opened)
    try:
        yield opened
    finally:
        _log.reset(token)


@contextlib.contextmanager
def call_log() -> Iterator[CallLog]:
    """The log of the call in progress: the one a layer above opened, else a new one for this
    layer's call alone (a layer used without the ones above it)."""
    current = _log.get()
    if current is not None:
        yield current
        return
    with open_call() as opened:
        yield opened


def reply_usage(reply: ChatMessage, log: CallLog, messages: list[ChatMessage], cached: int = 0) -> Usage:
    """One call's usage as the provider reported it, else estimated from the prompt and the reply."""
    used = reply.token_usage
    return Usage(
        requests=1,
        input_tokens=used.input_tokens if used else log.prompt_tokens(messages),
        output_tokens=used.output_tokens if used else estimate_tokens(message_text(reply)),
        cached_tokens=cached,
    )
