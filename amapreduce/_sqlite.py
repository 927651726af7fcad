"""Switching a SQLite file to WAL safely when several processes open it at once.

Why this exists: `PRAGMA journal_mode=WAL` needs an exclusive lock, and SQLite does not call
the busy handler for it in every case — two processes creating the same fresh file can get
`database is locked` at once, whatever `busy_timeout` says (seen in CI: one of two cache
writers died). Both SQLite users here (the web cache and the memory store) open their files
through `enable_wal`, which checks the mode first (no lock needed when it is already WAL, the
usual case) and otherwise retries the switch with a short backoff until a deadline.

`create_database` makes a new database file whole: SQLite itself creates the file empty and
writes the schema afterwards, so a reader arriving in between cannot tell a store being born from
one truncated to zero bytes. A file built aside and linked into place is never seen half made,
which lets the memory store refuse an empty file instead of silently starting over in it.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["create_database", "enable_wal", "is_lock_error"]

_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK}


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


def _fold_wal(conn: sqlite3.Connection, file: Path) -> None:
    """Copy every page of the WAL into the database file now, and fail if any is left behind.

    Why explicitly: closing the connection folds the WAL in too, but a close that cannot (the disk
    filled while the file grew) reports nothing, and only the file is linked into place: the store
    arrived without its pages ("database disk image is malformed").
    """
    busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy:
        raise sqlite3.OperationalError(f"could not fold the write-ahead log into {file} (checkpoint busy)")
    check = conn.execute("PRAGMA quick_check").fetchone()[0]
    if check != "ok":
        raise sqlite3.DatabaseError(f"the new database {file} failed its check: {check}")


def create_database(path: Path, build: Callable[[sqlite3.Connection], None]) -> bool:
    """Create the SQLite file `path` in WAL mode with `build` run on it, all or nothing.

    The database is built under a temporary name beside `path`, closed (SQLite then folds its WAL
    into the file), and hard-linked to `path`; the link fails when `path` exists, so of several
    processes creating the same store one wins and the others drop their copy. `path` never
    exists empty or half built. On a file system without hard links the copy is renamed into
    place when `path` is still absent (a narrower guarantee: two creators racing there can
    both succeed, the later replacing the earlier's empty store).

    Returns:
        True when this call created `path`; False when another process had created it first.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".new")
    os.close(fd)
    tmp = Path(name)
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")  # recorded in the file's header: it stays WAL
            build(conn)
            _fold_wal(conn, tmp)
        finally:
            conn.close()
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS or path.exists():
                raise
            os.replace(tmp, path)
        return True
    finally:
        for leftover in (tmp, tmp.with_name(f"{tmp.name}-wal"), tmp.with_name(f"{tmp.name}-shm")):
            leftover.unlink(missing_ok=True)
