"""Normalisation used to compare keys and detect duplicates.

Two key cells are the same entity when they differ only in case, Unicode width/compatibility
forms, surrounding or repeated white space, or markdown emphasis (`*`). This is deliberately
narrower than the scorer's `norm_str`: it must never merge two genuinely different entities.

A cell that holds no visible character (only white space, zero-width or other format characters,
or a "filler" letter such as U+3164) names nothing: `is_blank` says so, and the table and the
decision validator treat it like an empty cell rather than as an entity nobody can see.
"""

from __future__ import annotations

import functools
import re
import unicodedata

__all__ = ["is_blank", "normalize_key", "normalize_value"]

_SPACES = re.compile(r"\s+")
_VISIBLE_CATEGORIES = frozenset("LNPS")
"""Unicode general categories (first letter) that draw something: letters, numbers, punctuation,
symbols. Marks (M) draw only on a base character; separators (Z) and others (C: controls,
format characters such as U+200B/U+200D/U+FEFF, surrogates, unassigned) draw nothing."""
_FILLERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
"""Letters and symbols that render as blank space although their category says otherwise
(the Hangul fillers, the blank Braille pattern)."""


def is_blank(value: str) -> bool:
    """True when `value` has no visible character (empty, white space, zero-width characters ...)."""
    return not any(ch not in _FILLERS and unicodedata.category(ch)[0] in _VISIBLE_CATEGORIES for ch in value)


@functools.lru_cache(maxsize=65536)  # entity names and column values repeat across rows and rounds
def normalize_value(value: str) -> str:
    """Fold one cell for comparison (NFKC, casefold, `*` removed, white space collapsed)."""
    text = unicodedata.normalize("NFKC", value).replace("*", "")
    return _SPACES.sub(" ", text).strip().casefold()


def normalize_key(values: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Fold every cell of a row key."""
    return tuple(normalize_value(v) for v in values)
