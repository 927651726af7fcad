"""The append-only journal: typed entries, every line on disk before `append` returns, crash-tolerant reading."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Literal

import pytest

from amapreduce.errors import UserError
from amapreduce.journal import FORMAT, VERSION, JournalEntry, JournalHeader, JournalWriter, read_journal


class BatchDone(JournalEntry):
    type: Literal["batch_done"] = "batch_done"
    batch_id: str
    rows: list[dict[str, str]] = []


class Note(JournalEntry):
    type: Literal["note"] = "note"
    text: str


ENTRIES = (BatchDone, Note)


def test_entries_round_trip_in_order_after_the_header(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    with JournalWriter(path, kind="run") as journal:
        journal.append(BatchDone(batch_id="b1", rows=[{"country": "Peru"}]))
        journal.append(Note(text="half way"))
    header, entries = read_journal(path, ENTRIES, kind="run")
    assert header == JournalHeader(kind="run") and (header.format, header.version) == (FORMAT, VERSION)
    assert entries == [BatchDone(batch_id="b1", rows=[{"country": "Peru"}]), Note(text="half way")]
    assert path.read_text(encoding="utf-8").count("\n") == 3  # one line each, header included


def test_every_append_is_fsynced_before_it_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    with JournalWriter(tmp_path / "j.jsonl", kind="run") as journal:
        assert len(synced) == 1  # the header
        journal.append(Note(text="x"))
        assert len(synced) == 2


def test_a_torn_last_line_is_ignored_and_cut_off_before_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with JournalWriter(path, kind="run") as journal:
        journal.append(BatchDone(batch_id="b1"))
    with path.open("ab") as handle:
        handle.write(b'{"type": "batch_done", "batch_id": "b2", "ro')  # a crash mid-write
    assert read_journal(path, ENTRIES, kind="run")[1] == [BatchDone(batch_id="b1")]
    with JournalWriter(path, kind="run") as journal:  # the resumed run appends after the last whole line
        journal.append(BatchDone(batch_id="b2"))
    assert read_journal(path, ENTRIES, kind="run")[1] == [BatchDone(batch_id="b1"), BatchDone(batch_id="b2")]


def test_a_torn_header_is_a_fresh_journal(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"type": "jour')
    with pytest.raises(UserError, match="is empty"):
        read_journal(path, ENTRIES, kind="run")
    with JournalWriter(path, kind="run") as journal:
        journal.append(Note(text="first"))
    assert read_journal(path, ENTRIES, kind="run")[1] == [Note(text="first")]


@pytest.mark.parametrize(("line", "message"), [
    (b"not json", "line 3 is not valid JSON"),
    (b'{"type": "mystery"}', "line 3 has unknown entry type 'mystery'"),
    (b'{"type": "note"}', "line 3: invalid 'note' entry: text: Field required"),
    (b'{"type": "note", "text": "x", "extra": 1}', "line 3: invalid 'note' entry: extra: Extra inputs"),
])
def test_a_damaged_line_before_the_end_is_reported_with_its_number(tmp_path: Path, line: bytes, message: str) -> None:
    path = tmp_path / "j.jsonl"
    with JournalWriter(path, kind="run") as journal:
        journal.append(Note(text="ok"))
    with path.open("ab") as handle:
        handle.write(line + b"\n" + Note(text="after").model_dump_json().encode() + b"\n")
    with pytest.raises(UserError, match=message):
        read_journal(path, ENTRIES, kind="run")


def test_a_journal_of_another_kind_or_a_newer_version_or_no_journal_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    JournalWriter(path, kind="eval").close()
    with pytest.raises(UserError, match="is a 'eval' journal, not a 'run' one"):
        read_journal(path, ENTRIES, kind="run")
    with pytest.raises(UserError, match="is a 'eval' journal, not a 'run' one"):
        JournalWriter(path, kind="run")
    newer = tmp_path / "newer.jsonl"
    newer.write_text(JournalHeader(kind="run", version=VERSION + 1).model_dump_json() + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=f"format version {VERSION + 1}"):
        read_journal(newer, ENTRIES, kind="run")
    other = tmp_path / "other.jsonl"
    other.write_text('{"hello": 1}\n', encoding="utf-8")
    with pytest.raises(UserError, match="is not an amapreduce journal"):
        JournalWriter(other, kind="run")
    with pytest.raises(UserError, match="cannot read journal"):
        read_journal(tmp_path / "missing.jsonl", ENTRIES, kind="run")


def test_concurrent_appends_never_interleave_lines(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    start = threading.Barrier(8)

    def worker(journal: JournalWriter, n: int) -> None:
        start.wait()
        for i in range(50):
            journal.append(BatchDone(batch_id=f"w{n}-{i}", rows=[{"v": "x" * 500}]))

    with JournalWriter(path, kind="run") as journal:
        threads = [threading.Thread(target=worker, args=(journal, n)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    entries = read_journal(path, ENTRIES, kind="run")[1]
    assert sorted(e.batch_id for e in entries if isinstance(e, BatchDone)) == sorted(
        f"w{n}-{i}" for n in range(8) for i in range(50)
    )


_CHILD = """
import sys
from typing import Literal
from amapreduce.journal import JournalEntry, JournalWriter

class BatchDone(JournalEntry):
    type: Literal["batch_done"] = "batch_done"
    batch_id: str
    rows: list[dict[str, str]] = []

journal = JournalWriter(sys.argv[1], kind="run")
i = 0
while True:
    journal.append(BatchDone(batch_id=f"b{i}", rows=[{"v": "x" * 2000}]))
    if i == 20:
        print("ready", flush=True)
    i += 1
"""


def test_a_process_killed_mid_run_leaves_a_readable_journal_of_whole_entries(tmp_path: Path) -> None:
    """SIGKILL while appending: every entry read back is whole and in order, and appending continues."""
    path = tmp_path / "j.jsonl"
    with subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
    entries = read_journal(path, ENTRIES, kind="run")[1]
    assert len(entries) > 20
    assert [e.batch_id for e in entries if isinstance(e, BatchDone)] == [f"b{i}" for i in range(len(entries))]
    with JournalWriter(path, kind="run") as journal:
        journal.append(Note(text="resumed"))
    assert read_journal(path, ENTRIES, kind="run")[1][-1] == Note(text="resumed")
