"""The masking layer: no registered secret is ever sent to a provider, whatever text a prompt quotes.

Keys are registered once where a run or a command starts (`trace.register_secrets`); this layer
masks them by value in every message of every call (`messages.without_secrets`), before the
layers below estimate the prompt's tokens or record anything.
"""

from __future__ import annotations

from typing import Any

from smolagents.models import ChatMessage

from amapreduce.llm.messages import without_secrets
from amapreduce.llm.wrappers.base import WrapperModel

__all__ = ["MaskedModel"]


class MaskedModel(WrapperModel):
    """Sends `messages` with every registered secret masked."""

    def generate(self, messages: list[ChatMessage], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        return super().generate(without_secrets(messages), stop_sequences, response_format, tools_to_call_from,
                                **kwargs)
