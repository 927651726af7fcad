"""Reading a decision file: its size caps, its encoding, its JSON; every failure one `DecisionError`.

The size caps are checked before anything is spent on the file. Why: a 50 MB decision (1.5 M rows) took 25 s and 1.5 GB to plan as JSON, 468 s and 4.7 GB to print,
and `mapreduce run` refused it (for its batch cap) only after 19 s at 0.94 GB. Its size is now checked
before the file is read, and its rows before they are validated, planned or sent; both caps are
settings (`Settings.max_decision_bytes`, `Settings.max_decision_rows`), generous by default.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from amapreduce.errors import DecisionError

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_ROWS", "check_file_size", "check_rows", "read_decision_file"]

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
"""The largest decision file read by default (`Settings.max_decision_bytes`)."""
DEFAULT_MAX_ROWS = 100_000
"""The most `task_matrix` rows a decision file may hold by default (`Settings.max_decision_rows`)."""


def check_file_size(path: Path, max_bytes: int) -> None:
    """Refuse the decision file `path` when it is larger than `max_bytes`, before reading it.

    Raises:
        DecisionError: the file is larger than the cap (the message says how to raise it).
    """
    try:
        size = path.stat().st_size if path.is_file() else 0
    except (OSError, ValueError):
        return  # reading the file says what is wrong with the path
    if size > max_bytes:
        raise DecisionError(
            f"decision file {str(path)!r} is {size:,} bytes, over the {max_bytes:,}-byte cap; nothing was read. "
            "Split the matrix into several decisions, or raise the cap with AMAPREDUCE_MAX_DECISION_BYTES."
        )


def check_rows(path: Path, data: Any, max_rows: int) -> None:
    """Refuse the parsed decision file `data` (from `path`) when its `task_matrix` has more than
    `max_rows` rows, before the rows are validated.

    Raises:
        DecisionError: too many rows (the message says how to raise the cap).
    """
    rows = data.get("task_matrix") if isinstance(data, dict) else None
    if isinstance(rows, list) and len(rows) > max_rows:
        raise DecisionError(
            f"decision file {str(path)!r} has {len(rows):,} task_matrix rows, over the {max_rows:,}-row cap. Split "
            "it into several decisions, or raise the cap with AMAPREDUCE_MAX_DECISION_ROWS."
        )


def read_decision_file(p: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, max_rows: int = DEFAULT_MAX_ROWS) -> Any:
    """The JSON of the decision file `p`, within the caps (not yet validated as a decision).

    Raises:
        DecisionError: the file is missing, unreadable, too large, not JSON, or has too many rows.
    """
    check_file_size(p, max_bytes)
    try:
        # utf-8-sig: editors on Windows save JSON with a byte-order mark; it is not content.
        text = p.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise DecisionError(f"decision file {str(p)!r} does not exist; check the path.") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        # OSError covers a directory, no permission, a name too long, a symlink loop ...;
        # ValueError a path with a NUL byte. strerror keeps the reason to one line.
        reason = getattr(exc, "strerror", None) or str(exc)
        raise DecisionError(
            f"cannot read decision file {str(p)!r}: {reason}; check the path and that it is a readable UTF-8 file."
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DecisionError(
            f"decision file {str(p)!r} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}."
        ) from None
    except (RecursionError, ValueError) as exc:
        # Nesting deeper than Python's recursion limit, or an integer longer than 4300 digits.
        why = "it is nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise DecisionError(
            f"decision file {str(p)!r} cannot be read as a decision: {why}; a decision needs only a few levels "
            "of nesting and ordinary numbers."
        ) from None
    check_rows(p, data, max_rows)
    return data
