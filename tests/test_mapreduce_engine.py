"""The engine: retries that merge, patch rounds, timeouts, order, conflicts, cancellation, trace."""

from __future__ import annotations

import _thread
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from solvers import WorldSolver, world, world_decision

from amapreduce.decision import Decision
from amapreduce.errors import DecisionError
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.result import RunStatus
from amapreduce.mapreduce.solver import BatchRequest, SolverReply
from amapreduce.progress import ProgressEvent
from amapreduce.table.table import CellStatus
from amapreduce.trace import TraceWriter


class FnSolver:
    """Answers with `fn(request)`; records requests."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.requests: list[BatchRequest] = []
        self.lock = threading.Lock()

    def solve(self, request: BatchRequest) -> SolverReply:
        with self.lock:
            self.requests.append(request)
        out = self.fn(request)
        return out if isinstance(out, SolverReply) else SolverReply(output=out, usage=Usage(requests=1, input_tokens=7))


def run(decision: dict[str, Any], solver: Any, **config: Any) -> Any:
    return MapReduceEngine(solver, config=EngineConfig(**config)).run(Decision.parse(decision))


def test_complete_first_time_in_matrix_order() -> None:
    truth = world(12)
    result = run(world_decision(truth, batch_size=5), WorldSolver(truth))
    assert result.summary.complete and result.summary.attempts == 3 and result.summary.retries == 0
    assert [r["name"] for r in result.table.records()] == list(truth)
    assert result.table.records()[4] == {"name": "E004", "capital": "City4", "population": "1004"}
    assert result.table.rows[0].cells["capital"].source == "https://world.example/E000"
    assert result.table.rows[0].cells["name"].source == "task_matrix"
    assert result.summary.usage.requests == 3


def test_retry_merges_with_earlier_attempts_and_names_what_is_missing() -> None:
    def answer(req: BatchRequest) -> str:
        if req.attempt == 1:
            return json.dumps([{"task": 1, "capital": "Paris"}, {"task": 2, "capital": "", "population": "5"}])
        return json.dumps([{"task": 1, "population": "67", "capital": "Lyon"}, {"task": 2, "capital": "Rome"}])

    d = {"task_matrix": [["France"], ["Italy"]], "template": "About __0__", "json_schema": ["country", "capital", "population"], "batch_size": 2}
    solver = FnSolver(answer)
    result = run(d, solver)
    assert result.table.records() == [
        {"country": "France", "capital": "Paris", "population": "67"},
        {"country": "Italy", "capital": "Rome", "population": "5"},
    ]
    cell = result.table.rows[0].cells["capital"]
    assert cell.status is CellStatus.CONFLICT and cell.alternatives == ["Lyon"]  # first kept, conflict recorded
    second = solver.requests[1].prompt
    assert "attempt 2 of 3" in second
    assert "sub-question 1: still missing population" in second
    assert "sub-question 2: still missing capital" in second
    assert result.summary.retries == 1 and result.summary.complete


def test_malformed_json_is_retried_not_turned_into_fallback_rows() -> None:
    replies = iter(["Sorry, I could not format that.", '```json\n[{"task": 1, "capital": "Oslo"}]\n```'])
    solver = FnSolver(lambda req: next(replies))
    result = run({"task_matrix": [["Norway"]], "template": "__0__", "json_schema": ["country", "capital"]}, solver)
    assert [a.outcome for a in result.attempts] == ["parse_error", "ok"]
    assert "not a JSON array of rows" in solver.requests[1].prompt
    assert result.table.records() == [{"country": "Norway", "capital": "Oslo"}]


def test_missing_cells_stay_empty_and_marked_after_all_rounds() -> None:
    solver = FnSolver(lambda req: json.dumps([{"task": k, "capital": "X"} for k in range(1, len(req.tasks) + 1)]))
    d = {"task_matrix": [["A"], ["B"]], "template": "__0__", "json_schema": ["country", "capital", "currency"]}
    result = run(d, solver, max_attempts=2, patch_rounds=2)
    s = result.summary
    assert not s.complete and s.missing_cells == 2 and s.patch_rounds == 2
    assert s.batches == 2 + 2 + 2  # map, then one patch batch per row per round (batch_size defaults to 1)
    assert [row.missing() for row in result.table.rows] == [["currency"], ["currency"]]
    assert result.table.records()[0]["currency"] == ""
    assert s.attempts == 6 * 2  # every batch used both of its attempts


def test_delta_patch_asks_only_for_missing_columns_and_merges_back() -> None:
    def answer(req: BatchRequest) -> str:
        if req.batch_id.startswith("patch"):
            return json.dumps([{"task": k, "currency": f"cur{k}"} for k in range(1, len(req.tasks) + 1)])
        return json.dumps([{"task": k, "capital": "C"} for k in range(1, len(req.tasks) + 1)])

    solver = FnSolver(answer)
    d = {"task_matrix": [["A"], ["B"], ["C"]], "template": "Country __0__", "json_schema": ["country", "capital", "currency"]}
    result = run(d, solver, max_attempts=1)
    assert result.summary.complete and result.summary.patch_rounds == 1
    patch = [r for r in solver.requests if r.batch_id.startswith("patch")]
    assert [r.batch_id for r in patch] == ["patch1.1-batch-001", "patch1.1-batch-002", "patch1.1-batch-003"]
    assert [c.name for c in patch[0].column_specs] == ["country", "currency"]
    assert "Only this entry is still needed: country = A; find its currency" in patch[0].prompt
    assert [r["currency"] for r in result.table.records()] == ["cur1", "cur1", "cur1"]


def test_timed_out_attempt_is_abandoned_and_retried() -> None:
    def answer(req: BatchRequest) -> str:
        if req.attempt == 1:
            req.cancel.wait(30)  # a hung sub-agent that only stops when told
            return "[]"
        return json.dumps([{"task": 1, "capital": "Bern"}])

    solver = FnSolver(answer)
    result = run({"task_matrix": [["CH"]], "template": "__0__", "json_schema": ["country", "capital"]}, solver, batch_timeout_s=1.0)
    assert [a.outcome for a in result.attempts] == ["timeout", "ok"]
    assert solver.requests[0].cancel.is_set()
    assert "deadline" in solver.requests[1].prompt
    assert result.summary.timeouts == 1 and result.table.records() == [{"country": "CH", "capital": "Bern"}]


def test_conflicting_duplicates_across_tasks_keep_the_first() -> None:
    def answer(req: BatchRequest) -> str:
        return json.dumps([{"task": 1, "capital": "Paris" if "Europe" in req.tasks[0] else "Nice"}])

    d = {
        "task_matrix": [["France", "Europe"], ["France", "EU"]],
        "template": "__0__ in __1__",
        "json_schema": ["country", "region", "capital"],
        "key_columns": ["country"],
    }
    result = run(d, FnSolver(answer), workers=2)
    assert len(result.table) == 1
    row = result.table.rows[0]
    assert row.cells["capital"].value == "Paris" and row.cells["capital"].alternatives == ["Nice"]
    assert row.cells["region"].alternatives == ["EU"]
    assert result.summary.conflicts == 2


def test_matrix_order_does_not_depend_on_completion_order() -> None:
    truth = world(40)
    tables = [
        run(world_decision(truth), WorldSolver(truth, sleep=(0.0, 0.01), seed=seed), workers=8, max_batches=None).table.records()
        for seed in (1, 2)
    ]
    assert tables[0] == tables[1]
    assert [r["name"] for r in tables[0]] == list(truth)


def test_rows_attributed_by_entity_when_task_numbers_are_missing() -> None:
    def answer(req: BatchRequest) -> str:
        return json.dumps([{"country": "c", "capital": "C3"}, {"country": "A", "capital": "C1"}, {"country": "Z", "capital": "??"}])

    d = {"task_matrix": [["a"], ["b"], ["C"]], "template": "__0__", "json_schema": ["country", "capital"], "batch_size": 3}
    result = run(d, FnSolver(answer), max_attempts=1, patch_rounds=0)
    assert result.table.records() == [
        {"country": "a", "capital": "C1"},
        {"country": "b", "capital": ""},
        {"country": "C", "capital": "C3"},
    ]
    assert result.attempts[0].dropped_rows == 1


def test_multi_row_tasks_fill_up_to_rows_per_task() -> None:
    ranks = {"2019": ["Bezos", "Gates", "Buffett", "Arnault"], "2020": ["Bezos", "Gates", "Arnault", "Buffett"]}

    def answer(req: BatchRequest) -> str:
        year = "2019" if "2019" in req.tasks[0] else "2020"
        start = 0 if req.attempt == 1 and not req.batch_id.startswith("patch") else 2
        return json.dumps([{"rank": str(r + 1), "name": ranks[year][r], "year": "1999"} for r in range(start, start + 2)])

    d = {
        "task_matrix": [["2019"], ["2020"]],
        "template": "Top 4 billionaires of __0__",
        "json_schema": ["year", "rank", "name"],
        "key_columns": ["year", "rank"],
        "rows_per_task": 4,
    }
    solver = FnSolver(answer)
    result = run(d, solver, max_attempts=1)
    assert result.summary.complete and result.summary.patch_rounds == 1
    assert [(r["year"], r["rank"], r["name"]) for r in result.table.records()] == [
        ("2019", "1", "Bezos"), ("2019", "2", "Gates"), ("2019", "3", "Buffett"), ("2019", "4", "Arnault"),
        ("2020", "1", "Bezos"), ("2020", "2", "Gates"), ("2020", "3", "Arnault"), ("2020", "4", "Buffett"),
    ]  # the matrix value wins over the sub-agent's wrong "year"
    assert "Each sub-question yields 4 rows." in solver.requests[0].prompt
    assert "2 of 4 rows are found so far" in solver.requests[-1].prompt


def test_200_rows_with_30pct_failed_attempts_and_20pct_dropped_cells_end_complete() -> None:
    truth = world(200)
    solver = WorldSolver(truth, fail_rate=0.3, drop_rate=0.2, seed=7)
    result = run(world_decision(truth), solver, workers=16, max_batches=None, max_attempts=3, patch_rounds=2)
    s = result.summary
    assert s.complete, s.to_json()
    assert result.table.records() == [dict(v) for v in truth.values()]
    assert s.failures > 0 and s.retries > 0 and s.patch_rounds >= 1  # the faults really happened
    assert s.rows == 200 and s.missing_cells == 0


def test_cancel_returns_the_partial_result() -> None:
    truth = world(30)
    engine: MapReduceEngine

    def hook(req: BatchRequest) -> None:
        if req.batch_id == "batch-010":
            engine.cancel()

    engine = MapReduceEngine(WorldSolver(truth, hook=hook), config=EngineConfig(workers=1, max_batches=None))
    partial = engine.run(Decision.parse(world_decision(truth)))  # returned, not raised
    assert partial.cancelled and partial.ending.label == "stopped: the MapReduce run was cancelled"
    done = [r for r in partial.table.rows if not r.missing()]
    assert 7 <= len(done) < 30  # 3 threads hold jobs in order, but take the one slot in any order
    assert len(partial.table) == 30  # every known entity is still listed, the rest marked missing


@pytest.mark.usefixtures("python_sigint")
def test_ctrl_c_cancels_cleanly() -> None:
    truth = world(20)

    def hook(req: BatchRequest) -> None:
        if req.batch_id == "batch-005":
            _thread.interrupt_main()
            # CPython may deliver an interrupt raised from another thread only when the main thread
            # next blocks; holding this attempt until the engine cancels it guarantees that happens
            # inside `run` (otherwise the interrupt can land in a later test).
            assert req.cancel.wait(60)

    engine = MapReduceEngine(WorldSolver(truth, hook=hook, sleep=(0.001, 0.002)), config=EngineConfig(workers=2, max_batches=None))
    assert engine.run(Decision.parse(world_decision(truth))).ending.status is RunStatus.INTERRUPTED


def test_trace_and_progress(tmp_path: Path) -> None:
    truth = world(3)
    events: list[ProgressEvent] = []
    trace = TraceWriter(tmp_path / "trace.jsonl")
    engine = MapReduceEngine(WorldSolver(truth), config=EngineConfig(workers=2), trace=trace, progress=events.append)
    engine.run(Decision.parse(world_decision(truth)))
    trace.close()
    lines = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [e["event"] for e in lines] == ["run_start", "attempt", "attempt", "attempt", "run_end"]
    attempt = lines[1]
    assert {"prompt", "raw_output", "parsed_rows", "elapsed_s", "usage", "batch_id"} <= set(attempt)
    assert "[[E00" in attempt["prompt"] and attempt["parsed_rows"][0]["capital"].startswith("City")
    assert lines[-1]["summary"]["complete"] is True
    assert [e.done for e in events if e.kind == "batch_done"] == [1, 2, 3]


def test_batch_cap_applies_to_the_map() -> None:
    truth = world(51)
    with pytest.raises(DecisionError, match="51 batches"):
        run(world_decision(truth), WorldSolver(truth))
