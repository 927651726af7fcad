"""A circuit breaker per model provider, so that a provider outage ends a run in bounded time.

The breaker itself (states, waiting, the probe, the process-wide registry) is the foundation's
`amapreduce.breaker`, shared with the search backends; its names are re-exported here, where model
code has always found them. What this module adds is what counts as a provider outage.

What counts. An *outage failure* is a request that failed because the provider did not answer:
a server error (5xx), a timeout or a connection error (`is_outage`). Each HTTP attempt, retries
included, is reported. Any other outcome shows the provider is up and resets the count: a reply,
a 429 (rate limits are the limiter's and the retry loop's business), a refused request (4xx).

A provider's breaker raises `ProviderUnavailable` (`provider_unavailable`, the default error of
`CircuitBreaker` and `shared_breaker`); the run then ends `failed` with its one-line message.
Sharing: `shared_breaker(key, policy)` with a provider key (`llm.models.provider_of`).

Never reached. A provider that has not answered once in this process (`record_answer`: any HTTP
reply, an error status included) and cannot be connected to is a setup problem, not an outage:
`unreachable` turns the connection error into `ProviderUnreachable`, which names the host and the
cause (DNS, refused, TLS, proxy, timeout) and stops the run at its first attempt. Once a provider
has answered, a connection error is an outage again and is retried.
"""

from __future__ import annotations

import socket
import ssl
import threading
import urllib.request
from collections.abc import Iterator

from amapreduce import breaker as _foundation
from amapreduce.breaker import (
    BreakerPolicy,
    BreakerState,
    CircuitBreaker,
    Outage,
    provider_unavailable,
    shared_breaker,
)
from amapreduce.errors import ProviderUnreachable
from amapreduce.llm.retry import classify, http_status
from amapreduce.trace import redact_secrets

__all__ = [
    "OUTAGE_KINDS",
    "BreakerPolicy",
    "BreakerState",
    "CircuitBreaker",
    "Outage",
    "forget_shared_breakers",
    "is_outage",
    "provider_unavailable",
    "record_answer",
    "shared_breaker",
    "unreachable",
]

OUTAGE_KINDS = frozenset({"server", "timeout", "connection"})
"""The `Transient` kinds that mean the provider did not answer (a 429 is an answer)."""


def is_outage(exc: BaseException) -> bool:
    """Whether a failed request counts towards opening the breaker (5xx, timeout, connection)."""
    transient = classify(exc)
    return transient is not None and transient.kind in OUTAGE_KINDS


_ANSWERED: set[str] = set()
_ANSWERED_LOCK = threading.Lock()


def record_answer(provider: str, exc: BaseException | None = None) -> None:
    """Note that `provider` answered in this process: a reply (`exc` None) or an error that carries
    an HTTP status (a 4xx or 5xx is an answer too), unless the status is LiteLLM's 500 for a failed
    connection."""
    if exc is None or (http_status(exc) is not None and not _connect_failure(exc)):
        with _ANSWERED_LOCK:
            _ANSWERED.add(provider)


def forget_shared_breakers() -> None:
    """Drop every process-wide breaker (`amapreduce.breaker.forget_shared_breakers`) and forget
    which providers have answered (a long-lived process that changes its settings, test isolation)."""
    _foundation.forget_shared_breakers()
    with _ANSWERED_LOCK:
        _ANSWERED.clear()


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _named(exc: BaseException, name: str) -> bool:
    return any(cls.__name__ == name for cls in type(exc).__mro__)


_ADVICE = {
    "DNS": "the host name does not resolve: check the host in --api-base (or the provider's URL) and the "
           "network connection",
    "refused": "nothing accepts connections there: check the host and port of --api-base and that the server runs",
    "TLS": "the TLS handshake failed: check http:// vs https:// in --api-base and the server's certificate "
           "(SSL_CERT_FILE for a private CA)",
    "proxy": "the proxy refused or failed: check HTTPS_PROXY / HTTP_PROXY / NO_PROXY",
    "timeout": "the connection timed out: a firewall may drop it; check the network and any proxy "
               "(HTTPS_PROXY / HTTP_PROXY)",
    "network": "the connection failed: check the network, --api-base and any proxy (HTTPS_PROXY / HTTP_PROXY)",
}


_CONNECT_ERRORS = frozenset({"ConnectError", "ConnectTimeout", "ProxyError"})
"""httpx's and httpcore's errors of a connection that was never made (a read timeout is not one)."""


def _connect_failure(exc: BaseException) -> bool:
    """Whether `exc` (or an error it was raised from: LiteLLM reports one as an HTTP 500) is a
    connection that was never made."""
    return any(isinstance(err, socket.gaierror | ConnectionRefusedError)
               or any(cls.__name__ in _CONNECT_ERRORS for cls in type(err).__mro__) for err in _chain(exc))


def _cause(exc: BaseException) -> tuple[str, BaseException]:
    """Why a connection failed (a key of `_ADVICE`), told by the types in the exception chain,
    and the lowest-level error that says so."""
    chain = list(_chain(exc))
    checks: list[tuple[str, type[BaseException] | str]] = [
        ("proxy", "ProxyError"), ("DNS", socket.gaierror), ("refused", ConnectionRefusedError), ("TLS", ssl.SSLError),
        ("timeout", "ConnectTimeout"), ("timeout", TimeoutError)]
    for cause, kind in checks:
        for err in reversed(chain):
            if (isinstance(kind, str) and _named(err, kind)) or (isinstance(kind, type) and isinstance(err, kind)):
                return cause, err
    return "network", chain[-1]


def _host(exc: BaseException, provider: str) -> tuple[str, str | None]:
    """`host:port` of the request that failed (the provider key when the error holds no request), and
    the proxy the environment routes it through (None: direct)."""
    for err in _chain(exc):
        try:
            request = getattr(err, "request", None)
        except RuntimeError:  # httpx: an error raised outside a request has none
            continue
        url = getattr(request, "url", None)
        host, scheme = getattr(url, "host", None), getattr(url, "scheme", None)
        if isinstance(host, str) and host and isinstance(scheme, str):
            port = getattr(url, "port", None) or (443 if scheme == "https" else 80)
            proxies = urllib.request.getproxies_environment()
            proxy = proxies.get(scheme) or proxies.get("all")
            bypass = bool(urllib.request.proxy_bypass(host)) if proxy else True
            return f"{host}:{port}", None if bypass else redact_secrets(proxy or "")
    return provider, None


def unreachable(exc: BaseException, *, what: str, provider: str) -> ProviderUnreachable | None:
    """The `ProviderUnreachable` that a failed connection to `provider` amounts to when the provider
    has never answered in this process; None for any other error, or once it has answered."""
    with _ANSWERED_LOCK:
        if provider in _ANSWERED:
            return None
    if not _connect_failure(exc):
        return None
    cause, err = _cause(exc)
    host, proxy = _host(exc, provider)
    via = f" through the proxy {proxy}" if proxy else ""
    detail = " ".join(redact_secrets(f"{type(err).__name__}: {err}").split())
    return ProviderUnreachable(
        f"{what} could not reach {host}{via} ({cause}: {detail}); it has not answered once in this run, so "
        f"nothing was retried: {_ADVICE[cause]}.",
        provider=provider, host=host, status=None, failures=1, last_error=detail,
    )
