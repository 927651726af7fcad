"""Search backends: one module each, one result shape (`SearchResult`) for all.

`make_backend(spec, settings)` turns a spec string into a backend:
`ddgs` | `searxng` | `searxng:URL` | `serper` | `tavily` | `corpus:INDEX`.
Backend modules import their client libraries lazily.
"""

from __future__ import annotations

from amapreduce.web.backends.base import BackendError, SearchBackend, make_backend

__all__ = ["BackendError", "SearchBackend", "make_backend"]
