"""A commit is one unit of work, resumable at any instant (issue 29, point 2).

`eval run --benchmark sandbox` is killed with SIGKILL at four instants — between a commit and the
distillation it made due, half-way through that distillation (its first operations applied), after
it but before the evaluation journaled the commit, and after a trial was journaled but before its
instance was committed — then resumed. Each resumed
evaluation must end with exactly what an uninterrupted one has: `results.json` (scores, utilities,
sub-agents, model calls), `memory_log.jsonl`, and the memory (records with their labels, hints with
their weights), modulo random ids and wall times.

The kills come from a wrapper script that patches the functions at those instants in the child
process (as `test_eval_run` does), so the production code has no test hook.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from amapreduce.cli.app import main

pytestmark = pytest.mark.slow  # five sandbox evaluations

LIMIT = "4"  # the sandbox distils at its 3rd record (refine+merge); task 4 plans with the hint it made
ARGS = ["eval", "run", "--benchmark", "sandbox", "--limit", LIMIT, "--trials", "1", "--encoder", "hashing", "--json"]

KILLER = r"""
import os, signal, sys
from amapreduce import journal
from amapreduce.memory import core, update

mode = sys.argv[1]

def kill():
    os.kill(os.getpid(), signal.SIGKILL)

if mode == "trial":  # the 2nd trial is journaled; its instance is not committed yet
    original_append = journal.JournalWriter.append
    seen = [0]
    def append(self, entry):
        original_append(self, entry)
        if getattr(entry, "type", "") == "trial_done":
            seen[0] += 1
            if seen[0] == 2:
                kill()
    journal.JournalWriter.append = append
elif mode == "due":  # the store committed a record that made a distillation due; it has not run
    original_record = update.record_outcome
    def record_outcome(*args, **kwargs):
        result = original_record(*args, **kwargs)
        if result.distill:
            kill()
        return result
    update.record_outcome = record_outcome
    core.record_outcome = record_outcome
elif mode == "mid-distill":  # the distillation applied its first operations; the model has more to answer
    import importlib
    steps = importlib.import_module("amapreduce.memory.distill")
    original_apply = steps._apply
    def apply(*args, **kwargs):
        original_apply(*args, **kwargs)
        kill()
    steps._apply = apply
else:  # "distilled": the distillation ran; the evaluation has not journaled the commit
    original_distill = core.ExperientialMemory.distill
    def distill(self, **kwargs):
        report = original_distill(self, **kwargs)
        kill()
        return report
    core.ExperientialMemory.distill = distill
from amapreduce.cli.app import main
sys.exit(main(sys.argv[2:]))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")}
    env["AMAPREDUCE_ENV_FILE"] = os.devnull
    return env


def _results(out: Path) -> dict[str, Any]:
    """`results.json` without what differs between any two runs (wall times, run folders, its folder)."""
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    data["summary"].pop("wall_s_per_task")
    data["memory"].pop("store")
    for trials in data["per_task"].values():
        for trial in trials:
            trial.pop("wall_s")
            trial.pop("run_dir")
    return data


def _memory(out: Path) -> dict[str, Any]:
    """The memory's records (task, label) in order, and its hints (text, weight) by text."""
    from amapreduce.memory import MemoryStore

    with MemoryStore(out / "memory", readonly=True) as store, store.read() as conn:
        records = [tuple(r) for r in conn.execute("SELECT task_id, label FROM records ORDER BY rowid")]
        hints = sorted((r[0], int(r[1])) for r in conn.execute("SELECT text, w FROM hints"))
        pending = conn.execute(
            "SELECT count(*) FROM events d WHERE d.kind = 'distill_due' AND NOT EXISTS (SELECT 1 FROM events e "
            "WHERE e.kind = 'distill_done' AND e.record_id = d.record_id)").fetchone()[0]
    return {"records": records, "hints": hints, "pending_distillations": pending}


def _memory_log(out: Path) -> list[dict[str, Any]]:
    """`memory_log.jsonl` with hint ids replaced by their position (ids are random per run)."""
    lines = [json.loads(line) for line in (out / "memory_log.jsonl").read_text(encoding="utf-8").splitlines()]
    for line in lines:
        line.pop("record_id", None)
        line["prior_hints"] = [{k: v for k, v in h.items() if k != "id"} for h in line["prior_hints"]]
    return lines


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "ev"
    proc = subprocess.run([sys.executable, "-m", "amapreduce", *ARGS, "--out", str(out)], env=_env(),
                          cwd=out.parent, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _memory(out)["hints"], "the uninterrupted run must have distilled hints for the comparison to matter"
    return out


@pytest.mark.parametrize("mode", ["due", "mid-distill", "distilled", "trial"])
def test_an_evaluation_killed_and_resumed_ends_as_an_uninterrupted_one(
        mode: str, uninterrupted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ev"
    proc = subprocess.run([sys.executable, "-c", KILLER, mode, *ARGS, "--out", str(out)], env=_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert not (out / "results.json").exists()
    if mode in ("due", "mid-distill"):  # the kill left the distillation pending in the store
        assert _memory(out)["pending_distillations"] == 1
    if mode == "mid-distill":  # ... half done: a hint it added is there
        assert _memory(out)["hints"]
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith("AMAPREDUCE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AMAPREDUCE_ENV_FILE", os.devnull)
    assert main(["eval", "run", "--resume", str(out), "--json"]) == 0
    capsys.readouterr()
    assert _results(out) == _results(uninterrupted)
    assert _memory(out) == {**_memory(uninterrupted), "pending_distillations": 0}
    assert _memory_log(out) == _memory_log(uninterrupted)
