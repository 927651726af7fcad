"""A memory store that is not one is refused, never started over (issue 17, point 7).

The probe behind the issue truncated a store to zero bytes: `memory stats` exited 0 on an empty
store — 201 hints gone without a word, the encoder silently switched — and even that read-only
command wrote a schema into the file. Now a file that exists but is empty, is not SQLite, or is
SQLite without amapreduce's tables exits 2 with "STORE is empty or not an amapreduce memory
store; restore it or pass a new path", and is left exactly as it was. That is only sound because
a new store is created whole (built aside, then linked into place): an existing file is never a
store half way through being born, even with several processes creating it at once.
"""

from __future__ import annotations

import errno
import hashlib
import multiprocessing
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from amapreduce._sqlite import create_database
from amapreduce.memory import MemoryStore
from amapreduce.memory.schema import DB_NAME, NotAMemoryStore
from amapreduce.memory.store import get_meta, insert_hint
from tests.test_fuzz_inputs import assert_clean_outcome, run_cli

REFUSAL = "is empty or not an amapreduce memory store; restore it or pass a new path"
CREATORS, HINTS_EACH = 4, 5

EVERY_COMMAND = [
    ["stats"], ["list"], ["show", "h1"], ["search", "a question", "--no-project"], ["prune", "--dry-run"],
    ["prune"], ["add", "A new hint.", "--question", "a question"], ["edit", "h1", "--score", "3"], ["remove", "h1"],
    ["reindex"], ["import", "{export}"], ["export", "{out}"],
]
READ_ONLY = [["stats"], ["list"], ["show", "h1"], ["search", "a question", "--no-project"], ["prune", "--dry-run"],
             ["export", "{out}"]]


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file of the store folder with the hash of its bytes."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def cli(command: list[str], store: Path) -> tuple[int, str, str]:
    export = store.parent / "seed.jsonl"
    export.write_text('{"type": "hint", "id": "h9", "text": "Imported.", "score": 1}\n', encoding="utf-8")
    argv = [part.format(export=export, out=store.parent / "out.jsonl") for part in command]
    return run_cli(["memory", *argv, "--store", str(store)])


@pytest.fixture
def healthy(tmp_path: Path) -> Path:
    folder = tmp_path / "store"
    with MemoryStore(folder, encoder="hashing:64") as store, store.write() as conn:
        insert_hint(conn, "Batch by region.", 2, origin="test", hint_id="h1")
    return folder


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=lambda c: "-".join(c[:2]))
def test_a_store_truncated_to_zero_bytes_is_refused_and_left_empty(healthy: Path, command: list[str]) -> None:
    db = healthy / DB_NAME
    os.truncate(db, 0)  # `truncate -s0 STORE/memory.sqlite3`
    for sidecar in (healthy / f"{DB_NAME}-wal", healthy / f"{DB_NAME}-shm"):
        sidecar.unlink(missing_ok=True)
    code, out, err = cli(command, healthy)
    assert_clean_outcome(code, out, err)
    assert code == 2 and f"{healthy} {REFUSAL}" in err  # was 0, on a store started over
    assert db.stat().st_size == 0
    assert sorted(p.name for p in healthy.iterdir()) == [DB_NAME]


@pytest.mark.parametrize("content", ["garbage", "foreign-sqlite"])
def test_a_file_that_is_not_a_store_is_refused_and_not_touched(tmp_path: Path, content: str) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    db = folder / DB_NAME
    if content == "garbage":
        db.write_bytes(b"not a database " * 300)
    else:  # a SQLite database of some other program
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('mine')")
        conn.commit()
        conn.close()
    before = fingerprint(folder)
    for command in (["stats"], ["add", "A new hint.", "--question", "q"]):
        code, out, err = cli(command, folder)
        assert_clean_outcome(code, out, err)
        assert code == 2 and REFUSAL in err
    assert fingerprint(folder) == before
    with pytest.raises(NotAMemoryStore):
        MemoryStore(folder)


@pytest.mark.parametrize("command", READ_ONLY, ids=lambda c: "-".join(c[:2]))
def test_read_only_commands_open_the_store_read_only(
    healthy: Path, command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every connection a looking command opens is SQLite's `mode=ro`: it cannot write the file."""
    opened: list[str] = []
    real_connect = sqlite3.connect

    def recording_connect(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        opened.append(str(database))
        return real_connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", recording_connect)
    before = fingerprint(healthy)[DB_NAME]
    code, out, err = cli(command, healthy)
    assert code == 0, err
    assert opened and all(uri.endswith("?mode=ro") for uri in opened), opened
    assert fingerprint(healthy)[DB_NAME] == before


def test_a_new_store_is_born_whole_with_its_encoder(tmp_path: Path) -> None:
    folder = tmp_path / "new"
    code, out, err = run_cli(["memory", "add", "A hint.", "--question", "q", "--store", str(folder),
                              "--encoder", "hashing:32"])
    assert code == 0, err
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".new")]  # no copy left behind
    conn = sqlite3.connect(f"file:{folder / DB_NAME}?mode=ro", uri=True)
    try:
        assert get_meta(conn, "encoder") == "hashing:32"
    finally:
        conn.close()


def test_create_database_keeps_the_first_store_and_drops_a_late_copy(tmp_path: Path) -> None:
    db = tmp_path / "x.sqlite3"
    assert create_database(db, lambda conn: conn.execute("CREATE TABLE t (v TEXT)")) is True
    first = db.read_bytes()
    assert create_database(db, lambda conn: conn.execute("CREATE TABLE other (v TEXT)")) is False
    assert db.read_bytes() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.sqlite3"]


def test_create_database_without_hard_links_renames_into_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(src: Any, dst: Any) -> None:
        raise OSError(errno.EPERM, "hard links are not supported here")

    monkeypatch.setattr(os, "link", no_links)
    db = tmp_path / "x.sqlite3"
    assert create_database(db, lambda conn: conn.execute("CREATE TABLE t (v TEXT)")) is True
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 0
    finally:
        conn.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.sqlite3"]


def _create_and_add(folder: str, worker: int, start: Any) -> None:
    """One process: open (and so perhaps create) the store the moment the others do, then add hints."""
    start.wait(60)
    with MemoryStore(folder, encoder="hashing:64") as store:
        for i in range(HINTS_EACH):
            with store.write() as conn:
                insert_hint(conn, f"hint {worker}-{i}", 2, origin="test", hint_id=f"h{worker}-{i}")


def start_together(target: Callable[..., None], args: list[tuple[Any, ...]], *, timeout_s: float = 300) -> None:
    """Run `target(*a, start)` in one spawned process per `a`, all released by one `start` event
    once every process is up (so they race for real), and check that each exited 0."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=target, args=(*a, start)) for a in args]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(timeout_s)
    assert [p.exitcode for p in procs] == [0] * len(procs)


def test_processes_creating_one_store_at_once_all_use_it(tmp_path: Path) -> None:
    """Every opener either creates the store or finds it whole: none sees an empty file."""
    folder = tmp_path / "shared"
    start_together(_create_and_add, [(str(folder), w) for w in range(CREATORS)])
    with MemoryStore(folder, readonly=True) as store:
        assert store.counts()["hints"] == CREATORS * HINTS_EACH
        assert store.encoder_spec == "hashing:64"
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".new")]
