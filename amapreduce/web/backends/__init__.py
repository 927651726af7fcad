"""Search backends: one module each, one result shape (`SearchResult`) for all.

`make_backend(spec, settings)` turns a spec string into a backend:
`ddgs` | `searxng` | `searxng:URL` | `serper` | `tavily` | `corpus:INDEX`, or the name of a
backend an installed package registers in the `amapreduce.search_backends` entry-point group
(`registry`; `amapreduce search --list-backends` lists them all).
Backend modules import their client libraries lazily.

What a plug-in needs is importable from here: `SearchBackend` (or `RemoteBackend` for the
shared retries, rate limit and circuit breaker), `SearchResult`, `BackendError` and `backend_spec`.
"""

from __future__ import annotations

from amapreduce.web.backends.base import BackendError, RemoteBackend, SearchBackend
from amapreduce.web.backends.registry import available_backends, backend_spec, make_backend
from amapreduce.web.models import SearchResult

__all__ = [
    "BackendError",
    "RemoteBackend",
    "SearchBackend",
    "SearchResult",
    "available_backends",
    "backend_spec",
    "make_backend",
]
