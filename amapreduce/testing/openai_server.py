"""An OpenAI-compatible chat server on 127.0.0.1, answered by a simulated model.

It lets tests (and anyone curious) run the *real* client path — smolagents' `OpenAIModel`, our
`ManagedModel`, HTTP, JSON tool calls — with replies decided by a Python function instead of an
LLM. It serves `POST /v1/chat/completions` and `GET /v1/models`, can answer the first requests
with `429` and a `Retry-After` header, can require an API key and refuse any other with `401`
echoing the key it was sent (as OpenAI's "Incorrect API key provided: sk-..." does), can refuse
unknown model ids with `404`, and only ever binds to loopback.

Example:
    >>> from amapreduce.testing.scripted import FunctionModel
    >>> with OpenAICompatibleServer(FunctionModel(lambda m, i: "hi")) as server:
    ...     server.base_url.startswith("http://127.0.0.1:")
    True
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace, TracebackType
from typing import Any

from smolagents.models import ChatMessage, MessageRole, Model

from amapreduce.llm.endpoint import SIMULATED_SERVER

__all__ = ["OpenAICompatibleServer"]

_ROLES = {
    "system": MessageRole.SYSTEM,
    "user": MessageRole.USER,
    "assistant": MessageRole.ASSISTANT,
    "tool": MessageRole.TOOL_RESPONSE,
}


def _to_messages(raw: list[dict[str, Any]]) -> list[ChatMessage]:
    out = []
    for m in raw:
        content = m.get("content")
        if m.get("tool_calls"):
            calls = "\n".join(json.dumps(c.get("function", {})) for c in m["tool_calls"])
            content = f"{content or ''}\nCalling tools:\n{calls}".strip()
        out.append(ChatMessage(role=_ROLES.get(m.get("role", "user"), MessageRole.USER), content=content))
    return out


def _to_response(message: ChatMessage, model: str) -> dict[str, Any]:
    calls = [
        {
            "id": c.id,
            "type": "function",
            "function": {
                "name": c.function.name,
                "arguments": c.function.arguments if isinstance(c.function.arguments, str) else json.dumps(c.function.arguments),
            },
        }
        for c in message.tool_calls or []
    ]
    usage = message.token_usage
    prompt, completion = (usage.input_tokens, usage.output_tokens) if usage else (0, 0)
    content = message.content if isinstance(message.content, str) or message.content is None else json.dumps(message.content)
    return {
        "id": f"chatcmpl-{time.time_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})},
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def _incorrect_key(sent: str) -> dict[str, Any]:
    """OpenAI's reply to a wrong key: the message repeats the key (OpenAI shows most of it)."""
    return {
        "error": {
            "message": f"Incorrect API key provided: {sent}. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            "type": "invalid_request_error", "param": None, "code": "invalid_api_key",
        }
    }


class OpenAICompatibleServer:
    """A loopback chat-completions server backed by `model` (usually a simulated one).

    Args:
        model: decides every reply (its `generate` sees the request's messages and tools).
        rate_limit_first: answer this many first requests with 429 and `Retry-After`.
        retry_after_s: the `Retry-After` value sent with those 429s.
        latency_s: sleep this long before each reply (a slow provider).
        port: the loopback port (0: any free port).
        keep_requests: keep every request body in `requests` (tests read them); a long-lived server
            (`amapreduce demo --serve`) keeps only the count.
        api_key: the only key accepted (None: any); a request carrying another is answered `401`
            with OpenAI's error body, whose message repeats the key it was sent, so tests can check
            that a key a provider echoes is never stored or sent on.
        models: the model ids served (None: any); a request for another is answered `404`
            `model_not_found`, as OpenAI answers a mistyped `--model`.
    """

    def __init__(self, model: Model, *, rate_limit_first: int = 0, retry_after_s: float = 1.0, latency_s: float = 0.0,
                 port: int = 0, keep_requests: bool = True, api_key: str | None = None,
                 models: tuple[str, ...] | None = None) -> None:
        self.model = model
        self.api_key = api_key
        self.models = models
        self.rate_limit_first = rate_limit_first
        self.retry_after_s = retry_after_s
        self.latency_s = latency_s
        self.requests: list[dict[str, Any]] = []
        self.authorization: list[str | None] = []
        self.keep_requests = keep_requests
        self.request_count = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="openai-compatible-server", daemon=True)

    @property
    def base_url(self) -> str:
        """The `api_base` to give a client, e.g. `http://127.0.0.1:54321/v1`."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> OpenAICompatibleServer:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            # `http.server` writes a reply's headers and body in two sends; with Nagle's algorithm on,
            # the body waits for the client's delayed ACK (~40 ms a call), which no real server adds.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                return

            def _send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": server.model.model_id, "object": "model",
                                                                "owned_by": SIMULATED_SERVER}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                with server._lock:
                    server.request_count += 1
                    count = server.request_count
                    if server.keep_requests:
                        server.requests.append(body)
                        server.authorization.append(self.headers.get("Authorization"))
                sent = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                if server.api_key is not None and sent != server.api_key:
                    self._send(401, _incorrect_key(sent))
                    return
                asked = str(body.get("model"))
                if server.models is not None and asked not in server.models:
                    self._send(404, {"error": {"message": f"The model `{asked}` does not exist or you do not have access to it.",
                                               "type": "invalid_request_error", "param": None, "code": "model_not_found"}})
                    return
                if count <= server.rate_limit_first:
                    self._send(
                        429,
                        {"error": {"message": "rate limited (simulated)", "type": "rate_limit_error"}},
                        {"Retry-After": str(server.retry_after_s)},
                    )
                    return
                if server.latency_s:
                    time.sleep(server.latency_s)
                tools = [SimpleNamespace(name=t.get("function", {}).get("name")) for t in body.get("tools") or []]
                try:
                    reply = server.model.generate(_to_messages(body.get("messages", [])), tools_to_call_from=tools)
                except Exception as exc:  # noqa: BLE001 - reported to the client as a server error
                    self._send(500, {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error"}})
                    return
                self._send(200, _to_response(reply, body.get("model", "simulated")))

        return Handler
