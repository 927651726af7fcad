"""Templates with `__0__ … __{K-1}__` placeholders, filled from one task-matrix row.

Filling is a single regex pass over the template: a cell value is never scanned again, so a
value that happens to contain `__1__` cannot inject text into another slot (the reference
replaced placeholders one after another and was open to exactly that).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["PLACEHOLDER", "placeholders", "render"]

PLACEHOLDER = re.compile(r"__(\d+)__")
"""A placeholder: two underscores, a column index, two underscores."""


def placeholders(text: str) -> list[int]:
    """The placeholder indices used in `text`, sorted and without repeats."""
    return sorted({int(m) for m in PLACEHOLDER.findall(text)})


def render(template: str, row: Sequence[str]) -> str:
    """Fill `template` with the cells of `row` (`__i__` → `row[i]`) in one pass.

    Placeholders beyond the row stay as they are; the decision validator rejects such
    templates before any rendering happens.
    """

    def substitute(match: re.Match[str]) -> str:
        index = int(match.group(1))
        return row[index] if index < len(row) else match.group(0)

    return PLACEHOLDER.sub(substitute, template)
