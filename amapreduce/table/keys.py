"""Normalisation used to compare keys and detect duplicates.

Two key cells are the same entity when they differ only in case, Unicode width/compatibility
forms, surrounding or repeated white space, or markdown emphasis (`*`). This is deliberately
narrower than the scorer's `norm_str`: it must never merge two genuinely different entities.
"""

from __future__ import annotations

import functools
import re
import unicodedata

__all__ = ["normalize_key", "normalize_value"]

_SPACES = re.compile(r"\s+")


@functools.lru_cache(maxsize=65536)  # entity names and column values repeat across rows and rounds
def normalize_value(value: str) -> str:
    """Fold one cell for comparison (NFKC, casefold, `*` removed, white space collapsed)."""
    text = unicodedata.normalize("NFKC", value).replace("*", "")
    return _SPACES.sub(" ", text).strip().casefold()


def normalize_key(values: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Fold every cell of a row key."""
    return tuple(normalize_value(v) for v in values)
