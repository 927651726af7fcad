"""The endpoint layer: what an `--api-base` endpoint accepts, and a batch's calls sized to its rows.

The capabilities were probed once in pre-flight (`llm.endpoint`); the request adapters they turn
into live in the endpoint's client (`llm.dialect`). This layer keeps them where the callers read
them (`capabilities`: the read solver's window, `--solver auto`, the planner) and, for an
endpoint's calls only, sends a batch's reply budget (`scope.scope_reply_tokens`) as `max_tokens`
when the caller names none.
"""

from __future__ import annotations

from typing import Any

from smolagents.models import ChatMessage, Model

from amapreduce.llm.endpoint import EndpointCapabilities
from amapreduce.llm.scope import scope_reply_tokens
from amapreduce.llm.wrappers.base import WrapperModel

__all__ = ["EndpointModel"]


class EndpointModel(WrapperModel):
    """Carries `capabilities` (None: not an `api_base` endpoint, or a client given by the caller,
    a simulated model) and sizes an endpoint's replies to the open scope's reply budget."""

    def __init__(self, wrapped: Model, *, capabilities: EndpointCapabilities | None) -> None:
        super().__init__(wrapped)
        self.capabilities = capabilities

    def generate(self, messages: list[ChatMessage], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        budget = scope_reply_tokens()
        if budget is not None and "max_tokens" not in kwargs and self.capabilities is not None:
            kwargs["max_tokens"] = budget  # a batch's calls are sized to its rows (`ReplyBudget` caps it to the window)
        return super().generate(messages, stop_sequences, response_format, tools_to_call_from, **kwargs)
