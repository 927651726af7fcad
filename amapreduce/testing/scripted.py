"""Simulated models: Python functions that play a model's part. They are **not LLMs**.

They subclass smolagents' `Model`, so agents, tools and the engine run exactly as with a real
provider, while every reply is decided by code (pydantic-ai's `FunctionModel` idea). Tests,
benchmarks and the offline demo use them; the model-request guard never blocks them.

Example:
    >>> from amapreduce.testing.scripted import FunctionModel, final_answer
    >>> model = FunctionModel(lambda messages, info: final_answer("Paris"))
    >>> model.generate([]).tool_calls[0].function.name
    'final_answer'
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeAlias

from smolagents.models import (
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
    Model,
)
from smolagents.monitoring import TokenUsage

from amapreduce.errors import RunError
from amapreduce.llm.messages import estimate_tokens, message_text
from amapreduce.llm.meter import Price

__all__ = [
    "FunctionModel",
    "ModelInfo",
    "Reply",
    "SIMULATED_PRICES",
    "ScriptExhausted",
    "ScriptedModel",
    "ToolCall",
    "final_answer",
    "tool_call",
]


SIMULATED_PRICES: Mapping[str, Price] = MappingProxyType({"simulated/": Price(input=0.0, output=0.0)})
"""The price rule of simulated models: every `simulated/...` model id costs nothing. A meter that
meters them is given it as `PriceTable(by_prefix=SIMULATED_PRICES)`; without it they are unpriced."""


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One tool call a simulated model makes."""

    name: str
    """The tool's name, e.g. `web_search` or `final_answer`."""
    arguments: dict[str, Any] = field(default_factory=dict)
    """The call's arguments, as the tool's inputs name them."""


Reply: TypeAlias = ChatMessage | str | ToolCall | Sequence[ToolCall]
"""What a model function may return: a full message, plain text, or one or more tool calls."""


@dataclass(frozen=True, kw_only=True)
class ModelInfo:
    """What a model function learns about the call besides the messages."""

    call_index: int
    """0-based index of this call on this model object."""
    tools: tuple[str, ...]
    """Names of the tools the agent offers for this step (empty for plain completions)."""
    stop_sequences: tuple[str, ...] = ()
    response_format: dict[str, Any] | None = None


ModelFunction: TypeAlias = Callable[[list[ChatMessage], ModelInfo], Reply]


class ScriptExhausted(RunError):
    """A `ScriptedModel` was called more times than it has replies."""


def tool_call(name: str, /, **arguments: Any) -> ToolCall:
    """Build a `ToolCall` (`tool_call("web_search", query="...")`)."""
    return ToolCall(name=name, arguments=arguments)


def final_answer(answer: Any) -> ToolCall:
    """Build the `final_answer` tool call that ends a smolagents run."""
    return ToolCall(name="final_answer", arguments={"answer": answer})


_call_ids = itertools.count(1)
"""Tool-call ids, unique in the process. Written with a fixed width (`call_00000001`): the simulated
usage counts characters, so the id's length must not depend on how many calls the process made
before (an evaluation's trial counts the same tokens in a Ray worker as in the driver)."""


def _to_message(reply: Reply) -> ChatMessage:
    if isinstance(reply, ChatMessage):
        return reply
    if isinstance(reply, str):
        return ChatMessage(role=MessageRole.ASSISTANT, content=reply)
    calls = [reply] if isinstance(reply, ToolCall) else list(reply)
    return ChatMessage(
        role=MessageRole.ASSISTANT,
        content=None,
        tool_calls=[
            ChatMessageToolCall(
                id=f"call_{next(_call_ids):08d}",
                type="function",
                function=ChatMessageToolCallFunction(name=c.name, arguments=c.arguments),
            )
            for c in calls
        ],
    )


class FunctionModel(Model):
    """A simulated model whose every reply comes from `function(messages, info)`.

    Thread-safe: one instance may serve many sub-agents at once. Token usage is estimated from
    the text (about 4 characters per token) so usage accounting can be tested.
    """

    def __init__(self, function: ModelFunction, *, model_id: str = "simulated/function-model") -> None:
        super().__init__(model_id=model_id)
        self.function = function
        self._lock = threading.Lock()
        self._calls = 0
        self.input_tokens = 0
        self.output_tokens = 0

    @property
    def calls(self) -> int:
        """How many times the model was called."""
        return self._calls

    def generate(
        self,
        messages: list[ChatMessage],
        stop_sequences: list[str] | None = None,
        response_format: dict[str, str] | None = None,
        tools_to_call_from: list[Any] | None = None,
        **kwargs: Any,
    ) -> ChatMessage:
        with self._lock:
            index = self._calls
            self._calls += 1
        info = ModelInfo(
            call_index=index,
            tools=tuple(t.name for t in tools_to_call_from or ()),
            stop_sequences=tuple(stop_sequences or ()),
            response_format=dict(response_format) if response_format else None,
        )
        message = _to_message(self.function(list(messages), info))
        prompt_tokens = sum(estimate_tokens(message_text(m)) for m in messages)
        out_text = message_text(message) + "".join(
            json.dumps(c.function.arguments, default=str) for c in message.tool_calls or ()
        )
        completion_tokens = estimate_tokens(out_text)
        message.token_usage = TokenUsage(input_tokens=prompt_tokens, output_tokens=completion_tokens)
        with self._lock:
            self.input_tokens += prompt_tokens
            self.output_tokens += completion_tokens
        return message


class ScriptedModel(FunctionModel):
    """A simulated model that plays back a fixed list of replies, one per call, in order.

    Raises `ScriptExhausted` when called once more than it has replies, so a test notices an
    agent that loops longer than expected.
    """

    def __init__(self, replies: Sequence[Reply], *, model_id: str = "simulated/scripted-model") -> None:
        self.replies = list(replies)

        def play(messages: list[ChatMessage], info: ModelInfo) -> Reply:
            if info.call_index >= len(self.replies):
                raise ScriptExhausted(
                    f"scripted model has {len(self.replies)} replies but was called "
                    f"{info.call_index + 1} times. Add replies or check why the agent kept going."
                )
            return self.replies[info.call_index]

        super().__init__(play, model_id=model_id)
