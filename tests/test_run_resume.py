"""Durable runs (issue 10, point 2): a `mapreduce run` killed half-way is finished by `runs resume`
with no finished batch asked again; run states from the journal; the journal holds no secret."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amapreduce.cli.app import main
from amapreduce.journal import JournalWriter
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.hedge import HedgePolicy
from amapreduce.llm.messages import message_text
from amapreduce.mapreduce.checkpoint import BatchAttempt
from amapreduce.session.journal import JOURNAL_KIND, JOURNAL_NAME, RunStarted, read_run_journal
from amapreduce.settings import load_settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, final_answer, tool_call
from tests.test_cli_mapreduce import per_atom_decision

ROWS, ANSWERED_BEFORE_KILL = 8, 3
SECRET = "sk-test-secret-never-journaled"


class GatedSubAgents:
    """Answers `code of itemNNN?` sub-questions; after `open_for` answers, holds every request
    until `release` is set (so a run can be killed with batches in flight). Counts asks per item."""

    def __init__(self, open_for: int) -> None:
        self.asked: Counter[str] = Counter()
        self.release = threading.Event()
        self._open_for = open_for
        self._lock = threading.Lock()

    def __call__(self, messages: list[Any], info: ModelInfo) -> Any:
        text = "\n".join(message_text(m) for m in messages).rsplit("Sub-questions:", 1)[-1]
        items = re.findall(r"code of (item\d{3})\?", text)
        with self._lock:
            self.asked.update(items)
            turn = sum(self.asked.values())
        if turn > self._open_for:
            self.release.wait(timeout=120)
        return final_answer(json.dumps([{"task": 1, "item": item, "code": item.upper()} for item in items]))


@pytest.fixture
def server() -> Iterator[tuple[OpenAICompatibleServer, GatedSubAgents]]:
    agents = GatedSubAgents(ANSWERED_BEFORE_KILL)
    with OpenAICompatibleServer(FunctionModel(agents, model_id="sim-model")) as srv:
        try:
            yield srv, agents
        finally:
            agents.release.set()


@contextlib.contextmanager
def killed_at_the_end(child: subprocess.Popen[bytes]) -> Iterator[None]:
    """SIGKILL `child` once the block (waiting for the instant to kill at) ends, and reap it; killed
    anyway if the block raised."""
    try:
        yield
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def wait_for(what: str, check: Any, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def done_batches(run_dir: Path) -> set[str]:
    saved = read_run_journal(run_dir)
    assert saved is not None
    return {e.batch_id for e in saved.entries if isinstance(e, BatchAttempt) and e.done}


def _start_and_stop(tmp_path: Path, base_url: str, sig: signal.Signals) -> Path:
    """Start `mapreduce run` in a subprocess, wait for ANSWERED_BEFORE_KILL finished batches, send `sig`."""
    runs = tmp_path / "runs"
    env = {**os.environ, "AMAPREDUCE_RUNS_DIR": str(runs), "OPENAI_API_KEY": SECRET}
    child = subprocess.Popen(
        [sys.executable, "-c", "from amapreduce.cli.app import run; run()", "mapreduce", "run",
         str(per_atom_decision(tmp_path, ROWS)), "--model", "sim-model", "--api-base", base_url, "--workers", "2",
         "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        run_dir = wait_for("the run directory", lambda: next((p for p in runs.glob("*") if (p / JOURNAL_NAME).is_file()), None))
        wait_for("finished batches", lambda: (run_dir / "journal.jsonl").read_bytes().count(b'"done":true') >= ANSWERED_BEFORE_KILL)
        child.send_signal(sig)
        child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return run_dir


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "ctrl-c"])
def test_a_stopped_run_is_resumed_without_asking_a_finished_batch_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    server: tuple[OpenAICompatibleServer, GatedSubAgents], sig: signal.Signals,
) -> None:
    srv, agents = server
    run_dir = _start_and_stop(tmp_path, srv.base_url, sig)
    runs = run_dir.parent
    done_before = done_batches(run_dir)
    assert ANSWERED_BEFORE_KILL <= len(done_before) < ROWS
    asked_before = Counter(agents.asked)
    if sig is signal.SIGKILL:
        assert not (run_dir / "result.json").exists()
        with (run_dir / JOURNAL_NAME).open("ab") as journal:  # a crash mid-write: a torn last line
            journal.write(b'{"type": "batch_attempt", "execution": 1, "batch_id": "batch-0')
    else:
        assert json.loads((run_dir / "result.json").read_text())["status"] == "stopped: interrupted"

    # The dead run is `interrupted`, and `runs show` tells how far it got.
    assert main(["runs", "list", "--runs-dir", str(runs), "--status", "interrupted", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["runs"]
    assert [r["run"] for r in listed] == [run_dir.name]
    assert listed[0]["progress"]["batches_done"] == len(done_before)
    assert main(["runs", "list", "--runs-dir", str(runs), "--status", "running", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == []
    assert main(["runs", "show", run_dir.name, "--runs-dir", str(runs)]) == 0
    assert f"batches: {len(done_before)}/{ROWS} done" in capsys.readouterr().out

    agents.release.set()
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("AMAPREDUCE_PATCH_ROUNDS", "0")  # ignored: the run's own settings are journaled defaults
    with allow_model_requests():
        code = main(["runs", "resume", run_dir.name, "--runs-dir", str(runs), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["status"] == "complete" and out["rows"] == ROWS and out["missing_cells"] == 0
    assert out["run_dir"] == str(run_dir)
    assert all(f"| item{i:03d} | ITEM{i:03d} |" in out["table_markdown"] for i in range(ROWS))
    # The server's counts: no finished batch was asked again; every other batch was asked.
    resumed = agents.asked - asked_before
    finished_items = {f"item{int(b.rsplit('-', 1)[1]) - 1:03d}" for b in done_before}
    assert not finished_items & set(resumed), resumed
    assert set(resumed) == {f"item{i:03d}" for i in range(ROWS)} - finished_items
    # Usage counts the killed part too: one request per batch in all (the in-flight ones re-asked).
    assert out["usage"]["requests"] == len(done_before) + sum(resumed.values())
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "complete" and record["completeness"]["attempts"] >= ROWS

    journal_text = (run_dir / JOURNAL_NAME).read_text()
    assert SECRET not in journal_text and SECRET not in (run_dir / "result.json").read_text()
    saved = read_run_journal(run_dir)
    assert saved is not None and saved.finished and saved.started.resumed
    assert main(["runs", "list", "--runs-dir", str(runs), "--status", "complete", "--json"]) == 0
    assert [r["run"] for r in json.loads(capsys.readouterr().out)["runs"]] == [run_dir.name]

    # Resuming a finished run changes nothing.
    assert main(["runs", "resume", str(run_dir)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "already finished (complete)" in captured.err


def test_a_run_killed_with_a_backup_in_flight_is_resumed_counting_each_batch_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    server: tuple[OpenAICompatibleServer, GatedSubAgents],
) -> None:
    """Issue 28: a straggler and its backup both in flight when the process is killed; neither
    was journaled, so the resumed run asks that batch once more and counts it once."""
    srv, agents = server
    rows = 6
    runs = tmp_path / "runs"
    # Four slots, six batches: three answer, three are held; a slot is free and nothing waits, so
    # the longest-held batch gets a backup (the cap allows one per batch here).
    env = {**os.environ, "AMAPREDUCE_RUNS_DIR": str(runs), "OPENAI_API_KEY": SECRET, "AMAPREDUCE_BACKUP_MAX_EXTRA": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", "from amapreduce.cli.app import run; run()", "mapreduce", "run",
         str(per_atom_decision(tmp_path, rows)), "--model", "sim-model", "--api-base", srv.base_url, "--workers", "4",
         "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    with killed_at_the_end(child):
        run_dir = wait_for("the run directory", lambda: next((p for p in runs.glob("*") if (p / JOURNAL_NAME).is_file()), None))
        backed_up = wait_for("a backup in flight", lambda: [item for item, n in agents.asked.items() if n > 1])
    done_before = done_batches(run_dir)
    assert len(done_before) == ANSWERED_BEFORE_KILL
    held = f"batch-{int(backed_up[0][4:]) + 1:03d}"
    assert held not in done_before
    asked_before = Counter(agents.asked)

    agents.release.set()
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    with allow_model_requests():
        code = main(["runs", "resume", run_dir.name, "--runs-dir", str(runs), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["status"] == "complete" and out["rows"] == rows and out["missing_cells"] == 0
    assert all(out["table_markdown"].count(f"| item{i:03d} |") == 1 for i in range(rows))
    resumed = agents.asked - asked_before
    assert resumed[backed_up[0]] == 1  # the killed straggler's batch: asked once more, not twice
    saved = read_run_journal(run_dir)
    assert saved is not None
    done = Counter(e.batch_id for e in saved.entries if isinstance(e, BatchAttempt) and e.done)
    assert done == dict.fromkeys((f"batch-{i:03d}" for i in range(1, rows + 1)), 1)
    # Usage: the journaled answers and the resumed ones; the killed attempts never answered.
    assert out["usage"]["requests"] == len(done_before) + sum(resumed.values())


def test_a_run_killed_with_a_hedged_call_in_flight_is_resumed_counting_each_batch_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 28: late model calls and their hedges (`llm.hedge`) in flight when the process is
    killed; none was journaled, so the resumed run asks those batches once more, their rows and
    usage count once, and no journaled batch is asked again.

    Deterministic without a clock: the hedger trusts its lateness threshold after `min_samples`
    finished calls, so the server answers exactly that many asks and holds every later one. The
    two held calls then turn late (any run time past the threshold) and are hedged, and their
    hedges, held too, are hedged once more (`HedgePolicy.max_hedges`); the same request asked
    again is a hedge. Batches still wait for a slot, so no batch backup starts
    (`mapreduce.backup`: only when a slot is free and nothing waits); the trace shows none."""
    answered, copies = HedgePolicy().min_samples, 1 + HedgePolicy().max_hedges
    rows, workers = answered + 4, 2  # two batches held in flight, two waiting for a slot
    agents = GatedSubAgents(answered)
    runs = tmp_path / "runs"
    # Room for a hedge of each held call whatever the default share (`AMAPREDUCE_BACKUP_MAX_EXTRA`).
    env = {**os.environ, "AMAPREDUCE_RUNS_DIR": str(runs), "OPENAI_API_KEY": SECRET, "AMAPREDUCE_BACKUP": "auto",
           "AMAPREDUCE_BACKUP_MAX_EXTRA": "1"}
    with OpenAICompatibleServer(FunctionModel(agents, model_id="sim-model")) as srv:
        try:
            child = subprocess.Popen(
                [sys.executable, "-c", "from amapreduce.cli.app import run; run()", "mapreduce", "run",
                 str(per_atom_decision(tmp_path, rows)), "--model", "sim-model", "--api-base", srv.base_url,
                 "--workers", str(workers), "--json"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )
            with killed_at_the_end(child):
                run_dir = wait_for("the run directory",
                                   lambda: next((p for p in runs.glob("*") if (p / JOURNAL_NAME).is_file()), None))
                # Both held calls hedged as often as a call may be, waiting batches get no slot: the
                # killed process can ask nothing more, so the server's counts are final at the kill.
                hedged = wait_for("every hedge of each held call in flight",
                                  lambda: sorted(item for item, n in list(agents.asked.items()) if n > 1)
                                  if sum(agents.asked.values()) == answered + copies * workers else None)
                wait_for("the answered batches journaled", lambda: len(done_batches(run_dir)) == answered)
            trace = [json.loads(line) for line in (run_dir / "trace.jsonl").read_text().splitlines() if line]
            assert not [e for e in trace if e["event"] == "backup_start"]  # the second ask was the hedge
            assert not [e for e in trace if e["event"] == "model_hedge"]  # undecided: it was in flight
            done_before = done_batches(run_dir)
            assert len(done_before) == answered
            hedged_batches = {f"batch-{int(item[4:]) + 1:03d}" for item in hedged}
            assert len(hedged) == workers and not hedged_batches & done_before
            asked_before = Counter(agents.asked)
            assert all(asked_before[item] == copies for item in hedged)  # each call and its hedges, held when it died

            agents.release.set()
            monkeypatch.setenv("OPENAI_API_KEY", SECRET)
            with allow_model_requests():
                code = main(["runs", "resume", run_dir.name, "--runs-dir", str(runs), "--json"])
        finally:
            agents.release.set()
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["status"] == "complete" and out["rows"] == rows and out["missing_cells"] == 0
    # Rows: each batch's row once, in the table and its CSV.
    with (run_dir / "table.csv").open(newline="", encoding="utf-8") as table:
        items = Counter(row["item"] for row in csv.DictReader(table))
    assert items == dict.fromkeys((f"item{i:03d}" for i in range(rows)), 1)
    assert all(out["table_markdown"].count(f"| item{i:03d} |") == 1 for i in range(rows))
    # The resumed run asked each unfinished batch once (the hedged one too) and no journaled one.
    resumed = agents.asked - asked_before
    finished_items = {f"item{int(b.rsplit('-', 1)[1]) - 1:03d}" for b in done_before}
    assert resumed == dict.fromkeys({f"item{i:03d}" for i in range(rows)} - finished_items, 1)
    assert all(resumed[item] == 1 for item in hedged)
    # The journal counts each batch done once; usage and completeness count the hedged batch once.
    saved = read_run_journal(run_dir)
    assert saved is not None and saved.finished
    done = Counter(e.batch_id for e in saved.entries if isinstance(e, BatchAttempt) and e.done)
    assert done == dict.fromkeys((f"batch-{i:03d}" for i in range(1, rows + 1)), 1)
    assert out["usage"]["requests"] == len(done_before) + sum(resumed.values()) == rows
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "complete" and record["completeness"]["rows"] == rows
    assert record["usage"]["total"]["requests"] == rows


def test_a_run_whose_process_lives_is_running_and_cannot_be_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "runs" / "20250101-000000-live"
    with JournalWriter(run_dir / JOURNAL_NAME, kind=JOURNAL_KIND) as journal:  # this test process runs it
        journal.append(RunStarted.now(command="mapreduce_run", query="live", settings=load_settings({})))
    assert main(["runs", "list", "--runs-dir", str(tmp_path / "runs"), "--status", "running", "--json"]) == 0
    assert [r["run"] for r in json.loads(capsys.readouterr().out)["runs"]] == [run_dir.name]
    assert main(["runs", "list", "--runs-dir", str(tmp_path / "runs"), "--status", "interrupted", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == []
    assert main(["runs", "show", str(run_dir)]) == 0
    assert "status: running" in capsys.readouterr().out
    assert main(["runs", "resume", str(run_dir)]) == 2
    assert "is still running" in capsys.readouterr().err


def test_a_dead_pid_is_interrupted_even_when_reused(tmp_path: Path) -> None:
    """A journal whose process start time differs from the live pid's is a dead run (pid reuse)."""
    run_dir = tmp_path / "run"
    started = RunStarted.now(command="mapreduce_run", query="q", settings=load_settings({}))
    reused = started.model_copy(update={"process": started.process.model_copy(update={"start_ticks": -1})})
    with JournalWriter(run_dir / JOURNAL_NAME, kind=JOURNAL_KIND) as journal:
        journal.append(reused)
    saved = read_run_journal(run_dir)
    assert saved is not None and saved.status() == "interrupted"


def test_resume_of_a_folder_without_a_journal_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "old-run").mkdir()
    assert main(["runs", "resume", str(tmp_path / "old-run")]) == 2
    err = capsys.readouterr().err
    assert "has no journal.jsonl" in err and len(err.strip().splitlines()) == 1
    assert main(["runs", "list", "--runs-dir", str(tmp_path), "--status", "bogus"]) == 2


class GatedManagerAndSubAgents(GatedSubAgents):
    """Also plays the manager: it executes the per-item decision (after the plan stage) and would
    then finish; the sub-agents are gated as in `GatedSubAgents`."""

    def __init__(self, open_for: int, decision: dict[str, Any]) -> None:
        super().__init__(open_for)
        self.decision = decision
        self.manager_calls = 0

    def __call__(self, messages: list[Any], info: ModelInfo) -> Any:
        if "mapreduce" not in info.tools:
            return super().__call__(messages, info)
        self.manager_calls += 1
        if '"call_stage": "execute"' in "\n".join(message_text(m) for m in messages):
            return final_answer("The table is complete.")
        return tool_call("mapreduce", **self.decision)  # the plan stage, then the same call executes


def test_a_killed_ask_is_resumed_from_the_managers_decision_without_asking_the_manager_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    decision = json.loads(per_atom_decision(tmp_path, ROWS).read_text(encoding="utf-8"))
    agents = GatedManagerAndSubAgents(ANSWERED_BEFORE_KILL, decision)
    runs = tmp_path / "runs"
    env = {**os.environ, "AMAPREDUCE_RUNS_DIR": str(runs), "AMAPREDUCE_EXTRACTION_MODEL": "none"}
    with OpenAICompatibleServer(FunctionModel(agents, model_id="sim-model")) as srv:
        try:
            child = subprocess.Popen(
                [sys.executable, "-c", "from amapreduce.cli.app import run; run()", "ask", "What is the code of each item?",
                 "--model", "sim-model", "--api-base", srv.base_url, "--workers", "2", "--no-memory", "--json"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )
            with killed_at_the_end(child):
                run_dir = wait_for("the run directory", lambda: next(iter(runs.glob("*")), None))
                wait_for("finished batches", lambda: (run_dir / JOURNAL_NAME).is_file()
                          and (run_dir / JOURNAL_NAME).read_bytes().count(b'"done":true') >= ANSWERED_BEFORE_KILL)
            done_before = done_batches(run_dir)
            asked_before, manager_calls_before = Counter(agents.asked), agents.manager_calls
            agents.release.set()
            monkeypatch.setenv("AMAPREDUCE_EXTRACTION_MODEL", "none")
            with allow_model_requests():
                code = main(["runs", "resume", run_dir.name, "--runs-dir", str(runs), "--json"])
        finally:
            agents.release.set()
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["status"] == "complete" and out["rows"] == ROWS and out["query"] == "What is the code of each item?"
    assert all(f"| item{i:03d} | ITEM{i:03d} |" in out["table_markdown"] for i in range(ROWS))
    assert agents.manager_calls == manager_calls_before  # no scouting, no new decision: the saved one ran
    resumed = agents.asked - asked_before
    finished_items = {f"item{int(b.rsplit('-', 1)[1]) - 1:03d}" for b in done_before}
    assert finished_items and not finished_items & set(resumed), resumed
    record = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    assert record["kind"] == "ask" and record["status"] == "complete" and len(record["decisions"]) == 1


def test_an_ask_killed_before_any_decision_cannot_be_resumed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "runs" / "20260101-000000-q"
    run_dir.mkdir(parents=True)
    with JournalWriter(run_dir / JOURNAL_NAME, kind=JOURNAL_KIND) as journal:
        started = RunStarted.now(command="ask", query="q", settings=load_settings({}))
        journal.append(started.model_copy(update={"process": started.process.model_copy(update={"pid": 2**22 + 1})}))
    assert main(["runs", "resume", str(run_dir)]) == 2
    assert "before the manager executed a decision" in capsys.readouterr().err
