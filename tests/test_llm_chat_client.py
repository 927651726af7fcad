"""The `--api-base` client (`amapreduce.llm.chat_client`) against a real HTTP server on loopback:
what it sends, what smolagents reads from its replies, and how each failure is raised and
classified by the model layer (retried, refused for good, or unreachable)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from smolagents import OpenAIModel
from smolagents.models import ChatMessage, MessageRole

from amapreduce.llm.breaker import unreachable
from amapreduce.llm.chat_client import (
    BadRequestError,
    ChatCompletionsClient,
    InternalServerError,
    ProviderConnectionError,
    RateLimitError,
)
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.retry import classify, rejected_status

KEY = "sk-test-chat-client-0123456789"
TOOL_REPLY = {
    "id": "r1", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call-1", "type": "function", "function": {"name": "final_answer", "arguments": '{"answer": "Paris"}'}}]}}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
              "prompt_tokens_details": {"cached_tokens": 4}},
}


class Endpoint:
    """Answers each POST with the next scripted (status, headers, body) and keeps what it received."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, dict[str, str], bytes]] = []
        self.received: list[tuple[str, dict[str, str], dict[str, Any]]] = []


@pytest.fixture
def endpoint() -> Iterator[tuple[Endpoint, str]]:
    state = Endpoint()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.received.append((self.path, dict(self.headers), body))
            status, headers, content = state.replies.pop(0)
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def reply(status: int, body: Any, **headers: str) -> tuple[int, dict[str, str], bytes]:
    return status, headers, (body if isinstance(body, bytes) else json.dumps(body).encode())


def test_smolagents_reads_a_tool_call_reply_and_its_usage_through_the_client(endpoint: tuple[Endpoint, str]) -> None:
    state, base = endpoint
    state.replies.append(reply(200, TOOL_REPLY))
    model = OpenAIModel(model_id="m", client=ChatCompletionsClient(base_url=base, api_key=KEY), retry=False)
    with allow_model_requests():  # loopback only
        message = model.generate([ChatMessage(role=MessageRole.USER, content=[{"type": "text", "text": "Capital of France?"}])])
    assert message.tool_calls is not None and message.tool_calls[0].function.name == "final_answer"
    assert message.tool_calls[0].function.arguments == '{"answer": "Paris"}'
    assert message.token_usage is not None and (message.token_usage.input_tokens, message.token_usage.output_tokens) == (12, 3)
    assert message.raw.usage.prompt_tokens_details.cached_tokens == 4 and message.raw.system_fingerprint is None
    path, headers, body = state.received[0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == f"Bearer {KEY}"
    assert body["model"] == "m" and body["messages"][0]["role"] == "user"
    assert "Capital of France?" in json.dumps(body["messages"])


def test_a_429_is_a_rate_limit_with_the_servers_wait(endpoint: tuple[Endpoint, str]) -> None:
    state, base = endpoint
    state.replies.append(reply(429, {"error": {"message": "slow down", "type": "rate_limit_error"}}, **{"Retry-After": "2"}))
    with pytest.raises(RateLimitError) as caught:
        ChatCompletionsClient(base_url=base, api_key=KEY).chat.completions.create(model="m", messages=[])
    transient = classify(caught.value)
    assert transient is not None and transient.kind == "rate_limit" and transient.retry_after_s == 2
    assert caught.value.status_code == 429 and "slow down" in str(caught.value) and KEY not in str(caught.value)


def test_a_400_about_one_request_is_not_a_rejection_of_the_run(endpoint: tuple[Endpoint, str]) -> None:
    state, base = endpoint
    state.replies.append(reply(400, {"error": {"message": "too long", "code": "context_length_exceeded"}}))
    state.replies.append(reply(400, {"error": {"message": "unknown parameter", "code": "invalid_request"}}))
    client = ChatCompletionsClient(base_url=base, api_key=KEY)
    with pytest.raises(BadRequestError) as first:
        client.chat.completions.create(model="m", messages=[])
    with pytest.raises(BadRequestError) as second:
        client.chat.completions.create(model="m", messages=[])
    assert first.value.code == "context_length_exceeded" and rejected_status(first.value) is None
    assert rejected_status(second.value) == 400


def test_a_5xx_or_a_reply_that_is_not_json_is_a_server_error(endpoint: tuple[Endpoint, str]) -> None:
    state, base = endpoint
    state.replies.append(reply(503, b"upstream down"))
    state.replies.append(reply(200, b"<html>gateway</html>"))
    client = ChatCompletionsClient(base_url=base, api_key=KEY)
    for _ in range(2):
        with pytest.raises(InternalServerError) as caught:
            client.chat.completions.create(model="m", messages=[])
        transient = classify(caught.value)
        assert transient is not None and transient.kind == "server"


def test_a_closed_port_is_a_connection_error_that_names_the_host() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = ChatCompletionsClient(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY)
    with pytest.raises(ProviderConnectionError) as caught:
        client.chat.completions.create(model="m", messages=[])
    transient = classify(caught.value)
    assert transient is not None and transient.kind == "connection"
    error = unreachable(caught.value, what="subagent model 'm'", provider=f"never-answered-{port}")
    assert error is not None and f"127.0.0.1:{port}" in str(error) and "refused" in str(error)


@pytest.mark.parametrize("half", [False, True], ids=["before-the-headers", "mid-body"])
def test_a_failed_read_leaves_no_socket_open(half: bool) -> None:
    """`http.client` makes a reply's reader from the connection's socket before the headers arrive,
    and a read that fails leaves it open, holding the socket after the connection closed it. Kept
    in a reference cycle with its exception (as a hedge's loser or a retry's last error is), the
    socket is then finalised by the garbage collector, which CPython reports as an unclosed socket
    in whatever test runs then. The lean path closes the reply when a read fails."""
    import gc
    import warnings

    from amapreduce.llm.plain_http import PlainPoster

    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            if half:  # a `Connection: close` reply (HTTP/1.0) whose body stops coming
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{")
            done.wait(5)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    poster = PlainPoster(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", connect_timeout_s=5, read_timeout_s=0.3)

    def attempt(caught: list[BaseException]) -> None:
        try:
            poster.post("/v1/chat/completions", b"{}", {"Content-Type": "application/json"})
        except Exception as exc:  # noqa: BLE001 - kept, as a hedge keeps its loser's error
            caught.append(exc)  # exc -> traceback -> this frame -> caught -> exc: a cycle

    caught: list[BaseException] = []
    attempt(caught)
    done.set()
    server.join(5)
    listener.close()
    assert [type(e) for e in caught] == [TimeoutError]
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        del caught
        gc.collect()
        poster.close()
    assert not [str(w.message) for w in warned if issubclass(w.category, ResourceWarning)]
