"""Request adapters: each one fits chat-completions requests (and their replies) to one trait of an endpoint.

An endpoint's capabilities (`llm.endpoint.EndpointCapabilities`) say what it accepts; each
adapter here turns one of those findings into a rewrite of the request the OpenAI way (what
smolagents builds) into the endpoint's way, or of its reply back. They are small, composed into the
endpoint's client in one place (`adapters_for`), and each is tested alone, like pydantic-ai's wrapper
models; the managed model above them (`llm.models.ManagedModel`) knows no server.

* `FlattenContent`: content parts → one string per message (servers that take only strings).
* `FitToolChoice`: `tool_choice: "required"` → `"auto"` where the server refuses `"required"`
  (llama-cpp-python's `chatml-function-calling` asserts on it).
* `StructuredOutput`: OpenAI's `response_format: {"type": "json_schema", ...}` → the endpoint's
  dialect (`{"type": "json_object", "schema": S}`, a bare `json_object`, or the schema written into the
  prompt when the endpoint holds replies to no schema).
* `ReplyBudget`: every request carries a `max_tokens` (the role's default when the caller sent none),
  never more than the context window leaves after the prompt: a weak model otherwise generates
  toward the whole context, minutes per call on a CPU server.
* `UnescapeArguments`: tool-call arguments HTML-unescaped where the server escapes its prompt.
"""

from __future__ import annotations

import copy
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from amapreduce.llm.endpoint import EndpointCapabilities, StructuredDialect

__all__ = [
    "DEFAULT_REPLY_TOKENS",
    "Adapter",
    "FitToolChoice",
    "FlattenContent",
    "ReplyBudget",
    "StructuredOutput",
    "UnescapeArguments",
    "adapt_reply",
    "adapt_request",
    "adapters_for",
    "schema_instruction",
]

DEFAULT_REPLY_TOKENS: dict[str, int] = {
    "manager": 4096, "subagent": 2048, "extraction": 1024, "memory": 1024, "judge": 512,
}
"""A role's `max_tokens` when its caller names none: bounded above what the role's reply needs (a
manager's decision, a batch's rows, one extraction), so a model that never stops costs seconds."""

MIN_REPLY_TOKENS = 16
"""The least `ReplyBudget` leaves for a reply; a prompt that leaves less overflows (the server says so)."""


class Adapter(Protocol):
    """One rewrite of a chat-completions request (keys as the OpenAI API names them) and of its reply."""

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The request as this endpoint takes it (a new dict; `payload` is not changed)."""

    def reply(self, data: dict[str, Any]) -> dict[str, Any]:
        """The reply as the OpenAI API would give it."""


class _RequestOnly:
    def reply(self, data: dict[str, Any]) -> dict[str, Any]:
        return data


def _text_of(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    texts = [part.get("text", "") for part in content if isinstance(part, Mapping) and part.get("type") == "text"]
    return "\n".join(t for t in texts if isinstance(t, str))


@dataclass(frozen=True)
class FlattenContent(_RequestOnly):
    """Every message's list of content parts becomes one string (its text parts joined by newlines)."""

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        messages = payload.get("messages")
        if not isinstance(messages, list):
            return payload
        flat = [{**m, "content": _text_of(m.get("content"))} if isinstance(m, Mapping) else m for m in messages]
        return {**payload, "messages": flat}


@dataclass(frozen=True)
class FitToolChoice(_RequestOnly):
    """A `tool_choice` the endpoint refuses becomes one it honours: `required` → `auto` (the agent's
    prompt already says every reply must call a tool), or is dropped when it honours neither."""

    accepted: tuple[str, ...]

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        choice = payload.get("tool_choice")
        if choice is None:
            return payload
        kind = "named" if isinstance(choice, Mapping) else choice
        if kind in self.accepted or kind == "none":
            return payload
        for fallback in ("auto", "required"):
            if fallback in self.accepted:
                return {**payload, "tool_choice": fallback}
        return {k: v for k, v in payload.items() if k != "tool_choice"}


def schema_instruction(schema: Mapping[str, Any]) -> str:
    """What a prompt says when the endpoint cannot hold a reply to `schema` itself."""
    return ("Reply with one JSON object only, no prose and no code fence, matching this JSON schema:\n"
            + json.dumps(schema, ensure_ascii=False, separators=(",", ":")))


def _schema_of(response_format: Mapping[str, Any]) -> Mapping[str, Any] | None:
    if response_format.get("type") != "json_schema":
        return None
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, Mapping) else None
    return schema if isinstance(schema, Mapping) else None


@dataclass(frozen=True)
class StructuredOutput(_RequestOnly):
    """OpenAI's `json_schema` response format in the endpoint's dialect (see `StructuredDialect`)."""

    dialect: StructuredDialect

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        response_format = payload.get("response_format")
        schema = _schema_of(response_format) if isinstance(response_format, Mapping) else None
        if schema is None or self.dialect == "json_schema":
            return payload
        if self.dialect == "json_object_schema":
            return {**payload, "response_format": {"type": "json_object", "schema": dict(schema)}}
        out = {k: v for k, v in payload.items() if k != "response_format"}
        if self.dialect == "json_object":
            out["response_format"] = {"type": "json_object"}
        messages = copy.deepcopy(payload.get("messages"))
        if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
            last = messages[-1]
            note = schema_instruction(schema)
            content = last.get("content")
            if isinstance(content, list):
                last["content"] = [*content, {"type": "text", "text": note}]
            else:
                last["content"] = f"{content or ''}\n\n{note}".strip()
            out["messages"] = messages
        return out


def _prompt_tokens(payload: Mapping[str, Any]) -> int:
    """A generous estimate of the request's prompt tokens (3 characters a token: small models'
    tokenizers split non-English text finely; tools and schema count too)."""
    chars = len(json.dumps(payload.get("messages", []), ensure_ascii=False))
    chars += len(json.dumps(payload.get("tools", []), ensure_ascii=False)) if payload.get("tools") else 0
    chars += len(json.dumps(payload.get("response_format", {}), ensure_ascii=False)) if payload.get("response_format") else 0
    return chars // 3 + 64


@dataclass(frozen=True)
class ReplyBudget(_RequestOnly):
    """Every request bounds its reply: `max_tokens` (or the role's `default`), within what the
    context window leaves after the prompt."""

    default: int
    context_window: int | None = None
    key: str = "max_tokens"
    """`max_completion_tokens` for reasoning models, whose APIs refuse `max_tokens`."""

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        asked = payload.get("max_tokens") or payload.get("max_completion_tokens")
        budget = int(asked) if isinstance(asked, int) and asked > 0 else self.default
        if self.context_window is not None:
            budget = min(budget, max(MIN_REPLY_TOKENS, self.context_window - _prompt_tokens(payload)))
        out = {k: v for k, v in payload.items() if k not in ("max_tokens", "max_completion_tokens")}
        out[self.key] = budget
        return out


@dataclass(frozen=True)
class UnescapeArguments:
    """Tool-call arguments HTML-unescaped (`&#34;` → `"`): a server that escapes its prompt's
    template has the model copy the escapes into the JSON it writes."""

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    def reply(self, data: dict[str, Any]) -> dict[str, Any]:
        choices = data.get("choices")
        if not isinstance(choices, list):
            return data
        fixed = copy.deepcopy(data)
        for choice in fixed["choices"]:
            message = choice.get("message") if isinstance(choice, dict) else None
            for call in (message or {}).get("tool_calls") or []:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                    function["arguments"] = _unescaped_arguments(function["arguments"])
        return fixed


def _unescaped_arguments(text: str) -> str:
    """Arguments' JSON with every string in it unescaped (unescaping the JSON text itself would turn
    `&#34;` inside a string into a `"` that ends it); text that is not JSON is unescaped whole."""
    try:
        data = json.loads(text)
    except ValueError:
        return html.unescape(text)
    return json.dumps(_unescaped(data), ensure_ascii=False)


def _unescaped(value: Any) -> Any:
    if isinstance(value, str):
        return html.unescape(value)
    if isinstance(value, list):
        return [_unescaped(v) for v in value]
    if isinstance(value, dict):
        return {k: _unescaped(v) for k, v in value.items()}
    return value


def adapters_for(capabilities: EndpointCapabilities, *, role: str, max_tokens: int | None = None,
                 reasoning: bool = False) -> tuple[Adapter, ...]:
    """The adapters an endpoint with `capabilities` needs for `role`'s requests (`max_tokens`: the
    role's reply budget when a caller sends none, default `DEFAULT_REPLY_TOKENS[role]`; `reasoning`:
    the budget goes in `max_completion_tokens`)."""
    adapters: list[Adapter] = []
    if not capabilities.list_content:
        adapters.append(FlattenContent())
    if capabilities.tool_choices and set(capabilities.tool_choices) != {"required", "auto", "named"}:
        adapters.append(FitToolChoice(capabilities.tool_choices))
    if capabilities.structured != "json_schema":
        adapters.append(StructuredOutput(capabilities.structured))
    adapters.append(ReplyBudget(max_tokens or DEFAULT_REPLY_TOKENS.get(role, 2048), capabilities.context_window,
                                key="max_completion_tokens" if reasoning else "max_tokens"))
    if capabilities.escapes_arguments:
        adapters.append(UnescapeArguments())
    return tuple(adapters)


def adapt_request(adapters: Sequence[Adapter], payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` through every adapter, in order."""
    for adapter in adapters:
        payload = adapter.request(payload)
    return payload


def adapt_reply(adapters: Sequence[Adapter], data: dict[str, Any]) -> dict[str, Any]:
    """A reply through every adapter, last first."""
    for adapter in reversed(adapters):
        data = adapter.reply(data)
    return data
