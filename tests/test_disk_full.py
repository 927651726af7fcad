"""A full disk is an error, not a traceback (issue 29, point 1).

Each command runs in a child process whose runs folder, cache and memory store sit on a small
tmpfs of its own: a user and mount namespace (`unshare --user --map-root-user --mount`) mounts it
where only that child sees it, so nothing on the machine is touched. The disk is either full
before the command starts (0 bytes free) or fills while it runs. Afterwards the tmpfs is copied
out (a run "moved to a disk with space") and checked: one error line, no traceback, nothing left
unreadable, and a run that hit the full disk resumes.

Where the machine has no unprivileged user namespaces the tmpfs cases are skipped; the in-process
cases below them (a simulated ENOSPC) run everywhere.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amapreduce.cli.app import main
from amapreduce.journal import JournalWriter, read_journal
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.session.journal import read_run_journal
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, final_answer
from amapreduce.trace import TraceWriter, read_trace
from tests.sessions import manager_then_subagents

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-disk-full-test-key"


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs \"$d\" && umount \"$d\"; rc=$?; rmdir \"$d\"; exit $rc"],
                           capture_output=True, check=False)
    return probe.returncode == 0


_NO_TMPFS = not _namespaces_work()


def tmpfs(test: Any) -> Any:
    """A test on a private tmpfs: slow (a child process per command), skipped where none can be mounted."""
    return pytest.mark.slow(pytest.mark.skipif(_NO_TMPFS, reason="no unprivileged user+mount namespaces "
                                                                   "for a private tmpfs")(test))

_SCRIPT = """
set -u
mount -t tmpfs -o size="$DISK_SIZE" tmpfs "$DISK" || exit 99
mkdir -p "$DISK/cache"
if [ -n "${SETUP:-}" ]; then cp -a "$SETUP/." "$DISK/"; fi
if [ "$FILL" = yes ]; then cat /dev/zero > "$DISK/filler" 2>/dev/null; fi
"$@"
rc=$?
rm -f "$DISK/filler"
cp -a "$DISK/." "$OUT/"
exit $rc
"""


def on_small_disk(tmp_path: Path, args: list[str], *, size: str, full: bool = False, setup: Path | None = None,
                  env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run `amapreduce ARGS` with its runs folder, cache and memory store on a private tmpfs of
    `size` (`full`: filled to 0 bytes free first; `setup`: copied onto it first). Returns the
    process and a copy of the disk afterwards (paths inside name the tmpfs mount `tmp_path/disk`)."""
    disk, out = tmp_path / "disk", tmp_path / "after"
    disk.mkdir()
    out.mkdir()
    child_env = {**os.environ, "PYTHONPATH": str(REPO), "DISK": str(disk), "OUT": str(out), "DISK_SIZE": size,
                 "FILL": "yes" if full else "no", "SETUP": str(setup or ""), "AMAPREDUCE_RUNS_DIR": str(disk / "runs"),
                 "AMAPREDUCE_CACHE_DIR": str(disk / "cache"), "AMAPREDUCE_MEMORY_STORE": str(disk / "memory"),
                 "OPENAI_API_KEY": KEY, **(env or {})}
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", _SCRIPT, "sh",
                           sys.executable, "-m", "amapreduce", *args],
                          env=child_env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 99, proc.stderr
    return proc, out


def assert_one_error_line(proc: subprocess.CompletedProcess[str], *, naming: str) -> str:
    """Exit 1, no traceback, and exactly one `error:` line on stderr that names `naming`."""
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert naming in errors[0], errors[0]
    return errors[0]


def assert_nothing_unreadable(folder: Path) -> None:
    """Every journal under `folder` has its header; every run folder reads (`runs list` marks none unreadable)."""
    for journal in folder.rglob("journal.jsonl"):
        assert journal.stat().st_size > 0, f"{journal} is empty"
        assert read_run_journal(journal.parent) is not None
    runs = folder / "runs"
    if runs.is_dir():
        from amapreduce.session.rundir import list_runs

        for row in list_runs(runs):
            assert not str(row["status"]).startswith("unreadable"), row
    for db in folder.rglob("memory.sqlite3"):
        import sqlite3

        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def padded_agents(pad: int) -> Any:
    """Sub-agents that answer `code of itemNNN?` with a `pad`-character code: big replies fill a small disk fast."""

    def answer(messages: list[Any], info: ModelInfo) -> Any:
        text = "\n".join(message_text(m) for m in messages).rsplit("Sub-questions:", 1)[-1]
        items = re.findall(r"code of (item\d{3})\?", text)
        return final_answer(json.dumps([{"task": 1, "item": i, "code": i.upper() + " " + "x" * pad} for i in items]))

    return answer


@pytest.fixture
def big_replies() -> Iterator[OpenAICompatibleServer]:
    with OpenAICompatibleServer(FunctionModel(padded_agents(20_000), model_id="sim-model")) as server:
        yield server


def decision_file(tmp_path: Path, rows: int = 8) -> Path:
    path = tmp_path / "decision.json"
    path.write_text(json.dumps({
        "task_matrix": [[f"item{i:03d}"] for i in range(rows)], "template": "What is the code of __0__?",
        "json_schema": {"type": "object", "properties": {"item": {}, "code": {"description": "the item's code"}}},
        "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
    }), encoding="utf-8")
    return path


@tmpfs
@pytest.mark.parametrize("full", [True, False], ids=["0-bytes-free", "fills-while-running"])
def test_memory_add_on_a_full_disk(tmp_path: Path, full: bool) -> None:
    proc, after = on_small_disk(tmp_path, ["memory", "add", "a hint " + "y" * (0 if full else 100_000),
                                           "--question", "q?", "--encoder", "hashing"],
                                size="1m" if full else "160k", full=full)
    line = assert_one_error_line(proc, naming=str(tmp_path / "disk" / "memory"))
    assert "Free space" in line
    assert_nothing_unreadable(after)


@tmpfs
def test_mapreduce_run_that_fills_the_disk_resumes_on_a_disk_with_space(
        tmp_path: Path, big_replies: OpenAICompatibleServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    proc, after = on_small_disk(tmp_path, ["mapreduce", "run", str(decision_file(tmp_path)), "--model", "sim-model",
                                           "--api-base", big_replies.base_url, "--workers", "1"], size="300k")
    line = assert_one_error_line(proc, naming=str(tmp_path / "disk" / "runs"))
    assert "runs resume" in line
    assert_nothing_unreadable(after)
    (run,) = (after / "runs").iterdir()
    if (run / "result.json").exists():  # written when the full disk still had a page for it
        result = json.loads((run / "result.json").read_text(encoding="utf-8"))
        assert result["status"].startswith("failed") and "No space left" in result["error"]
    # Space is back (the run was copied to a disk with room): `runs resume` finishes it.
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(after / "runs"))
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with allow_model_requests():
        code = main(["runs", "resume", str(run), "--json"])
    finished = json.loads(capsys.readouterr().out)
    assert code == 0, finished["completeness"]
    assert finished["status"] == "complete" and finished["rows"] == 8


@tmpfs
def test_mapreduce_run_with_0_bytes_free_leaves_no_run_folder(tmp_path: Path, big_replies: OpenAICompatibleServer) -> None:
    proc, after = on_small_disk(tmp_path, ["mapreduce", "run", str(decision_file(tmp_path)), "--model", "sim-model",
                                           "--api-base", big_replies.base_url], size="1m", full=True)
    assert "no run was started" in assert_one_error_line(proc, naming=str(tmp_path / "disk" / "runs"))
    assert not any((after / "runs").iterdir())
    assert_nothing_unreadable(after)


@tmpfs
@pytest.mark.parametrize("full", [True, False], ids=["0-bytes-free", "fills-while-running"])
def test_demo_on_a_full_disk(tmp_path: Path, full: bool) -> None:
    proc, after = on_small_disk(tmp_path, ["demo"], size="1m" if full else "520k", full=full)
    assert_one_error_line(proc, naming=str(tmp_path / "disk"))
    assert_nothing_unreadable(after)


@tmpfs
def test_ask_with_a_memory_on_a_full_disk(tmp_path: Path) -> None:
    store = tmp_path / "setup" / "memory"
    assert main(["memory", "add", "Look each item up on its own page.", "--question", "q?", "--store", str(store),
                 "--encoder", "hashing"]) == 0
    decision = json.loads(decision_file(tmp_path, rows=2).read_text(encoding="utf-8"))
    play = manager_then_subagents(decision, lambda text: [{"item": i, "code": i.upper()}
                                                          for i in re.findall(r"item\d{3}", text)])
    with OpenAICompatibleServer(FunctionModel(play, model_id="sim-model")) as server:
        proc, after = on_small_disk(tmp_path, ["ask", "What is the code of each item?", "--memory",
                                               str(tmp_path / "disk" / "memory"), "--model", "sim-model",
                                               "--api-base", server.base_url], size="1m", full=True,
                                    setup=tmp_path / "setup")
    assert_one_error_line(proc, naming=str(tmp_path / "disk"))
    assert_nothing_unreadable(after)


# In-process, everywhere: a simulated ENOSPC at the writers themselves.


def _enospc(*_: object, **__: object) -> Any:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_journal_is_never_created_without_its_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "journal.jsonl"
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(OSError, match="No space left") as caught:
        JournalWriter(path, kind="run")
    assert str(path) in str(caught.value)
    assert not path.exists() and list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    with JournalWriter(path, kind="run"):
        pass
    assert read_journal(path, (), kind="run")[1] == []


def test_a_trace_that_fills_the_disk_keeps_whole_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = TraceWriter(tmp_path / "trace.jsonl")
    trace.write("first", n=1)
    real_write = os.write

    def half_then_full(fd: int, data: Any) -> int:
        monkeypatch.setattr(os, "write", _enospc)
        return real_write(fd, bytes(data)[: len(data) // 2])

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="ENOSPC") as caught:
        trace.write("second", text="z" * 1000)
    assert caught.value.errno == errno.ENOSPC and str(tmp_path / "trace.jsonl") in str(caught.value)
    monkeypatch.undo()
    trace.write("third", n=3)
    trace.close()
    assert [e["event"] for e in read_trace(tmp_path / "trace.jsonl")] == ["first", "third"]


@pytest.mark.parametrize(("number", "code"), [(errno.ENOSPC, 1), (errno.EIO, 1), (errno.EACCES, 2), (errno.EROFS, 2)])
def test_an_os_error_reaching_the_cli_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str], number: int, code: int) -> None:
    import amapreduce.memory.store as store_module

    def refuse(*_: object, **__: object) -> Any:
        raise OSError(number, os.strerror(number), str(tmp_path / "m"))

    monkeypatch.setattr(store_module, "connect", refuse)
    assert main(["memory", "add", "hint", "--store", str(tmp_path / "m"), "--encoder", "hashing"]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and str(tmp_path / "m") in err
    assert errno.errorcode[number] in err


def test_a_run_whose_trace_hits_enospc_says_so_in_result_json_and_resumes(
        tmp_path: Path, big_replies: OpenAICompatibleServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The trace's disk fills after a few lines; `result.json` (another disk page) can still be written."""
    real_append = TraceWriter._append
    lines = [0]

    def append(self: TraceWriter, fd: int, data: bytes) -> None:
        lines[0] += 1
        if lines[0] > 6:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_append(self, fd, data)

    monkeypatch.setattr(TraceWriter, "_append", append)
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with allow_model_requests():
        code = main(["mapreduce", "run", str(decision_file(tmp_path)), "--model", "sim-model", "--api-base",
                     big_replies.base_url, "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("error:") == 1 and "Traceback" not in err
    (run,) = (tmp_path / "runs").iterdir()
    assert "runs resume" in err and str(run) in err
    result = json.loads((run / "result.json").read_text(encoding="utf-8"))
    assert result["status"].startswith("failed") and "No space left on device (ENOSPC)" in result["error"]
    assert result["error_type"] == "StorageError"
    monkeypatch.setattr(TraceWriter, "_append", real_append)
    with allow_model_requests():
        assert main(["runs", "resume", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "complete"
