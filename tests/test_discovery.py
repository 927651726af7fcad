"""Discovery as MapReduce: map over sources through the real engine, code dedup, model merge by tree reduce."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from sessions import mapreduce_run, offline_settings, tool_session
from smolagents.models import ChatMessage
from test_mapreduce_engine import FnSolver

from amapreduce.decision.discover_spec import DiscoverSpec
from amapreduce.journal import JournalEntry
from amapreduce.llm.messages import message_text
from amapreduce.llm.tokens import TokenCounter
from amapreduce.mapreduce.checkpoint import Checkpoint
from amapreduce.mapreduce.discover import DiscoveryResult, discover, discovery_decision
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.merge import Candidate, ModelMerger
from amapreduce.mapreduce.solver import BatchRequest, SolverReply
from amapreduce.mapreduce.tree_reduce import Node
from amapreduce.table.table import CellStatus
from amapreduce.testing.scripted import FunctionModel, ModelInfo
from amapreduce.trace import Trace

SOURCE = re.compile(r"\[\[(.+?)\]\]")
TEMPLATE = "List every city on [[__0__]] with its country."


class ListTrace(Trace):
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def write(self, event: str, **data: Any) -> None:
        self.events.append((event, data))


class PageSolver(FnSolver):
    """A scripted sub-agent: each task names a page; it lists that page's cities, one row each."""

    def __init__(self, pages: dict[str, list[dict[str, str]]]) -> None:
        super().__init__(self.answer)
        self.pages = pages

    def answer(self, request: BatchRequest) -> str:
        rows = []
        for number, task in enumerate(request.tasks, 1):
            page = SOURCE.search(task).group(1)  # type: ignore[union-attr]
            rows += [{"task": number, **city, "source": f"https://atlas.example/{page}"} for city in self.pages[page]]
        return json.dumps(rows)


class Refuse:
    def solve(self, request: BatchRequest) -> SolverReply:
        raise AssertionError(f"a resumed discovery ran batch {request.batch_id} again")


class ListSink:
    def __init__(self) -> None:
        self.entries: list[JournalEntry] = []

    def append(self, entry: JournalEntry) -> None:
        self.entries.append(entry)


def canonical(city: str) -> str:
    return re.sub(r"^(st\.?|sankt|santo|san)\s+", "saint ", city.strip().casefold())


class Chars(TokenCounter):
    """chars/4, whatever tokenizer this machine has: tree shapes in these tests must not depend on it."""

    def count(self, text: str) -> int:
        return (len(text) + 3) // 4


class Merging:
    """The scripted merge model: groups candidates whose city is the same after `canonical`, keeps the
    longest spelling; records every prompt's token count."""

    def __init__(self, *, extra: list[dict[str, Any]] | None = None, leave_out: bool = False) -> None:
        self.counter = Chars(None)
        self.prompt_tokens: list[int] = []
        self.extra = extra or []
        self.leave_out = leave_out
        self.model = FunctionModel(self.reply, model_id="sim/merger")

    def reply(self, messages: list[ChatMessage], info: ModelInfo) -> str:
        system, user = (message_text(m) for m in messages)
        assert system.startswith("You merge lists of candidate entities: decide which candidates name the same entity.")
        self.prompt_tokens.append(self.counter.count(f"{system}\n{user}"))
        lines = user.split("Candidates (one JSON object per line):\n", 1)[1].splitlines()
        by_name: dict[tuple[str, str], list[dict[str, str]]] = {}
        for line in lines:
            cand = json.loads(line)
            by_name.setdefault((canonical(cand["City"]), cand["Country"]), []).append(cand)
        groups = [{"ids": [c["id"] for c in cands], "keep": max(cands, key=lambda c: len(c["City"]))["id"]}
                  for cands in by_name.values() if not (self.leave_out and len(cands) == 1)]
        return json.dumps({"groups": groups + self.extra})


def spec(**extra: Any) -> DiscoverSpec:
    data: dict[str, Any] = {"sources": ["p0", "p1", "p2"], "template": TEMPLATE, "json_schema": ["City", "Country", "Mayor"],
                            "key_columns": ["City", "Country"], **extra}
    return DiscoverSpec.model_validate(data)


PAGES = {
    "p0": [{"City": "St. Petersburg", "Country": "Russia", "Mayor": "Ivan"}, {"City": "Oslo", "Country": "Norway", "Mayor": "Anne"}],
    "p1": [{"City": "oslo", "Country": "Norway"}, {"City": "Saint Petersburg", "Country": "Russia"},
           {"City": "Bergen", "Country": "Norway"}],
    "p2": [{"City": "Sankt Petersburg", "Country": "Russia"}, {"City": "Moscow", "Country": "Russia"}],
}


def run(the_spec: DiscoverSpec, merging: Merging | None = None, *, pages: Any = PAGES, **kwargs: Any) -> DiscoveryResult:
    engine = MapReduceEngine(PageSolver(pages), config=EngineConfig(workers=2, patch_rounds=0, max_attempts=1))
    merger = ModelMerger(merging.model, counter=merging.counter) if merging is not None else None
    return discover(engine, the_spec, merger=merger, **kwargs)


def test_map_decision_uses_sources_as_context_and_spec_keys() -> None:
    decision = discovery_decision(spec(batch_size=2))
    assert decision.task_matrix == [["p0"], ["p1"], ["p2"]]
    assert decision.resolved_matrix_columns == (None,)
    assert decision.resolved_key_columns == ("City", "Country")
    assert not decision.one_row_per_task and decision.batch_size == 2


def test_code_merge_dedups_by_normalised_key_only() -> None:
    result = run(spec())
    assert result.rows == [["St. Petersburg", "Russia"], ["Oslo", "Norway"], ["Saint Petersburg", "Russia"],
                           ["Bergen", "Norway"], ["Sankt Petersburg", "Russia"], ["Moscow", "Russia"]]
    s = result.summary
    assert (s.sources, s.candidates, s.entities, s.merge_calls, s.levels) == (3, 6, 6, 0, 0)
    assert s.nodes == ("map", "map", "map") and s.token_budget is None and s.warnings == ()
    oslo = result.table.rows[1].cells
    assert oslo["City"].source == "https://atlas.example/p0" and oslo["Mayor"].value == "Anne"


def test_model_merge_groups_fuzzy_duplicates_and_keeps_the_chosen_spelling() -> None:
    merging = Merging()
    trace = ListTrace()
    result = run(spec(merge="model"), merging, trace=trace)
    # first-seen order (St. Petersburg came first), the kept (longest, then first) spelling with its own evidence
    assert result.rows == [["Saint Petersburg", "Russia"], ["Oslo", "Norway"], ["Bergen", "Norway"], ["Moscow", "Russia"]]
    first = result.table.rows[0].cells
    assert first["City"].source == "https://atlas.example/p1"
    assert first["Mayor"].value == "Ivan"  # a gap of the kept row filled from a row merged into it
    assert first["Mayor"].source == "https://atlas.example/p0"
    s = result.summary
    assert (s.candidates, s.entities, s.merge_calls, s.levels) == (6, 4, 1, 0)
    assert s.nodes == ("map", "map", "map", "final")  # everything fits the budget: one final call
    assert s.token_budget == 64_000 and 0 < s.peak_prompt_tokens <= s.token_budget
    assert s.peak_prompt_tokens == max(merging.prompt_tokens)
    nodes = [(d["node"], d["level"]) for e, d in trace.events if e == "tree_node"]
    assert nodes == [("map", 0), ("map", 0), ("map", 0), ("final", 1)]
    assert [e for e, _ in trace.events].count("merge_call") == 1
    assert trace.events[-1][0] == "discovery" and trace.events[-1][1]["summary"]["entities"] == 4


def big_world(pages: int = 30, per_page: int = 15, entities: int = 30) -> dict[str, list[dict[str, str]]]:
    """`pages` list pages of `per_page` cities each over `entities` entities; page p spells them its own way."""
    spellings = ("Saint {}", "St. {}", "Sankt {}", "St {}", "San {}", "Santo {}")
    return {
        f"page{p:02d}": [
            {"City": spellings[p % len(spellings)].format(f"Town{(p * 7 + i) % entities:03d}"), "Country": "Atlantis"}
            for i in range(per_page)
        ]
        for p in range(pages)
    }


def test_adaptive_tree_reduce_merges_everything_with_no_call_over_the_budget() -> None:
    world = big_world()  # 30 pages x 15 cities over 30 entities, six spellings: 180 distinct candidates
    merging = Merging()
    budget = 1_200
    result = run(spec(sources=list(world), merge="model", token_budget=budget, max_levels=6), merging, pages=world)
    assert len(result.rows) == 30 and len({canonical(r[0]) for r in result.rows}) == 30
    assert result.rows[0] == ["Saint Town000", "Atlantis"]  # first seen (page00), longest spelling kept
    s = result.summary
    assert s.candidates == 180 and s.entities == 30 and s.warnings == ()
    assert s.nodes[30:] == ("reduce L1",) * 3 + ("reduce L2", "final") and s.levels == 2
    assert s.merge_calls == merging.model.calls == len(merging.prompt_tokens) == 5
    assert max(merging.prompt_tokens) <= budget and s.peak_prompt_tokens == max(merging.prompt_tokens)
    assert s.token_budget == budget


def test_static_chunk_size_tree_shape() -> None:
    world = big_world(pages=6, per_page=10, entities=12)
    merging = Merging()
    result = run(spec(sources=list(world), merge="model", chunk_size=2), merging, pages=world)
    assert len(result.rows) == 12
    s = result.summary
    # 6 lists -> 3 (L1) -> 2 (L2: a pair and a single merged list, which needs no call) -> final
    assert s.nodes == ("map",) * 6 + ("reduce L1",) * 3 + ("reduce L2",) * 2 + ("final",)
    assert s.levels == 2 and s.token_budget is None
    assert s.merge_calls == merging.model.calls == 5


def test_budget_too_small_for_two_lists_is_combined_in_code_never_dropped() -> None:
    world = big_world(pages=6, per_page=10, entities=12)
    merging = Merging()
    result = run(spec(sources=list(world), merge="model", token_budget=300), merging, pages=world)
    assert {canonical(r[0]) for r in result.rows} == {f"saint town{i:03d}" for i in range(12)}
    assert all(t <= 300 for t in merging.prompt_tokens)
    assert any("over the token budget" in w for w in result.summary.warnings)


def test_ids_left_out_are_kept_and_unknown_ids_are_warned() -> None:
    merging = Merging(extra=[{"ids": ["c99"], "keep": "c99"}], leave_out=True)
    result = run(spec(merge="model"), merging)
    assert [r[0] for r in result.rows] == ["Saint Petersburg", "Oslo", "Bergen", "Moscow"]  # singles never dropped
    assert any("unknown candidate id 'c99'" in w for w in result.summary.warnings)


def test_model_merge_without_a_merger_warns_and_dedups_in_code() -> None:
    result = run(spec(merge="model"))
    assert len(result.rows) == 6 and result.summary.merge_calls == 0
    assert "no merge model" in result.summary.warnings[0]


def test_single_candidate_needs_no_merge_call() -> None:
    merging = Merging()
    result = run(spec(sources=["p9"], merge="model"), merging, pages={"p9": [{"City": "Oslo", "Country": "Norway"}]})
    assert result.rows == [["Oslo", "Norway"]] and merging.model.calls == 0
    assert result.summary.nodes == ("map",)


def test_resume_does_not_repeat_map_batches() -> None:
    sink = ListSink()
    first = run(spec(merge="model"), Merging(), checkpoint=Checkpoint(sink))
    assert any(e.type == "batch_attempt" for e in sink.entries)
    engine = MapReduceEngine(Refuse(), config=EngineConfig(workers=2, patch_rounds=0, max_attempts=1))
    merging = Merging()
    again = discover(engine, spec(merge="model"), merger=ModelMerger(merging.model, counter=merging.counter),
                     checkpoint=Checkpoint(ListSink(), sink.entries))
    assert again.rows == first.rows and again.summary == first.summary
    assert merging.model.calls == 1  # merge calls are not journaled: asked again


def test_summary_json_shape() -> None:
    out = run(spec()).summary.to_json()
    assert set(out) == {"sources", "candidates", "entities", "merge_calls", "levels", "nodes", "peak_prompt_tokens",
                        "token_budget", "warnings"}
    assert out["nodes"] == ["map", "map", "map"] and json.dumps(out)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"chunk_size": 3, "token_budget": 100}, "exclusive"),
        ({"chunk_size": 1}, "greater than or equal to 2"),
        ({"budget_ratio": 0}, "budget_ratio must be a number in (0, 1]"),
        ({"budget_ratio": 1.5}, "got 1.5"),
        ({"budget_ratio": True}, "got True"),
        ({"budget_ratio": float("nan")}, "got nan"),
        ({"max_levels": 0}, "greater than or equal to 1"),
        ({"template": "List cities"}, "no __0__"),
        ({"template": "List __0__ and __1__"}, "use only __0__"),
        ({"sources": ["p0", " P0 "]}, "the same"),
        ({"sources": []}, "at least 1"),
        ({"key_columns": ["Town"]}, "not a column"),
        ({"merge": "llm"}, "'code' or 'model'"),
        ({"extra": 1}, "Extra inputs"),
    ],
)
def test_spec_validation(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        spec(**extra)


def test_spec_budget_values() -> None:
    assert spec().resolved_key_columns == ("City", "Country")
    assert DiscoverSpec.model_validate({"sources": ["a"], "template": "__0__", "json_schema": ["A", "B"]}).resolved_key_columns == ("A",)
    assert spec().token_budget_for(100_000) == 50_000
    assert spec(budget_ratio=0.25).token_budget_for(1000) == 250
    assert spec(token_budget=700).token_budget_for(1000) == 700
    assert spec(chunk_size=4).token_budget_for(1000) is None


def test_merged_table_keeps_conflicts_of_the_kept_row() -> None:
    pages = {"p0": [{"City": "Oslo", "Country": "Norway", "Mayor": "Anne"}],
             "p1": [{"City": "OSLO", "Country": "Norway", "Mayor": "Bob"}]}
    result = run(spec(sources=["p0", "p1"]), pages=pages)
    mayor = result.table.rows[0].cells["Mayor"]
    assert mayor.value == "Anne" and mayor.status is CellStatus.CONFLICT and mayor.alternatives == ["Bob"]


FILL = re.compile(r"<<(.+?)\|(.+?)>>")


class AtlasSolver(PageSolver):
    """Lists pages for discovery tasks and answers the fill tasks (`<<city|country>>`) with a mayor."""

    def answer(self, request: BatchRequest) -> str:
        if all(SOURCE.search(t) for t in request.tasks):
            return super().answer(request)
        return json.dumps([{"task": n, "Mayor": f"Mayor of {FILL.search(t).group(1)}", "source": "https://atlas.example/mayors"}  # type: ignore[union-attr]
                           for n, t in enumerate(request.tasks, 1)])


def test_tool_plans_then_runs_a_discovery_and_its_fill(tmp_path: Path) -> None:
    solver = AtlasSolver(PAGES)
    merging = Merging()
    # The run's merge model is its sub-agent role's model: here the scripted merger (the solver
    # replaces the sub-agents); its context window is the setting's.
    settings = offline_settings(tmp_path, workers=2, patch_rounds=0, max_attempts=1, context_window=10_000)
    args: dict[str, Any] = {
        "template": "Who is the mayor of <<__0__|__1__>>?",
        "json_schema": ["City", "Country", "Mayor"],
        "discover": {"sources": ["p0", "p1", "p2"], "template": TEMPLATE, "json_schema": ["City", "Country"],
                     "key_columns": ["City", "Country"], "merge": "model"},
    }
    with tool_session(settings, solver, query="mayors of cities", inner=lambda role: merging.model) as (session, tool):
        plan = json.loads(tool(**args))
        assert plan["call_stage"] == "plan" and plan["discovery_plan"]["num_batches"] == 3
        assert "follows discovery" in plan["batch_plan"] and plan["current_mapreduce_args"]["discover"]["sources"] == 3
        assert solver.requests == []  # planning runs nothing
        lines = tool(**args).splitlines()
        outcome = session.finish()
    head = json.loads(lines[0])
    assert head["call_stage"] == "execute" and head["discovery"]["entities"] == 4 and head["discovery"]["merge_calls"] == 1
    rows = [json.loads(line) for line in lines[1:5]]
    assert [r["City"] for r in rows] == ["Saint Petersburg", "Oslo", "Bergen", "Moscow"]
    assert rows[0]["Mayor"] == "Mayor of Saint Petersburg"
    assert len(outcome.table) == 4
    assert outcome.results[0].discovery is not None and outcome.results[0].discovery.token_budget == 5_000


def test_tool_refuses_a_discovery_with_a_matrix(tmp_path: Path) -> None:
    from amapreduce.errors import ToolCallRefused

    with tool_session(offline_settings(tmp_path), AtlasSolver(PAGES)) as (_, tool):
        with pytest.raises(ToolCallRefused, match="discover"):
            tool(template="Mayor of <<__0__|__1__>>", json_schema=["City", "Country", "Mayor"],
                 task_matrix=[["Oslo", "Norway"]],
                 discover={"sources": ["p0"], "template": TEMPLATE, "json_schema": ["City", "Country"],
                           "key_columns": ["City", "Country"]})


class SimulatedAtlas:
    """One scripted model for the sub-agent role: lists pages, answers mayors, and merges by `Merging`'s rule."""

    def __init__(self) -> None:
        self.merging = Merging()
        self.asked: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, messages: list[ChatMessage], info: ModelInfo) -> Any:
        from amapreduce.testing.scripted import final_answer

        first = message_text(messages[0])
        if first.startswith("You merge lists of candidate entities"):
            return self.merging.reply(messages, info)
        text = "\n".join(message_text(m) for m in messages).rsplit("Sub-questions:", 1)[-1]
        rows: list[dict[str, Any]] = []
        for number, line in enumerate((ln for ln in text.splitlines() if re.match(r"\d+\. ", ln)), 1):
            with self.lock:
                self.asked.append(line)
            if page := SOURCE.search(line):
                rows += [{"task": number, **c, "source": f"https://atlas.example/{page.group(1)}"} for c in PAGES[page.group(1)]]
            elif city := FILL.search(line):
                rows.append({"task": number, "Mayor": f"Mayor of {city.group(1)}", "source": "https://atlas.example/m"})
        return final_answer(json.dumps(rows))


def test_mapreduce_run_discovers_fills_records_and_resumes(tmp_path: Any) -> None:
    from amapreduce.decision.model import Decision
    from amapreduce.session.journal import read_run_journal
    from amapreduce.session.resume import resume
    from amapreduce.session.session import DECISION_FILE
    from amapreduce.settings import load_settings

    sim = SimulatedAtlas()
    settings = load_settings({"AMAPREDUCE_MODEL": "sim/atlas", "AMAPREDUCE_RUNS_DIR": str(tmp_path),
                              "AMAPREDUCE_EXTRACTION_MODEL": "none", "AMAPREDUCE_WORKERS": "2"})
    decision = Decision.parse({
        "template": "Who is the mayor of <<__0__|__1__>>?", "json_schema": ["City", "Country", "Mayor"],
        "discover": {"sources": ["p0", "p1", "p2"], "template": TEMPLATE, "json_schema": ["City", "Country"],
                     "key_columns": ["City", "Country"], "merge": "model"},
    })
    inner = lambda role: FunctionModel(sim, model_id="sim/atlas")  # noqa: E731
    outcome = mapreduce_run(decision, settings, label="mayors", inner=inner, web_tools=[], show_progress=False)
    assert outcome.status == "complete"
    assert [r["City"] for r in outcome.result.table.records()] == ["Saint Petersburg", "Oslo", "Bergen", "Moscow"]
    assert outcome.record.discovery.entities == 4 and outcome.record.discovery.merge_calls == 1
    path = outcome.run_dir.path
    assert Decision.parse(json.loads((path / DECISION_FILE).read_text(encoding="utf-8"))) == decision
    asked = len(sim.asked)
    saved = read_run_journal(path)
    assert saved is not None
    again = resume(path, saved, settings, inner=inner, web_tools=[], show_progress=False)
    assert again.status == "complete" and again.result.table.records() == outcome.result.table.records()
    assert len(sim.asked) == asked  # every map and fill batch replayed from the journal
    assert len(sim.merging.prompt_tokens) == 1  # the merge reply came from the run directory's merge cache
    same = outcome.record.discovery.model_dump(exclude={"peak_prompt_tokens"})  # cached: counted, not the provider's
    assert again.record.discovery.model_dump(exclude={"peak_prompt_tokens"}) == same


def test_ask_keeps_the_executed_decisions_once_one_is_composed(tmp_path: Path) -> None:
    """A resumed `ask` reruns the manager's decisions; a composed one is not in the journal as such."""
    from amapreduce.decision.model import Decision
    from amapreduce.mapreduce.batching import plan_batches
    from amapreduce.session.resume import saved_decisions
    from amapreduce.session.session import EXECUTED_FILE

    plain = Decision.parse({"task_matrix": [["Oslo", "Norway"]], "template": "Mayor of <<__0__|__1__>>",
                            "json_schema": ["City", "Country", "Mayor"]})
    composed = Decision.parse({"template": "Mayor of <<__0__|__1__>>", "json_schema": ["City", "Country", "Mayor"],
                               "discover": {"sources": ["p0"], "template": TEMPLATE, "json_schema": ["City", "Country"],
                                            "key_columns": ["City", "Country"]}})
    plan = plan_batches(plain)
    # an `ask` session executing the manager's decisions (the scripted sub-agents list the pages and answer mayors)
    with tool_session(offline_settings(tmp_path, context_window=20_000), AtlasSolver(PAGES)) as (session, _):
        session.execute(plain, plan)
        assert not (session.run_dir / EXECUTED_FILE).exists()  # plain decisions only: the journal has them
        session.execute(composed)
        run_dir = session.run_dir
        assert (run_dir / EXECUTED_FILE).is_file()  # once one is composed: every executed decision, in order
        assert saved_decisions(run_dir, None) == [(plain, plan), (composed, None)]  # type: ignore[arg-type]


def test_context_window_setting_then_model_info_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from amapreduce.errors import ConfigError
    from amapreduce.session import parts as wiring
    from amapreduce.settings import load_settings

    fake = types.ModuleType("litellm")
    fake.model_cost = {"big-model": {"max_input_tokens": 1_000_000}, "tiny": {"max_tokens": 4096}}  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "litellm", fake)
    wiring._litellm_context_window.cache_clear()
    try:
        plain = load_settings({})
        assert wiring.context_window_for(plain, "acme/big-model") == 1_000_000  # provider prefix dropped
        assert wiring.context_window_for(plain, "tiny") == 4096
        assert wiring.context_window_for(plain, "sim/unknown") == 128_000
        assert wiring.context_window_for(load_settings({"AMAPREDUCE_CONTEXT_WINDOW": "32000"}), "acme/big-model") == 32_000
    finally:
        wiring._litellm_context_window.cache_clear()
    with pytest.raises(ConfigError, match="AMAPREDUCE_CONTEXT_WINDOW"):
        load_settings({"AMAPREDUCE_CONTEXT_WINDOW": "12"})


def test_run_parts_carry_a_model_merger(tmp_path: Any) -> None:
    from amapreduce.llm.factory import new_meter
    from amapreduce.session.parts import build_models, build_parts
    from amapreduce.settings import load_settings
    from amapreduce.trace import NullTrace

    settings = load_settings({"AMAPREDUCE_MODEL": "sim/atlas", "AMAPREDUCE_CONTEXT_WINDOW": "20000",
                              "AMAPREDUCE_EXTRACTION_MODEL": "none"})
    sim = SimulatedAtlas()
    meter = new_meter(settings)
    models = build_models(settings, ("subagent",), meter=meter, trace=NullTrace(),
                          inner=lambda role: FunctionModel(sim, model_id="sim/atlas"))
    with build_parts(settings, models=models, trace=NullTrace(), web_tools=[]) as parts:
        assert isinstance(parts.merger, ModelMerger) and parts.merger.model is parts.models["subagent"]
        assert parts.context_window() == 20_000
        pair = [Candidate("c0", {"City": "St. Oslo", "Country": "Norway"}),
                Candidate("c1", {"City": "Saint Oslo", "Country": "Norway"})]
        reply = parts.merger.merge(pair, Node("final", 1, 0, 2, 10))
    assert reply.groups[0].ids == ("c0", "c1") and reply.usage.requests == 1  # metered as the sub-agent role
    assert meter.by_role()["subagent"].requests == 1


def test_a_budget_stop_during_the_merge_keeps_the_candidates() -> None:
    from amapreduce.errors import BudgetExceeded
    from amapreduce.mapreduce.result import RunStatus

    def spent(messages: list[ChatMessage], info: ModelInfo) -> str:
        raise BudgetExceeded("the run's cost budget of $0.01 is spent")

    engine = MapReduceEngine(PageSolver(PAGES), config=EngineConfig(workers=2, patch_rounds=0, max_attempts=1))
    found = discover(engine, spec(merge="model"), merger=ModelMerger(FunctionModel(spent), counter=Chars(None)))
    assert found.stopped and found.rows == []  # returned, not raised
    ending = found.map_result.ending
    assert ending.status is RunStatus.STOPPED and "budget" in (ending.reason or "")
    assert "while merging candidates" in (ending.reason or "")
    assert len(found.table) == 6 and found.summary.candidates == 6  # every candidate of the map kept
