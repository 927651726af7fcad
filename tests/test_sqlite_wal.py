"""WAL switching under concurrent openers (CI once lost a cache writer to `database is locked`)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from amapreduce._sqlite import enable_wal, is_lock_error


class _LockedThenFree:
    """A connection whose WAL switch is refused `locked` times before it succeeds."""

    def __init__(self, locked: int, error: str = "database is locked") -> None:
        self.locked = locked
        self.error = error
        self.mode = "delete"
        self.switch_attempts = 0

    def execute(self, sql: str) -> Any:
        if sql == "PRAGMA journal_mode":
            return _Cursor(self.mode)
        self.switch_attempts += 1
        if self.switch_attempts <= self.locked:
            raise sqlite3.OperationalError(self.error)
        self.mode = "wal"
        return _Cursor("wal")


class _Cursor:
    def __init__(self, value: str) -> None:
        self.value = value

    def fetchone(self) -> tuple[str]:
        return (self.value,)


def test_switch_is_retried_until_the_lock_goes() -> None:
    conn = _LockedThenFree(locked=3)
    sleeps: list[float] = []
    enable_wal(conn, timeout_s=10, sleep=sleeps.append)  # type: ignore[arg-type]
    assert conn.mode == "wal"
    assert conn.switch_attempts == 4
    assert sleeps == [0.005, 0.01, 0.02]


def test_already_wal_needs_no_switch() -> None:
    conn = _LockedThenFree(locked=99)
    conn.mode = "wal"
    enable_wal(conn, sleep=lambda _: pytest.fail("must not wait"))  # type: ignore[arg-type]
    assert conn.switch_attempts == 0


def test_gives_up_at_the_deadline_with_the_sqlite_error() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    conn = _LockedThenFree(locked=10_000)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        enable_wal(conn, timeout_s=1.0, sleep=sleep, clock=lambda: now[0])  # type: ignore[arg-type]
    assert 0.75 <= now[0] <= 1.0


def test_other_errors_are_not_retried() -> None:
    conn = _LockedThenFree(locked=1, error="disk I/O error")
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        enable_wal(conn, sleep=lambda _: pytest.fail("must not wait"))  # type: ignore[arg-type]
    assert not is_lock_error(sqlite3.OperationalError("disk I/O error"))
    assert is_lock_error(sqlite3.OperationalError("database is busy"))


@pytest.mark.parametrize("opener", ["cache", "memory"])
def test_many_processes_create_the_same_fresh_file(tmp_path: Path, opener: str) -> None:
    script = textwrap.dedent("""
        import sys
        from pathlib import Path
        if sys.argv[2] == "cache":
            from amapreduce.web.cache import WebCache
            WebCache(Path(sys.argv[1]) / "c.sqlite3", ttl_s=60).put("search", "k", "v")
        else:
            from amapreduce.memory.schema import connect
            connect(Path(sys.argv[1]) / "store").execute("SELECT count(*) FROM meta").fetchone()
    """)
    for trial in range(3):
        folder = tmp_path / str(trial)
        procs = [subprocess.Popen([sys.executable, "-c", script, str(folder), opener], stderr=subprocess.PIPE)
                 for _ in range(5)]
        errors = [p.communicate(timeout=120)[1].decode() for p in procs]
        assert [p.returncode for p in procs] == [0] * 5, "\n".join(errors)
