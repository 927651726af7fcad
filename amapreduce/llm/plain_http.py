"""A lean POST for plain-HTTP endpoints (`--api-base http://...`): `http.client`, one keep-alive
connection per thread.

Why: a wide fan-out's model calls all go through the one client, and in one process every CPU
cycle of it is GIL time the other workers wait for. Measured on the oracle server (a 3 KB chat
request, loopback): httpx's client took about 0.6-0.7 ms of CPU per call, `http.client` about
0.2 ms; at 32 workers the HTTP client was about 40 % of the run's GIL time (a `py-spy --gil`
profile), and a burst of replies is processed one at a time. So requests to an `http://`
endpoint that no proxy applies to (local servers: vLLM, llama.cpp, Ollama, the oracle) go
through this path; `https://` and proxied endpoints keep httpx (`llm.transport`), whose TLS
settings and proxy support they need.

As the quick-ACK transport does, it asks the kernel to acknowledge at once (`TCP_QUICKACK`)
before it reads the reply and its body, and it sends the request in one write with `TCP_NODELAY`.
A connection the server closed while idle is replaced and the request sent again once (nothing
of a reply was read). A `CancelToken` (`llm.hedge`) gets the connection's socket while the
request is in flight, so a hedged call can cut the loser short.
"""

from __future__ import annotations

import http.client
import socket
import threading
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from amapreduce.llm.hedge import CancelToken
from amapreduce.llm.transport import QUICKACK

__all__ = ["PlainPoster", "plain_http_usable"]

_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)
"""What a keep-alive connection the server closed while idle raises on its next request."""


def plain_http_usable(base_url: str) -> bool:
    """Whether requests to `base_url` may take this path: plain `http://`, no proxy for its host."""
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        return False
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get("http") or proxies.get("all")
    return not proxy or bool(urllib.request.proxy_bypass(parts.hostname))


class _Connection(http.client.HTTPConnection):
    """An `http.client` connection that keeps the reply it last began to read.

    Why: `getresponse` makes the reply's reader from the socket before the headers arrive, and a
    read that fails (a timeout, a reset, a hedge cutting the request short) leaves that reader
    open, holding the socket's file descriptor after the connection closed the socket. When the
    exception is kept (a hedge's loser, a retry's last error), the two sit in a reference cycle
    and the garbage collector finalises the socket first: CPython reports an unclosed socket, and
    the descriptor stays open until then. `PlainPoster._drop` closes the reply too."""

    reply: http.client.HTTPResponse | None = None

    def response_class(self, sock: socket.socket, *args: Any, **kwargs: Any) -> http.client.HTTPResponse:  # type: ignore[override]
        self.reply = http.client.HTTPResponse(sock, *args, **kwargs)
        return self.reply


class PlainPoster:
    """POSTs to one `http://host:port` on a keep-alive connection per thread.

    Args:
        base_url: the endpoint (`http://127.0.0.1:8000/v1`).
        connect_timeout_s: seconds to open a connection.
        read_timeout_s: seconds any one send or read may block.
    """

    def __init__(self, base_url: str, *, connect_timeout_s: float, read_timeout_s: float) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self._connect_timeout = connect_timeout_s
        self._read_timeout = read_timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[_Connection] = set()

    def _connection(self) -> tuple[_Connection, bool]:
        conn: _Connection | None = getattr(self._local, "conn", None)
        if conn is not None and conn.sock is not None:
            return conn, False
        conn = _Connection(self.host, self.port, timeout=self._connect_timeout)
        conn.connect()
        sock = conn.sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self._read_timeout)
        self._local.conn = conn
        with self._lock:
            self._open.add(conn)
        return conn, True

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        if conn.reply is not None:
            conn.reply.close()  # see `_Connection`
            conn.reply = None
        self._local.conn = None
        with self._lock:
            self._open.discard(conn)

    def post(self, path: str, content: bytes, headers: dict[str, str],
             token: CancelToken | None = None) -> tuple[int, list[tuple[str, str]], bytes]:
        """POST `content` to `path` (the URL's path, `/v1/chat/completions`); return the reply's
        status, headers and body.

        Raises:
            TimeoutError: connecting or a read took longer than its timeout.
            OSError, http.client.HTTPException: the request could not be sent or its reply read.
        """
        try:
            for attempt in (1, 2):
                conn, fresh = self._connection()
                sock = conn.sock
                if token is not None:
                    token.attach(sock)
                try:
                    conn.request("POST", path, body=content, headers=headers)
                    quick_ack(sock)
                    response = conn.getresponse()
                    quick_ack(sock)
                    body = response.read()
                except _STALE:
                    self._drop(conn)
                    if fresh or attempt == 2 or (token is not None and token.cancelled):
                        raise
                    continue  # the server closed the idle connection: once more on a new one
                except BaseException:
                    self._drop(conn)
                    raise
                if response.will_close:
                    self._drop(conn)
                return response.status, response.getheaders(), body
        finally:
            if token is not None:
                token.detach()
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def close(self) -> None:
        """Close every connection this poster opened."""
        with self._lock:
            conns, self._open = list(self._open), set()
        for conn in conns:
            conn.close()


def quick_ack(sock: socket.socket | None) -> None:
    """Ask for an immediate acknowledgement of what arrives next (Linux; elsewhere nothing)."""
    if sock is not None and QUICKACK is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
        except OSError:
            pass
