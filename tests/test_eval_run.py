"""`amapreduce eval run`: the sandbox benchmark end to end, offline, with the memory protocol.

Every run here is the real pipeline (manager, mapreduce tool, engine, sub-agents, scorer, memory
store and distillation) with the simulated model (deterministic code, not an LLM) and the hashing
encoder (no torch needed).
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

IDS = "sbx_en_001,sbx_en_005,sbx_en_002"
METRICS = {"score", "precision_by_row", "recall_by_row", "f1_by_row", "precision_by_item", "recall_by_item", "f1_by_item"}
FACTS = {"trial", "cost_usd", "prompt_tokens", "completion_tokens", "model_calls", "subagents", "wall_s", "status",
         "utility", "run_dir"}


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main(["eval", "run", *args, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def _journal(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "journal.jsonl").read_text().splitlines()[1:]]


def test_eval_run_sandbox_writes_answers_results_and_learns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ev"
    code, doc = _run(["--benchmark", "sandbox", "--ids", IDS, "--trials", "2", "--out", str(out),
                      "--encoder", "hashing"], capsys)
    assert code == 0 and doc["status"] == "complete" and doc["tasks"] == 3 and doc["trials"] == 2
    results = json.loads((out / "results.json").read_text())
    assert list(results["per_task"]) == IDS.split(",") == results["task_order"]
    for rows in results["per_task"].values():
        assert [r["trial"] for r in rows] == [1, 2]
        for row in rows:
            assert METRICS | FACTS <= set(row)
            assert row["subagents"] >= 1 and row["model_calls"] > row["subagents"]
            assert (out / row["run_dir"] / "result.json").is_file()
    for k in (1, 2):
        assert sorted(p.stem for p in (out / f"trial{k}").glob("*.md")) == sorted(IDS.split(","))
    summary = results["summary"]
    assert {"cost_usd", "subagents_per_task", "wall_s_per_task"} <= set(summary)
    assert summary["f1_by_item"]["avg_n"] > 0.9
    memory = results["memory"]
    assert memory["store"] == str((out / "memory").resolve()) and memory["learn"] is True
    assert (memory["records_before"], memory["records_after"]) == (0, 3)
    assert results["utility"]["cost_weight"] == 1.0  # the sandbox weighs cost by default
    log = [json.loads(line) for line in (out / "memory_log.jsonl").read_text().splitlines()]
    assert [e["task_id"] for e in log] == IDS.split(",") and all(e["committed"] for e in log)
    assert [e["records"] for e in log] == [1, 2, 3]
    # The canonical trial is the one with the highest utility, ties to the lowest trial.
    for entry in log:
        rows = results["per_task"][entry["task_id"]]
        best = max(rows, key=lambda r: (r["utility"], -r["trial"]))
        assert entry["chosen_trial"] == best["trial"]

    # `eval score` over the answer folders reproduces the numbers exactly.
    rescored = tmp_path / "rescore.json"
    assert main(["eval", "score", "--benchmark", "sandbox", "--pred-dir", str(out / "trial1"),
                 "--pred-dir", str(out / "trial2"), "--out", str(rescored)]) == 0
    again = json.loads(rescored.read_text())
    for iid, rows in again["per_task"].items():
        for mine, theirs in zip(results["per_task"][iid], rows, strict=True):
            assert {k: mine[k] for k in theirs} == theirs
    assert {k: v for k, v in results["summary"].items() if k in again["summary"]} == again["summary"]

    # The folder is a journal: running it again needs --resume, and a resume reruns nothing.
    capsys.readouterr()
    assert main(["eval", "run", "--benchmark", "sandbox", "--ids", IDS, "--trials", "2", "--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err
    trials_before = [e for e in _journal(out) if e["type"] == "trial_done"]
    code, doc = _run(["--resume", str(out)], capsys)
    assert code == 0 and doc["memory"]["records_after"] == 3
    assert [e for e in _journal(out) if e["type"] == "trial_done"] == trials_before


def test_no_memory_and_no_learn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    off = tmp_path / "off"
    code, doc = _run(["--benchmark", "sandbox", "--ids", "sbx_en_001", "--out", str(off), "--no-memory"], capsys)
    assert code == 0 and doc["memory"]["store"] is None and doc["memory"]["records_after"] == 0
    assert not (off / "memory").exists()
    assert not (off / "memory_log.jsonl").exists() or not (off / "memory_log.jsonl").read_text().strip()
    learnt = tmp_path / "learnt"
    code, _ = _run(["--benchmark", "sandbox", "--ids", "sbx_en_005", "--out", str(learnt), "--encoder", "hashing"],
                   capsys)
    assert code == 0
    store = learnt / "memory"
    frozen = tmp_path / "frozen"
    code, doc = _run(["--benchmark", "sandbox", "--ids", "sbx_en_001", "--out", str(frozen), "--memory", str(store),
                      "--no-learn"], capsys)
    assert code == 0 and doc["memory"]["learn"] is False
    assert (doc["memory"]["records_before"], doc["memory"]["records_after"]) == (1, 1)


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "run", "--benchmark", "widesearch", "--out", str(tmp_path / "w")]) == 2
    assert main(["eval", "run", "--benchmark", "widesearch", "--model", "openai/m", "--out", str(tmp_path / "v")]) == 2
    assert main(["eval", "run", "--benchmark", "sandbox", "--out", str(tmp_path / "x"), "--ids", "nope"]) == 2
    assert main(["eval", "run", "--benchmark", "sandbox", "--out", str(tmp_path / "y"), "--no-memory",
                 "--memory", str(tmp_path / "m")]) == 2
    assert main(["eval", "run", "--resume", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "no model is configured" in err and "needs --tasks FILE and --gold-dir DIR" in err
    assert "unknown instance id" in err and "not both" in err and "holds no evaluation" in err
    assert not (tmp_path / "w").exists() and not (tmp_path / "x").exists()  # refused before anything is made


KILLER = r"""
import os, signal, sys
from amapreduce import journal
from amapreduce.memory import update

mode, after = sys.argv[1], int(sys.argv[2])
seen = {"trial_done": 0, "commits": 0}
if mode == "trial":
    original = journal.JournalWriter.append
    def append(self, entry):
        original(self, entry)
        if getattr(entry, "type", "") == "trial_done":
            seen["trial_done"] += 1
            if seen["trial_done"] == after:
                os.kill(os.getpid(), signal.SIGKILL)
    journal.JournalWriter.append = append
else:  # killed after the memory committed an instance, before its journal line
    original_record = update.record_outcome
    def record_outcome(*args, **kwargs):
        result = original_record(*args, **kwargs)
        seen["commits"] += 1
        if seen["commits"] == after:
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    update.record_outcome = record_outcome
    import amapreduce.memory.core as core
    core.record_outcome = record_outcome
from amapreduce.cli.app import main
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.parametrize(("mode", "after"), [("trial", 3), ("commit", 2)])
def test_kill_9_then_resume_repeats_no_trial_and_no_commit(mode: str, after: int, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ev"
    args = ["eval", "run", "--benchmark", "sandbox", "--ids", IDS, "--trials", "2", "--out", str(out),
            "--encoder", "hashing", "--json"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")}
    proc = subprocess.run([sys.executable, "-c", KILLER, mode, str(after), *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    killed = _journal(out)
    done_before = [(e["task_id"], e["trial"]) for e in killed if e["type"] == "trial_done"]
    assert done_before and not any(e["type"] == "eval_ended" for e in killed)
    code, doc = _run(["--resume", str(out)], capsys)
    assert code == 0 and doc["status"] == "complete"
    entries = _journal(out)
    done = [(e["task_id"], e["trial"]) for e in entries if e["type"] == "trial_done"]
    assert done[: len(done_before)] == done_before  # nothing finished was rerun ...
    assert sorted(done) == sorted({(i, k) for i in IDS.split(",") for k in (1, 2)})  # ... and each ran once
    commits = [e["task_id"] for e in entries if e["type"] == "instance_committed"]
    assert commits == IDS.split(",")
    from amapreduce.memory import MemoryStore

    with MemoryStore(out / "memory", readonly=True) as store, store.read() as conn:
        records = [r[0] for r in conn.execute("SELECT task_id FROM records ORDER BY rowid")]
    assert records == IDS.split(",")  # every instance committed exactly once, in task order
    if mode == "commit":
        log = [json.loads(line) for line in (out / "memory_log.jsonl").read_text().splitlines()]
        # the commit replayed on resume reports what the killed process committed (issue 29)
        assert log[after - 1]["committed"] is True and "reason" not in log[after - 1]


@pytest.mark.parametrize(("kill_after", "flags"), [(1, []), (0, ["--encoder", "hashing"])])
def test_the_same_command_plus_resume_continues_the_evaluation(kill_after: int, flags: list[str], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The first run creates its store (recording the default or given encoder); the same command
    plus `--resume` asks for the same evaluation, after a SIGKILL or after it completed."""
    args = ["eval", "run", "--benchmark", "sandbox", "--limit", "2", "--trials", "1", "--memory", "st",
            "--out", "ev", *flags, "--json"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")}
    env.update(AMAPREDUCE_MEMORY_ENCODER="hashing", AMAPREDUCE_ENV_FILE=os.devnull)
    proc = subprocess.run([sys.executable, "-c", KILLER, "trial", str(kill_after), *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == (-signal.SIGKILL if kill_after else 0), proc.stderr[-2000:]
    assert (tmp_path / "st").is_dir()  # the store the first run created
    first = [(e["task_id"], e["trial"]) for e in _journal(tmp_path / "ev") if e["type"] == "trial_done"]
    assert len(first) == (kill_after or 2)
    monkeypatch.setenv("AMAPREDUCE_MEMORY_ENCODER", "hashing")
    assert main([*args, "--resume"]) == 0, capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "complete" and doc["tasks"] == 2 and doc["memory"]["records_after"] == 2
    done = [(e["task_id"], e["trial"]) for e in _journal(tmp_path / "ev") if e["type"] == "trial_done"]
    assert done[: len(first)] == first and len(done) == len(set(done)) == 2  # nothing finished was rerun


def test_eval_run_through_a_real_client_and_http(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--model/--api-base`: the real OpenAI client path (smolagents' OpenAIModel, HTTP on loopback) for
    every role, the memory's included; the server's model is the simulated one (code, not an LLM)."""
    from amapreduce.demo.serve import serving_model
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.testing.openai_server import OpenAICompatibleServer

    served = serving_model()  # the simulated atlas model, and the simulated memory model for memory prompts
    out = tmp_path / "ev"
    with OpenAICompatibleServer(served) as server, allow_model_requests():
        code, doc = _run(["--benchmark", "sandbox", "--ids", "sbx_en_005,sbx_en_001", "--out", str(out),
                          "--model", "simulated-sandbox", "--api-base", server.base_url, "--encoder", "hashing",
                          "--workers", "3"], capsys)
        requests = len(server.requests)
    assert code == 0 and doc["status"] == "complete"
    results = json.loads((out / "results.json").read_text())
    assert results["model"] == "simulated-sandbox"
    rows = [r for rs in results["per_task"].values() for r in rs]
    assert all(r["score"] == 1.0 for r in rows)
    assert requests >= sum(r["model_calls"] for r in rows)  # every model call went over HTTP
    assert doc["memory"]["records_after"] == 2
    run_result = json.loads((out / rows[0]["run_dir"] / "result.json").read_text())
    assert "manager" in run_result["usage"]["by_role"]


LEARNING_IDS = "sbx_en_002,sbx_en_004,sbx_en_011,sbx_en_012,sbx_en_018,sbx_en_019,sbx_en_025,sbx_en_026"
"""Ranked-countries and top-cities tasks in task order: both ask 2 attributes of a two-column matrix."""


def test_learning_makes_later_tasks_cheaper_at_equal_quality(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Memory on vs off on the same tasks and seeds: what the first half taught (through records, FINCH,
    the simulated memory model's distillation and retrieval) makes the second half use fewer sub-agents."""
    halves: dict[str, tuple[float, float]] = {}
    for name, extra in (("on", ["--encoder", "hashing"]), ("off", ["--no-memory"])):
        code, printed = _run(["--benchmark", "sandbox", "--ids", LEARNING_IDS, "--trials", "2", "--out",
                              str(tmp_path / name), *extra], capsys)
        assert code == 0
        results = json.loads((tmp_path / name / "results.json").read_text())
        second = results["task_order"][4:]
        rows = [r for iid in second for r in results["per_task"][iid]]
        halves[name] = (sum(r["subagents"] for r in rows) / len(rows), sum(r["f1_by_item"] for r in rows) / len(rows))
        # The learning figure `eval run` prints: the same halves of the task order, per task.
        learning = printed["learning"]
        assert learning == results["learning"] and learning["second_half"]["tasks"] == 4
        assert learning["second_half"]["subagents_per_task"] == pytest.approx(halves[name][0], abs=1e-3)
        assert learning["second_half"]["item_f1"] == pytest.approx(halves[name][1], abs=1e-3)
    (sub_on, f1_on), (sub_off, f1_off) = halves["on"], halves["off"]
    assert sub_on <= 0.6 * sub_off and f1_on >= f1_off
    log = [json.loads(line) for line in (tmp_path / "on" / "memory_log.jsonl").read_text().splitlines()]
    assert any((e.get("distillation") or {}).get("created") for e in log)  # hints came from distillation ...
    later = [e for e in log[4:] if e["prior_hints"]]
    credited = [h for e in later for h in e["prior_hints"] if h["w_after"] != h["w_before"]]
    assert credited and all(h["w_after"] == h["w_before"] + 2 for h in credited)  # ... and the followed ones earned credit
    for iid in LEARNING_IDS.split(",")[4:]:
        run = next((tmp_path / "on" / "runs" / iid / "trial1").iterdir())
        decision = json.loads((run / "result.json").read_text())["decisions"][0]
        rationale = decision["batch_strategy"]["rationale"]  # the typed advice: a proposal Θ′ or a hint's payload
        assert rationale == "applied the memory's advice" or rationale.startswith("following the typed advice")


def test_the_sandbox_runs_in_the_benchmarks_family_order_and_a_task_file_in_its_own() -> None:
    """Without --ids, `eval run --benchmark sandbox` takes its tasks round-robin across the question
    families, as `benchmarks/bench_evolution.py` does (so --limit 8 reaches the second generation),
    and any other task file in file order."""
    from amapreduce.cli.eval_run import _task_order
    from amapreduce.settings import load_settings

    settings = load_settings()
    file_order = [f"sbx_en_{n:03d}" for n in range(1, 63)]
    order = _task_order("sandbox", None, file_order, settings)
    assert sorted(order) == file_order and order[:8] == [*file_order[:7], "sbx_en_043"]
    assert _task_order("widesearch", None, file_order, settings) == file_order
    assert _task_order("sandbox", Path("tasks.jsonl"), file_order, settings) == file_order
