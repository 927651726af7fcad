"""Switching a SQLite file to WAL safely when several processes open it at once.

Why this exists: `PRAGMA journal_mode=WAL` needs an exclusive lock, and SQLite does not call
the busy handler for it in every case — two processes creating the same fresh file can get
`database is locked` at once, whatever `busy_timeout` says (seen in CI: one of two cache
writers died). Both SQLite users here (the web cache and the memory store) open their files
through `enable_wal`, which checks the mode first (no lock needed when it is already WAL, the
usual case) and otherwise retries the switch with a short backoff until a deadline.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

__all__ = ["enable_wal", "is_lock_error"]


def is_lock_error(exc: BaseException) -> bool:
    """True for SQLite's transient 'database is locked' / 'busy' errors."""
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


def enable_wal(
    conn: sqlite3.Connection,
    *,
    timeout_s: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Put the database behind `conn` in WAL mode, waiting out other openers.

    Raises:
        sqlite3.OperationalError: still locked after `timeout_s`, or any non-lock error.
    """
    deadline = clock() + timeout_s
    delay = 0.005
    while True:
        try:
            if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
                return
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if not is_lock_error(exc) or clock() + delay > deadline:
                raise
        sleep(delay)
        delay = min(delay * 2, 0.25)
