"""The manager's `mapreduce` tool: plan stage, execute stage, guards, delta follow-ups, trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from amapreduce.mapreduce.tool import MapReduceTool
from solvers import WorldSolver, world

from amapreduce.errors import RunError, ToolCallRefused
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.prior import Prior, PriorRequest
from amapreduce.trace import TraceWriter

TRUTH = world(8)
ARGS: dict[str, Any] = {
    "task_matrix": [[k] for k in TRUTH],
    "template": "Capital and population of [[__0__]]",
    "json_schema": {"type": "object", "properties": {"name": {}, "capital": {}, "population": {}}},
    "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
    "batch_size": 2,
}


class RecordingPrior:
    def __init__(self) -> None:
        self.requests: list[PriorRequest] = []

    def prior(self, request: PriorRequest) -> Prior:
        self.requests.append(request)
        return Prior(text="- Use per_atom for short lists.", hint_ids=("h1",))


def make_tool(**kw: Any) -> MapReduceTool:
    return MapReduceTool(MapReduceEngine(WorldSolver(TRUTH), config=EngineConfig(workers=4)), query="capitals?", **kw)


def test_plan_then_execute() -> None:
    provider = RecordingPrior()
    tool = make_tool(prior_provider=provider, task_id="ws_1")
    plan = json.loads(tool(**ARGS))
    assert plan["call_stage"] == "plan"
    assert plan["experiential_prior"] == "- Use per_atom for short lists."
    assert plan["batch_plan"] == {"strategy": "per_atom", "num_batches": 4, "sizes": [2, 2, 2, 2]}
    assert plan["current_mapreduce_args"]["task_matrix_preview"][-1] == "... (3 more rows)"
    assert provider.requests[0].query == "capitals?" and provider.requests[0].task_id == "ws_1"
    assert tool.prior is not None and tool.prior.hint_ids == ("h1",)
    lines = tool(**ARGS).splitlines()
    head = json.loads(lines[0])
    assert head["call_stage"] == "execute" and head["complete"] and head["rows"] == 8
    assert [json.loads(line)["name"] for line in lines[1:]] == list(TRUTH)
    assert tool.table is not None and len(tool.table) == 8


def test_without_plan_stage_executes_first() -> None:
    tool = make_tool(plan_stage=False)
    assert json.loads(tool(**ARGS).splitlines()[0])["call_stage"] == "execute"


def test_guards() -> None:
    tool = make_tool(max_calls=3)
    tool(**ARGS)
    tool(**ARGS)
    with pytest.raises(ToolCallRefused, match="already executed"):
        tool(**ARGS)
    delta = {**ARGS, "task_matrix": [["E001"]]}
    tool(**delta)
    with pytest.raises(ToolCallRefused, match="at most 3 times per run"):
        tool(**{**ARGS, "task_matrix": [["E002"]]})


def test_guard_refusals_are_traced(tmp_path: Path) -> None:
    """Every call the manager makes shows in the trace, including those the guards turn away."""
    trace = TraceWriter(tmp_path / "t.jsonl")
    tool = make_tool(max_calls=2, trace=trace)
    tool(**ARGS)
    tool(**ARGS)
    with pytest.raises(ToolCallRefused, match="at most 2 times"):
        tool(**{**ARGS, "task_matrix": [["E002"]]})
    trace.close()
    calls = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    calls = [e for e in calls if e["event"] == "tool_call"]
    assert [e["stage"] for e in calls] == ["plan", "execute", "refused"]
    assert calls[-1]["reason"] == "max_calls" and "at most 2 times" in calls[-1]["error"]
    assert calls[-1]["args"]["task_matrix"] == [["E002"]]

    trace = TraceWriter(tmp_path / "t2.jsonl")
    tool = make_tool(plan_stage=False, trace=trace)
    tool(**ARGS)
    with pytest.raises(ToolCallRefused, match="already executed"):
        tool(**ARGS)
    trace.close()
    calls = [json.loads(x) for x in (tmp_path / "t2.jsonl").read_text().splitlines()]
    refused = [e for e in calls if e["event"] == "tool_call" and e["stage"] == "refused"]
    assert [e["reason"] for e in refused] == ["repeated_args"] and tool.calls == 1


def test_invalid_decision_is_refused_without_using_a_call(tmp_path: Path) -> None:
    trace = TraceWriter(tmp_path / "t.jsonl")
    tool = make_tool(trace=trace)
    with pytest.raises(ToolCallRefused, match=r"template uses __3__ .* Fix the arguments"):
        tool(**{**ARGS, "template": "about __3__"})
    assert tool.calls == 0
    tool(**ARGS)
    trace.close()
    events = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [(e["event"], e["stage"]) for e in events] == [("tool_call", "refused"), ("tool_call", "plan")]


def test_delta_follow_up_fills_the_same_table() -> None:
    tool = make_tool(plan_stage=False)
    tool(**{**ARGS, "json_schema": ["name", "capital"]})
    assert tool.table is not None and tool.table.records()[0] == {"name": "E000", "capital": "City0"}
    tool(**{**ARGS, "task_matrix": [["E000"], ["E009"]], "json_schema": ["name", "population"]})
    assert tool.table.records()[0] == {"name": "E000", "capital": "City0"}  # population is not a column of the run table
    assert tool.table.records()[-1] == {"name": "E009", "capital": ""}


def test_broken_memory_is_reported_not_hidden() -> None:
    class Broken:
        def prior(self, request: PriorRequest) -> Prior:
            raise RunError("store is locked")

    plan = json.loads(make_tool(prior_provider=Broken())(**ARGS))
    assert "unavailable for this run (RunError: store is locked)" in plan["experiential_prior"]


def test_tool_and_engine_share_one_trace(tmp_path: Path) -> None:
    trace = TraceWriter(tmp_path / "run.jsonl")
    tool = MapReduceTool(MapReduceEngine(WorldSolver(TRUTH), trace=trace), plan_stage=False)
    tool(**ARGS)
    trace.close()
    events = [json.loads(x)["event"] for x in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert events[0] == "run_start" and events.count("attempt") == 4 and events[-1] == "tool_call"


def test_top_k_per_group_through_optional_inputs() -> None:
    """key_columns / matrix_columns / rows_per_task let the manager delegate a top-k per group."""
    ranks = {"Asia": ["Tokyo", "Delhi"], "Europe": ["Moscow", "London"]}

    class TopK:
        def solve(self, request: Any) -> Any:
            from amapreduce.mapreduce.solver import SolverReply

            region = "Asia" if "Asia" in request.tasks[0] else "Europe"
            return SolverReply(output=[{"rank": str(i + 1), "city": c} for i, c in enumerate(ranks[region])])

    tool = MapReduceTool(MapReduceEngine(TopK()), plan_stage=False)
    head = json.loads(
        tool(
            task_matrix=[["Asia"], ["Europe"]],
            template="Two largest cities of __0__",
            json_schema=["region", "rank", "city"],
            key_columns=["region", "rank"],
            rows_per_task=2,
        ).splitlines()[0]
    )
    assert head["complete"] and head["rows"] == 4
    assert tool.table is not None
    assert [(r["region"], r["rank"], r["city"]) for r in tool.table.records()] == [
        ("Asia", "1", "Tokyo"), ("Asia", "2", "Delhi"), ("Europe", "1", "Moscow"), ("Europe", "2", "London")
    ]


def test_what_is_still_missing_comes_right_after_the_summary_line() -> None:
    """The manager sees a clipped tool output: the rows still missing must not be cut off the end
    behind a long table, so they come second, before the rows."""
    tool = MapReduceTool(MapReduceEngine(WorldSolver(TRUTH, drop_rate=1.0), config=EngineConfig(workers=4, patch_rounds=0)),
                         query="capitals?", plan_stage=False)
    lines = tool(**ARGS).splitlines()
    assert not json.loads(lines[0])["complete"]
    assert json.loads(lines[1])["count"] == 8 and len(json.loads(lines[1])["still_missing"]) == 8
    assert [json.loads(line)["name"] for line in lines[2:]] == list(TRUTH)
