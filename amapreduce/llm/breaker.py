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
"""

from __future__ import annotations

from amapreduce.breaker import (
    BreakerPolicy,
    BreakerState,
    CircuitBreaker,
    Outage,
    forget_shared_breakers,
    provider_unavailable,
    shared_breaker,
)
from amapreduce.llm.retry import classify

__all__ = [
    "OUTAGE_KINDS",
    "BreakerPolicy",
    "BreakerState",
    "CircuitBreaker",
    "Outage",
    "forget_shared_breakers",
    "is_outage",
    "provider_unavailable",
    "shared_breaker",
]

OUTAGE_KINDS = frozenset({"server", "timeout", "connection"})
"""The `Transient` kinds that mean the provider did not answer (a 429 is an answer)."""


def is_outage(exc: BaseException) -> bool:
    """Whether a failed request counts towards opening the breaker (5xx, timeout, connection)."""
    transient = classify(exc)
    return transient is not None and transient.kind in OUTAGE_KINDS
