"""Atomic file writes: a temporary file in the same folder, then `os.replace`.

Every file amapreduce writes for later reading (run results, caches, exports, indexes) goes
through here, so a crash or Ctrl-C never leaves half a file where a whole one was expected:
readers see the old version or the new one, nothing in between.

Every JSON file a run or an evaluation writes (`result.json`, `results.json`, `memory_log.jsonl`,
the reply and date caches, ...) is written by `write_json` / `write_json_lines`: non-ASCII kept as
it is, registered secrets masked (`trace.redacted_json`, the one redaction) and unencodable code
points replaced (`_text.scrub`), so none of them holds a configured key or half a document.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from amapreduce._text import scrub
from amapreduce.errors import storage_error
from amapreduce.trace import redacted_json

__all__ = ["atomic_open", "atomic_write", "write_json", "write_json_lines"]


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
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise storage_error(exc, path=target) from exc
    try:
        if mode == "wb":
            handle: IO[Any] = os.fdopen(fd, "wb")
        else:
            handle = os.fdopen(fd, "w", encoding="utf-8", newline=newline)
        with handle:
            yield handle
        os.replace(tmp, target)
    except OSError as exc:  # a full disk, an I/O error: the old file (if any) is left as it was
        Path(tmp).unlink(missing_ok=True)
        raise storage_error(exc, path=target) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_open(path) as handle:
        handle.write(text)


def write_json(path: str | Path, data: Any, *, indent: int | None = None, credential_keys: bool = False) -> None:
    """Write `data` to `path` as one JSON document, atomically, with secrets masked.

    Every registered secret is masked wherever it occurs (`trace.redact_secrets`); an object JSON
    cannot encode is written as its text, masked too; lone surrogates become U+FFFD.

    Args:
        path: the final file (its folder is created if missing).
        data: JSON-shaped data.
        indent: as `json.dumps`'s (None: one line).
        credential_keys: also replace the value of every credential-named key (`api_key`,
            `password`, ...) by `[REDACTED]`. Off by default: in most documents keys are data
            (a decision's column names, a cache keyed by text) that must come back as written.
    """
    atomic_write(path, scrub(redacted_json(data, indent=indent, by_name=credential_keys)))


def write_json_lines(path: str | Path, items: Iterable[Any]) -> None:
    """Write `items` to `path` as JSON lines (one object per line), the whole file at once and
    atomically, masked as `write_json` masks a document."""
    with atomic_open(path) as handle:
        for item in items:
            handle.write(scrub(redacted_json(item, by_name=False)) + "\n")
