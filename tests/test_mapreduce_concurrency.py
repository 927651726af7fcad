"""Runs sharing an engine or a tool are independent (issue 10, point 4).

smolagents runs one manager step's tool calls in parallel, and a process may run several
decisions on one engine. No sleeps: the scripted solvers hold attempts with `threading.Barrier`
and `threading.Event` so the runs really overlap.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sessions import offline_settings, tool_session
from solvers import WorldSolver, world, world_decision

from amapreduce.decision.model import Decision
from amapreduce.errors import BudgetExceeded, ToolCallRefused
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.result import MapReduceResult, RunStatus
from amapreduce.mapreduce.solver import BatchRequest
from amapreduce.settings import Settings

TRUTH = world(8)
FIRST, SECOND = dict(list(TRUTH.items())[:4]), dict(list(TRUTH.items())[4:])
WAIT_S = 30  # a safety net against a hang, never reached when the code is right
# One slot per run: a run's first attempt holds it at the barrier, so the barrier's other party
# must be the other run's attempt. A long deadline: no attempt of a correct engine times out.
CONFIG = EngineConfig(workers=1, batch_timeout_s=WAIT_S, patch_rounds=0, max_batches=None)


def first_attempts_meet(parties: int) -> WorldSolver:
    """A solver whose first `parties` attempts wait for each other before answering."""
    barrier = threading.Barrier(parties)
    seen = [0]
    lock = threading.Lock()

    def hook(request: BatchRequest) -> None:
        with lock:
            seen[0] += 1
            meet = seen[0] <= parties
        if meet:
            barrier.wait(WAIT_S)

    return WorldSolver(TRUTH, hook=hook)


def assert_every_attempt_answered(result: MapReduceResult) -> None:
    assert [r.outcome for r in result.attempts] == ["ok"] * len(result.attempts)
    assert result.summary.timeouts == 0 and result.ending.status is RunStatus.COMPLETE


def tool_settings(tmp_path: Path) -> Settings:
    """A run's settings carrying `CONFIG` (a manager's plans are always capped; these are 4 batches)."""
    return offline_settings(tmp_path, workers=CONFIG.workers, batch_timeout_s=CONFIG.batch_timeout_s,
                            patch_rounds=CONFIG.patch_rounds)


def test_two_tool_calls_in_one_step_keep_every_row(tmp_path: Path) -> None:
    with tool_session(tool_settings(tmp_path), first_attempts_meet(2)) as (session, tool):

        def call(entities: dict[str, Any]) -> str:
            out: str = tool(**world_decision(entities, batch_strategy={"type": "per_atom", "rationale": "r"}))
            return out

        call(TRUTH)  # the plan stage: runs nothing
        with ThreadPoolExecutor(2) as pool:  # as smolagents runs a step's parallel tool calls
            outputs = list(pool.map(call, [FIRST, SECOND]))
        outcome = session.finish()
    assert all('"complete": true' in out.splitlines()[0] for out in outputs)
    assert sorted(map(str, outcome.table.records())) == sorted(map(str, TRUTH.values()))
    assert not outcome.table.missing_cells()
    assert len(outcome.results) == len(outcome.decisions) == 2
    for result in outcome.results:
        assert_every_attempt_answered(result)


def test_follow_up_with_other_key_columns_is_refused_and_keeps_the_table(tmp_path: Path) -> None:
    with tool_session(tool_settings(tmp_path), WorldSolver(TRUTH)) as (session, tool):
        tool(**world_decision(FIRST))  # the plan stage
        tool(**world_decision(FIRST))
        with pytest.raises(ToolCallRefused, match=r"same key columns .*keyed by \['name', 'capital'\]"):
            tool(**world_decision(SECOND, key_columns=["name", "capital"]))
        outcome = session.finish()
    assert [r["name"] for r in outcome.table.records()] == list(FIRST)
    # the plan stage and the execution: a refused call does not use up one of the manager's calls
    assert outcome.record.completeness.mapreduce_calls == 2


def test_two_concurrent_runs_on_one_engine() -> None:
    engine = MapReduceEngine(first_attempts_meet(2), config=CONFIG)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(engine.run, Decision.parse(world_decision(part))) for part in (FIRST, SECOND)]
        results = [f.result() for f in futures]
    for result, part in zip(results, (FIRST, SECOND), strict=True):
        assert result.table.records() == [dict(v) for v in part.values()]
        assert_every_attempt_answered(result)


def test_a_budget_stop_ends_only_its_own_run() -> None:
    """Run A's attempt raises `BudgetExceeded` while run B's attempt is in flight: A stops, B
    finishes complete, and a later run C on the same engine runs normally."""
    b_in_flight, release_b = threading.Event(), threading.Event()

    def hook(request: BatchRequest) -> None:
        entity = request.tasks[0]
        if "[[E000]]" in entity:  # run A's first attempt
            assert b_in_flight.wait(WAIT_S)
            raise BudgetExceeded("the token budget of run A is spent")
        if "[[E004]]" in entity and not b_in_flight.is_set():  # run B's first attempt
            b_in_flight.set()
            assert release_b.wait(WAIT_S)

    engine = MapReduceEngine(WorldSolver(TRUTH, hook=hook), config=CONFIG)
    with ThreadPoolExecutor(2) as pool:
        run_b = pool.submit(engine.run, Decision.parse(world_decision(SECOND)))
        run_a = pool.submit(engine.run, Decision.parse(world_decision(FIRST)))
        partial = run_a.result(WAIT_S)  # A's stop is its result's ending
        release_b.set()  # B's attempt answers only after A has stopped
        result_b = run_b.result(WAIT_S)
    assert (
        partial.ending.status is RunStatus.STOPPED
        and partial.ending.reason == "the token budget of run A is spent"
    )
    assert partial.ending.label == "stopped: the token budget of run A is spent"
    assert result_b.table.records() == [dict(v) for v in SECOND.values()]
    assert_every_attempt_answered(result_b)
    result_c = engine.run(Decision.parse(world_decision(dict(list(SECOND.items())[1:]))))
    assert_every_attempt_answered(result_c)


def test_cancel_stops_the_runs_in_flight_but_not_a_later_run() -> None:
    engine: MapReduceEngine

    def hook(request: BatchRequest) -> None:
        if "[[E000]]" in request.tasks[0]:
            engine.cancel()

    engine = MapReduceEngine(WorldSolver(TRUTH, hook=hook), config=CONFIG)
    assert engine.run(Decision.parse(world_decision(FIRST))).ending.status is RunStatus.STOPPED
    assert_every_attempt_answered(engine.run(Decision.parse(world_decision(SECOND))))
