"""`eval run --executor ray`: the trials as Ray tasks give the evaluation a local run gives, draw on
one budget across the cluster, and stop (the budget, Ctrl-C) keeping what had finished.

The Ray run happens in a child process that starts a local Ray itself (`ray.init(num_cpus=2)`), as a
user's script would, and then runs the command line there: the test process keeps its sockets to
loopback (pytest-socket) and Ray's workers are the child's. Both runs use the simulated model
(deterministic code, not an LLM), the sandbox corpus and the hashing encoder, with one sub-agent at
a time so each trial's engine runs in one order.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from amapreduce.cli.app import main
from amapreduce.errors import RunError, UserError

IDS = "sbx_en_001,sbx_en_005,sbx_en_002,sbx_en_003,sbx_en_004"
"""Two instances at a time (`--tasks-parallel 2`): the third reads the first's record, the third
commit distils a hint, and the fifth, which starts once it is committed, is shown (and credits) it."""
ARGS = ["--benchmark", "sandbox", "--ids", IDS, "--trials", "2", "--encoder", "hashing", "--workers", "1",
        "--tasks-parallel", "2", "--json"]
PER_PROCESS = {"wall_s", "run_dir"}
"""Facts that differ between any two runs, two local ones included: the run folder's timestamped name
and the wall time. (Prompt tokens, and the utility that charges them, are the same: the simulated
model's tool-call ids have a fixed width, `testing.scripted`.)"""
PER_EVALUATION = {"record_id", "utility"}
"""Memory-log fields that differ by design: the record id is derived from the evaluation's id."""

RAY_DRIVER = r"""
import json, os, sys
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
from amapreduce.cli.app import main
codes = [main(["eval", "run", *sys.argv[1:]])]
out = sys.argv[sys.argv.index("--out") + 1]
codes.append(main(["eval", "run", "--resume", out, "--executor", "ray", "--json"]))
print(json.dumps({"codes": codes, "pid": os.getpid()}))
ray.shutdown()
"""


RAY_KILLED = r"""
import os, signal, sys
import ray
from amapreduce import journal

ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
after, seen = int(sys.argv[1]), []
original = journal.JournalWriter.append
def append(self, entry):
    original(self, entry)
    if getattr(entry, "type", "") == "trial_done":
        seen.append(entry)
        if len(seen) == after:
            os.kill(os.getpid(), signal.SIGKILL)  # Ray stops its own processes when its driver dies
journal.JournalWriter.append = append
from amapreduce.cli.app import main
sys.exit(main(["eval", "run", *sys.argv[2:]]))
"""


RAY_BUDGET = r"""
import json, sys
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
from amapreduce.demo.model import SimulatedAtlasModel
from amapreduce.cluster import limits as ray_limits
from amapreduce.testing.openai_server import OpenAICompatibleServer
spent = []
stop = ray_limits.ClusterLimiter.stop
def stopping(self):  # what the cluster spent, read from its limiter as the evaluation ends
    spent.append(self.spent()[0])
    stop(self)
ray_limits.ClusterLimiter.stop = stopping
from amapreduce.cli.app import main
with OpenAICompatibleServer(SimulatedAtlasModel(model_id="simulated-sandbox")) as server:
    code = main(["eval", "run", *sys.argv[1:], "--api-base", server.base_url])
print(json.dumps({"code": code, "spent": spent}))
ray.shutdown()
"""


RAY_INTERRUPTED = r"""
import json, os, signal, sys
import ray
from amapreduce import journal

ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
original, sent = journal.JournalWriter.append, []
def append(self, entry):
    original(self, entry)
    if getattr(entry, "type", "") == "trial_done" and not sent:  # a trial finished, its sibling is running
        sent.append(entry.task_id)
        os.kill(os.getpid(), signal.SIGINT)
journal.JournalWriter.append = append
from amapreduce.cli.app import main
out = sys.argv[sys.argv.index("--out") + 1]
codes = [main(["eval", "run", *sys.argv[1:]])]
lines = len(open(os.path.join(out, "journal.jsonl")).read().splitlines())
codes.append(main(["eval", "run", "--resume", out, "--executor", "ray", "--json"]))
print(json.dumps({"codes": codes, "lines": lines}))
ray.shutdown()
"""


def _ray_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")}
    env.update(AMAPREDUCE_ENV_FILE=os.devnull, RAY_USAGE_STATS_ENABLED="0")
    return env


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def _journal(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "journal.jsonl").read_text().splitlines()[1:]]


def _trials(folder: Path) -> dict[tuple[str, int], dict[str, Any]]:
    return {(e["task_id"], e["trial"]): e for e in _journal(folder) if e["type"] == "trial_done"}


def _names(folder: Path) -> dict[str, str]:
    """Record ids → their instance, hint ids → their text (both ids are the store's own: a record's
    is derived from the evaluation's id, a hint's is random)."""
    from amapreduce.memory.schema import DB_NAME

    conn = sqlite3.connect(folder / "memory" / DB_NAME)
    try:
        return dict(conn.execute("SELECT id, task_id FROM records UNION ALL SELECT id, text FROM hints").fetchall())
    finally:
        conn.close()


def _log(folder: Path) -> list[dict[str, Any]]:
    names = _names(folder)
    entries = []
    for line in (folder / "memory_log.jsonl").read_text().splitlines():
        entry = {k: v for k, v in json.loads(line).items() if k not in PER_EVALUATION}
        entry["prior_hints"] = [{**h, "id": names.get(h["id"], "(removed)")} for h in entry["prior_hints"]]
        entry["pruned"] = [names.get(h, "(removed)") for h in entry["pruned"]]
        entries.append(entry)
    return entries


def _prior(entry: dict[str, Any], folder: Path) -> dict[str, Any] | None:
    """A trial's prior, its record and hint ids replaced by what they name."""
    prior = entry["prior"]
    if prior is None:
        return None
    names = _names(folder)

    def named(value: Any) -> Any:
        """Ids replaced by what they name; wall times (which vary with the machine's load) left out."""
        if isinstance(value, dict):
            return {k: named(v) for k, v in value.items() if k != "mean_wall_s"}
        if isinstance(value, list):
            return [named(v) for v in value]
        return names.get(value, "(removed)" if str(value).startswith(("h-", "r-")) else value) \
            if isinstance(value, str) else value

    return {**named({k: v for k, v in prior.items() if k != "record_ids"}),
            "record_ids": [names[r] for r in prior["record_ids"]]}


def _store(folder: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """The instances a memory recorded, in order, and its hints with their scores."""
    from amapreduce.memory.schema import DB_NAME

    conn = sqlite3.connect(folder / DB_NAME)
    try:
        tasks = [r[0] for r in conn.execute("SELECT task_id FROM records ORDER BY rowid")]
        return tasks, conn.execute("SELECT text, w FROM hints ORDER BY text").fetchall()
    finally:
        conn.close()


def _assert_same(local: Path, remote: Path, ids: list[str], *, per_process: set[str] = PER_PROCESS) -> None:
    """The two evaluations agree: results.json's scores and per-trial facts (but `per_process`), every
    answer, the memory log and the memory itself."""
    # results.json: the same scores, the same facts of every trial, the same summary scores
    mine, theirs = (json.loads((f / "results.json").read_text()) for f in (local, remote))
    assert mine["task_order"] == theirs["task_order"] == ids
    for iid, rows in mine["per_task"].items():
        assert [{k: v for k, v in r.items() if k not in per_process} for r in rows] == \
               [{k: v for k, v in r.items() if k not in per_process} for r in theirs["per_task"][iid]]
    scores = {k for k, v in mine["summary"].items() if isinstance(v, dict)}
    assert scores and {k: mine["summary"][k] for k in scores} == {k: theirs["summary"][k] for k in scores}
    assert mine["memory"] | {"store": None} == theirs["memory"] | {"store": None}
    # the same answers, word for word
    for k in (1, 2):
        for iid in ids:
            assert (local / f"trial{k}" / f"{iid}.md").read_text() == (remote / f"trial{k}" / f"{iid}.md").read_text()
    # the same memory log (the same canonical trials, labels, credits, distillations, pool sizes) ...
    assert _log(local) == _log(remote)
    # ... and the same memory
    stores = [_store(folder / "memory") for folder in (local, remote)]
    assert stores[0] == stores[1] and stores[0][0] == ids


@pytest.mark.slow
def test_ray_and_local_give_the_same_evaluation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert main(["eval", "run", *ARGS, "--out", str(local)]) == 0
    capsys.readouterr()
    env = _ray_env()
    proc = subprocess.run([sys.executable, "-c", RAY_DRIVER, *ARGS, "--out", str(remote), "--executor", "ray"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    first, resumed, driver = lines[0], lines[1], lines[2]
    assert driver["codes"] == [0, 0] and first["status"] == resumed["status"] == "complete"

    _assert_same(local, remote, IDS.split(","))
    log = _log(remote)  # the evaluation used its memory: hints were distilled and shown
    assert any(e["prior_hints"] for e in log) and any(e["distillation"] for e in log)
    # each trial read the same snapshot (the same prior) and executed the same decision
    # (its records named by their instance: a record's id is derived from the evaluation's id)
    ours, ray_trials = _trials(local), _trials(remote)
    assert ours.keys() == ray_trials.keys()
    for key, entry in ours.items():
        assert (_prior(entry, local), entry["decision"]) == (_prior(ray_trials[key], remote), ray_trials[key]["decision"])
    assert sum(1 for e in ours.values() if e["prior"] is not None) >= 6  # instances 2-4 had a prior
    # the trials ran in Ray's worker processes, and their run folders came back into the evaluation folder
    for entry in ray_trials.values():
        run = remote / entry["run_dir"]
        assert (run / "result.json").is_file() and (run / "trace.jsonl").is_file()
        start = json.loads((run / "journal.jsonl").read_text().splitlines()[1])
        assert start["type"] == "run_start" and start["process"]["pid"] != driver["pid"]
    # the resume found everything done and reran nothing
    assert len([e for e in _journal(remote) if e["type"] == "trial_done"]) == len(ray_trials)


@pytest.mark.slow
def test_a_killed_ray_driver_resumes_without_rerunning_a_trial(tmp_path: Path) -> None:
    out = tmp_path / "ev"
    ids = "sbx_en_001,sbx_en_005,sbx_en_002"
    env = _ray_env()
    args = ["--benchmark", "sandbox", "--ids", ids, "--trials", "2", "--encoder", "hashing", "--out", str(out),
            "--executor", "ray", "--json"]
    killed = subprocess.run([sys.executable, "-c", RAY_KILLED, "3", *args], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=600, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    done_before = [(e["task_id"], e["trial"]) for e in _journal(out) if e["type"] == "trial_done"]
    assert len(done_before) == 3 and not any(e["type"] == "eval_ended" for e in _journal(out))
    resumed = subprocess.run([sys.executable, "-c", RAY_KILLED, "0", "--resume", str(out), "--executor", "ray",
                              "--json"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                             check=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout.splitlines()[-1])["status"] == "complete"
    entries = _journal(out)
    done = [(e["task_id"], e["trial"]) for e in entries if e["type"] == "trial_done"]
    assert done[:3] == done_before and sorted(done) == sorted({(i, k) for i in ids.split(",") for k in (1, 2)})
    assert [e["task_id"] for e in entries if e["type"] == "instance_committed"] == ids.split(",")
    assert _store(out / "memory")[0] == ids.split(",")  # every instance committed once, in task order


@pytest.mark.slow
def test_a_budget_shared_across_ray_trials_stops_the_evaluation_at_its_limit(tmp_path: Path) -> None:
    """Four trials start at once with $0.02 left, each worth about $0.016 (the simulated model, served and
    priced): each used to get the whole $0.02 to spend (about $0.064 in all); on one budget across the
    cluster the evaluation stops at the limit, overshooting by at most one call in flight per Ray worker."""
    budget, out = 0.02, tmp_path / "ev"
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"simulated-sandbox": {"input": 1e-6, "output": 1e-6}}), encoding="utf-8")
    env = _ray_env() | {"AMAPREDUCE_PRICES_FILE": str(prices)}
    args = ["--benchmark", "sandbox", "--ids", "sbx_en_001,sbx_en_005", "--trials", "2", "--tasks-parallel", "2",
            "--no-memory", "--model", "simulated-sandbox", "--max-cost", str(budget), "--workers", "1",
            "--executor", "ray", "--out", str(out), "--json"]
    proc = subprocess.run([sys.executable, "-c", RAY_BUDGET, *args], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    outcome, driver = lines[0], lines[1]
    assert driver["code"] == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert outcome["status"] == "stopped" and "--max-cost $0.02 reached" in outcome["reason"]
    assert _journal(out)[-1] == {"type": "eval_ended", "status": "stopped", "reason": outcome["reason"]}
    trials = _trials(out)
    assert len(trials) < 4 or any(t["status"].startswith("stopped") for t in trials.values())  # cut short
    calls = [json.loads(line)["usage"]["cost_usd"] for t in trials.values()
             for line in (out / t["run_dir"] / "trace.jsonl").read_text().splitlines() if '"model_call"' in line]
    (spent,) = driver["spent"]  # every call of every trial, cancelled ones included, as the cluster counted it
    assert budget <= spent <= budget + 2 * max(calls)  # two Ray workers (num_cpus=2), one call each at most
    assert sum(t["cost_usd"] for t in trials.values()) <= spent + 1e-6  # the journal rounds each trial's cost


@pytest.mark.slow
def test_ctrl_c_cancels_the_ray_trials_and_resume_finishes_the_evaluation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGINT once the first trial is journaled (its sibling is still running): exit 130, the finished trial
    kept, nothing committed or started after it; `--resume` gives the evaluation an uninterrupted run gives."""
    ids = "sbx_en_001,sbx_en_005,sbx_en_002"
    args = ["--benchmark", "sandbox", "--ids", ids, "--trials", "2", "--encoder", "hashing", "--workers", "1",
            "--json"]
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert main(["eval", "run", *args, "--out", str(local)]) == 0
    capsys.readouterr()
    proc = subprocess.run([sys.executable, "-c", RAY_INTERRUPTED, *args, "--out", str(remote), "--executor", "ray"],
                          env=_ray_env(), cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    driver = json.loads(proc.stdout.splitlines()[-1])
    assert driver["codes"] == [130, 0]
    entries = _journal(remote)
    before = entries[:driver["lines"] - 1]  # what the interrupted run journaled
    assert before[0]["type"] == "eval_started"
    assert {(e["type"], e["task_id"]) for e in before[1:]} == {("trial_done", "sbx_en_001")}  # 1 or 2 trials
    assert all(e["status"] == "complete" for e in before[1:])  # a cancelled trial is never journaled
    _assert_same(local, remote, ids.split(","))
    done = [(e["task_id"], e["trial"]) for e in entries if e["type"] == "trial_done"]
    assert sorted(done) == sorted({(i, k) for i in ids.split(",") for k in (1, 2)})  # each trial once


class _InProcessTrials:
    """`RemoteTrials` in this process (the Ray task's own function, `run_detached`, run when its result is
    asked for): trial 1 of `stopper` sends Ctrl-C once `first`'s two trials have come back, then waits to
    be cancelled, as a running Ray task would."""

    instances: list[_InProcessTrials] = []

    def __init__(self, address: str | None = None, *, first: str = "sbx_en_001", stopper: str = "sbx_en_005") -> None:
        self.first, self.stopper = first, stopper
        self.cancelled: list[tuple[str, int]] = []
        self.interrupt = not _InProcessTrials.instances  # the first evaluation is interrupted, its resume not
        self.first_back = threading.Event()
        self.returned = 0
        _InProcessTrials.instances.append(self)

    def __enter__(self) -> _InProcessTrials:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @contextlib.contextmanager
    def shared_budget(self, max_cost_usd: float | None, spent_usd: float) -> Iterator[None]:
        yield

    def spent(self) -> float | None:
        return None

    def submit(self, jobs: Sequence[Any], image: bytes | None) -> list[Any]:
        return [(job, image, threading.Event()) for job in jobs]

    def result(self, handle: Any) -> Any:
        from amapreduce.cluster.trials import run_detached

        job, image, cancelled = handle
        if self.interrupt and job.task_id == self.stopper and job.trial == 1:
            assert self.first_back.wait(60), "the first instance's trials never came back"
            os.kill(os.getpid(), signal.SIGINT)
            assert cancelled.wait(60), "the running trial was never cancelled"
        if cancelled.is_set():
            raise RunError("a trial failed in Ray (TaskCancelledError)")
        run = run_detached(job, image)
        if job.task_id == self.first:
            self.returned += 1
            if self.returned == 2:
                self.first_back.set()
        return run

    def cancel(self, handles: Sequence[Any]) -> None:
        for job, _, cancelled in handles:
            self.cancelled.append((job.task_id, job.trial))
            cancelled.set()


def test_ctrl_c_cancels_the_remote_trials_still_running_and_keeps_the_finished_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The cancel path without Ray or a clock: the second instance's trial 1 is running (waiting to be
    cancelled) when Ctrl-C comes, once both trials of the first instance have come back."""
    from amapreduce.cluster import RayExecutor
    from amapreduce.session.executor import parse_executor

    monkeypatch.setattr("amapreduce.cli.eval_run.executor_for",  # no Ray here: its extra is not checked
                        lambda settings, flag: None if settings.executor == "local" else RayExecutor(parse_executor(settings.executor)))
    monkeypatch.setattr("amapreduce.cluster.trials.RayTrials", _InProcessTrials)
    monkeypatch.setattr(_InProcessTrials, "instances", [])
    ids = ["sbx_en_001", "sbx_en_005"]
    args = ["eval", "run", "--benchmark", "sandbox", "--ids", ",".join(ids), "--trials", "2", "--encoder", "hashing",
            "--workers", "1", "--tasks-parallel", "2", "--json"]
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert main([*args, "--out", str(local), "--executor", "local"]) == 0
    assert main([*args, "--out", str(remote), "--executor", "ray"]) == 130
    (interrupted,) = _InProcessTrials.instances
    assert {("sbx_en_005", 1), ("sbx_en_005", 2)} <= set(interrupted.cancelled)  # both were still running
    entries = _journal(remote)
    assert [(e["task_id"], e["trial"]) for e in entries if e["type"] == "trial_done"] == [(ids[0], 1), (ids[0], 2)]
    assert not any(e["type"] in ("instance_committed", "eval_ended") for e in entries)
    assert not (remote / "trial1" / f"{ids[1]}.md").exists()
    assert main(["eval", "run", "--resume", str(remote), "--executor", "ray", "--json"]) == 0
    resumed = _InProcessTrials.instances[-1]
    assert not resumed.cancelled
    # The stand-in runs its trials in this process, after the interrupted ones: their prompt tokens (and the
    # utility that charges them) differ from an uninterrupted run's; a real Ray worker's do not (the test above).
    _assert_same(local, remote, ids, per_process=PER_PROCESS | {"prompt_tokens", "utility"})
    done = [(e["task_id"], e["trial"]) for e in _journal(remote) if e["type"] == "trial_done"]
    assert done[:2] == [(ids[0], 1), (ids[0], 2)] and sorted(done[2:]) == [(ids[1], 1), (ids[1], 2)]


def test_ctrl_c_in_a_local_evaluation_starts_no_further_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local path stops the same way: the running trial is recorded, the next one never starts (it
    used to run every remaining trial of the started instances before exiting), and `--resume` finishes."""
    from amapreduce import journal
    from amapreduce.bench import evaluate

    original, halt, halted = journal.JournalWriter.append, evaluate._TrialRunner.halt, threading.Event()

    def append(self: Any, entry: Any) -> None:
        original(self, entry)
        if getattr(entry, "type", "") == "trial_done" and entry.trial == 1 and entry.task_id == "sbx_en_001":
            os.kill(os.getpid(), signal.SIGINT)
            assert halted.wait(60), "Ctrl-C never reached the evaluation"  # the signal is handled in the main thread

    def halting(self: Any, stop: Any) -> None:
        halt(self, stop)
        halted.set()

    monkeypatch.setattr(journal.JournalWriter, "append", append)
    monkeypatch.setattr(evaluate._TrialRunner, "halt", halting)
    out = tmp_path / "ev"
    args = ["eval", "run", "--benchmark", "sandbox", "--ids", "sbx_en_001,sbx_en_005", "--trials", "2",
            "--encoder", "hashing", "--workers", "1", "--out", str(out), "--json"]
    assert main(args) == 130
    assert [(e["type"], e.get("trial")) for e in _journal(out)] == [("eval_started", None), ("trial_done", 1)]
    monkeypatch.setattr(journal.JournalWriter, "append", original)
    assert main(["eval", "run", "--resume", str(out), "--json"]) == 0
    assert sorted(_trials(out)) == [(i, k) for i in ("sbx_en_001", "sbx_en_005") for k in (1, 2)]


def test_executor_flag_and_variable_are_checked_before_anything_is_made(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["eval", "run", "--benchmark", "sandbox", "--ids", "sbx_en_001"]
    assert main([*base, "--out", str(tmp_path / "a"), "--executor", "dask"]) == 2
    assert "--executor 'dask': use local, ray" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "b"), "--executor", "ray:"]) == 2
    monkeypatch.setenv("AMAPREDUCE_EXECUTOR", "threads")
    assert main([*base, "--out", str(tmp_path / "c")]) == 2
    assert "AMAPREDUCE_EXECUTOR 'threads'" in capsys.readouterr().err
    # a cluster address nothing answers at: refused at once (Ray itself would retry for minutes)
    assert main([*base, "--out", str(tmp_path / "f"), "--executor", "ray:127.0.0.1:1"]) == 2
    assert "--executor ray:127.0.0.1:1: nothing answers at 127.0.0.1:1" in capsys.readouterr().err
    # Ray not installed: exit 2, and the message names the extra
    monkeypatch.setenv("AMAPREDUCE_EXECUTOR", "ray")
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main([*base, "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "needs the `ray` extra: pip install 'amapreduce[ray]'" in err and err.startswith("error: ")
    assert main([*base, "--out", str(tmp_path / "e"), "--executor", "ray:127.0.0.1:6379"]) == 2
    assert not any((tmp_path / name).exists() for name in "abcdef")


def test_nothing_imports_ray_unless_asked(tmp_path: Path) -> None:
    code = ("import sys\n"
            "import amapreduce.cli.app, amapreduce.cli.eval_run, amapreduce.bench.evaluate, amapreduce.cluster.trials\n"
            "from amapreduce.session.executor import parse_executor\n"
            "assert parse_executor('ray:auto').address == 'auto'\n"
            "print('ray' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.strip() == "False"


def test_a_snapshot_image_reads_what_the_snapshot_reads(tmp_path: Path) -> None:
    """What a remote trial gets of the memory: the instance's snapshot, not the live memory."""
    from test_memory_fixtures import PASS, QUERY, ranked_store

    from amapreduce.bench.trial import open_snapshot_image, snapshot_image
    from amapreduce.mapreduce.prior import PriorRequest
    from amapreduce.memory import InstanceSession
    from amapreduce.memory.records import DecisionSummary

    mem, enc = ranked_store(tmp_path / "live")
    enc.vectors["other instance"] = enc.at(0.99)
    session = InstanceSession(mem, task_id="task-1", query=QUERY)
    request = PriorRequest(query=QUERY, task_id="task-1")
    frozen = session.snapshot.prior(request)
    mem.update(frozen, query="other instance", decision=DecisionSummary(), metrics=PASS, task_id="task-0")
    assert mem.prior(request) != frozen  # the live memory moved on ...
    image = snapshot_image(session.snapshot)
    copy = open_snapshot_image(image, tmp_path / "scratch", config={}, model=None)
    try:
        assert copy.prior(request) == frozen  # ... the image did not
        assert copy.store.counts()["records"] == session.snapshot.store.counts()["records"]
        with pytest.raises(UserError, match="read-only"), copy.store.write():
            pass
    finally:
        copy.close()
        session.snapshot.close()
        mem.close()
    assert not (tmp_path / "scratch").exists()  # nothing is written beside it


def test_a_shipped_run_folder_is_written_under_the_evaluation_only(tmp_path: Path) -> None:
    from amapreduce.bench.trial import TrialRun, write_run_files
    from amapreduce.errors import RunError

    runs = tmp_path / "runs" / "sbx_en_001" / "trial1"
    run = TrialRun(status="complete", answer="| a |", run_dir="20261124-run",
                   files={"result.json": b"{}", "sub/trace.jsonl": b"{}\n"})
    written = write_run_files(run, runs)
    assert written.run_dir == str(runs / "20261124-run") and written.files is None
    assert (runs / "20261124-run" / "sub" / "trace.jsonl").read_bytes() == b"{}\n"
    for bad in (TrialRun(status="complete", answer="", run_dir="..", files={}),
                TrialRun(status="complete", answer="", run_dir="a/b", files={}),
                TrialRun(status="complete", answer="", run_dir="ok", files={"../../escape": b""})):
        with pytest.raises(RunError, match="refusing"):
            write_run_files(bad, runs)
    assert not (tmp_path / "runs" / "escape").exists() and not (tmp_path / "escape").exists()
    local = TrialRun(status="complete", answer="", run_dir=str(tmp_path / "here"))
    assert write_run_files(local, runs) is local  # a local trial's folder is already in place
