"""The backend interface and its error, the rate limiting, retries and circuit breaker of remote
backends, and the shared HTTP/JSON plumbing of remote APIs. `registry.make_backend` builds a
spec's backend with the factory its name is registered under (built-ins and plug-ins alike).

Why here: every remote backend is spaced by the process-wide `SpacingLimiter` of its name
(`amapreduce.ratelimit`) and retried by the one retry loop (`amapreduce._retry`) with the same
capped, jittered, `Retry-After`-aware backoff as model calls; only the number of attempts differs.

Outages. A backend built from settings (`registry.make_backend`) also has the process-wide circuit
breaker of its name (`amapreduce.breaker`, key `search:NAME`), the model providers' breaker: every search
attempt, retries included, is admitted by it and reports to it. A failure where the backend did
not answer (`BackendError.outage`: connection or DNS error, timeout, 5xx) counts; anything else
resets the count (results, *no* results, a 429, a refused key). After `search_breaker_failures`
in a row the breaker opens; searches then wait for its probe at most until
`search_breaker_max_wait_s` after the outage began and then raise `SearchUnavailable` at once,
which stops the run `failed` with that one line instead of letting a manager spend every step on
the same DNS error. While the breaker is open a failed attempt is not backed off: the breaker's own
wait replaces the backoff.

Refusals. A keyed backend (`KeyedBackend`: serper, tavily) that refuses its key (HTTP 401/403)
refuses every search of the run: the search raises `ProviderRejected` at once, unretried, and the
run stops `failed` with that line, instead of every sub-agent spending its steps on the same
refusal. The key is registered for redaction by value (`trace.register_secrets`) and every
message quoting a reply or an HTTP error is masked, in case the backend echoes it.
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from amapreduce._retry import RetryPolicy, Transient, parse_retry_after, retry_loop
from amapreduce.breaker import BreakerPolicy, BreakerState, CircuitBreaker, Outage, shared_breaker
from amapreduce.errors import ProviderRejected, RunError, SearchUnavailable
from amapreduce.ratelimit import SpacingPolicy, shared_limiter
from amapreduce.trace import redact_secrets, register_secrets
from amapreduce.web.models import SearchResult

if TYPE_CHECKING:
    import httpx

    from amapreduce.settings import Settings

__all__ = [
    "SEARCH_RETRY",
    "BackendError",
    "KeyedBackend",
    "RemoteBackend",
    "SearchBackend",
    "breaker_key",
    "http_json",
    "search_breaker_policy",
    "search_unavailable",
]

SEARCH_RETRY = RetryPolicy(max_retries=2)
"""Three attempts per search; backoff cap, jitter and `Retry-After` limit as for model calls."""


class BackendError(RunError):
    """A search backend failed; its structured fields (keyword arguments) say how."""

    backend: str = ""
    """The backend's name."""
    transient: bool = False
    """Whether a retry may help."""
    status: int | None = None
    """The HTTP status, when there was one."""
    retry_after_s: float | None = None
    """The wait the server asked for (`Retry-After`), when it said."""
    outage: bool = False
    """Whether the backend did not answer (connection or DNS error, timeout, 5xx): what the
    circuit breaker counts. A 429, a refused key or an unreadable reply is an answer."""


def breaker_key(name: str) -> str:
    """The process-wide circuit breaker key of the backend `name` (kept apart from providers' keys)."""
    return f"search:{name}"


def search_unavailable(outage: Outage) -> SearchUnavailable:
    """The error of a search backend's open breaker: the run's one-line reason to stop `failed`."""
    name = outage.key.removeprefix("search:")
    return SearchUnavailable(
        f"search backend {name!r} is unavailable: {outage.failures} requests in a row failed "
        f"(last: {outage.last_error}) and it has not answered for {outage.lasted_s:.0f} s. Check the network "
        "or the backend, or search a local index offline (`--search corpus:INDEX`); "
        "AMAPREDUCE_SEARCH_BREAKER_MAX_WAIT_S sets how long a run waits for it.",
        provider=name,
        failures=outage.failures,
        last_error=outage.last_error,
    )


def search_breaker_policy(settings: Settings) -> BreakerPolicy:
    """A search backend's circuit breaker policy, from the `search_breaker_*` settings."""
    return BreakerPolicy(
        failures=settings.search_breaker_failures,
        cooldown_s=settings.search_breaker_cooldown_s,
        max_wait_s=settings.search_breaker_max_wait_s,
    )


class SearchBackend(ABC):
    """A search engine returning `SearchResult`s, best first."""

    name: str = "backend"
    """Identifies the backend in cache keys, rate limits and result `source` fields."""

    @abstractmethod
    def search(self, query: str, n: int) -> list[SearchResult]:
        """Return at most `n` results for `query`.

        Raises:
            BackendError: the backend failed (network down, bad key, bad reply).
        """


def _classify(exc: Exception) -> Transient | None:
    if isinstance(exc, BackendError) and exc.transient:
        return Transient(kind="backend", retry_after_s=exc.retry_after_s)
    return None


class RemoteBackend(SearchBackend):
    """A backend reached over the network: rate-limited and retried with backoff.

    Args:
        min_interval_s: minimum spacing between calls from this process; every backend of one
            `name` shares one limiter, so they must all give the same spacing (else the first
            search raises `ConfigError`, see `amapreduce.ratelimit.shared_limiter`).
        retry: attempts and backoff for transient failures.
        timeout_s: HTTP timeout of one request.
        breaker: the policy of the backend's process-wide circuit breaker (None: no breaker;
            `registry.make_backend` gives the `search_breaker_*` settings' one). Like the limiter, every
            backend of one `name` shares it, so they must all give the same policy.
        sleep, rng: injected by tests so retries neither wait nor vary.
    """

    refusal_stops_run = False
    """Whether a 401/403 refuses the whole run (`ProviderRejected`): true of keyed backends, whose
    key is then wrong; a keyless backend's 403 may be about one query or one instance setting."""

    def __init__(
        self,
        *,
        min_interval_s: float = 1.0,
        retry: RetryPolicy = SEARCH_RETRY,
        timeout_s: float = 10.0,
        breaker: BreakerPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.min_interval_s = min_interval_s
        self.retry = retry
        self.timeout_s = timeout_s
        self.breaker_policy = breaker
        self._sleep = sleep
        self._rng = rng

    def circuit_breaker(self) -> CircuitBreaker | None:
        """The backend's process-wide breaker (None without a breaker policy).

        Raises:
            ConfigError: another backend of this name set a different breaker policy.
        """
        if self.breaker_policy is None:
            return None
        return shared_breaker(breaker_key(self.name), self.breaker_policy, unavailable=search_unavailable)

    @abstractmethod
    def _search_once(self, query: str, n: int) -> list[SearchResult]:
        """One attempt; raise `BackendError(transient=...)` on failure."""

    def search(self, query: str, n: int) -> list[SearchResult]:
        """Return at most `n` results for `query`, retrying transient failures per `retry`.

        Raises:
            BackendError: a permanent failure, or the last transient one (its message then says
                how many attempts were made).
            SearchUnavailable: the backend's circuit breaker is open and its outage has lasted
                `max_wait_s`; this attempt was not sent.
            ProviderRejected: a keyed backend refused its key (`refusal_stops_run`); not retried.
            ConfigError: another backend of this name set a different `min_interval_s` or breaker policy.
        """
        limiter = shared_limiter(self.name, SpacingPolicy(self.min_interval_s))
        breaker = self.circuit_breaker()
        what = f"`{self.name}` search"
        probe = [False]  # whether the attempt about to go out is the breaker's half-open probe

        def admit() -> None:
            probe[0] = breaker.admit() if breaker is not None else False

        def attempt() -> list[SearchResult]:
            try:
                limiter.acquire()
                results = self._search_once(query, n)
            except BackendError as exc:
                if breaker is not None:
                    breaker.record(probe[0], exc.message if exc.outage else None)
                raise
            except BaseException:
                if breaker is not None:
                    breaker.release(probe[0])
                raise
            if breaker is not None:
                breaker.record(probe[0], None)
            return results

        def pause_then_admit(delay_s: float) -> None:
            # The retry loop's sleep: a retry is admitted like the first attempt, outside the loop's
            # `try`, so `SearchUnavailable` leaves the loop as it is. With the breaker open, `admit`
            # waits for the probe (or fails at once): a backoff would only add to that wait.
            if breaker is None or breaker.state is BreakerState.CLOSED:
                self._sleep(delay_s)
            admit()

        def give_up(exc: Exception, tries: int, transient: Transient | None) -> BaseException:
            # A new error, never `exc` itself: the loop raises it `from exc`, and an error caused by
            # itself would send every walk of the cause chain (`errors.find_cause`) round forever.
            if self.refusal_stops_run and isinstance(exc, BackendError) and exc.status in (401, 403):
                env = f"{self.name.upper()}_API_KEY"
                return ProviderRejected(
                    f"search backend `{self.name}` refused its API key (HTTP {exc.status}), so every search would "
                    f"fail. Set {env} (or AMAPREDUCE_{env}) to a valid key, or choose another search backend.",
                    provider=self.name, status=exc.status, failures=1, last_error=exc.message,
                )
            if isinstance(exc, BackendError):
                suffix = f" (after {tries} attempts of {what})" if tries > 1 else ""
                return BackendError(f"{exc.message}{suffix}", **exc.fields)
            return exc

        admit()
        return retry_loop(attempt, policy=self.retry, classify=_classify, give_up=give_up,
                          sleep=pause_then_admit, rng=self._rng)


class KeyedBackend(RemoteBackend):
    """A remote API that needs a key: holds the key out of reprs and messages.

    Args:
        api_key: the provider key.
        base_url: API root (tests point it at a local fake); defaults to `default_url`.
        transport: httpx transport (tests).
        **kwargs: `RemoteBackend` options (rate limit, retries, timeout).
    """

    default_url = ""
    refusal_stops_run = True

    def __init__(self, api_key: str, *, base_url: str | None = None,
                 transport: httpx.BaseTransport | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        register_secrets([api_key])
        self._api_key = api_key
        self.base_url = (base_url or self.default_url).rstrip("/")
        self._transport = transport

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, api_key='***')"


def http_json(
    backend: str,
    method: str,
    url: str,
    *,
    timeout_s: float,
    params: dict[str, Any] | None = None,
    json_body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    transport: httpx.BaseTransport | None = None,
) -> Any:
    """Make one JSON API request and map every failure to a `BackendError`.

    Connection errors, timeouts, 429 and 5xx are transient (retried, after the reply's
    `Retry-After` when it has one), and all but the 429 are outages (the breaker counts them);
    401/403 say the key is wrong; other 4xx and unreadable bodies are permanent. Quoted reply
    text and errors have every registered secret masked.
    """
    import httpx

    from amapreduce.web.fetch import shared_ssl_context

    try:
        with httpx.Client(timeout=timeout_s, transport=transport, verify=shared_ssl_context()) as client:
            response = client.request(method, url, params=params, json=json_body, headers=headers)
    except httpx.TimeoutException as exc:
        raise BackendError(f"`{backend}` timed out after {timeout_s:g} s. Try again later.",
                           backend=backend, transient=True, outage=True) from exc
    except httpx.HTTPError as exc:
        raise BackendError(
            f"`{backend}` is unreachable ({type(exc).__name__}: {redact_secrets(str(exc))}). Check the network, or use "
            "`--search corpus:INDEX` to search a local index offline.",
            backend=backend, transient=True, outage=True,
        ) from exc
    status = response.status_code
    if status in (401, 403):
        raise BackendError(f"`{backend}` refused the API key (HTTP {status}). Check the key in the environment.",
                           backend=backend, transient=False, status=status)
    if status == 429 or status >= 500:
        raise BackendError(f"`{backend}` answered HTTP {status}. Retry later or lower the request rate.",
                           backend=backend, transient=True, status=status, outage=status >= 500,
                           retry_after_s=parse_retry_after(response.headers))
    if status >= 400:
        raise BackendError(f"`{backend}` rejected the request (HTTP {status}): {redact_secrets(response.text)[:200]}",
                           backend=backend, transient=False, status=status)
    try:
        return response.json()
    except ValueError as exc:
        raise BackendError(f"`{backend}` returned a non-JSON reply: {redact_secrets(response.text)[:200]!r}. "
                           "Check the backend URL.", backend=backend, transient=False) from exc

