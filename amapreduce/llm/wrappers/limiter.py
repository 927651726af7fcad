"""The limiter layer: each HTTP attempt takes a ticket from the provider's rate limiter.

Every attempt, the first and each retry, is a request the provider counts, so each takes its own
ticket for the prompt's estimated tokens; a failed request keeps its ticket. A reply settles its
ticket with the tokens really used. A retry that waited its own `Retry-After` is not held again
by the deferral that same answer set (`ratelimit.WindowGate.acquire(skip_deferral=True)`).
"""

from __future__ import annotations

from typing import Any

from smolagents.models import ChatMessage, Model

from amapreduce.llm.usage import Usage
from amapreduce.llm.wrappers.base import WrapperModel, call_log, reply_usage
from amapreduce.ratelimit import WindowGate, WindowLimiter

__all__ = ["LimiterModel"]


class LimiterModel(WrapperModel):
    """Takes each attempt's ticket from `gate`, the provider's shared limiter (this process's or a
    Ray cluster's); optional work has room only when this process's limiter admits it at once."""

    def __init__(self, wrapped: Model, *, gate: WindowGate) -> None:
        super().__init__(wrapped)
        self.gate = gate

    def has_room_for(self, usage: Usage) -> bool:
        per_request = usage.input_tokens // max(1, usage.requests)
        if isinstance(self.gate, WindowLimiter) and self.gate.wait_s(per_request) > 0:
            return False
        return super().has_room_for(usage)

    def generate(self, messages: list[ChatMessage], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        with call_log() as log:
            ticket = self.gate.acquire(log.prompt_tokens(messages), skip_deferral=log.waited_retry_after)
            reply = super().generate(messages, stop_sequences, response_format, tools_to_call_from, **kwargs)
            self.gate.settle(ticket, reply_usage(reply, log, messages).total_tokens)
        return reply
