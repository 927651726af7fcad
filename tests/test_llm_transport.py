"""The HTTP client of OpenAI-compatible endpoints asks for immediate ACKs before every read, so a
server that writes a reply in two pieces costs no 40 ms delayed-ACK stall per call."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from typing import Any

import httpcore
import pytest
from smolagents.models import ChatMessage, MessageRole

from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.models import ModelSpec, build_model
from amapreduce.llm.transport import (
    QUICKACK,
    QuickAckBackend,
    QuickAckStream,
    QuickAckTransport,
    chat_http_client,
)

pytestmark = pytest.mark.skipif(QUICKACK is None, reason="TCP_QUICKACK is Linux-only; elsewhere the client is httpx's own")


class _SpySocket(socket.socket):
    """A real TCP socket that records the options set on it."""

    calls: list[tuple[int, int, int]]

    def setsockopt(self, level: int, option: int, value: Any, *rest: Any) -> None:  # type: ignore[override]
        self.calls.append((level, option, value))
        super().setsockopt(level, option, value, *rest)


class _FakeStream(httpcore.NetworkStream):
    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.reads = sock, 0

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self.reads += 1
        return b"chunk"

    def get_extra_info(self, info: str) -> Any:
        return self.sock if info == "socket" else None


def test_every_read_is_preceded_by_a_quickack_request() -> None:
    with _SpySocket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.calls = []
        inner = _FakeStream(sock)
        stream = QuickAckStream(inner)
        assert [stream.read(10), stream.read(10), stream.read(10)] == [b"chunk"] * 3
        assert inner.reads == 3
        assert sock.calls == [(socket.IPPROTO_TCP, QUICKACK, 1)] * 3  # before each read, not once at connect


class _TwoPieceHandler(BaseHTTPRequestHandler):
    """Writes the status line and headers, then the body, in separate sends (as `http.server` does)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def two_piece_server() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _TwoPieceHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_chat_client_talks_through_quickack_connections(two_piece_server: str) -> None:
    with chat_http_client() as client:
        assert isinstance(client._transport, QuickAckTransport)
        assert isinstance(client._transport._pool._network_backend, QuickAckBackend)
        for _ in range(3):  # one kept-alive connection, several replies
            assert client.post(two_piece_server + "/v1/chat/completions", json={}).json() == {"ok": True}


def test_models_on_an_api_base_use_it() -> None:
    model = build_model(ModelSpec(model_id="m", api_base="http://127.0.0.1:9/v1"), role="subagent", meter=UsageMeter())
    assert isinstance(model.inner.client._http._transport, QuickAckTransport)


class _ForwardProxy(BaseHTTPRequestHandler):
    """A plain-HTTP forward proxy: takes `POST http://host:port/path` (absolute form), records it,
    and forwards it to that server."""

    seen: list[str]

    def do_POST(self) -> None:  # noqa: N802 - http.server's handler name
        import http.client
        from urllib.parse import urlsplit

        self.seen.append(self.path)
        target = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        upstream = http.client.HTTPConnection(target.hostname or "", target.port or 80, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in {"host", "proxy-connection", "connection"}}
        upstream.request("POST", target.path, body=body, headers=headers)
        reply = upstream.getresponse()
        data = reply.read()
        self.send_response(reply.status)
        for key, value in reply.getheaders():
            if key.lower() not in {"transfer-encoding", "connection", "content-length"}:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        upstream.close()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def forward_proxy() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Handler", (_ForwardProxy,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("no_proxy", [None, "127.0.0.1"])
def test_an_api_base_model_goes_through_the_environments_proxy(
    no_proxy: str | None, forward_proxy: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the OpenAI SDK's default client would: HTTP_PROXY is used unless NO_PROXY covers the host."""
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.testing.openai_server import OpenAICompatibleServer
    from amapreduce.testing.scripted import FunctionModel, final_answer

    proxy, seen = forward_proxy
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy)
    if no_proxy is not None:
        monkeypatch.setenv("NO_PROXY", no_proxy)
    sim = FunctionModel(lambda messages, info: final_answer("pong"), model_id="m")
    with OpenAICompatibleServer(sim) as server, allow_model_requests():
        model = build_model(ModelSpec(model_id="m", api_base=server.base_url), role="subagent", meter=UsageMeter())
        reply = model.generate([ChatMessage(role=MessageRole.USER, content="ping")])
        assert server.request_count == 1 and "pong" in str(reply.tool_calls or reply.content)
    target = f"{server.base_url}/chat/completions"
    assert seen == ([] if no_proxy else [target])
