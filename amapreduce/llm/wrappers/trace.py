"""The trace layers: one `model_call` event per call, and each HTTP attempt counted and spanned.

`CallEvents` is where a stack's events go: one stream (`events.EventStream`) that the layers emit
typed events on (this one's `llm.events.ModelCalled`, the retries' `llm.retry.ProviderRetry`, the
hedges' `llm.events.ModelHedged`), each once; the run's trace and its retry handler are its
subscribers, attached once the run's directory exists (a session builds its models in pre-flight,
before it has a trace). Every event carries the role, the model id and the open usage scope's labels
(the batch and attempt); errors in it are capped and never hold a registered secret.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from smolagents.models import ChatMessage

from amapreduce import telemetry
from amapreduce.errors import ProviderUnavailable
from amapreduce.events import Event, EventStream, trace_channel
from amapreduce.llm.events import ModelCalled
from amapreduce.llm.retry import ModelCallError, ProviderRetry, ProviderRetryHandler
from amapreduce.llm.scope import scope_labels
from amapreduce.llm.wrappers.base import WrapperModel, call_log, open_call
from amapreduce.trace import redact_secrets

if TYPE_CHECKING:
    from smolagents.models import Model

    from amapreduce.trace import Trace

__all__ = ["CallEvents", "SpanModel", "TracedModel", "describe", "describe_text"]


def describe(exc: BaseException | None) -> str | None:
    """An error for the trace: capped at 1,000 characters, and never a key (servers may echo it)."""
    return None if exc is None else describe_text(f"{type(exc).__name__}: {exc}")


def describe_text(text: str | None) -> str | None:
    """Text for the trace, capped and masked as `describe`'s."""
    return None if text is None else redact_secrets(text)[:1000]


def _nothing() -> None:
    return None


class CallEvents:
    """Where one role model's events go: `stream`, with the trace and the retry handler as subscribers.

    Args:
        role: what the model is used for (`manager`, `subagent`, ...).
        model_id: the model id.
        trace: where call, retry and hedge events are written (None: not traced).
        on_retry: told of each retry (e.g. to count retries in progress).
    """

    def __init__(self, *, role: str, model_id: str | None, trace: Trace | None = None,
                 on_retry: ProviderRetryHandler | None = None) -> None:
        self.role = role
        self.model_id = model_id
        self.stream = EventStream()
        """Every event of this model's calls, emitted once; anyone may subscribe."""
        self._trace: Trace | None = None
        self._on_retry: ProviderRetryHandler | None = None
        self._untrace: Callable[[], None] = _nothing
        self._unretry: Callable[[], None] = _nothing
        self.trace = trace
        self.on_retry = on_retry

    @property
    def trace(self) -> Trace | None:
        """Where call, retry and hedge events are written (None: not traced)."""
        return self._trace

    @trace.setter
    def trace(self, trace: Trace | None) -> None:
        self._untrace()
        self._trace, self._untrace = trace, _nothing if trace is None else trace_channel(self.stream, trace)

    @property
    def on_retry(self) -> ProviderRetryHandler | None:
        """Told of each retry (a subscriber of its `ProviderRetry`)."""
        return self._on_retry

    @on_retry.setter
    def on_retry(self, handler: ProviderRetryHandler | None) -> None:
        self._unretry()
        self._on_retry = handler
        self._unretry = _nothing if handler is None else self.stream.subscribe(ProviderRetry, handler)

    @property
    def what(self) -> str:
        """The model in messages: `subagent model 'gpt-5-mini'`."""
        return f"{self.role} model {self.model_id!r}"

    def labels(self) -> dict[str, Any]:
        """The open usage scope's labels, for an event made now."""
        return scope_labels()

    def emit(self, event: Event) -> None:
        """Hand `event` to the stream's subscribers."""
        self.stream.emit(event)


class TracedModel(WrapperModel):
    """Writes one `model_call` event per call: its latency, retries and the waits before them, its
    priced usage (from the meter layer below) or its error."""

    def __init__(self, wrapped: Model, *, events: CallEvents) -> None:
        super().__init__(wrapped)
        self.events = events

    def generate(self, messages: list[ChatMessage], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        started = time.monotonic()
        with open_call() as log:
            try:
                reply = super().generate(messages, stop_sequences, response_format, tools_to_call_from, **kwargs)
            except (ModelCallError, ProviderUnavailable) as exc:
                self._called(started, max(0, log.attempts - 1), log.waits, None, describe(exc))
                raise
            self._called(started, log.attempts - 1, log.waits, log.usage.to_json() if log.usage else None, None)
        return reply

    def _called(self, started: float, retries: int, waits: list[dict[str, Any]], usage: dict[str, Any] | None,
                error: str | None) -> None:
        events = self.events
        events.emit(ModelCalled(role=events.role, model_id=events.model_id, labels=events.labels(),
                                latency_s=round(time.monotonic() - started, 6), retries=retries,
                                retry_waits=tuple(waits), usage=usage, error=error))


class SpanModel(WrapperModel):
    """The innermost layer: the attempt is sent now (counted in the call's log, a retry's real wait
    noted) as an OpenTelemetry LLM span (`telemetry.traced_generate`: a simulated model's calls too)."""

    def generate(self, messages: list[ChatMessage], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        with call_log() as log:
            log.sending()
        reply: ChatMessage = telemetry.traced_generate(self.wrapped, messages, stop_sequences=stop_sequences,
                                                       response_format=response_format,
                                                       tools_to_call_from=tools_to_call_from, **kwargs)
        return reply
