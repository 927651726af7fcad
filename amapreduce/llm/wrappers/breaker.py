"""The breaker layer: each HTTP attempt admitted by the provider's circuit breaker, its outcome reported.

An outage (`llm.breaker.is_outage`) counts against the provider's breaker, which, open, fails a
call at once (`ProviderUnavailable`, nothing sent) or holds it while it cools down; any answer
closes it again. Whatever the breaker, a provider that never answered in this process and cannot
be connected to (DNS, refused, TLS, proxy) fails the call as `ProviderUnreachable` at once
(`llm.breaker.unreachable`): a setup problem, said now rather than retried for a minute.
"""

from __future__ import annotations

from typing import Any, Protocol

from smolagents.models import ChatMessage, Model

from amapreduce.breaker import BreakerState, CircuitBreaker
from amapreduce.llm.breaker import is_outage, record_answer, unreachable
from amapreduce.llm.usage import Usage
from amapreduce.llm.wrappers.base import WrapperModel
from amapreduce.llm.wrappers.trace import describe

__all__ = ["BreakerGate", "BreakerModel"]


class BreakerGate(Protocol):
    """What a model call needs of its provider's circuit breaker (`breaker.CircuitBreaker` is one)."""

    def admit(self) -> bool:
        """Wait until a request may be sent; True when it is the half-open probe (raises the
        breaker's error when the provider is down)."""

    def record(self, probe: bool, outage: str | None) -> None:
        """Report a request's outcome (`outage`: why it failed as an outage; None: it answered)."""

    def release(self, probe: bool) -> None:
        """A request ended without an outcome."""


class BreakerModel(WrapperModel):
    """Admits each attempt through `gate` (None: no breaker, only the reachability check).

    Args:
        wrapped: the limiter layer, or the client.
        gate: the provider's shared circuit breaker (this process's or a Ray cluster's).
        provider: the provider's key (`llm.models.provider_of`).
        what: the model in messages (`subagent model 'm'`).
    """

    def __init__(self, wrapped: Model, *, gate: BreakerGate | None, provider: str, what: str) -> None:
        super().__init__(wrapped)
        self.gate = gate
        self.provider = provider
        self.what = what

    def has_room_for(self, usage: Usage) -> bool:
        if isinstance(self.gate, CircuitBreaker) and self.gate.state is not BreakerState.CLOSED:
            return False
        return super().has_room_for(usage)

    def generate(self, messages: list[ChatMessage], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        gate = self.gate
        probe = gate.admit() if gate is not None else False
        try:
            reply = super().generate(messages, stop_sequences, response_format, tools_to_call_from, **kwargs)
        except Exception as exc:
            if gate is not None:
                gate.record(probe, describe(exc) if is_outage(exc) else None)
            record_answer(self.provider, exc)
            never_reached = unreachable(exc, what=self.what, provider=self.provider)
            if never_reached is not None:  # a setup problem: said at once, not retried for a minute
                raise never_reached from exc
            raise
        except BaseException:
            if gate is not None:
                gate.release(probe)
            raise
        if gate is not None:
            gate.record(probe, None)
        record_answer(self.provider)
        return reply
