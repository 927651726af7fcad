"""Results are returned, not raised (issue 36, part 2): the engine, compose and the session hand back
a stopped run's result with its ending; only the `mapreduce` tool, the smolagents boundary, raises
`RunCancelled`, which carries no result, and the session keeps the ending without walking causes."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from sessions import offline_settings, tool_session
from solvers import WorldSolver, world

from amapreduce.errors import BudgetExceeded, RunCancelled
from amapreduce.mapreduce.result import RunStatus
from amapreduce.mapreduce.solver import BatchRequest
from amapreduce.trace import read_trace

TRUTH = world(6)
ARGS = {
    "task_matrix": [[k] for k in TRUTH],
    "template": "Capital and population of [[__0__]]",
    "json_schema": {"type": "object", "properties": {"name": {}, "capital": {}, "population": {}}},
    "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
    "batch_size": 2,
}


def _raisers(repo_root: Path) -> list[str]:
    """Every `raise RunCancelled(...)` in the package, as `path:line`."""
    found = []
    for path in sorted((repo_root / "amapreduce").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            exc = node.exc if isinstance(node, ast.Raise) else None
            called = exc.func if isinstance(exc, ast.Call) else exc
            if isinstance(called, ast.Name) and called.id == "RunCancelled":
                found.append(f"{path.relative_to(repo_root).as_posix()}:{node.lineno}")
    return found


def test_run_cancelled_is_raised_only_at_the_tool_boundary(repo_root: Path) -> None:
    raisers = _raisers(repo_root)
    assert len(raisers) == 1 and raisers[0].startswith("amapreduce/agents/mapreduce_tool.py:"), raisers


def test_run_cancelled_carries_no_result() -> None:
    stop = RunCancelled("the run stopped: stopped: cancelled")
    assert not hasattr(stop, "partial") and stop.fields == {}


def test_a_budget_stop_comes_back_from_the_session_and_the_tool_raises_without_a_result(tmp_path: Path) -> None:
    calls = {"n": 0}

    def spent_after_two(request: BatchRequest) -> None:
        calls["n"] += 1
        if calls["n"] > 2:
            raise BudgetExceeded("the run's token budget is spent")

    settings = offline_settings(tmp_path, workers=1, patch_rounds=0, max_attempts=1)
    with tool_session(settings, WorldSolver(TRUTH, hook=spent_after_two), query="capitals?") as (session, tool):
        assert json.loads(tool(**ARGS))["call_stage"] == "plan"
        with pytest.raises(RunCancelled, match="token budget") as raised:
            tool(**ARGS)
        assert raised.value.__cause__ is None and not hasattr(raised.value, "partial")
        assert session.stopped is not None and session.stopped.status is RunStatus.STOPPED  # kept, not raised
        assert "token budget" in (session.stopped.reason or "")
        outcome = session.finish(stopped=session.stopped)
        run_dir = session.run_dir
    assert outcome.ending.status is RunStatus.STOPPED
    assert 0 < len([r for r in outcome.table.rows if not r.missing()]) < len(TRUTH)  # the rows found are kept
    executed = [e for e in read_trace(run_dir / "trace.jsonl", event="tool_call") if e["stage"] == "execute"]
    assert executed and executed[0]["output"]["status"].startswith("stopped:")  # the stopped call is traced too


def test_an_estimate_only_ask_returns_an_empty_result_ended_estimate_only(tmp_path: Path) -> None:
    settings = offline_settings(tmp_path, workers=1)
    with tool_session(settings, WorldSolver(TRUTH), query="capitals?", estimate_only=True) as (session, tool):
        tool(**ARGS)
        with pytest.raises(RunCancelled, match="estimate only"):
            tool(**ARGS)
        assert session.stopped is not None and (session.stopped.reason or "").startswith("estimate only")
        assert session.estimate is not None
