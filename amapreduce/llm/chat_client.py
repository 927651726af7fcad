"""A lean `chat.completions.create` for OpenAI-compatible endpoints: the SDK's client, less its
per-call request transform.

Why: a wide run is CPU-bound in one process (issue 28: 7.0 s of CPU in a 7.4 s span at N=3,000,
64 workers), and most of a sub-agent call's CPU was the openai SDK's, not amapreduce's. Of that,
`chat.completions.create` spends most in `maybe_transform`, which walks every message and tool of
the request against the SDK's `TypedDict` annotations (typing introspection per key, per call) to
rename aliased keys and drop unset ones. A chat completion as smolagents builds it is plain JSON
(dicts, lists, strings, numbers) with no aliased key, so the walk returns what it was given.
Measured offline (httpx `MockTransport`, a sub-agent-sized request): 2.4 ms of CPU per call through
`create`, 0.7 ms through the client's own `post` with the same body and reply type.

How: `LeanOpenAIClient` wraps an `openai.OpenAI`; its `chat.completions.create` sends the
parameters as the body through the client's documented `post` (the SDK's way to call any
endpoint), with the auth `create` asks for and `ChatCompletion` as the reply type. So the request
goes through the same client — its base URL, key, timeout, HTTP client (`llm.transport`), headers
and error types (a 429 is still a `RateLimitError` carrying `Retry-After`) — and the reply is the
same `ChatCompletion`. Anything else — streaming, per-request options (`extra_headers`,
`extra_body`, `timeout`, ...), an SDK sentinel value — goes to the SDK's `create` unchanged, and
every other attribute is the SDK client's.
"""

from __future__ import annotations

from typing import Any

import openai
from openai.types.chat import ChatCompletion

__all__ = ["LeanChatCompletions", "LeanOpenAIClient"]

_SDK_ONLY = frozenset({"stream", "stream_options", "extra_headers", "extra_query", "extra_body", "timeout"})
"""Parameters that are request options, or change the reply's type: left to the SDK's `create`."""


class LeanChatCompletions:
    """`chat.completions` with a `create` that sends plain-JSON parameters as they are."""

    def __init__(self, sdk: openai.OpenAI) -> None:
        self._sdk = sdk

    def create(self, **params: Any) -> Any:
        """The SDK's `chat.completions.create(**params)`, without its request transform when the
        parameters are plain JSON (see the module's docstring)."""
        if _SDK_ONLY & params.keys() or any(isinstance(v, (openai.NotGiven, openai.Omit)) for v in params.values()):
            return self._sdk.chat.completions.create(**params)
        return self._sdk.post("/chat/completions", body=params, cast_to=ChatCompletion,
                              options={"security": {"bearer_auth": True}})


class _LeanChat:
    def __init__(self, sdk: openai.OpenAI) -> None:
        self.completions = LeanChatCompletions(sdk)


class LeanOpenAIClient:
    """An `openai.OpenAI` whose `chat.completions.create` is `LeanChatCompletions`'; every other
    attribute is the wrapped client's (`sdk`)."""

    def __init__(self, sdk: openai.OpenAI) -> None:
        self.sdk = sdk
        self.chat = _LeanChat(sdk)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sdk, name)
