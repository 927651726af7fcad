"""`eval run --executor ray`: the trials as Ray tasks give the evaluation a local run gives.

The Ray run happens in a child process that starts a local Ray itself (`ray.init(num_cpus=2)`), as a
user's script would, and then runs the command line there: the test process keeps its sockets to
loopback (pytest-socket) and Ray's workers are the child's. Both runs use the simulated model
(deterministic code, not an LLM), the sandbox corpus and the hashing encoder, with one sub-agent at
a time so each trial's engine runs in one order.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from amapreduce.cli.app import main
from amapreduce.errors import UserError

IDS = "sbx_en_001,sbx_en_005,sbx_en_002,sbx_en_003,sbx_en_004"
"""Two instances at a time (`--tasks-parallel 2`): the third reads the first's record, the third
commit distils a hint, and the fifth, which starts once it is committed, is shown (and credits) it."""
ARGS = ["--benchmark", "sandbox", "--ids", IDS, "--trials", "2", "--encoder", "hashing", "--workers", "1",
        "--tasks-parallel", "2", "--json"]
PER_PROCESS = {"wall_s", "run_dir", "prompt_tokens", "utility"}
"""Facts that differ between any two runs, two local ones included: the run folder's timestamped name,
the wall time, and the prompt tokens (the simulated model numbers its tool calls per process,
`testing.scripted`, so a trial's prompts depend on what its process ran before) with the utility
that charges them."""
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
    return {**prior, "record_ids": [names[r] for r in prior["record_ids"]],
            "hint_ids": [names.get(h, "(removed)") for h in prior["hint_ids"]]}


def _store(folder: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """The instances a memory recorded, in order, and its hints with their scores."""
    from amapreduce.memory.schema import DB_NAME

    conn = sqlite3.connect(folder / DB_NAME)
    try:
        tasks = [r[0] for r in conn.execute("SELECT task_id FROM records ORDER BY rowid")]
        return tasks, conn.execute("SELECT text, w FROM hints ORDER BY text").fetchall()
    finally:
        conn.close()


@pytest.mark.slow
def test_ray_and_local_give_the_same_evaluation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert main(["eval", "run", *ARGS, "--out", str(local)]) == 0
    capsys.readouterr()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")}
    env.update(AMAPREDUCE_ENV_FILE=os.devnull, RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.run([sys.executable, "-c", RAY_DRIVER, *ARGS, "--out", str(remote), "--executor", "ray"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    first, resumed, driver = lines[0], lines[1], lines[2]
    assert driver["codes"] == [0, 0] and first["status"] == resumed["status"] == "complete"

    # results.json: the same scores, the same facts of every trial, the same summary scores
    mine, theirs = (json.loads((f / "results.json").read_text()) for f in (local, remote))
    assert mine["task_order"] == theirs["task_order"] == IDS.split(",")
    for iid, rows in mine["per_task"].items():
        assert [{k: v for k, v in r.items() if k not in PER_PROCESS} for r in rows] == \
               [{k: v for k, v in r.items() if k not in PER_PROCESS} for r in theirs["per_task"][iid]]
    scores = {k for k, v in mine["summary"].items() if isinstance(v, dict)}
    assert scores and {k: mine["summary"][k] for k in scores} == {k: theirs["summary"][k] for k in scores}
    assert mine["memory"] | {"store": None} == theirs["memory"] | {"store": None}
    # the same answers, word for word
    for k in (1, 2):
        for iid in IDS.split(","):
            assert (local / f"trial{k}" / f"{iid}.md").read_text() == (remote / f"trial{k}" / f"{iid}.md").read_text()
    # each trial read the same snapshot (the same prior) and executed the same decision
    # (its records named by their instance: a record's id is derived from the evaluation's id)
    ours, ray_trials = _trials(local), _trials(remote)
    assert ours.keys() == ray_trials.keys()
    for key, entry in ours.items():
        assert (_prior(entry, local), entry["decision"]) == (_prior(ray_trials[key], remote), ray_trials[key]["decision"])
    assert sum(1 for e in ours.values() if e["prior"] is not None) >= 6  # instances 2-4 had a prior
    # the same memory log (the same canonical trials, labels, credits, distillations, pool sizes) ...
    log = _log(local)
    assert log == _log(remote)
    assert any(e["prior_hints"] for e in log) and any(e["distillation"] for e in log)
    # ... and the same memory
    stores = [_store(folder / "memory") for folder in (local, remote)]
    assert stores[0] == stores[1] and stores[0][0] == IDS.split(",")

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
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")}
    env.update(AMAPREDUCE_ENV_FILE=os.devnull, RAY_USAGE_STATS_ENABLED="0")
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
            "import amapreduce.cli.app, amapreduce.cli.eval_run, amapreduce.run.evaluate, amapreduce.run.eval_ray\n"
            "from amapreduce.run.eval_ray import parse_executor\n"
            "assert parse_executor('ray:auto').address == 'auto'\n"
            "print('ray' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.strip() == "False"


def test_a_snapshot_image_reads_what_the_snapshot_reads(tmp_path: Path) -> None:
    """What a remote trial gets of the memory: the instance's snapshot, not the live memory."""
    from test_memory_fixtures import PASS, QUERY, ranked_store

    from amapreduce.mapreduce.prior import PriorRequest
    from amapreduce.memory import InstanceSession
    from amapreduce.memory.records import DecisionSummary
    from amapreduce.run.eval_trial import open_snapshot_image, snapshot_image

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
    from amapreduce.errors import RunError
    from amapreduce.run.eval_trial import TrialRun, write_run_files

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
