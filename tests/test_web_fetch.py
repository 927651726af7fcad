"""fetch/crawl against real HTTP servers on 127.0.0.1: redirects, caps, timeouts, content types.

`LocalServer` is reused by the other web test modules (imported as `test_web_fetch`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from amapreduce.web.fetch import FetchFailed, FetchLimits, fetch
from amapreduce.web.policy import UrlPolicy, UrlRefused

Route = Callable[[BaseHTTPRequestHandler], None]


class _QuietServer(ThreadingHTTPServer):
    """Clients that give up mid-response (timeouts under test) are expected, not errors."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LocalServer:
    """A threaded HTTP server on 127.0.0.1 whose paths are answered by Python functions.

    Each request is recorded as (method, path, headers, body) in `requests`.
    """

    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                server.requests.append((self.command, self.path, dict(self.headers), body))
                route = server.routes.get(self.path.split("?", 1)[0])
                if route is None:
                    self.send_response(404)
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()
                    self.wfile.write(b"not found")
                    return
                route(self)

            do_GET = _handle  # noqa: N815
            do_POST = _handle  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> LocalServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def send(status: int = 200, body: bytes | str = b"", content_type: str = "text/html; charset=utf-8",
         headers: dict[str, str] | None = None) -> Route:
    """A route answering with a fixed response."""
    data = body.encode() if isinstance(body, str) else body

    def route(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        if content_type:
            h.send_header("Content-Type", content_type)
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    return route


def send_json(payload: Any, status: int = 200) -> Route:
    return send(status, json.dumps(payload), "application/json")


def redirect(location: str, status: int = 302) -> Route:
    return send(status, b"", "text/plain", {"Location": location})


ARTICLE = (
    "<html><head><title>Local Test Page</title></head><body><nav>Menu | Login</nav><article>"
    "<h1>Kingdom of Testland</h1><p>Testland is a small kingdom. Its capital is Probe City and it is known "
    "for its careful engineers and long winters.</p>"
    "<table><tr><th>Capital</th><td>Probe City</td></tr><tr><th>Population</th><td>1,234,567</td></tr></table>"
    "</article><footer>Copyright Testland Press</footer></body></html>"
)
PRIVATE = UrlPolicy(allow_private_urls=True)


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with LocalServer({"/page": send(body=ARTICLE)}) as srv:
        yield srv


def test_fetch_html_with_private_urls_allowed(server: LocalServer) -> None:
    got = fetch(server.url + "/page", PRIVATE)
    assert got.status == 200
    assert got.content_type == "text/html"
    assert b"Probe City" in got.body
    assert got.final_url == server.url + "/page"


def test_default_policy_blocks_the_local_server(server: LocalServer) -> None:
    with pytest.raises(UrlRefused, match="loopback"):
        fetch(server.url + "/page", UrlPolicy())
    assert server.requests == []  # refused before any request was sent


def test_redirect_is_followed_and_every_hop_checked(server: LocalServer) -> None:
    server.routes["/r1"] = redirect("/r2")
    server.routes["/r2"] = redirect(server.url + "/page", 301)
    got = fetch(server.url + "/r1", PRIVATE)
    assert got.final_url == server.url + "/page"
    assert [r[1] for r in server.requests] == ["/r1", "/r2", "/page"]


@pytest.mark.parametrize("target", [
    "http://169.254.169.254/latest/meta-data/",
    "http://[::ffff:169.254.169.254]/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://[fd00:ec2::254]/",
])
def test_redirect_to_cloud_metadata_is_refused_even_with_private_urls(server: LocalServer, target: str) -> None:
    server.routes["/evil"] = redirect(target)
    with pytest.raises(UrlRefused, match="metadata"):
        fetch(server.url + "/evil", PRIVATE)
    assert [r[1] for r in server.requests] == ["/evil"]


@pytest.mark.parametrize("target", [
    "http://127.0.0.1:1/", "http://0x7f000001/", "http://2130706433/", "http://127.1/", "http://[::1]/",
    "http://[::ffff:127.0.0.1]/", "http://10.0.0.5/", "http://192.168.1.1/", "http://localhost/",
    "http://100.64.0.1/", "http://[fe80::1]/", "file:///etc/passwd", "gopher://127.0.0.1/",
])
def test_redirect_from_a_public_host_to_private_targets_is_refused(target: str) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(302, headers={"Location": target})

    with pytest.raises(UrlRefused):
        fetch("http://public.example/start", UrlPolicy(), resolver=lambda host, port: ["93.184.216.34"],
              transport=httpx.MockTransport(handler))
    assert seen == ["http://public.example/start"]


def test_dns_name_resolving_to_private_address_is_refused() -> None:
    with pytest.raises(UrlRefused, match="private"):
        fetch("http://intranet.example/", UrlPolicy(), resolver=lambda host, port: ["93.184.216.34", "10.1.2.3"])


def test_redirect_limit(server: LocalServer) -> None:
    server.routes["/loop"] = redirect("/loop")
    with pytest.raises(FetchFailed, match="too many redirects"):
        fetch(server.url + "/loop", PRIVATE, FetchLimits(max_redirects=3))
    assert len(server.requests) == 4


def test_oversize_by_content_length(server: LocalServer) -> None:
    server.routes["/big"] = send(body=b"<html>" + b"x" * 5000 + b"</html>")
    with pytest.raises(FetchFailed, match="too large"):
        fetch(server.url + "/big", PRIVATE, FetchLimits(max_bytes=1000))


def test_oversize_without_content_length_is_cut_while_streaming(server: LocalServer) -> None:
    def chunked(h: Any) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/html")
        h.end_headers()
        for _ in range(50):
            h.wfile.write(b"<p>" + b"y" * 1000 + b"</p>")
        h.close_connection = True

    server.routes["/stream"] = chunked
    with pytest.raises(FetchFailed, match="too large"):
        fetch(server.url + "/stream", PRIVATE, FetchLimits(max_bytes=10_000))


def test_slow_page_times_out(server: LocalServer) -> None:
    release = threading.Event()

    def slow(h: Any) -> None:
        release.wait(5)
        send(body=ARTICLE)(h)

    server.routes["/slow"] = slow
    try:
        with pytest.raises(FetchFailed, match="timed out"):
            fetch(server.url + "/slow", PRIVATE, FetchLimits(read_timeout_s=0.2))
    finally:
        release.set()


def test_trickling_page_hits_the_total_deadline(server: LocalServer) -> None:
    def trickle(h: Any) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/html")
        h.end_headers()
        for _ in range(40):
            h.wfile.write(b"<p>z</p>")
            h.wfile.flush()
            time.sleep(0.05)
        h.close_connection = True

    server.routes["/trickle"] = trickle
    with pytest.raises(FetchFailed, match="in total"):
        fetch(server.url + "/trickle", PRIVATE, FetchLimits(read_timeout_s=1.0, total_timeout_s=0.3))


@pytest.mark.parametrize("content_type", ["application/pdf", "image/png", "application/octet-stream"])
def test_non_html_content_is_refused(server: LocalServer, content_type: str) -> None:
    server.routes["/bin"] = send(body=b"%PDF-1.4 binary", content_type=content_type)
    with pytest.raises(FetchFailed, match="not HTML or text"):
        fetch(server.url + "/bin", PRIVATE)


def test_missing_content_type_is_sniffed(server: LocalServer) -> None:
    server.routes["/bare"] = send(body="<!DOCTYPE html><html><body><p>hi</p></body></html>", content_type="")
    assert fetch(server.url + "/bare", PRIVATE).content_type == "text/html"


def test_http_error_status(server: LocalServer) -> None:
    with pytest.raises(FetchFailed, match="HTTP 404") as info:
        fetch(server.url + "/missing", PRIVATE)
    assert info.value.status == 404


def test_closed_port_is_a_clear_error() -> None:
    with LocalServer({}) as srv:
        url = srv.url
    with pytest.raises(FetchFailed, match="could not fetch"):
        fetch(url + "/", PRIVATE, FetchLimits(connect_timeout_s=1.0))


def test_connection_is_pinned_to_the_checked_address(server: LocalServer) -> None:
    # `rebind.invalid` cannot resolve through real DNS: the fetch only works because the socket
    # goes to the address the policy checked (127.0.0.1), never to a second resolution.
    port = server.url.rsplit(":", 1)[1]
    got = fetch(f"http://rebind.invalid:{port}/page", PRIVATE, resolver=lambda host, p: ["127.0.0.1"])
    assert b"Probe City" in got.body
    assert server.requests[0][2]["Host"] == f"rebind.invalid:{port}"


def test_pinned_addresses_are_tried_in_order(server: LocalServer) -> None:
    # The server listens on 127.0.0.1 only, so ::1 refuses and the next checked address is used.
    port = server.url.rsplit(":", 1)[1]
    got = fetch(f"http://multi.invalid:{port}/page", PRIVATE, resolver=lambda host, p: ["::1", "127.0.0.1"])
    assert got.status == 200
    with pytest.raises(FetchFailed, match="could not fetch"):
        fetch(f"http://multi.invalid:{port}/page", PRIVATE, resolver=lambda host, p: ["::1"])


def test_every_hop_is_recorded_with_its_checked_addresses(server: LocalServer) -> None:
    server.routes["/r1"] = redirect("/page")
    got = fetch(server.url + "/r1", PRIVATE)
    assert [(h.url, h.addresses) for h in got.hops] == [
        (server.url + "/r1", ("127.0.0.1",)), (server.url + "/page", ("127.0.0.1",))]


def test_malformed_redirect_location_is_refused_not_raised_raw() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(302, headers={"Location": "http://a]b/"})  # httpx accepts it, urljoin raises

    with pytest.raises(UrlRefused, match=r"refused redirect .*Invalid IPv6 URL"):
        fetch("http://public.example/start", UrlPolicy(), resolver=lambda host, port: ["93.184.216.34"],
              transport=httpx.MockTransport(handler))


@pytest.mark.parametrize("pinned", [True, False])
def test_url_that_httpx_rejects_is_refused_not_raised_raw(pinned: bool) -> None:
    transport = None if pinned else httpx.MockTransport(lambda request: httpx.Response(200))
    with pytest.raises(UrlRefused, match="Invalid IPv6 address"):  # urllib accepts `[v1.x]`, httpx does not
        fetch("http://[v1.x]/", UrlPolicy(), resolver=lambda host, port: ["93.184.216.34"], transport=transport)
