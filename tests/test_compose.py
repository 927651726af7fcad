"""Composed execution through the real engine: nested decisions, discovery, provenance, stops.

The sub-agents are scripted (`tests/solvers.py`): a task names its entity as `[[name]]` and
the solver answers from a small truth table, so every run is deterministic.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from solvers import ENTITY, WorldSolver

from amapreduce.decision import Decision
from amapreduce.errors import BudgetExceeded, DecisionError, ProviderRejected
from amapreduce.journal import JournalEntry
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.checkpoint import Checkpoint
from amapreduce.mapreduce.compose import execute_decision
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.result import RunStatus
from amapreduce.mapreduce.solver import BatchRequest, SolverReply
from amapreduce.table.render import to_jsonl

YEARS = ["2019", "2020"]
RANKS = ["1", "2", "3"]
TRUTH = {f"{y}-{r}": {"company": f"Co{y}{r}", "revenue": str(int(y) * 10 + int(r))} for y in YEARS for r in RANKS}


def engine(solver: Any, **config: Any) -> MapReduceEngine:
    return MapReduceEngine(solver, config=EngineConfig(**{"workers": 2, **config}))


def two_levels(**extra: Any) -> dict[str, Any]:
    """Per year, a child that finds each rank's company and revenue."""
    return {
        "task_matrix": [[y] for y in YEARS], "template": "Top companies of __0__",
        "json_schema": ["year", "rank", "company", "revenue"], "key_columns": ["year", "rank"],
        "child": "top", "decisions": {"top": {
            "task_matrix": [[r] for r in RANKS], "template": "Company ranked __0__: [[__parent_0__-__0__]]",
            "json_schema": ["rank", "company", "revenue"], "batch_size": 2,
        }},
        **extra,
    }


def chain(depth: int, **extra: Any) -> dict[str, Any]:
    """`depth` levels: the year, then (depth - 2) pass-through levels, then the rank's fill."""
    levels = {"fill": {
        "task_matrix": [[r, "__parent_1__"] for r in RANKS], "matrix_columns": ["rank", None],
        "template": "Company ranked __0__: [[__1__-__0__]]", "json_schema": ["rank", "company", "revenue"],
    }}
    below = "fill"
    for k in range(depth - 2):
        name = f"pass{k}"
        levels[name] = {"task_matrix": [["all", "__parent_1__"]], "matrix_columns": [None, None],
                        "template": "Level __0__ of __1__", "json_schema": ["rank", "company", "revenue"],
                        "key_columns": ["rank"], "child": below}
        below = name
    return {"task_matrix": [[y, y] for y in YEARS], "matrix_columns": ["year", None], "template": "Year __0__",
            "json_schema": ["year", "rank", "company", "revenue"], "key_columns": ["year", "rank"],
            "child": below, "decisions": levels, **extra}


def test_nested_rows_merge_with_the_parent_cells_forced_and_their_origin() -> None:
    solver = WorldSolver(TRUTH)
    result = execute_decision(engine(solver), Decision.parse(two_levels()))
    assert result.ending.status is RunStatus.COMPLETE and result.summary.complete
    assert [(r["year"], r["rank"], r["company"]) for r in result.table.records()] == [
        (y, r, f"Co{y}{r}") for y in YEARS for r in RANKS]
    first = result.table.rows[0]
    assert first.origin == "top[2019]" and first.task_index == 0 and result.table.rows[3].task_index == 1
    assert first.cells["year"].source == "task_matrix" and first.cells["rank"].source == "task_matrix"
    assert first.cells["company"].source == "https://world.example/2019-1"
    rows = result.table.to_json()["rows"]
    assert rows[4]["origin"] == "top[2020]"
    assert json.loads(to_jsonl(result.table, with_status=True).splitlines()[0])["_origin"] == "top[2019]"
    # each child ran through the engine with its parent's cells filled in
    assert sorted({ENTITY.search(t).group(1) for q in solver.requests for t in q.tasks}) == sorted(TRUTH)  # type: ignore[union-attr]


def test_nested_decisions_run_to_the_depth_limit_and_no_further() -> None:
    for depth, limit in [(3, None), (4, 4), (8, 8)]:
        extra = {} if limit is None else {"max_depth": limit}
        result = execute_decision(engine(WorldSolver(TRUTH)), Decision.parse(chain(depth, **extra)))
        assert result.summary.complete and len(result.table) == len(TRUTH)
        names = [*(f"pass{k}" for k in reversed(range(depth - 2))), "fill"]  # from the root down
        cells = ["2019, 2019", *["all, 2019"] * (depth - 2)]  # each step: the parent task it ran for
        assert result.table.rows[0].origin == "/".join(f"{n}[{c}]" for n, c in zip(names, cells, strict=True))
    with pytest.raises(DecisionError, match=r"nesting depth 4 exceeds max_depth 3 at decisions\[pass1\] -> "
                                            r"decisions\[pass0\] -> decisions\[fill\]"):
        Decision.parse(chain(4))


def test_the_summary_adds_up_the_children() -> None:
    decision = Decision.parse(two_levels())
    def solver() -> WorldSolver:
        return WorldSolver(TRUTH, drop_rate=0.3, fail_rate=0.3, seed=7)
    combined = execute_decision(engine(solver(), patch_rounds=2), decision)
    alone = [engine(solver(), patch_rounds=2).run(decision.child_for(i)).summary for i in range(len(YEARS))]
    s = combined.summary
    assert s.retries == sum(c.retries for c in alone) > 0
    assert s.patch_rounds == sum(c.patch_rounds for c in alone)
    assert s.attempts == sum(c.attempts for c in alone) == len(combined.attempts)
    assert s.batches == sum(c.batches for c in alone) and s.failures == sum(c.failures for c in alone)
    assert s.usage == sum((c.usage for c in alone), Usage())
    assert s.missing_cells == sum(c.missing_cells for c in alone)
    assert s.rows == sum(c.rows for c in alone)
    assert s.completeness.expected_rows == sum(c.completeness.expected_rows or 0 for c in alone)
    assert s.incomplete_tasks == sum(c.incomplete_tasks for c in alone)
    assert combined.ending.status is s.completeness.status
    assert {a.batch_id.split("/")[0] for a in combined.attempts} == {"top[2019]", "top[2020]"}


class Stopper:
    """Answers from `TRUTH`, but raises `error` for the task naming `entity`."""

    def __init__(self, entity: str, error: Exception) -> None:
        self.inner = WorldSolver(TRUTH)
        self.entity, self.error = entity, error

    def solve(self, request: BatchRequest) -> SolverReply:
        if any(f"[[{self.entity}]]" in t for t in request.tasks):
            raise self.error
        return self.inner.solve(request)


def test_a_budget_stop_in_a_child_stops_the_run_with_its_path_and_the_rows_so_far() -> None:
    decision = Decision.parse(chain(3))
    partial = execute_decision(engine(Stopper("2020-2", BudgetExceeded("the cost budget of $0.10 is spent"))), decision)
    where = "child pass0 of task 1 (2020, 2020): child fill of task 0 (all, 2020): the cost budget of $0.10 is spent"
    assert partial.ending.status is RunStatus.STOPPED and partial.ending.reason == where
    assert [r["year"] for r in partial.table.records()].count("2019") == 3  # the first year's rows are kept
    assert ("2020", "1") in {(r["year"], r["rank"]) for r in partial.table.records()}


def test_a_refusing_provider_fails_the_run_and_keeps_rejected() -> None:
    decision = Decision.parse(two_levels())
    ending = execute_decision(engine(Stopper("2019-3", ProviderRejected("401 wrong key", provider="x", failures=1,
                                                                         last_error="401"))), decision).ending
    assert ending.status is RunStatus.FAILED and ending.rejected
    assert ending.reason.startswith("child top of task 0 (2019): 401 wrong key")


def test_a_child_that_cannot_start_fails_the_run_with_its_path() -> None:
    decision = Decision.parse(two_levels())  # each child plans 2 batches: over a cap of 1
    failed = execute_decision(engine(WorldSolver(TRUTH), max_batches=1), decision)
    ending = failed.ending
    assert ending.status is RunStatus.FAILED and ending.error is not None
    assert re.match(r"child top of task 0 \(2019\): .*batch", ending.error)
    assert len(failed.table) == 0


def test_a_resumed_nested_run_replays_every_child_from_the_checkpoint() -> None:
    class Sink:
        def __init__(self) -> None:
            self.entries: list[JournalEntry] = []

        def append(self, entry: JournalEntry) -> None:
            self.entries.append(entry)

    sink = Sink()
    decision = Decision.parse(two_levels())
    first = execute_decision(engine(WorldSolver(TRUTH)), decision, checkpoint=Checkpoint(sink))
    again = WorldSolver(TRUTH)
    resumed = execute_decision(engine(again), decision, checkpoint=Checkpoint(Sink(), saved=sink.entries))
    assert again.requests == [] and resumed.table.records() == first.table.records()
    assert resumed.summary.attempts == first.summary.attempts


# -- discovery --------------------------------------------------------------------------------------

PAGES = {"list-a": ["Paris", "Rome"], "list-b": ["Rome", "Oslo"], "list-2019": ["Paris"], "list-2020": ["Oslo", "Lima"]}
POPULATION = {"Paris": "2.1M", "Rome": "2.8M", "Oslo": "0.7M", "Lima": "10M"}
LISTING = re.compile(r"List every city on (\S+)\.")


class Atlas:
    """Lists cities for a discovery task, fills a city's population for a fill task."""

    def __init__(self) -> None:
        self.requests: list[BatchRequest] = []

    def solve(self, request: BatchRequest) -> SolverReply:
        self.requests.append(request)
        rows: list[dict[str, Any]] = []
        for number, task in enumerate(request.tasks, 1):
            listing = LISTING.search(task)
            if listing:
                page = listing.group(1)
                rows += [{"task": number, "City": c, "source": f"https://atlas.example/{page}"} for c in PAGES[page]]
            else:
                city = ENTITY.search(task).group(1)  # type: ignore[union-attr]
                rows.append({"task": number, "Population": POPULATION[city], "source": f"https://atlas.example/{city}"})
        return SolverReply(output=json.dumps(rows), usage=Usage(requests=1, input_tokens=10))


def fill(sources: list[str], **extra: Any) -> dict[str, Any]:
    return {"discover": {"sources": sources, "template": "List every city on __0__.", "json_schema": ["City"]},
            "template": "Population of [[__0__]]", "json_schema": ["City", "Population"], **extra}


def test_discovery_becomes_the_task_matrix_of_the_fill() -> None:
    solver = Atlas()
    result = execute_decision(engine(solver), Decision.parse(fill(["list-a", "list-b"])))
    assert result.table.records() == [{"City": c, "Population": POPULATION[c]} for c in ["Paris", "Rome", "Oslo"]]
    assert result.discovery is not None and result.discovery.sources == 2 and result.discovery.entities == 3
    assert result.summary.complete and result.summary.attempts == len(solver.requests) == len(result.attempts)
    assert result.summary.usage.requests == len(solver.requests)
    assert [a.batch_id.startswith("discover/") for a in result.attempts].count(True) == 2


def test_a_discovery_that_finds_nothing_is_an_incomplete_run() -> None:
    PAGES["list-empty"] = []
    try:
        result = execute_decision(engine(Atlas()), Decision.parse(fill(["list-empty"])))
    finally:
        del PAGES["list-empty"]
    assert result.ending.status is RunStatus.INCOMPLETE and len(result.table) == 0
    assert result.summary.incomplete_tasks == 1 and result.discovery is not None and result.discovery.entities == 0


def test_a_child_discovers_per_parent_task_and_the_discoveries_add_up() -> None:
    child = fill(["list-__parent_0__"])
    decision = Decision.parse({"task_matrix": [["2019"], ["2020"]], "template": "Cities of __0__",
                               "json_schema": ["year", "City", "Population"], "key_columns": ["year", "City"],
                               "child": child})
    result = execute_decision(engine(Atlas()), decision)
    assert [(r["year"], r["City"], r["Population"]) for r in result.table.records()] == [
        ("2019", "Paris", "2.1M"), ("2020", "Oslo", "0.7M"), ("2020", "Lima", "10M")]
    assert [r.origin for r in result.table.rows] == ["child[2019]", "child[2020]", "child[2020]"]
    assert result.discovery is not None and result.discovery.sources == 2 and result.discovery.entities == 3
    assert result.summary.complete


def test_a_discovered_matrix_can_run_a_child_per_entity() -> None:
    child = {"task_matrix": [["__parent_0__"]], "template": "Population of [[__0__]]", "json_schema": ["City", "Population"]}
    decision = Decision.parse({**fill(["list-a", "list-b"]), "child": child})
    result = execute_decision(engine(Atlas()), decision)
    assert result.table.records() == [{"City": c, "Population": POPULATION[c]} for c in ["Paris", "Rome", "Oslo"]]
    assert [r.origin for r in result.table.rows] == ["child[Paris]", "child[Rome]", "child[Oslo]"]
    assert result.discovery is not None and result.discovery.entities == 3 and result.summary.complete
    assert result.summary.attempts == len(result.attempts) == 2 + 3  # two discovery batches, a child per city


def test_a_budget_stop_in_a_merge_call_stops_the_run_like_a_map_stop() -> None:
    class Broke:
        def merge(self, candidates: Any, node: Any) -> Any:
            raise BudgetExceeded("the token budget of 100 is spent")

    spec = fill(["list-a", "list-b"])
    spec["discover"]["merge"] = "model"
    ending = execute_decision(engine(Atlas()), Decision.parse(spec), merger=Broke()).ending
    assert ending.status is RunStatus.STOPPED
    assert ending.reason == "discovery: the token budget of 100 is spent (while merging candidates)"


def test_a_cancel_between_two_children_stops_the_run_before_the_next_child() -> None:
    """`engine.cancel()` reaches only runs in flight: one that comes after a child has ended and
    before the next starts (here: when the first child's `child_run` event is written) must still
    stop the composed run, with the first child's rows kept and no request for the second."""
    from amapreduce.trace import Trace

    asked: list[str] = []
    eng = engine(WorldSolver(TRUTH, hook=lambda request: asked.extend(request.tasks)))

    class CancelAfterFirstChild(Trace):
        def write(self, event: str, **data: Any) -> None:
            if event == "child_run":
                eng.cancel()

    eng.trace = CancelAfterFirstChild()
    partial = execute_decision(eng, Decision.parse(two_levels()))
    assert partial.ending.status is RunStatus.STOPPED
    assert {r["year"] for r in partial.table.records()} == {"2019"} and len(partial.table) == 3
    assert not any("2020" in task for task in asked)


def test_the_merge_calls_usage_is_in_the_runs_summary() -> None:
    """A discovery's merge calls are model calls of the run: their usage adds to the summary's,
    like the sub-agents' (a reply from the run's merge cache costs nothing again)."""
    from amapreduce.mapreduce.merge import MergeGroup, MergeReply

    class Merging:
        def __init__(self, cached: bool) -> None:
            self.cached = cached

        def merge(self, candidates: Any, node: Any) -> MergeReply:
            return MergeReply(groups=tuple(MergeGroup(ids=(c.id,), keep=c.id) for c in candidates),
                              usage=Usage(requests=1, input_tokens=500), cached=self.cached)

    spec = fill(["list-a", "list-b"])
    spec["discover"]["merge"] = "model"
    plain = execute_decision(engine(Atlas()), Decision.parse(fill(["list-a", "list-b"])))
    merged = execute_decision(engine(Atlas()), Decision.parse(spec), merger=Merging(cached=False))
    cached = execute_decision(engine(Atlas()), Decision.parse(spec), merger=Merging(cached=True))
    assert merged.discovery is not None and merged.discovery.merge_calls >= 1
    calls = merged.discovery.merge_calls
    assert merged.summary.usage.requests == plain.summary.usage.requests + calls
    assert merged.summary.usage.input_tokens == plain.summary.usage.input_tokens + 500 * calls
    assert cached.summary.usage.requests == plain.summary.usage.requests
