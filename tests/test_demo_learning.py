"""The simulated model's side of learning (issue 11): a sub-agent capacity that makes batching a
real decision, a manager with a fixed default, seeded exploration and hints it follows, and a
simulated memory model (deterministic code, not an LLM) that distils those hints from records.

Every run here goes through the real pipeline (`run_ask`: manager agent, mapreduce tool, engine,
sub-agents, reducer) over the sandbox corpus; every memory prompt is the one the real memory renders.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from sessions import ask as run_ask

from amapreduce.decision.model import Decision
from amapreduce.demo.faults import FaultPlan
from amapreduce.demo.hints import (
    BatchingHint,
    RowShape,
    advice_of,
    format_hint,
    hint_applies,
    parse_hint,
    read_hint,
    write_hint,
)
from amapreduce.demo.memory_model import MEMORY_MODEL_ID, SimulatedMemoryModel
from amapreduce.demo.model import (
    CAPACITY_CELLS,
    JITTER_ONE_IN,
    OVERLOAD_COST,
    SimulatedAtlasModel,
    answer_limit,
)
from amapreduce.demo.plan import (
    EXPLORATION_SIZES,
    Batching,
    advised_batching,
    default_batching,
    explore_batching,
    plan_cap,
)
from amapreduce.demo.run import demo_settings, load_sandbox_tasks, score_answer
from amapreduce.llm.factory import new_meter
from amapreduce.mapreduce.prior import Prior, PriorRequest
from amapreduce.memory import ExperientialMemory, MemoryConfig
from amapreduce.memory.advice import compute_advice
from amapreduce.memory.llm import ask
from amapreduce.memory.parsing import parse_list, parse_operations
from amapreduce.memory.records import DecisionSummary, TraceSummary
from amapreduce.memory.retrieval import Retrieval, ScoredHint
from amapreduce.memory.store import insert_hint
from amapreduce.prompts import render_prompt
from amapreduce.session.outcome import RunOutcome as AskOutcome
from amapreduce.settings import Settings
from amapreduce.testing.scripted import SIMULATED_PRICES

PASS = {"score": 1.0, "f1_by_row": 1.0, "f1_by_item": 1.0}
CODES_3 = "sbx_en_030"
"""14 countries of South America with ISO3 code, capital, calling code: rows of 3 attributes."""
CODES_HINT = BatchingHint(attributes=3, rows=4, lossy_rows=6)


# -- wiring ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any, Path]:
    cache = tmp_path_factory.mktemp("cache")
    tasks, built = load_sandbox_tasks(Settings(cache_dir=cache))
    return tasks, built, cache


class FixedPrior:
    """A prior provider that always returns the same text (for runs that only need a batching)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def prior(self, request: PriorRequest) -> Prior:
        return Prior(text=self.text)


def run_task(world: tuple[dict[str, Any], Any, Path], runs: Path, task_id: str, *, sample: int = 0,
             capacity: int | None = CAPACITY_CELLS, provider: Any = None) -> tuple[AskOutcome, dict[str, float]]:
    """`run_demo`'s wiring (simulated model, sandbox corpus, real `run_ask`) with a chosen prior provider."""
    tasks, built, cache = world
    base = Settings.model_validate({"cache_dir": cache, "runs_dir": runs, "workers": 4})
    settings = demo_settings(base, built.index_dir)
    model = SimulatedAtlasModel(sample=sample, capacity_cells=capacity)
    outcome = run_ask(tasks[task_id].query, settings, inner=lambda role: model,
                      meter=new_meter(settings, prices_by_prefix=SIMULATED_PRICES), task_id=task_id,
                      show_progress=False, prior_provider=provider)
    return outcome, score_answer(tasks[task_id], built.gold_dir, outcome.markdown)


def trace_events(outcome: AskOutcome, event: str) -> list[dict[str, Any]]:
    lines = (outcome.run_dir.path / "trace.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == event]


def plan_stage_args(outcome: AskOutcome) -> dict[str, Any]:
    return next(e["args"] for e in trace_events(outcome, "tool_call") if e["stage"] == "plan")


def asked(prompt: str) -> int:
    """Sub-questions a batch prompt numbers."""
    return len(re.findall(r"^\d+\. ", prompt.partition("Sub-questions:")[2], flags=re.MULTILINE))


class TypedPrior:
    """A prior provider handing over one hint as the plan stage does: its sentence in the prose and
    its typed payload in the computed advice (`memory.advice.compute_advice`, no records)."""

    def __init__(self, hint: BatchingHint) -> None:
        self.hint = hint

    def prior(self, request: PriorRequest) -> Prior:
        assert request.decision is not None
        advice = compute_advice(request.decision, [], MemoryConfig(), [("h-test", advice_of(self.hint))])
        return Prior(text=format_hint(self.hint), hint_ids=("h-test",), kept_hint_ids=("h-test",),
                     details={"advice": advice.to_json()})


def hint_prior(hint: BatchingHint) -> TypedPrior:
    return TypedPrior(hint)


# -- 1. the sub-agent's capacity ------------------------------------------------------------------


def test_answer_limit_holds_capacity_cells_of_whole_rows_and_overload_costs_room() -> None:
    limits = {cols: answer_limit("p", columns=cols, asked_rows=1, capacity_cells=16) for cols in (5, 4, 3, 2)}
    assert limits == {5: 3, 4: 4, 3: 5, 2: 8}  # best rows per batch differ by the row's width
    # Every cell asked for beyond the capacity costs OVERLOAD_COST (2) cells of room: 5 rows x 4
    # cells ask 20, so 16 - 2 * 4 = 8 cells (2 rows) are left; a batch of 6 or of 58 rows leaves no
    # room, and still answers one row.
    assert OVERLOAD_COST == 2
    assert answer_limit("p", columns=4, asked_rows=5, capacity_cells=16) == 2
    assert answer_limit("p", columns=4, asked_rows=6, capacity_cells=16) == 1
    assert answer_limit("p", columns=4, asked_rows=58, capacity_cells=16) == 1
    assert answer_limit("p", columns=4, asked_rows=58, capacity_cells=None) is None
    prompts = [f"batch prompt {i}" for i in range(800)]
    full = [answer_limit(p, columns=4, asked_rows=4, capacity_cells=16) for p in prompts]
    assert full == [answer_limit(p, columns=4, asked_rows=4, capacity_cells=16) for p in prompts]  # seeded by text
    assert set(full) == {3, 4}  # the jitter: sometimes exactly one row fewer
    assert 0.5 / JITTER_ONE_IN < full.count(3) / len(full) < 2.0 / JITTER_ONE_IN


def test_oversized_batches_are_cut_after_whole_rows_reproducibly(world: Any, tmp_path: Path) -> None:
    six = hint_prior(BatchingHint(attributes=3, rows=6))

    def first_answers(runs: Path, capacity: int | None) -> list[dict[str, Any]]:
        out, score = run_task(world, runs, CODES_3, capacity=capacity, provider=six)
        assert out.record.decisions[0]["batch_size"] == 6 and score["score"] == 1.0  # retries recover
        first = [e for e in trace_events(out, "attempt") if e["phase"] == "map" and e["attempt"] == 1]
        return sorted(first, key=lambda e: e["batch_id"])  # in batch order, not completion order

    cut = first_answers(tmp_path / "a", CAPACITY_CELLS)
    assert sorted(asked(e["prompt"]) for e in cut) == [2, 6, 6]  # 14 rows in batches of 6
    full_batches = [e for e in cut if asked(e["prompt"]) == 6]
    for attempt in full_batches:
        raw = attempt["raw_output"]
        assert raw.startswith("[") and raw.endswith(",")  # cut as at an output-token limit
        rows = attempt["parsed_rows"]
        assert len(rows) == 1  # 6 rows x 4 cells ask 24 of 16 cells: room for one row only
        assert all(r["ISO3 Code"] and r["Capital"] and r["Calling Code"] for r in rows)  # whole rows only
    assert [e["raw_output"] for e in first_answers(tmp_path / "b", CAPACITY_CELLS)] == [e["raw_output"] for e in cut]
    unlimited = first_answers(tmp_path / "c", None)
    assert [len(json.loads(e["raw_output"])) for e in unlimited] == [asked(e["prompt"]) for e in unlimited]


def test_faults_spoil_a_cut_answer_without_closing_it() -> None:
    """A reply cut at the capacity can still get a fault on top: cells dropped, or cut further."""
    model = SimulatedAtlasModel(faults=FaultPlan(rate=1.0, seed=4))
    rows = [{"task": k, "Capital": f"C{k}", "source": f"corpus://sandbox/{k}"} for k in (1, 2, 3)]
    cut = "[" + ", ".join(json.dumps(r) for r in rows) + ","
    dropped = model._spoil(cut, "drop", "subagent|k|0")
    assert dropped.endswith(",") and len(json.loads(dropped[:-1] + "]")) == 3
    assert json.loads(dropped[:-1] + "]") != rows  # some cells were emptied, none invented
    shorter = model._spoil(cut, "malformed", "subagent|k|1")
    assert not shorter.rstrip().endswith("]")


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity_cells"):
        SimulatedAtlasModel(capacity_cells=0)
    with pytest.raises(ValueError, match="sample"):
        SimulatedAtlasModel(sample=-1)


# -- 2. the manager: default, exploration, hints --------------------------------------------------


def test_the_default_is_one_row_per_subagent_under_the_stated_plan_cap() -> None:
    instructions = render_prompt("manager", "instructions", max_batches=7)
    assert plan_cap(["system text", instructions]) == 7 and plan_cap(["no cap here"]) is None
    one = default_batching([["a"]] * 14, 50)
    assert (one.strategy, one.rows) == ("per_atom", 1) and "one row per sub-agent" in one.rationale
    assert default_batching([["a"]] * 58, 50).rows == 2  # only as large as the cap requires
    assert default_batching([["a"]] * 14, 7).rows == 2 and default_batching([["a"]] * 58, None).rows == 1


def test_exploration_is_a_seeded_choice_from_a_small_grid() -> None:
    one_col, two_col = [["a"]] * 20, [["x", "1"], ["x", "2"], ["y", "1"]]
    picks = [explore_batching("q", k, one_col, 50) for k in range(1, 40)]
    assert picks == [explore_batching("q", k, one_col, 50) for k in range(1, 40)]  # same trial, same choice
    assert {p.rows for p in picks} == set(EXPLORATION_SIZES) and {p.strategy for p in picks} == {"per_atom"}
    assert all("exploring" in p.rationale for p in picks)
    assert [p.rows for p in picks] != [explore_batching("another q", k, one_col, 50).rows for k in range(1, 40)]
    two = {(p.strategy, p.rows) for p in (explore_batching("q", k, two_col, 50) for k in range(1, 40))}
    assert ("by_attr", None) in two  # two-column matrices may also group by their first column
    assert all(explore_batching("q", k, [["a"]] * 100, 10).rows >= 10 for k in range(1, 20))  # never over the cap
    many_groups = [[f"g{i}", "1"] for i in range(30)]
    grouped = [explore_batching("q", k, many_groups, 10) for k in range(1, 40)]
    assert {(b.strategy, b.rows) for b in grouped if "first matrix column" in b.rationale} == {("per_atom", 3)}


def test_typed_advice_applies_by_row_shape_and_stays_under_the_cap() -> None:
    draft = {"task_matrix": [[f"a{i}"] for i in range(30)], "template": "__0__", "json_schema": ["c", "x", "y", "z"]}
    decision = Decision.parse(draft)

    def advice(*hints: BatchingHint) -> dict[str, Any]:
        return compute_advice(decision, [], MemoryConfig(), [(f"h{k}", advice_of(h)) for k, h in enumerate(hints)]).to_json()

    wrong = BatchingHint(attributes=2, rows=5)
    assert advised_batching(advice(wrong, CODES_HINT), draft, 50) == (
        Batching(rows=4, rationale="following the typed advice of hint h1"), False)
    assert advised_batching(advice(wrong), draft, 50) == (None, False)
    assert advised_batching(advice(CODES_HINT), draft, 3) == (Batching(
        rows=10, rationale="following the typed advice of hint h0; 10 rows per batch keep the plan under 3 batches"), False)
    proposal = {"proposal": {"strategy": "per_atom", "batch_size": 5}, "hints": []}
    assert advised_batching(proposal, draft, 50) == (None, True)  # accepted as proposed: use_advice
    assert advised_batching(proposal, draft, 3) == (None, False)  # 6 batches: over the stated cap
    assert advised_batching(None, draft, 50) == (None, False)


def test_the_manager_explores_with_a_sample_and_defaults_without(world: Any, tmp_path: Path) -> None:
    tasks = world[0]
    sample = next(k for k in range(1, 50) if explore_batching(tasks[CODES_3].query, k, [["a"]] * 14, 50).rows == 3)
    explored, score = run_task(world, tmp_path, CODES_3, sample=sample)
    executed = explored.record.decisions[0]
    assert executed["batch_size"] == 3 and executed["batch_strategy"]["rationale"] == "exploring 3 rows per sub-agent batch"
    assert score["score"] == 1.0 and explored.record.completeness.batches == 5
    default, score = run_task(world, tmp_path, CODES_3)
    assert default.record.decisions[0]["batch_size"] == 1 and score["score"] == 1.0
    assert default.record.completeness.attempts == 14 > explored.record.completeness.attempts


def test_a_hint_in_the_plan_stage_prior_changes_the_executed_decision(world: Any, tmp_path: Path) -> None:
    """A real store (hashing encoder) and the simulated memory model's projection."""
    tasks = world[0]
    memory = ExperientialMemory(tmp_path / "mem", encoder="hashing", model=SimulatedMemoryModel())
    seen = memory.update(None, query=tasks["sbx_en_003"].query, metrics=PASS, task_id="sbx_en_003",
                         decision=Decision.parse({"task_matrix": [["Chad"]], "template": "__0__",
                                                  "json_schema": ["Country", "ISO3 Code", "Capital", "Calling Code"],
                                                  "batch_size": 4}), auto_distill=False)
    other = BatchingHint(attributes=4, rows=3)
    with memory.store.write() as conn:
        ids = [insert_hint(conn, format_hint(hint), 3, origin="test", provenance=[seen.record_id or ""],
                           advice=advice_of(hint)) for hint in (CODES_HINT, other)]
    out, score = run_task(world, tmp_path / "runs", CODES_3, provider=memory)
    assert out.prior is not None and format_hint(CODES_HINT) in out.prior.text
    assert format_hint(other) not in out.prior.text  # projected away: rows of 4 attributes
    assert out.prior.kept_hint_ids == (ids[0],)  # the projection cited the one that applies
    assert plan_stage_args(out)["batch_size"] == 1  # the draft was the default ...
    executed = out.record.decisions[0]
    assert executed["batch_size"] == 4  # ... the execute call follows the typed advice
    assert executed["batch_strategy"]["rationale"] == f"following the typed advice of hint {ids[0]}"
    assert score["score"] == 1.0 and out.record.completeness.batches == 4
    memory.close()


def test_a_reworded_hint_is_followed_by_its_payload_and_without_it_completes_uncredited(
        world: Any, tmp_path: Path) -> None:
    """Same advice in other words: with its typed payload it is followed (and credited under
    `credit_rule: used`); with the payload removed the run completes on prose only, the simulated
    projection cannot cite it, and it is not credited."""
    tasks = world[0]
    reworded = "Rows that ask three facts of one named entity: four of them fit in one sub-agent's answer."
    for payload in (True, False):
        memory = ExperientialMemory(tmp_path / f"mem-{payload}", encoder="hashing", model=SimulatedMemoryModel())
        seen = memory.update(None, query=tasks["sbx_en_003"].query, metrics=PASS, task_id="sbx_en_003",
                             decision=Decision.parse({"task_matrix": [["Chad"]], "template": "__0__",
                                                      "json_schema": ["Country", "ISO3 Code", "Capital", "Calling Code"]}),
                             auto_distill=False)
        with memory.store.write() as conn:
            hid = insert_hint(conn, reworded, 3, origin="test", provenance=[seen.record_id or ""],
                              advice=advice_of(CODES_HINT) if payload else None)
        out, score = run_task(world, tmp_path / f"runs-{payload}", CODES_3, provider=memory)
        executed = Decision.parse(out.record.decisions[0])
        assert score["score"] == 1.0 and out.prior is not None and out.prior.hint_ids == (hid,)
        assert executed.batch_size == (4 if payload else 1)
        assert out.prior.kept_hint_ids == ((hid,) if payload else ())
        result = memory.update(out.prior, decision=executed, metrics=score, task_id=CODES_3, auto_distill=False)
        assert result.credited == ({hid: 5} if payload else {})
        memory.close()


def test_a_hint_for_another_row_shape_is_not_followed(world: Any, tmp_path: Path) -> None:
    out, score = run_task(world, tmp_path, CODES_3, provider=hint_prior(BatchingHint(attributes=4, rows=3)))
    executed = out.record.decisions[0]
    assert executed["batch_size"] == 1 and "following" not in executed["batch_strategy"]["rationale"]
    assert score["score"] == 1.0


# -- 3. the hint grammar --------------------------------------------------------------------------


def test_hints_round_trip_and_name_only_structure() -> None:
    hints = [CODES_HINT, BatchingHint(attributes=1, rows=1, matrix_columns=1),
             BatchingHint(attributes=2, rows=3, matrix_columns=2, strategy="by_attr", lossy_rows=5)]
    for hint in hints:
        assert parse_hint(format_hint(hint)) == hint
        assert parse_hint(f"2. **{format_hint(hint)}**") == hint  # list markers and emphasis are ignored
    assert format_hint(CODES_HINT) == (
        "When each row of a one-column task matrix asks for 3 attributes, put up to 4 rows in one sub-agent batch "
        "(per_atom, batch_size 4): batches of 4 rows came back complete; batches of 6 rows lost rows.")
    assert parse_hint("Group rows by continent to reuse the list page.") is None
    assert parse_hint("When each row of a 2-column task matrix asks for 2 attributes, put up to 4 rows in one "
                      "sub-agent batch (per_atom, batch_size 4).") == BatchingHint(attributes=2, rows=4, matrix_columns=2)
    decision = Decision.parse({"task_matrix": [["Peru"]], "template": "__0__", "json_schema": ["a", "b", "c", "d"]})
    assert RowShape.of(decision) == RowShape(matrix_columns=1, attributes=3) == CODES_HINT.shape
    assert hint_applies(CODES_HINT, decision) and not hint_applies(BatchingHint(attributes=3, rows=4, matrix_columns=2), decision)


def test_the_memory_model_writes_a_typed_payload_and_reads_it_back() -> None:
    written = write_hint(CODES_HINT)
    assert written.startswith(format_hint(CODES_HINT) + " ADVICE: {")
    assert read_hint(written) == CODES_HINT
    assert advice_of(CODES_HINT).to_json() == {"strategy": "per_atom", "batch_size": 4,
                                               "applies_when": {"cols": [4, 4], "matrix_cols": [1, 1]}}
    reworded = "Rows asking 3 facts of one named entity: batch 4 per sub-agent. ADVICE: " + written.split("ADVICE: ")[1]
    assert read_hint(reworded) == BatchingHint(attributes=3, rows=4)  # the payload carries the advice
    assert read_hint("Rows asking 3 facts of one named entity: batch 4 per sub-agent.") is None


def test_the_manager_reads_no_prose(world: Any, tmp_path: Path) -> None:
    """The simulated manager reads the typed advice only: the hint's sentence alone changes nothing."""
    out, score = run_task(world, tmp_path, CODES_3, provider=FixedPrior(format_hint(CODES_HINT)))
    assert out.record.decisions[0]["batch_size"] == 1 and score["score"] == 1.0


# -- 4. the simulated memory model, on the prompts the memory renders -----------------------------


def pattern(rows: int, columns: int, *, batch_size: int | None = None, strategy: dict[str, Any] | None = None,
            width: int = 1) -> str:
    matrix = [[f"e{i}", *(["k"] * (width - 1))] for i in range(rows)]
    decision = Decision.parse({"task_matrix": matrix, "template": " ".join(f"__{j}__" for j in range(width)),
                               "json_schema": [f"c{j}" for j in range(columns)], "batch_size": batch_size,
                               **({"batch_strategy": strategy} if strategy else {})})
    return DecisionSummary.of(decision, batches=-(-rows // (batch_size or 1))).pattern


def compare(good: str, weak: str, rules: list[str], max_ops: int = 4) -> list[tuple[str, int | None, str]]:
    listed = "\n".join(f"{k}. {t}" for k, t in enumerate(rules, 1)) or "(no rules yet)"
    user = render_prompt("memory", "compare_user", pos_query="List every country of A with three codes.",
                         pos_pattern=good, neg_query="List every country of B with three codes.", neg_pattern=weak,
                         rules=listed, format=render_prompt("memory", "operation_format", max_ops=max_ops))
    ops, rejected = parse_operations(ask(SimulatedMemoryModel(), render_prompt("memory", "compare_system"), user))
    assert rejected == []
    return [(o.op, o.number, o.text) for o in ops]


def test_contrastive_refinement_adds_raises_agrees_and_lowers() -> None:
    good, weak = pattern(58, 4, batch_size=4), pattern(51, 4, batch_size=6)
    assert compare(good, weak, []) == [("ADD", None, write_hint(CODES_HINT))]
    lower = write_hint(BatchingHint(attributes=3, rows=2))
    assert compare(good, weak, [lower]) == [("EDIT", 1, write_hint(CODES_HINT))]  # raised to the larger success
    assert compare(good, weak, [write_hint(CODES_HINT)]) == [("AGREE", 1, write_hint(CODES_HINT))]
    big = write_hint(BatchingHint(attributes=3, rows=8))
    assert compare(good, weak, [big]) == [("EDIT", 1, write_hint(CODES_HINT))]  # lowered below the weaker size
    unrelated = write_hint(BatchingHint(attributes=1, rows=8))
    assert compare(good, weak, [unrelated]) == [("ADD", None, write_hint(CODES_HINT))]
    # a weaker case of another shape lowers that shape's rule only
    assert compare(good, pattern(30, 5, batch_size=4), [write_hint(BatchingHint(attributes=4, rows=5))]) == [
        ("ADD", None, write_hint(BatchingHint(attributes=3, rows=4))),
        ("EDIT", 1, write_hint(BatchingHint(attributes=4, rows=3, lossy_rows=4)))]
    assert compare(good, pattern(30, 5, batch_size=4), [write_hint(BatchingHint(attributes=4, rows=5))], max_ops=1) == [
        ("ADD", None, write_hint(BatchingHint(attributes=3, rows=4)))]


def success(patterns: list[str], rules: list[str]) -> list[tuple[str, int | None, str]]:
    cases = "\n".join(f"Case {k}: Question {k}\nwith columns\n{p}" for k, p in enumerate(patterns, 1))
    listed = "\n".join(f"{k}. {t}" for k, t in enumerate(rules, 1)) or "(no rules yet)"
    user = render_prompt("memory", "success_user", cases=cases, rules=listed,
                         format=render_prompt("memory", "operation_format", max_ops=4))
    ops, _ = parse_operations(ask(SimulatedMemoryModel(), render_prompt("memory", "success_system"), user))
    return [(o.op, o.number, o.text) for o in ops]


def test_success_only_refinement_keeps_the_largest_successful_batch_per_shape() -> None:
    cases = [pattern(58, 4), pattern(51, 4, batch_size=3), pattern(14, 4, batch_size=4), pattern(58, 2, batch_size=8)]
    assert success(cases, []) == [("ADD", None, write_hint(BatchingHint(attributes=3, rows=4))),
                                  ("ADD", None, write_hint(BatchingHint(attributes=1, rows=8)))]
    assert success(cases, [write_hint(BatchingHint(attributes=1, rows=8))]) == [
        ("ADD", None, write_hint(BatchingHint(attributes=3, rows=4))),
        ("AGREE", 1, write_hint(BatchingHint(attributes=1, rows=8)))]
    # One row per sub-agent is the manager's default: a rule restating it is never added.
    reply = ask(SimulatedMemoryModel(), render_prompt("memory", "success_system"), render_prompt(
        "memory", "success_user", cases=f"Case 1: q\n{pattern(20, 4)}", rules="(no rules yet)",
        format=render_prompt("memory", "operation_format", max_ops=4)))
    assert parse_operations(reply) == ([], []) and reply.strip()


def test_by_attr_groups_of_unknown_size_are_read_from_the_batch_count() -> None:
    groups = pattern(18, 4, strategy={"type": "by_attr", "attribute_index": 0}, width=2)
    assert "batching by_attr (18 batches)" in groups
    shown = groups.replace("(18 batches)", "(6 batches)")  # six continents of three ranks each
    assert success([shown], []) == [
        ("ADD", None, write_hint(BatchingHint(attributes=2, rows=3, matrix_columns=2, strategy="by_attr")))]


def test_merge_keeps_one_uncontradicted_hint_per_shape() -> None:
    rules = [write_hint(BatchingHint(attributes=3, rows=6)), "Reuse the list page of each continent.",
             write_hint(BatchingHint(attributes=3, rows=4, lossy_rows=6)), write_hint(BatchingHint(attributes=3, rows=2)),
             write_hint(BatchingHint(attributes=1, rows=8))]
    user = render_prompt("memory", "merge_user", rules="\n".join(f"{k}. {t}" for k, t in enumerate(rules, 1)), limit=3)
    merged = parse_list(ask(SimulatedMemoryModel(), render_prompt("memory", "merge_system"), user), limit=3)
    assert merged == [write_hint(BatchingHint(attributes=3, rows=4, lossy_rows=6)),
                      "Reuse the list page of each continent.", write_hint(BatchingHint(attributes=1, rows=8))]
    user = render_prompt("memory", "merge_user", rules="\n".join(f"{k}. {t}" for k, t in enumerate(rules, 1)), limit=1)
    assert len(parse_list(ask(SimulatedMemoryModel(), render_prompt("memory", "merge_system"), user))) == 1


def test_projection_returns_the_hints_for_the_draft_rows_shape(tmp_path: Path) -> None:
    memory = ExperientialMemory(tmp_path, encoder="hashing", model=SimulatedMemoryModel(), config=MemoryConfig(max_bullets=2))
    texts = [format_hint(BatchingHint(attributes=4, rows=3)), format_hint(CODES_HINT),
             format_hint(BatchingHint(attributes=3, rows=5)), format_hint(BatchingHint(attributes=3, rows=2))]
    retrieval = Retrieval(query="q", hints=tuple(ScoredHint(id=f"h{k}", text=t, w=2, v=1, s=3) for k, t in enumerate(texts)))
    draft = Decision.parse({"task_matrix": [[f"c{i}"] for i in range(9)], "template": "__0__",
                            "json_schema": ["Country", "ISO3 Code", "Capital", "Calling Code"]})
    guidance, error, kept = memory.project("q", draft, retrieval)
    assert error is None and guidance == [f"{texts[1]} [2]", f"{texts[2]} [3]"]  # applicable ones, citing, at most max_bullets
    assert kept == ("h1", "h2")
    wide = Decision.parse({"task_matrix": [["c"]], "template": "__0__", "json_schema": ["a", "b"]})
    assert memory.project("q", wide, retrieval) == (["No stored hint applies to rows of 1 attribute."], None, ())
    assert SimulatedMemoryModel().model_id == MEMORY_MODEL_ID == "simulated/memory"
    memory.close()


def test_decision_summaries_carry_every_strategy_s_rows_per_batch() -> None:
    base = {"task_matrix": [["a", "x"], ["b", "x"], ["c", "y"]], "template": "__0__ __1__", "json_schema": ["k", "g", "v"]}
    assert DecisionSummary.of(Decision.parse({**base, "batch_size": 2})).batch_size == 2
    assert DecisionSummary.of(Decision.parse({**base, "batch_strategy": {"type": "open", "chunk_size": 3}})).batch_size == 3
    assert DecisionSummary.of(Decision.parse({**base, "batch_size": 2, "batch_strategy": {"type": "open"}})).batch_size == 2
    grouped = {"type": "by_attr", "attribute_index": 1, "max_group_size": 2}
    summary = DecisionSummary.of(Decision.parse({**base, "batch_size": 5, "batch_strategy": grouped}))
    assert summary.batch_size == 2 and "with up to 2 rows per batch" in summary.pattern


# -- 5. end to end through the real memory pipeline -----------------------------------------------


def test_committed_runs_are_distilled_into_a_hint_the_next_task_follows(world: Any, tmp_path: Path) -> None:
    """Three sandbox runs of rows with 3 attributes (Africa, Asia, North America) are committed;
    the simulated memory model distils them (FINCH cluster, success-only refinement); the prior of
    a new question of the same shape (Oceania's codes, then the euro countries) carries the hint
    (retrieval by s = w + v, projection), and the manager follows it."""
    tasks = world[0]
    memory = ExperientialMemory(tmp_path / "mem", encoder="hashing", model=SimulatedMemoryModel(),
                                config=MemoryConfig(label_rule="success"))
    explored = []
    for task_id in ("sbx_en_003", "sbx_en_009", "sbx_en_016"):
        query = tasks[task_id].query
        sample = next(k for k in range(1, 60) if explore_batching(query, k, [["a"]] * 40, 50).rows in (3, 4))
        out, score = run_task(world, tmp_path / "runs", task_id, sample=sample)
        decision = Decision.parse(out.record.decisions[0])
        explored.append(decision.batch_size)
        result = memory.update(None, query=query, decision=decision, metrics=score, task_id=task_id,
                               trace=TraceSummary(batches=out.record.completeness.batches), auto_distill=False)
        assert result.label is True
    report = memory.distill()
    added = [a for a in report.applied if a["op"] == "ADD"]
    assert [parse_hint(a["text"]) for a in added] == [BatchingHint(attributes=3, rows=max(explored))]
    for task_id in ("sbx_en_023", "sbx_en_005"):
        out, score = run_task(world, tmp_path / "runs", task_id, provider=memory)
        assert out.prior is not None and added[0]["text"] in out.prior.text
        assert out.prior.hint_ids == (added[0]["hint_id"],)
        executed = out.record.decisions[0]
        # the typed advice: the proposal the records support (a choice made twice, all passed), else the hint's payload
        rationale = executed["batch_strategy"]["rationale"]
        assert rationale in ("applied the memory's advice", f"following the typed advice of hint {added[0]['hint_id']}")
        assert executed["batch_size"] in explored and executed["batch_size"] > 1
        rows = len(executed["task_matrix"])
        assert score["score"] == 1.0 and out.record.completeness.attempts < rows  # fewer sub-agents than one per row
    memory.close()
