"""The budget layer: a call is refused before anything is sent once the run's budget is spent.

Outermost but for the hedge, so a refused call leaves no trace event and takes no ticket; the
budget itself (`meter.Budget`: a cost and a token limit) lives in the run's meter, which the
meter layer below charges.
"""

from __future__ import annotations

from typing import Any

from smolagents.models import ChatMessage, Model

from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.usage import Usage
from amapreduce.llm.wrappers.base import WrapperModel

__all__ = ["BudgetModel"]


class BudgetModel(WrapperModel):
    """Raises `BudgetExceeded` before a call when `meter`'s budget is spent; optional work of
    `usage` has room only when it would not reach the budget."""

    def __init__(self, wrapped: Model, *, meter: UsageMeter) -> None:
        super().__init__(wrapped)
        self.meter = meter

    def generate(self, messages: list[ChatMessage], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        self.meter.check()
        return super().generate(messages, stop_sequences, response_format, tools_to_call_from, **kwargs)

    def has_room_for(self, usage: Usage) -> bool:
        return not self.meter.would_cross(usage) and super().has_room_for(usage)
