"""The trace layers: one `model_call` event per call, and each HTTP attempt counted and spanned.

`CallEvents` is where a stack's events go: the run's trace and its retry handler, attached once
the run's directory exists (a session builds its models in pre-flight, before it has a trace), and
shared by the layers that write events (this one, the retries' `model_retry`, the hedges'
`model_hedge`). Every event carries the role, the model id and the open usage scope's labels (the
batch and attempt); errors in it are capped and never hold a registered secret.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from smolagents.models import ChatMessage

from amapreduce import telemetry
from amapreduce.errors import ProviderUnavailable
from amapreduce.llm.retry import ModelCallError, ProviderRetryHandler
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


@dataclass(kw_only=True)
class CallEvents:
    """Where one role model's events go."""

    role: str
    """What the model is used for (`manager`, `subagent`, ...)."""
    model_id: str | None
    trace: Trace | None = None
    """Where call, retry and hedge events go (None: not traced)."""
    on_retry: ProviderRetryHandler | None = None
    """Told of each retry (e.g. to count retries in progress)."""

    @property
    def what(self) -> str:
        """The model in messages: `subagent model 'gpt-5-mini'`."""
        return f"{self.role} model {self.model_id!r}"

    def write(self, event: str, **data: Any) -> None:
        """Write `event` with the role, the model id and the open scope's labels."""
        if self.trace is not None and self.trace.enabled:
            self.trace.write(event, **{"role": self.role, "model_id": self.model_id, **scope_labels(), **data})


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
                self.events.write("model_call", latency_s=round(time.monotonic() - started, 6),
                                  retries=max(0, log.attempts - 1), retry_waits=log.waits, usage=None,
                                  error=describe(exc))
                raise
            self.events.write("model_call", latency_s=round(time.monotonic() - started, 6), retries=log.attempts - 1,
                              retry_waits=log.waits, usage=log.usage.to_json() if log.usage else None, error=None)
        return reply


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
