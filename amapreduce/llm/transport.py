"""The HTTP client for OpenAI-compatible endpoints (`--api-base`): no delayed-ACK stall per call.

Why: a server that writes its response in two pieces (headers, then body) with Nagle's
algorithm on (Python's `http.server` does, and so do many small serving stacks) sends the
second piece only once the client has acknowledged the first, and Linux delays that
acknowledgement by up to 40 ms. Measured on the oracle server at 210 ms per call: 252 ms per
call with the default client, 211.8 ms with this one; across a 32-worker fan-out that stall was
the whole gap between the engine and the latency-bound ideal. The fix is the client's: ask the
kernel to acknowledge at once (`TCP_QUICKACK`) before each read. The option is not sticky (the
kernel may drop back to delayed ACKs), so it is set before every read, one `setsockopt` per
read, not once at connect time (which measured no gain).

How: httpx builds its connection pool on httpcore, whose pool takes a network backend; this
module wraps httpcore's own sync backend so each stream sets the option before reading. httpx's
`HTTPTransport` does not take a backend, so `QuickAckTransport` replaces its pool with the same
pool built on the wrapped backend. On systems without `TCP_QUICKACK` (macOS, Windows) the
client is httpx's plain one.

Proxies. httpx reads HTTP_PROXY / HTTPS_PROXY / ALL_PROXY / NO_PROXY only when it builds the
transport itself (`allow_env_proxies = trust_env and transport is None`), so a client given this
transport used to go direct behind a proxy. `chat_http_client` mounts the environment's proxies
itself, read by httpx's own helper (`httpx._utils.get_environment_proxies`, the map httpx's default
client builds): a proxied URL goes through an `httpx.HTTPTransport(proxy=...)` as with httpx's
default client, a direct one (NO_PROXY, or no proxy set) through the quick-ACK transport.

Cancelling. A request sent inside `cancellable(token)` attaches its socket to the token as it
writes and reads, so another thread can cancel it (`llm.hedge.CancelToken`: the socket is shut
down, the blocked read returns and the request fails at once; httpcore drops that connection).
A hedged call (`llm.hedge`) cancels the request that lost its race so. Requests through a proxy
transport never attach a socket, so they cannot be cancelled (and are not hedged).
"""

from __future__ import annotations

import functools
import socket
import ssl
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import httpcore
import httpx

if TYPE_CHECKING:
    from amapreduce.llm.hedge import CancelToken

__all__ = ["CONNECTION_LIMITS", "QUICKACK", "QuickAckBackend", "QuickAckStream", "QuickAckTransport",
           "cancellable", "chat_http_client", "environment_proxy_mounts", "shared_ssl_context"]

QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)
"""The socket option (Linux only); None where the system has none."""

_requests = threading.local()
"""The `CancelToken` of the request this thread is sending, if any (`cancellable`)."""


@contextmanager
def cancellable(token: CancelToken) -> Iterator[None]:
    """Send requests in this block so that `token.cancel()` from another thread cuts them short."""
    _requests.token = token
    try:
        yield
    finally:
        _requests.token = None
        token.detach()


class QuickAckStream(httpcore.NetworkStream):
    """A stream that asks for an immediate acknowledgement before each read."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream
        sock = stream.get_extra_info("socket")
        self._sock: socket.socket | None = sock if isinstance(sock, socket.socket) else None
        self._socket = self._sock
        """The socket a `CancelToken` shuts (kept when the option is refused)."""

    def _attach(self) -> None:
        token: CancelToken | None = getattr(_requests, "token", None)
        if token is not None and self._socket is not None:
            token.attach(self._socket)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._attach()
        if self._sock is not None and QUICKACK is not None:
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
            except OSError:  # a socket that refuses the option reads as it would have anyway
                self._sock = None
        return self._stream.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._attach()
        self._stream.write(buffer, timeout)

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return QuickAckStream(self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class QuickAckBackend(httpcore.NetworkBackend):
    """httpcore's sync backend whose TCP streams set `TCP_QUICKACK` before each read."""

    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return QuickAckStream(self._backend.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return self._backend.connect_unix_socket(path, timeout, socket_options)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class QuickAckTransport(httpx.HTTPTransport):
    """`httpx.HTTPTransport` (same arguments) whose connections use `QuickAckBackend`."""

    def __init__(self, *, limits: httpx.Limits, http2: bool = False) -> None:
        super().__init__(verify=shared_ssl_context(), limits=limits, http2=http2)
        pool: httpcore.ConnectionPool = self._pool
        self._pool = httpcore.ConnectionPool(
            ssl_context=pool._ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=True,
            http2=http2,
            network_backend=QuickAckBackend(),
        )
        pool.close()


@functools.lru_cache(maxsize=1)
def shared_ssl_context() -> ssl.SSLContext:
    """One verifying SSL context for every chat client of the process (httpx's default: certifi's
    CA bundle, or `SSL_CERT_FILE`/`SSL_CERT_DIR` as the process started): building one loads the CA
    certificates, about 30 ms, which every model built (two per Ray chunk, per evaluation trial)
    paid again."""
    return httpx.create_ssl_context()


CONNECTION_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
"""Connections to one endpoint: as many as a wide fan-out's workers (the openai SDK's defaults)."""


def chat_http_client() -> httpx.Client:
    """The httpx client for an OpenAI-compatible endpoint (`amapreduce.llm.chat_client`): connection
    limits for a wide fan-out, redirects followed, on a `QuickAckTransport` with the environment's
    proxies mounted; httpx's plain client (which reads the proxies itself) where the system has no
    `TCP_QUICKACK`."""
    if QUICKACK is None:
        return httpx.Client(limits=CONNECTION_LIMITS, follow_redirects=True)
    return httpx.Client(transport=QuickAckTransport(limits=CONNECTION_LIMITS),
                        mounts=environment_proxy_mounts(CONNECTION_LIMITS), follow_redirects=True)


def environment_proxy_mounts(limits: httpx.Limits) -> dict[str, httpx.BaseTransport | None]:
    """httpx's mounts for the environment's proxies, as its default client builds them: a proxy
    transport per proxied URL pattern, None (the client's own transport) for each NO_PROXY entry."""
    from httpx._utils import get_environment_proxies

    return {pattern: None if url is None else httpx.HTTPTransport(proxy=httpx.Proxy(url), limits=limits,
                                                                  verify=shared_ssl_context())
            for pattern, url in get_environment_proxies().items()}
