"""HTTP fetch for `crawl_page`: timeouts, a size cap, a redirect limit and a content-type check.

Why redirects are followed by hand: httpx's automatic redirects would hop to a new host without
asking the URL policy, so a public page could bounce the crawler to `http://169.254.169.254/`.
Here every hop is checked by `UrlPolicy.check` before it is requested.

Why connections are pinned: the policy resolves a host name and checks its addresses; if httpx
then resolved the name again, a DNS server could answer differently the second time (DNS
rebinding) and steer the socket to an internal address. `_PinnedBackend` makes every socket go
to an address the policy checked for that very host, and refuses any other connection. TLS still
verifies the certificate against the host name. Proxies from the environment are not used.
"""

from __future__ import annotations

import functools
import ssl
import time
from typing import Any
from urllib.parse import urljoin

import httpcore
import httpx
from pydantic import BaseModel, ConfigDict, Field

from amapreduce._version import __version__
from amapreduce.errors import RunError
from amapreduce.web.policy import CheckedUrl, Resolver, UrlPolicy, UrlRefused

__all__ = ["TEXT_CONTENT_TYPES", "FetchFailed", "FetchLimits", "Fetched", "fetch", "shared_ssl_context"]

TEXT_CONTENT_TYPES: frozenset[str] = frozenset(
    {"text/html", "application/xhtml+xml", "text/plain", "text/markdown", "text/x-markdown", "text/xml",
     "application/xml"}
)
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class FetchFailed(RunError):
    """A page could not be fetched: network error, HTTP error, timeout, too large or not text."""

    outage: bool = False
    """Whether the host did not answer (connection error, timeout, 5xx): what the host's circuit
    breaker counts (`web.service`). A 4xx, an oversize or non-text page is an answer."""


class FetchLimits(BaseModel):
    """Bounds of one fetch; the defaults suit a sub-agent reading ordinary web pages."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    connect_timeout_s: float = Field(default=5.0, gt=0)
    read_timeout_s: float = Field(default=10.0, gt=0)
    """Longest wait for any single read."""
    total_timeout_s: float = Field(default=30.0, gt=0)
    """Longest time for the whole fetch, redirects included (stops pages that trickle bytes)."""
    max_bytes: int = Field(default=5_000_000, ge=1)
    max_redirects: int = Field(default=5, ge=0)


class Fetched(BaseModel):
    """The raw result of a fetch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    final_url: str
    status: int
    content_type: str
    """Media type without parameters, lower case (e.g. `text/html`)."""
    body: bytes
    encoding: str | None = None
    """The charset the Content-Type header declares; None lets extraction detect it (e.g. `<meta charset>`)."""
    hops: tuple[CheckedUrl, ...] = ()
    """Every URL requested, in order (the last is `final_url`), with the addresses the policy approved;
    the cache keeps them so a later, stricter policy can re-check a cached page's redirect chain."""


@functools.lru_cache(maxsize=1)
def shared_ssl_context() -> ssl.SSLContext:
    """One verifying SSL context for every client: building one costs ~30 ms (loading CA
    certificates), more than a whole local fetch."""
    return httpx.create_ssl_context()


class _PinnedBackend(httpcore.SyncBackend):
    """Opens TCP connections only to addresses the URL policy checked for that host and port."""

    def __init__(self) -> None:
        self.pins: dict[tuple[str, int], tuple[str, ...]] = {}

    def connect_tcp(self, host: str, port: int, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        addresses = self.pins.get((host, port))
        if not addresses:
            raise httpcore.ConnectError(f"connection to {host}:{port} was not checked by the URL policy")
        error: Exception | None = None
        for address in addresses:
            try:
                return super().connect_tcp(address, port, *args, **kwargs)
            except httpcore.ConnectError as exc:  # try the next checked address, keep the last error
                error = exc
        raise error if error is not None else httpcore.ConnectError(f"no address for {host}")


def _pinned_transport(backend: _PinnedBackend) -> httpx.HTTPTransport:
    transport = httpx.HTTPTransport(verify=shared_ssl_context(), trust_env=False)
    # httpx has no public hook for the network backend; its pool is replaced with one that has it.
    transport._pool = httpcore.ConnectionPool(ssl_context=shared_ssl_context(), network_backend=backend)
    return transport


def _redirect_target(current: str, location: str) -> str:
    """The absolute URL a `Location` header points to; a malformed one is refused, not raised raw."""
    try:
        return urljoin(current, location)
    except ValueError as exc:
        raise UrlRefused(
            f"refused redirect from {current!r} to {location!r}: {exc}. The site sent a malformed Location; "
            "try another source."
        ) from None


def _media_type(header: str) -> str:
    return header.split(";", 1)[0].strip().lower()


def _looks_like_html(head: bytes) -> bool:
    sample = head[:1024].lstrip().lower()
    return sample.startswith((b"<!doctype html", b"<html")) or b"<body" in sample


def fetch(
    url: str,
    policy: UrlPolicy,
    limits: FetchLimits | None = None,
    *,
    resolver: Resolver | None = None,
    transport: httpx.BaseTransport | None = None,
) -> Fetched:
    """GET `url`, checking the policy on the URL and on every redirect hop.

    Args:
        url: an http(s) URL.
        policy: the URL policy applied to every hop.
        limits: timeouts and caps (defaults when None).
        resolver: host resolver used by the policy (tests inject a fake one).
        transport: httpx transport (tests may inject one); when None, connections are pinned to
            the addresses the policy checked.

    Raises:
        UrlRefused: the URL or a redirect target is not allowed.
        FetchFailed: network error, HTTP error status, timeout, oversize or non-text content.
    """
    lim = limits or FetchLimits()
    timeout = httpx.Timeout(lim.read_timeout_s, connect=lim.connect_timeout_s)
    deadline = time.monotonic() + lim.total_timeout_s
    headers = {"User-Agent": f"amapreduce/{__version__} (wide-search research agent)", "Accept": "text/html,*/*;q=0.5"}
    current = url
    hops: list[CheckedUrl] = []
    pinned: _PinnedBackend | None = None
    if transport is None:
        pinned = _PinnedBackend()
        transport = _pinned_transport(pinned)
    with httpx.Client(timeout=timeout, follow_redirects=False, headers=headers, transport=transport,
                      trust_env=False) as client:
        for _hop in range(lim.max_redirects + 1):
            checked = policy.check(current, resolver)
            hops.append(checked)
            try:
                if pinned is not None:
                    target = httpx.URL(current)
                    port = target.port or (443 if target.scheme == "https" else 80)
                    pinned.pins[(target.raw_host.decode("ascii"), port)] = checked.addresses
                with client.stream("GET", current) as response:
                    if response.status_code in _REDIRECTS and "location" in response.headers:
                        current = _redirect_target(current, response.headers["location"])
                        continue
                    return _read(url, current, response, lim, deadline).model_copy(update={"hops": tuple(hops)})
            except httpx.InvalidURL as exc:
                # The policy parses with urllib; httpx is stricter (e.g. non-printable characters).
                raise UrlRefused(f"refused URL {current!r}: {exc}. Check the URL.") from None
            except httpx.TimeoutException as exc:
                raise FetchFailed(
                    f"timed out fetching {current!r} ({type(exc).__name__}). The site is slow or down; try another source.",
                    url=current,
                    outage=True,
                ) from exc
            except httpx.HTTPError as exc:
                raise FetchFailed(
                    f"could not fetch {current!r}: {type(exc).__name__}: {exc}. Check the URL or try another source.",
                    url=current,
                    outage=True,
                ) from exc
    raise FetchFailed(
        f"too many redirects fetching {url!r} (limit {lim.max_redirects}). Try the final page's URL directly.",
        url=url,
    )


def _read(url: str, current: str, response: httpx.Response, lim: FetchLimits, deadline: float) -> Fetched:
    if response.status_code >= 400:
        raise FetchFailed(
            f"HTTP {response.status_code} fetching {current!r}. The page is missing or blocked; try another source.",
            url=current,
            status=response.status_code,
            outage=response.status_code >= 500,
        )
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > lim.max_bytes:
        raise FetchFailed(
            f"page {current!r} is too large ({int(declared):,} bytes > {lim.max_bytes:,}). Try a smaller page.",
            url=current,
        )
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > lim.max_bytes:
            raise FetchFailed(
                f"page {current!r} is too large (> {lim.max_bytes:,} bytes). Try a smaller page.", url=current
            )
        if time.monotonic() > deadline:
            raise FetchFailed(
                f"timed out fetching {current!r} (over {lim.total_timeout_s:g} s in total). "
                "The site is slow; try another source.",
                url=current,
                outage=True,
            )
        chunks.append(chunk)
    body = b"".join(chunks)
    media = _media_type(response.headers.get("content-type", ""))
    if not media and _looks_like_html(body):
        media = "text/html"
    if media not in TEXT_CONTENT_TYPES:
        raise FetchFailed(
            f"page {current!r} is `{media or 'unknown'}`, not HTML or text; it cannot be read. "
            "Look for an HTML page with the same facts.",
            url=current,
            content_type=media,
        )
    return Fetched(
        url=url,
        final_url=current,
        status=response.status_code,
        content_type=media,
        body=body,
        encoding=response.charset_encoding,
    )
