"""The retry layer: transient errors retried with backoff, `Retry-After` honoured, nothing sent once
the attempt was given up.

Which errors are retried and what a call raises when it gives up is `llm.retry`'s
(`call_with_retries`): a refusal for good is `ProviderRejected` at once, the last transient error
a `ModelCallError`. Each retry is a `model_retry` event and a `ProviderRetry` for the run's
handler; a `Retry-After` the provider sends also defers its shared limiter (`defer`), so every
caller slows down, and a 429 keeps optional work (`has_room_for`) from starting until its wait is
over. Layers below this one run once per HTTP attempt.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from smolagents.models import ChatMessage, Model

from amapreduce.llm.retry import ModelCallError, ProviderRetry, RetryPolicy, Transient, call_with_retries
from amapreduce.llm.scope import scope_cancelled
from amapreduce.llm.usage import Usage
from amapreduce.llm.wrappers.base import WrapperModel, call_log
from amapreduce.llm.wrappers.trace import CallEvents, describe

__all__ = ["RetryModel"]


class RetryModel(WrapperModel):
    """Retries the layers below per `policy`.

    Args:
        wrapped: the per-attempt layers (breaker, limiter) over the client.
        policy: the retry policy (the `retry_*` settings, `llm.factory.ModelSettings.retry`).
        events: where `model_retry` events and `ProviderRetry`s go.
        provider: the provider's key in a `ProviderRejected`.
        sleep: replaces `time.sleep` between retries (tests).
        defer: told of a `Retry-After` (capped at `policy.max_retry_after_s`): the provider's limiter.
    """

    def __init__(self, wrapped: Model, *, policy: RetryPolicy, events: CallEvents, provider: str | None = None,
                 sleep: Callable[[float], object] | None = None, defer: Callable[[float], object] | None = None) -> None:
        super().__init__(wrapped)
        self.policy = policy
        self.events = events
        self.provider = provider
        self.sleep = sleep
        self.defer = defer
        self.slowed_until = float("-inf")
        """`time.monotonic()` until which the provider asked us to slow down (its last 429 and the
        wait it asked for): no optional work (`has_room_for`) starts before then."""

    def has_room_for(self, usage: Usage) -> bool:
        return time.monotonic() >= self.slowed_until and super().has_room_for(usage)

    def _admit(self) -> None:
        """Before the first request and before each retry."""
        if scope_cancelled():  # Ctrl-C, cancel() or a deadline gave the attempt up: send nothing more
            raise ModelCallError(f"{self.events.what}: not sent, its attempt was cancelled")

    def generate(self, messages: list[ChatMessage], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        pause = self.sleep or time.sleep
        events = self.events
        with call_log() as log:

            def pause_then_admit(delay_s: float) -> None:  # the retry loop's sleep: a retry is admitted like the first
                pause(delay_s)
                self._admit()

            def call() -> ChatMessage:
                try:
                    return super(RetryModel, self).generate(messages, stop_sequences, response_format,
                                                            tools_to_call_from, **kwargs)
                except Exception as exc:
                    log.error = exc
                    raise

            def retried(attempt: int, transient: Transient, delay_s: float) -> None:
                log.failed_at = time.monotonic()
                log.waited_retry_after = transient.retry_after_s is not None
                log.waits.append({"kind": transient.kind, "retry_after_s": transient.retry_after_s,
                                  "delay_s": round(delay_s, 6), "waited_s": None})
                if transient.retry_after_s is not None and self.defer is not None:
                    self.defer(min(transient.retry_after_s, self.policy.max_retry_after_s))
                if transient.kind == "rate_limit":
                    self.slowed_until = max(self.slowed_until, time.monotonic() + delay_s)
                events.emit(ProviderRetry(role=events.role, model_id=self.model_id or "unknown", retry=attempt,
                                          kind=transient.kind, delay_s=round(delay_s, 3), error=describe(log.error),
                                          labels=events.labels()))  # the trace and `on_retry` subscribe to it

            self._admit()
            return call_with_retries(call, what=events.what, policy=self.policy, on_retry=retried,
                                     sleep=pause_then_admit, provider=self.provider)
