"""The offline demo end to end: the simulated model (not an LLM) plays the manager and the
sub-agents over the sandbox corpus through the real tools, engine and reducer."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from amapreduce.demo.faults import FaultPlan
from amapreduce.demo.run import load_sandbox_tasks, run_demo
from amapreduce.settings import Settings

TASKS = ["sbx_en_001", "sbx_en_002", "sbx_en_003", "sbx_en_004", "sbx_en_005"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def settings(cache: Path, tmp_path: Path, **extra: object) -> Settings:
    return Settings.model_validate({"cache_dir": cache, "runs_dir": tmp_path / "runs", "workers": 4, **extra})


def gold_rows(cache: Path, task_id: str) -> list[list[str]]:
    _tasks, world = load_sandbox_tasks(Settings(cache_dir=cache))
    frame = pd.read_csv(world.gold_dir / f"{task_id}.csv", dtype=str, keep_default_na=False)
    return [list(frame.columns), *frame.values.tolist()]


@pytest.mark.parametrize("task_id", TASKS)
def test_every_sandbox_task_equals_the_gold(task_id: str, cache: Path, tmp_path: Path) -> None:
    out = run_demo(task_id, settings(cache, tmp_path))
    table = out.ask.table
    assert [list(table.columns), *[list(r.values()) for r in table.records()]] == gold_rows(cache, task_id)
    assert out.ask.status == "complete" and out.score["score"] == 1.0 and out.score["f1_by_item"] == 1.0
    decision = out.ask.record.decisions[0]
    assert out.ask.record.completeness.mapreduce_calls == 2  # plan stage, then execute
    # The fixed default for every kind of question: one row per sub-agent, only as many more as
    # the plan cap (50 batches) requires (Africa's 58 countries: 2 per sub-agent).
    rows = len(decision["task_matrix"])
    assert decision["batch_strategy"]["type"] == "per_atom" and decision["batch_size"] == -(-rows // 50)
    assert "one row per sub-agent" in decision["batch_strategy"]["rationale"]
    assert out.ask.record.completeness.batches == -(-rows // decision["batch_size"])
    assert "integer" not in decision["json_schema"]["properties"]["Country"]["description"]
    saved = json.loads((out.ask.run_dir.path / "result.json").read_text())
    timings = saved["timings"]  # the same shape as `mapreduce run`: whole run, then each execution
    assert set(timings) == {"wall_s", "executions"} and timings["wall_s"] >= 0
    assert len(timings["executions"]) == 1 and set(timings["executions"][0]) == {"map_s", "patch_s", "wall_s"}
    usage = out.ask.meter.by_role()
    assert usage["manager"].requests >= 3 and usage["subagent"].requests > usage["manager"].requests
    assert out.ask.meter.unpriced_models == set() and out.ask.meter.total().cost_usd == 0.0  # simulated: priced, free
    attempts = [json.loads(x) for x in (out.ask.run_dir.path / "trace.jsonl").read_text().splitlines()]
    rows = [r for a in attempts if a["event"] == "attempt" for r in a["parsed_rows"]]
    assert rows and all(str(r["source"]).startswith("corpus://sandbox/") for r in rows)  # a source URL per row
    assert out.faults == {}


def test_thirty_percent_faults_end_complete_through_retries_and_patch_rounds(cache: Path, tmp_path: Path) -> None:
    # One attempt per batch: whatever a fault breaks must be recovered by the delta-patch rounds.
    out = run_demo("sbx_en_003", settings(cache, tmp_path, max_attempts=1, patch_rounds=4), faults=FaultPlan(rate=0.3, seed=11))
    c = out.ask.record.completeness
    assert out.ask.status == "complete" and c.missing_cells == 0 and out.score["score"] == 1.0
    assert c.patch_rounds >= 1
    assert "rate_limit" in out.faults and len({"error", "malformed", "drop"} & set(out.faults)) >= 2


def test_faults_with_retries_are_deterministic_per_seed(cache: Path, tmp_path: Path) -> None:
    runs = [run_demo("sbx_en_001", settings(cache, tmp_path / str(k), workers=1 + 3 * k), faults=FaultPlan(rate=0.3, seed=5)) for k in range(2)]
    assert runs[0].faults == runs[1].faults and sum(runs[0].faults.values()) > 0
    assert all(r.ask.status == "complete" and r.score["score"] == 1.0 for r in runs)
    assert all(r.ask.record.completeness.retries >= 1 for r in runs)


def test_budget_stop_keeps_a_partial_table_and_a_run_directory(cache: Path, tmp_path: Path) -> None:
    full = run_demo("sbx_en_003", settings(cache, tmp_path / "full", workers=1))
    spent = full.ask.meter.total().total_tokens
    out = run_demo("sbx_en_003", settings(cache, tmp_path / "cut", workers=1, max_tokens=spent // 2))
    assert out.ask.status.startswith("stopped: ") and "token budget" in out.ask.status
    table = out.ask.table
    filled = sum(1 for row in table.rows for col in table.columns if col not in row.missing())
    assert len(table) == 58 and 0 < len(table.missing_cells()) and filled > 58  # some looked-up cells, not all
    result = json.loads((out.ask.run_dir.path / "result.json").read_text())
    assert result["status"] == out.ask.status and result["completeness"]["missing_cells"] == len(table.missing_cells())
    assert (out.ask.run_dir.path / "table.md").is_file()
    assert out.score["score"] == 0.0


def test_unknown_task_is_a_user_error(cache: Path, tmp_path: Path) -> None:
    from amapreduce.errors import UserError

    with pytest.raises(UserError, match="sbx_en_001, sbx_en_002"):
        run_demo("sbx_nope", settings(cache, tmp_path))


def test_manager_sends_a_delta_follow_up_with_only_the_missing_rows(cache: Path, tmp_path: Path) -> None:
    # No retries and no patch rounds inside the tool: the gaps reach the manager, which calls
    # mapreduce once more with ONLY the incomplete rows (never the whole matrix again).
    cfg = settings(cache, tmp_path, max_attempts=1, patch_rounds=0)
    out = run_demo("sbx_en_003", cfg, faults=FaultPlan(rate=0.3, seed=1))
    c = out.ask.record.completeness
    assert c.mapreduce_calls == 3 and c.executions == 2
    first, follow_up = out.ask.record.decisions
    gaps = [[row.cells["Country"].value] for row in out.ask.results[0].table.rows if row.missing()]
    assert 0 < len(follow_up["task_matrix"]) < len(first["task_matrix"]) == 58
    assert follow_up["task_matrix"] == gaps
    assert len(out.ask.table.missing_cells()) < len(out.ask.results[0].table.missing_cells())
    assert len(out.ask.table) == 58
