"""Atomic file writes: a temporary file in the same folder, then `os.replace`.

Every file amapreduce writes for later reading (run results, caches, exports, indexes) goes
through here, so a crash or Ctrl-C never leaves half a file where a whole one was expected:
readers see the old version or the new one, nothing in between.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_open", "atomic_write"]


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", *, newline: str | None = None) -> Iterator[IO[Any]]:
    """Open a temporary file beside `path`; on a clean exit it replaces `path` atomically.

    Args:
        path: the final file (its folder is created if missing).
        mode: `"w"` (UTF-8 text) or `"wb"`.
        newline: passed to `open` in text mode (`""` for the csv module).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"`mode` must be 'w' or 'wb', got {mode!r}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        if mode == "wb":
            handle: IO[Any] = os.fdopen(fd, "wb")
        else:
            handle = os.fdopen(fd, "w", encoding="utf-8", newline=newline)
        with handle:
            yield handle
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_open(path) as handle:
        handle.write(text)
