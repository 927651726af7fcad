"""`corpus:INDEX` backend: search a local index built by `amapreduce corpus index`."""

from __future__ import annotations

from pathlib import Path

from amapreduce.web.backends.base import SearchBackend
from amapreduce.web.corpus import CorpusIndex
from amapreduce.web.models import SearchResult

__all__ = ["CorpusBackend"]


class CorpusBackend(SearchBackend):
    """Local BM25 search; no network, no rate limit.

    Args:
        path: the index folder.
    """

    def __init__(self, path: Path) -> None:
        self.index = CorpusIndex.open(path)
        self.name = f"corpus:{self.index.name}"

    def search(self, query: str, n: int) -> list[SearchResult]:
        return self.index.search(query, n)
