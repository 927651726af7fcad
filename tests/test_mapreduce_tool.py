"""The manager's `mapreduce` tool: plan stage, execute stage, guards, delta follow-ups, trace.

Each test runs the tool as a run does: on an open `Session` whose sub-agents are a scripted
solver; what the run kept (its table, calls, prior) is read from the session's `RunOutcome`, and
what was traced from the run's own `trace.jsonl`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sessions import offline_settings, tool_session, unused_models
from solvers import WorldSolver, world

from amapreduce.agents.mapreduce_tool import MapReduceTool
from amapreduce.errors import RunError, ToolCallRefused
from amapreduce.mapreduce.prior import Prior, PriorProvider, PriorRequest
from amapreduce.mapreduce.solver import BatchSolver
from amapreduce.session import RunOptions, Session
from amapreduce.session.journal import read_run_journal
from amapreduce.trace import read_trace

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


@contextlib.contextmanager
def make_tool(tmp_path: Path, solver: BatchSolver | None = None, *, max_calls: int = 4, workers: int = 4,
              patch_rounds: int = 2, prior_provider: PriorProvider | None = None, task_id: str | None = None,
              query: str = "capitals?") -> Iterator[tuple[Session, MapReduceTool]]:
    """The tool on an open session; `max_calls` is the run's `max_tool_calls`."""
    settings = offline_settings(tmp_path, workers=workers, patch_rounds=patch_rounds, max_tool_calls=max_calls)
    with tool_session(settings, solver or WorldSolver(TRUTH), query=query, task_id=task_id,
                      prior_provider=prior_provider) as opened:
        yield opened


def tool_calls(run_dir: Path) -> list[dict[str, Any]]:
    return list(read_trace(run_dir / "trace.jsonl", event="tool_call"))


def test_plan_then_execute(tmp_path: Path) -> None:
    provider = RecordingPrior()
    with make_tool(tmp_path, prior_provider=provider, task_id="ws_1") as (session, tool):
        plan = json.loads(tool(**ARGS))
        assert plan["call_stage"] == "plan"
        assert plan["experiential_prior"] == "- Use per_atom for short lists."
        assert plan["batch_plan"] == {"strategy": "per_atom", "num_batches": 4, "sizes": [2, 2, 2, 2]}
        assert plan["current_mapreduce_args"]["task_matrix_preview"][-1] == "... (3 more rows)"
        assert provider.requests[0].query == "capitals?" and provider.requests[0].task_id == "ws_1"
        assert session.prior is not None and session.prior.hint_ids == ("h1",)
        lines = tool(**ARGS).splitlines()
        outcome = session.finish()
    head = json.loads(lines[0])
    assert head["call_stage"] == "execute" and head["complete"] and head["rows"] == 8
    assert [json.loads(line)["name"] for line in lines[1:]] == list(TRUTH)
    assert len(outcome.table) == 8
    assert outcome.prior is not None and outcome.prior.hint_ids == ("h1",)


def test_without_plan_stage_executes_first(tmp_path: Path) -> None:
    """A run with no plan stage (a resumed one: its manager had planned before) executes on its
    first call."""
    settings = offline_settings(tmp_path, workers=4)
    with tool_session(settings, WorldSolver(TRUTH), query="capitals?") as (session, tool):
        assert json.loads(tool(**ARGS))["call_stage"] == "plan"
        killed = session.run_dir
    saved = read_run_journal(killed)
    assert saved is not None
    options = RunOptions(query="capitals?", solver=WorldSolver(TRUTH), web_tools=[], inner=unused_models,
                         show_progress=False)
    with Session(settings, options, resuming=(killed, saved)) as session:
        assert json.loads(MapReduceTool(session)(**ARGS).splitlines()[0])["call_stage"] == "execute"


def test_guards(tmp_path: Path) -> None:
    with make_tool(tmp_path, max_calls=3) as (_, tool):
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
    with make_tool(tmp_path / "a", max_calls=2) as (session, tool):
        tool(**ARGS)
        tool(**ARGS)
        with pytest.raises(ToolCallRefused, match="at most 2 times"):
            tool(**{**ARGS, "task_matrix": [["E002"]]})
        run_dir = session.run_dir
    calls = tool_calls(run_dir)
    assert [e["stage"] for e in calls] == ["plan", "execute", "refused"]
    assert calls[-1]["reason"] == "max_calls" and "at most 2 times" in calls[-1]["error"]
    assert calls[-1]["args"]["task_matrix"] == [["E002"]]

    with make_tool(tmp_path / "b") as (session, tool):
        tool(**ARGS)  # the plan stage
        tool(**ARGS)
        with pytest.raises(ToolCallRefused, match="already executed"):
            tool(**ARGS)
        outcome = session.finish()
    refused = [e for e in tool_calls(outcome.run_dir.path) if e["stage"] == "refused"]
    # the plan stage and the one execution: the refused call is not counted
    assert [e["reason"] for e in refused] == ["repeated_args"] and outcome.record.completeness.mapreduce_calls == 2


def test_invalid_decision_is_refused_without_using_a_call(tmp_path: Path) -> None:
    with make_tool(tmp_path) as (session, tool):
        with pytest.raises(ToolCallRefused, match=r"template uses __3__ .* Fix the arguments"):
            tool(**{**ARGS, "template": "about __3__"})
        plan = json.loads(tool(**ARGS))  # still the plan stage: the refused call was not counted
        outcome = session.finish()
    assert plan["call_stage"] == "plan" and outcome.record.completeness.mapreduce_calls == 1
    events = list(read_trace(outcome.run_dir.path / "trace.jsonl"))
    assert [(e["event"], e.get("stage")) for e in events] == [
        ("tool_call", "refused"), ("tool_call", "plan"), ("run_finished", None)
    ]


def test_delta_follow_up_fills_the_same_table(tmp_path: Path) -> None:
    with make_tool(tmp_path) as (session, tool):
        first = {**ARGS, "json_schema": ["name", "capital"]}
        tool(**first)  # the plan stage
        head = json.loads(tool(**first).splitlines()[0])
        assert head["table_rows_total"] == 8
        head = json.loads(
            tool(**{**ARGS, "task_matrix": [["E000"], ["E009"]], "json_schema": ["name", "population"]}).splitlines()[0]
        )
        assert head["table_rows_total"] == 9  # E009 joined the run's table; E000 filled its own row
        outcome = session.finish()
    assert outcome.results[0].table.records()[0] == {"name": "E000", "capital": "City0"}
    assert outcome.table.records()[0] == {"name": "E000", "capital": "City0"}  # population is not a column of the run table
    assert outcome.table.records()[-1] == {"name": "E009", "capital": ""}


def test_broken_memory_is_reported_not_hidden(tmp_path: Path) -> None:
    class Broken:
        def prior(self, request: PriorRequest) -> Prior:
            raise RunError("store is locked")

    with make_tool(tmp_path, prior_provider=Broken()) as (_, tool):
        plan = json.loads(tool(**ARGS))
    assert "unavailable for this run (RunError: store is locked)" in plan["experiential_prior"]


def test_tool_and_engine_share_one_trace(tmp_path: Path) -> None:
    with make_tool(tmp_path) as (session, tool):
        tool(**ARGS)  # the plan stage
        tool(**ARGS)
        run_dir = session.run_dir
    events = [e["event"] for e in read_trace(run_dir / "trace.jsonl")]
    assert events[0] == "tool_call"  # the plan stage's
    assert events[1] == "run_start" and events.count("attempt") == 4 and events[-2] == "tool_call"
    assert events[-1] == "run_finished"  # the session's own end of the run


def test_top_k_per_group_through_optional_inputs(tmp_path: Path) -> None:
    """key_columns / matrix_columns / rows_per_task let the manager delegate a top-k per group."""
    ranks = {"Asia": ["Tokyo", "Delhi"], "Europe": ["Moscow", "London"]}

    class TopK:
        def solve(self, request: Any) -> Any:
            from amapreduce.mapreduce.solver import SolverReply

            region = "Asia" if "Asia" in request.tasks[0] else "Europe"
            return SolverReply(output=[{"rank": str(i + 1), "city": c} for i, c in enumerate(ranks[region])])

    args: dict[str, Any] = {
        "task_matrix": [["Asia"], ["Europe"]],
        "template": "Two largest cities of __0__",
        "json_schema": ["region", "rank", "city"],
        "key_columns": ["region", "rank"],
        "rows_per_task": 2,
    }
    with make_tool(tmp_path, TopK()) as (session, tool):
        tool(**args)  # the plan stage
        head = json.loads(tool(**args).splitlines()[0])
        outcome = session.finish()
    assert head["complete"] and head["rows"] == 4
    assert [(r["region"], r["rank"], r["city"]) for r in outcome.table.records()] == [
        ("Asia", "1", "Tokyo"), ("Asia", "2", "Delhi"), ("Europe", "1", "Moscow"), ("Europe", "2", "London")
    ]


def test_what_is_still_missing_comes_right_after_the_summary_line(tmp_path: Path) -> None:
    """The manager sees a clipped tool output: the rows still missing must not be cut off the end
    behind a long table, so they come second, before the rows."""
    with make_tool(tmp_path, WorldSolver(TRUTH, drop_rate=1.0), patch_rounds=0) as (_, tool):
        tool(**ARGS)  # the plan stage
        lines = tool(**ARGS).splitlines()
    assert not json.loads(lines[0])["complete"]
    assert json.loads(lines[1])["count"] == 8 and len(json.loads(lines[1])["still_missing"]) == 8
    assert [json.loads(line)["name"] for line in lines[2:]] == list(TRUTH)
