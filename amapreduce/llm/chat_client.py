"""The client of an OpenAI-compatible endpoint (`--api-base`): one JSON POST per chat completion, on httpx.

smolagents' `OpenAIModel` builds each request (messages, tools, tool choice, sampling) and reads
each reply (`choices[0].message`, `usage`); it only needs a client object with the shape of the
openai SDK's, `client.chat.completions.create(**request)`. This module is that client, and no more.

Why our own, not the openai SDK (kept for LiteLLM, which uses it internally): measured on this
project's runs, importing the SDK and its chat resources took about 1 s of a 2.5 s start-up before
the first model call (`benchmarks/bench_startup.py`), and on very wide runs about three quarters of
the client's GIL time per call was the SDK's request building and pydantic validation of the reply
(a profile at 32 workers on the oracle server), time every worker thread waits for. A chat
completion is one POST of JSON and one JSON reply; what the SDK adds beyond that (typed replies,
its own retries, streaming helpers) is unused here, since retries, rate limits and the breaker are
ours (`amapreduce.llm.models.ManagedModel`).

Errors keep the SDK's vocabulary where the rest of the model layer and users read it: an HTTP error
reply raises a `ProviderHTTPError` named as the SDK names it (`RateLimitError`, `InternalServerError`,
`AuthenticationError`, ...) with `status_code`, `response` (its `Retry-After`), `body` (the
provider's error object) and `code`; a connection that fails raises `ProviderConnectionError` (a
`ConnectionError`) and a timeout `ProviderTimeout` (a `TimeoutError`), each raised from httpx's
own error, so the request's host and the low-level cause stay in the chain
(`amapreduce.llm.breaker.unreachable`).

A plain-`http://` endpoint that no proxy applies to (local servers) is sent to through the standard
library's `http.client` instead, a keep-alive connection per thread (`amapreduce.llm.plain_http`:
about half of httpx's CPU per call); `https://` and proxied endpoints keep httpx.

With a `hedger` (`amapreduce.llm.hedge`; a managed model installs one), a request that runs late
gets a hedged copy (and a second if that runs late too); the first valid reply wins, the others are cancelled.
"""

from __future__ import annotations

import functools
import http.client
import json
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from typing import Any
from urllib.parse import urlsplit

import httpx

from amapreduce._version import __version__
from amapreduce.llm.dialect import Adapter, adapt_reply, adapt_request
from amapreduce.llm.hedge import CancelToken, Hedger, RequestCancelled
from amapreduce.llm.plain_http import PlainPoster, plain_http_usable
from amapreduce.llm.scope import in_flight
from amapreduce.llm.transport import cancellable, chat_http_client

__all__ = ["AuthenticationError", "BadRequestError", "ChatCompletionsClient", "InternalServerError", "NotFoundError",
           "PermissionDeniedError", "ProviderConnectionError", "ProviderHTTPError", "ProviderTimeout", "RateLimitError",
           "Reply", "UnprocessableEntityError", "http_error"]

CONNECT_TIMEOUT_S = 5.0
"""Seconds to open a connection (the openai SDK's default too)."""
DEFAULT_TIMEOUT_S = 600.0
"""Seconds for a whole call when the model's settings give none (the openai SDK's default)."""


class ProviderHTTPError(Exception):
    """The endpoint answered with an HTTP error status.

    Attributes:
        status_code: the HTTP status.
        response: the `httpx.Response` (its headers carry `Retry-After`).
        body: the provider's error object (`{"message": ..., "code": ...}`), else the reply's JSON or text.
        code: the provider's structured error code (`context_length_exceeded`, ...), or None.
    """

    def __init__(self, response: httpx.Response) -> None:
        self.status_code = response.status_code
        self.response = response
        self.request = response.request
        try:
            parsed: Any = response.json()
        except ValueError:
            parsed = response.text
        error = parsed.get("error") if isinstance(parsed, Mapping) else None
        self.body: Any = error if isinstance(error, Mapping) else parsed
        code = self.body.get("code") if isinstance(self.body, Mapping) else None
        self.code: str | None = code if isinstance(code, str) else None
        message = self.body.get("message") if isinstance(self.body, Mapping) else None
        self.message = message if isinstance(message, str) and message else str(parsed)[:2000]
        super().__init__(f"Error code: {self.status_code} - {self.message}")


class BadRequestError(ProviderHTTPError):
    """HTTP 400."""


class AuthenticationError(ProviderHTTPError):
    """HTTP 401."""


class PermissionDeniedError(ProviderHTTPError):
    """HTTP 403."""


class NotFoundError(ProviderHTTPError):
    """HTTP 404."""


class UnprocessableEntityError(ProviderHTTPError):
    """HTTP 422."""


class RateLimitError(ProviderHTTPError):
    """HTTP 429."""


class InternalServerError(ProviderHTTPError):
    """HTTP 5xx."""


_BY_STATUS: dict[int, type[ProviderHTTPError]] = {
    400: BadRequestError, 401: AuthenticationError, 403: PermissionDeniedError, 404: NotFoundError,
    422: UnprocessableEntityError, 429: RateLimitError}


def http_error(response: httpx.Response) -> ProviderHTTPError:
    """The error of an HTTP error reply, its class named as the openai SDK names it (what users and
    the error messages know: `RateLimitError`, `InternalServerError`, ...)."""
    if response.status_code >= 500:
        return InternalServerError(response)
    return _BY_STATUS.get(response.status_code, ProviderHTTPError)(response)


class ProviderConnectionError(ConnectionError):
    """The request could not be sent or its reply not read (refused, DNS, TLS, proxy, reset)."""

    def __init__(self, message: str, *, request: httpx.Request | None) -> None:
        super().__init__(message)
        self.request = request


class ProviderTimeout(TimeoutError):
    """The connection or the reply took longer than the timeout."""

    def __init__(self, message: str, *, request: httpx.Request | None) -> None:
        super().__init__(message)
        self.request = request


class Reply:
    """A JSON object of the reply, read by attribute as smolagents reads the SDK's typed replies:
    `reply.choices[0].message.tool_calls`. A field the reply lacks reads None (the SDK's optional
    fields do the same); `model_dump()` gives the JSON object back."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = data

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return _wrapped(self._data.get(name))

    def model_dump(self, **_: Any) -> dict[str, Any]:
        """The JSON object (smolagents turns a tool call into its own type from it)."""
        return dict(self._data)

    def __repr__(self) -> str:
        return f"Reply({json.dumps(self._data, ensure_ascii=False)[:200]})"


def _wrapped(value: Any) -> Any:
    if isinstance(value, Mapping):
        return Reply(value)
    if isinstance(value, list):
        return [_wrapped(item) for item in value]
    return value


def _request_of(exc: httpx.TransportError) -> httpx.Request | None:
    try:
        return exc.request
    except RuntimeError:  # httpx: an error raised outside a request has none
        return None


def _request_text(request: httpx.Request | None) -> str:
    return f" ({request.method} {request.url})" if request is not None else ""


def _parsed(body: bytes, request: httpx.Request) -> Reply:
    """A successful reply's JSON object (an HTTP 502 error when the body is not one)."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        text = body[:200].decode("utf-8", "replace")
        raise http_error(httpx.Response(502, text=f"the reply is not JSON: {text!r}", request=request)) from exc
    if not isinstance(data, Mapping):
        raise http_error(httpx.Response(502, text=f"the reply is not a JSON object: {str(data)[:200]}",
                                        request=request))
    return Reply(data)


class _Completions:
    def __init__(self, client: ChatCompletionsClient) -> None:
        self._client = client

    def create(self, **request: Any) -> Reply:
        """POST the chat-completions request (keys as the OpenAI API names them) and return the reply.

        Raises:
            ProviderHTTPError: the endpoint answered with an error status.
            ProviderConnectionError: the request could not be sent or the reply not read.
            ProviderTimeout: the connection or the reply timed out.
        """
        client = self._client
        payload = adapt_request(client.adapters, {k: v for k, v in request.items() if v is not None})
        reply = client.post("chat/completions", payload)
        return Reply(adapt_reply(client.adapters, reply.model_dump())) if client.adapters else reply


class _Chat:
    def __init__(self, client: ChatCompletionsClient) -> None:
        self.completions = _Completions(client)


class ChatCompletionsClient:
    """An OpenAI-compatible endpoint's client: `client.chat.completions.create(**request)`.

    Args:
        base_url: the endpoint's base URL, e.g. `http://127.0.0.1:8000/v1`.
        api_key: sent as `Authorization: Bearer ...` (servers that take none ignore it).
        timeout_s: seconds for a whole call (connecting: at most `CONNECT_TIMEOUT_S`); default 600.
        http_client: the httpx client to send with; default `chat_http_client()` (no delayed-ACK
            stall, the environment's proxies).
        adapters: fit each request to the endpoint's dialect, and its reply back (`llm.dialect`,
            chosen from the endpoint's probed capabilities by `llm.dialect.adapters_for`).
    """

    def __init__(self, *, base_url: str, api_key: str, timeout_s: float | None = None,
                 http_client: httpx.Client | None = None, adapters: Sequence[Adapter] = ()) -> None:
        self.adapters = tuple(adapters)
        self.base_url = base_url.rstrip("/") + "/"
        total = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
        self._timeout = httpx.Timeout(total, connect=min(CONNECT_TIMEOUT_S, total))
        self._headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
                         "Accept": "application/json", "User-Agent": f"amapreduce/{__version__}"}
        self._http = http_client or chat_http_client()
        self._plain = (PlainPoster(self.base_url, connect_timeout_s=min(CONNECT_TIMEOUT_S, total), read_timeout_s=total)
                       if http_client is None and plain_http_usable(self.base_url) else None)
        """The lean path for a plain-HTTP endpoint no proxy applies to (`llm.plain_http`)."""
        self._path = urlsplit(self.base_url).path
        self.chat = _Chat(self)
        self.hedger: Hedger | None = None
        """Hedges late requests (`llm.hedge`); None: each request is sent once."""

    def post(self, path: str, payload: Mapping[str, Any]) -> Reply:
        """POST `payload` as JSON to `base_url + path` and return the reply's JSON object (with a
        `hedger`, the first valid reply of the request and its hedge, when it ran late)."""
        content = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        hedger = self.hedger
        if hedger is None:
            return self._dropped_with_its_attempt(path, content, CancelToken())
        messages = payload.get("messages")
        return hedger.race(functools.partial(self._dropped_with_its_attempt, path, content),
                           shape=len(messages) if isinstance(messages, list) else 0, request_bytes=len(content))

    def _dropped_with_its_attempt(self, path: str, content: bytes, token: CancelToken) -> Reply:
        """`_send`, the request given up when the work that sent it is (`llm.scope.in_flight`: an
        attempt the engine abandons at its deadline shuts its socket, so the server sees the
        connection close and may stop computing a reply nobody reads)."""
        with in_flight(token.cancel):
            return self._send(path, content, token)

    def _send(self, path: str, content: bytes, token: CancelToken | None) -> Reply:
        """Send one request; `token` may cancel it from another thread (`RequestCancelled`)."""
        if self._plain is not None:
            reply = self._send_plain(path, content, token)
            if reply is not None:
                return reply
        try:
            with cancellable(token) if token is not None else nullcontext():
                response = self._http.post(self.base_url + path, content=content, headers=self._headers,
                                           timeout=self._timeout)
        except httpx.TransportError as exc:
            if token is not None and token.cancelled:
                raise RequestCancelled(f"cancelled{_request_text(_request_of(exc))}: another copy answered, or its "
                                       "attempt was given up") from exc
            raise self._transport_error(exc) from exc
        if response.status_code >= 400:
            raise http_error(response)
        return _parsed(response.content, response.request)

    def _send_plain(self, path: str, content: bytes, token: CancelToken | None) -> Reply | None:
        """`_send` on the lean path (`llm.plain_http`); None for a redirect, which httpx follows."""
        assert self._plain is not None  # noqa: S101 - the caller checked
        try:
            status, headers, body = self._plain.post(self._path + path, content, self._headers, token)
        except (OSError, http.client.HTTPException) as exc:
            request = httpx.Request("POST", self.base_url + path)
            if token is not None and token.cancelled:
                raise RequestCancelled(f"cancelled{_request_text(request)}: another copy answered, or its attempt "
                                       "was given up") from exc
            if isinstance(exc, TimeoutError):
                raise ProviderTimeout(f"Request timed out{_request_text(request)}.", request=request) from exc
            raise ProviderConnectionError(f"Connection error{_request_text(request)}: {exc}", request=request) from exc
        if 300 <= status < 400:
            return None
        request = httpx.Request("POST", self.base_url + path)
        if status >= 400:
            raise http_error(httpx.Response(status, headers=headers, content=body, request=request))
        return _parsed(body, request)

    @staticmethod
    def _transport_error(exc: httpx.TransportError) -> ProviderTimeout | ProviderConnectionError:
        request = _request_of(exc)
        if isinstance(exc, httpx.TimeoutException):
            return ProviderTimeout(f"Request timed out{_request_text(request)}.", request=request)
        return ProviderConnectionError(f"Connection error{_request_text(request)}: {exc}", request=request)

    def close(self) -> None:
        """Close the connections."""
        self._http.close()
        if self._plain is not None:
            self._plain.close()
