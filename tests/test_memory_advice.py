"""Experience that acts (issue 24): advice computed in code from the records, typed hint payloads,
one-step acceptance (`use_advice`, `AMAPREDUCE_MEMORY_ADVICE=apply`), credit for what was used,
and imported hints served through their provenance questions.

Stores are real (SQLite + the hashing encoder); the tool runs on an open `Session` whose
sub-agents are a scripted solver, as in tests/test_mapreduce_tool.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sessions import offline_settings, tool_session
from solvers import WorldSolver, world

from amapreduce.decision.model import Decision
from amapreduce.errors import ToolCallRefused
from amapreduce.mapreduce.prior import Prior, PriorRequest
from amapreduce.memory import ExperientialMemory, MemoryConfig
from amapreduce.memory.advice import (
    AppliesWhen,
    HintAdvice,
    Outcome,
    apply_choice,
    compute_advice,
    render_hint,
    split_advice,
)
from amapreduce.memory.io import export_jsonl, import_file
from amapreduce.memory.records import DecisionSummary, TraceSummary
from amapreduce.memory.store import get_hint, insert_hint, list_hints
from amapreduce.trace import read_trace

PASS = {"score": 1.0, "f1_by_row": 1.0, "f1_by_item": 1.0}
FAIL = {"score": 0.0, "f1_by_row": 0.5, "f1_by_item": 0.5}
TRUTH = world(8)
COLUMNS = ["name", "capital", "population"]


def decision(rows: int = 8, *, batch_size: int | None = None, strategy: dict[str, Any] | None = None,
             columns: list[str] = COLUMNS) -> Decision:
    return Decision.parse({"task_matrix": [[f"e{i}"] for i in range(rows)], "template": "Facts of __0__",
                           "json_schema": columns, "batch_size": batch_size,
                           **({"batch_strategy": strategy} if strategy else {})})


def outcome(rid: str, d: Decision, *, passed: bool = True, tokens: int = 8000, batches: int | None = None) -> Outcome:
    summary = DecisionSummary.of(d)
    return Outcome(record_id=rid, decision=summary, label=passed, metrics=PASS if passed else FAIL,
                   trace=TraceSummary(batches=batches if batches is not None else -(-summary.rows // (summary.batch_size or 1)),
                                      tokens=tokens))


# -- 1. advice computed from the records ---------------------------------------------------------


def test_the_cheapest_reliable_choice_is_proposed_with_its_numbers() -> None:
    records = [outcome("r1", decision(batch_size=4), tokens=4000), outcome("r2", decision(20, batch_size=4), tokens=10000),
               outcome("r3", decision(batch_size=2), tokens=6000), outcome("r4", decision(batch_size=2), tokens=6000),
               outcome("r5", decision(batch_size=8), passed=False, tokens=2000),
               outcome("r6", decision(batch_size=8, columns=["a", "b"]), tokens=1000)]  # another shape: left out
    advice = compute_advice(decision(), records, MemoryConfig())
    assert advice.similar_records == 5 and advice.shape == {"rows": 8, "matrix_cols": 1, "cols": 3}
    assert advice.draft == {"strategy": "per_atom", "batch_size": 1}
    by = {(c.strategy, c.batch_size): c for c in advice.choices}
    assert by[("per_atom", 4)].n == 2 and by[("per_atom", 4)].tokens_per_row == 500.0
    assert by[("per_atom", 8)].success_rate == 0.0  # cheap, but it failed: never proposed
    assert advice.proposal is not None and (advice.proposal.strategy, advice.proposal.batch_size) == ("per_atom", 4)
    assert advice.proposal.evidence.records == ["r1", "r2"] and advice.proposal.draft is None
    assert "unseen" in advice.proposal.why and "passed in all 2" in advice.proposal.why
    assert "at least 2 similar records" in advice.rule
    # the draft's own choice, reliable and as cheap within the margin: nothing to propose
    assert compute_advice(decision(batch_size=4), records, MemoryConfig()).proposal is None
    # a choice seen once is not enough evidence
    assert compute_advice(decision(), records[:1], MemoryConfig()).proposal is None
    assert compute_advice(decision(), records[:1], MemoryConfig(min_advice_records=1)).proposal is not None
    # a draft choice that failed once is revised even when it was cheaper
    failed = compute_advice(decision(batch_size=8), records, MemoryConfig()).proposal
    assert failed is not None and failed.batch_size == 4 and "failed in 1 of 1" in failed.why


def test_a_draft_choice_that_costs_more_per_row_than_the_margin_is_revised() -> None:
    records = [outcome("a1", decision(batch_size=2), tokens=6000), outcome("a2", decision(batch_size=2), tokens=6000),
               outcome("b1", decision(batch_size=3), tokens=5800), outcome("b2", decision(batch_size=3), tokens=5800)]
    assert compute_advice(decision(batch_size=2), records, MemoryConfig(advice_margin=0.05)).proposal is None
    revised = compute_advice(decision(batch_size=2), records, MemoryConfig(advice_margin=0.01)).proposal
    assert revised is not None and revised.batch_size == 3 and revised.draft is not None and revised.draft.n == 2


def test_apply_choice_changes_strategy_and_size_only() -> None:
    base = {"task_matrix": [["Asia", "1"], ["Asia", "2"], ["Africa", "1"]], "template": "__0__ rank __1__",
            "json_schema": ["Continent", "Rank", "Country"]}
    draft = Decision.parse({**base, "batch_size": 1})
    grouped = apply_choice(draft, "by_attr", 2)
    assert grouped.batch_strategy.type == "by_attr" and grouped.batch_strategy.max_group_size == 2  # type: ignore[union-attr]
    assert grouped.task_matrix == draft.task_matrix and grouped.template == draft.template
    by_name = Decision.parse({**base, "batch_strategy": {"type": "by_attr", "attribute_name": "Continent"}})
    kept = apply_choice(by_name, "by_attr", None).batch_strategy
    assert kept.attribute_name == "Continent" and kept.max_group_size is None  # type: ignore[union-attr]
    flat = apply_choice(grouped, "per_atom", 3)
    assert flat.batch_strategy.type == "per_atom" and flat.batch_size == 3


# -- 2. typed hint payloads ----------------------------------------------------------------------


def test_a_payload_travels_after_the_text_and_a_bad_one_is_dropped_with_a_reason() -> None:
    advice = HintAdvice(strategy="per_atom", batch_size=3, applies_when=AppliesWhen(cols=(3, 5)))
    line = render_hint("Batch 3 rows per sub-agent for rows of 3 to 5 columns.", advice)
    assert split_advice(line) == ("Batch 3 rows per sub-agent for rows of 3 to 5 columns.", advice, None)
    assert HintAdvice.model_validate({"strategy": "by_attr", "applies_when": {"cols": 4}}).applies_when.cols == (4, 4)
    text, dropped, problem = split_advice('Batch 3. ADVICE: {"strategy": "sideways", "batch_size": 3}')
    assert text == "Batch 3." and dropped is None and problem is not None and "advice payload not used" in problem
    assert split_advice("Plain prose.") == ("Plain prose.", None, None)
    assert advice.verdict(decision(batch_size=3)) == "followed"
    assert advice.verdict(decision(batch_size=2)) == "contradicted"
    assert advice.verdict(decision(batch_size=3, columns=["a", "b"])) == "not_applicable"


def test_payloads_round_trip_through_export_and_import(tmp_path: Path) -> None:
    memory = ExperientialMemory(tmp_path / "a", encoder="hashing")
    advice = HintAdvice(strategy="by_attr", batch_size=3, applies_when=AppliesWhen(cols=(3, 5), matrix_cols=(2, 2)))
    with memory.store.write() as conn:
        typed = insert_hint(conn, "Group ranked rows by continent, three per sub-agent.", 4, origin="test", advice=advice)
        prose = insert_hint(conn, "Reuse list pages.", 2, origin="test")
    export_jsonl(memory.store, tmp_path / "export.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "export.jsonl").read_text().splitlines()]
    assert next(h for h in lines if h.get("id") == typed)["advice"] == advice.to_json()
    assert "advice" not in next(h for h in lines if h.get("id") == prose)
    other = ExperientialMemory(tmp_path / "b", encoder="hashing")
    import_file(other.store, tmp_path / "export.jsonl")
    with other.store.read() as conn:
        assert get_hint(conn, typed)["advice"] == advice.to_json()  # type: ignore[index]
        assert get_hint(conn, prose)["advice"] is None  # type: ignore[index]
    memory.close()
    other.close()


# -- 3. credit for what was used -----------------------------------------------------------------


def _store_with_hints(tmp_path: Path, config: MemoryConfig) -> tuple[ExperientialMemory, dict[str, str]]:
    memory = ExperientialMemory(tmp_path / "mem", encoder="hashing", config=config)
    four = HintAdvice(strategy="per_atom", batch_size=4, applies_when=AppliesWhen(cols=3, matrix_cols=1))
    wide = HintAdvice(strategy="per_atom", batch_size=2, applies_when=AppliesWhen(cols=(6, 9)))
    with memory.store.write() as conn:
        ids = {"four": insert_hint(conn, "Four rows a batch for three columns.", 2, origin="test", advice=four),
               "wide": insert_hint(conn, "Two rows a batch for wide rows.", 2, origin="test", advice=wide),
               "kept": insert_hint(conn, "Reuse the list page.", 2, origin="test"),
               "dropped": insert_hint(conn, "Verify numbers twice.", 2, origin="test")}
    return memory, ids


def _credit(memory: ExperientialMemory, ids: dict[str, str], executed: Decision, metrics: dict[str, float]) -> dict[str, int]:
    prior = Prior(text="", hint_ids=tuple(ids.values()), kept_hint_ids=(ids["four"], ids["wide"], ids["kept"]),
                  details={"query": "q"})
    memory.update(prior, decision=executed, metrics=metrics)
    with memory.store.read() as conn:
        return {name: get_hint(conn, hid)["w"] for name, hid in ids.items()}  # type: ignore[index]


def test_used_credits_followed_advice_and_kept_prose_only(tmp_path: Path) -> None:
    memory, ids = _store_with_hints(tmp_path, MemoryConfig())
    assert _credit(memory, ids, decision(batch_size=4), PASS) == {"four": 4, "wide": 2, "kept": 4, "dropped": 2}
    records = memory.store.conn.execute("SELECT trace FROM records").fetchall()
    assert json.loads(records[0][0])["followed_hints"] == [ids["four"]]  # the record says which advice was followed
    memory.close()


def test_used_never_credits_a_hint_whose_advice_the_decision_contradicts(tmp_path: Path) -> None:
    memory, ids = _store_with_hints(tmp_path, MemoryConfig())
    after = _credit(memory, ids, decision(batch_size=2), PASS)  # the "four" hint applies and was not followed
    assert after["four"] == 2 and after["wide"] == 2 and after["kept"] == 4
    after = _credit(memory, ids, decision(batch_size=4), FAIL)  # followed and failed: -1, pruned at 0 next time
    assert after["four"] == 1 and after["kept"] == 3
    memory.close()


def test_credit_rule_all_is_the_papers_rule(tmp_path: Path) -> None:
    memory, ids = _store_with_hints(tmp_path, MemoryConfig(credit_rule="all"))
    assert _credit(memory, ids, decision(batch_size=2), PASS) == {"four": 4, "wide": 4, "kept": 4, "dropped": 4}
    memory.close()


# -- 4. the plan stage: advice beside the prose, use_advice, apply mode --------------------------


ARGS: dict[str, Any] = {
    "task_matrix": [[k] for k in TRUTH], "template": "Capital and population of [[__0__]]",
    "json_schema": {"type": "object", "properties": {"name": {}, "capital": {}, "population": {}}},
    "batch_size": 1,
}


def _memory_with_records(tmp_path: Path) -> ExperientialMemory:
    memory = ExperientialMemory(tmp_path / "mem", encoder="hashing")
    for k in range(2):
        memory.update(None, query=f"capitals and populations, list {k}", decision=decision(8, batch_size=4),
                      metrics=PASS, trace=TraceSummary(batches=2, tokens=4000), auto_distill=False)
    return memory


def test_the_plan_stage_shows_typed_advice_and_use_advice_applies_it(tmp_path: Path) -> None:
    memory = _memory_with_records(tmp_path)
    settings = offline_settings(tmp_path, workers=4, max_tool_calls=4)
    with tool_session(settings, WorldSolver(TRUTH), query="capitals and populations?", prior_provider=memory) as (
            session, tool):
        plan = json.loads(tool(**ARGS))
        advice = plan["memory_advice"]
        assert advice["mode"] == "suggest" and advice["applied_at_execute"] is False
        assert advice["proposal"]["strategy"] == "per_atom" and advice["proposal"]["batch_size"] == 4
        assert advice["proposal"]["evidence"]["n"] == 2 and "use_advice: true" in plan["next"]
        head = json.loads(tool(**ARGS, use_advice=True).splitlines()[0])
        outcome = session.finish()
    assert head["complete"] and head["batches"] == 2  # 8 rows, 4 a batch: the proposal ran
    assert outcome.decisions[0].batch_size == 4
    assert outcome.prior is not None and outcome.prior.advice_used == {"by": "manager", "strategy": "per_atom",
                                                                      "batch_size": 4}
    result = json.loads((outcome.run_dir.path / "result.json").read_text())
    assert result["prior"]["advice_used"]["by"] == "manager" and result["prior"]["advice"]["proposal"]["batch_size"] == 4
    assert [e["by"] for e in read_trace(outcome.run_dir.path / "trace.jsonl", event="advice_applied")] == ["manager"]
    memory.close()


def test_use_advice_without_a_proposal_is_refused_with_the_reason(tmp_path: Path) -> None:
    settings = offline_settings(tmp_path, workers=4, max_tool_calls=4)
    with tool_session(settings, WorldSolver(TRUTH), query="capitals?") as (session, tool):
        json.loads(tool(**ARGS))
        with pytest.raises(ToolCallRefused, match="proposed no revision"):
            tool(**ARGS, use_advice=True)
        session.finish()


def test_apply_mode_has_the_plan_stage_apply_supported_advice(tmp_path: Path) -> None:
    memory = _memory_with_records(tmp_path)
    settings = offline_settings(tmp_path, workers=4, max_tool_calls=4).model_copy(update={"memory_advice": "apply"})
    with tool_session(settings, WorldSolver(TRUTH), query="capitals and populations?", prior_provider=memory) as (
            session, tool):
        plan = json.loads(tool(**ARGS))
        assert plan["memory_advice"]["mode"] == "apply" and plan["memory_advice"]["applied_at_execute"] is True
        tool(**ARGS)  # the manager did not say use_advice: the plan stage applies it
        outcome = session.finish()
    assert outcome.decisions[0].batch_size == 4 and outcome.prior is not None
    assert outcome.prior.advice_used is not None and outcome.prior.advice_used["by"] == "plan_stage"
    memory.close()


def test_prose_only_config_computes_no_advice(tmp_path: Path) -> None:
    memory = _memory_with_records(tmp_path)
    memory.config = MemoryConfig(advice=False)
    prior = memory.prior(PriorRequest(query="capitals and populations?", decision=decision()))
    assert prior.advice is None and prior.record_ids
    memory.close()


# -- 5. imported experience serves at once; random retrieval ---------------------------------------


INSIGHTS = [
    {"rule": "For rankings per year, batch one year per sub-agent and keep the rank column as a key.", "score": 5,
     "correlation_tasks": ["List the top 10 Forbes billionaires for each year from 2019 to 2024 with rank and net worth."]},
    {"rule": "For lists of universities, look up each institution's official site first.", "score": 3,
     "correlation_tasks": ["Which universities in Germany have more than 30,000 students, with founding year?"]},
]


def test_an_imported_hint_is_found_by_its_provenance_question_and_a_paraphrase(tmp_path: Path) -> None:
    (tmp_path / "insights.json").write_text(json.dumps(INSIGHTS))
    memory = ExperientialMemory(tmp_path / "mem", encoder="hashing", config=MemoryConfig(k_hints=1))
    import_file(memory.store, tmp_path / "insights.json")
    assert memory.store.counts()["records"] == 0
    ids = {h["text"]: h["id"] for h in list_hints(memory.store.conn)}
    for question in (INSIGHTS[0]["correlation_tasks"][0],
                     "list the top 10 forbes billionaires for each year from 2019 to 2024, with their rank and net worth"):
        retrieval, prior = memory.search(str(question))
        assert [h.id for h in retrieval.hints] == [ids[str(INSIGHTS[0]["rule"])]]
        assert retrieval.hints[0].questions == 1 and prior.hint_ids == (ids[str(INSIGHTS[0]["rule"])],)
    universities = memory.search(str(INSIGHTS[1]["correlation_tasks"][0]))[0]
    assert [h.id for h in universities.hints] == [ids[str(INSIGHTS[1]["rule"])]]
    # in an evaluation of that very question the hint it came from is left out, as its records would be
    held_out = memory.search(str(INSIGHTS[0]["correlation_tasks"][0]), task_id="ws_1")[0]
    assert ids[str(INSIGHTS[0]["rule"])] not in [h.id for h in held_out.hints]
    memory.close()


def test_random_retrieval_ignores_similarity_and_is_seeded(tmp_path: Path) -> None:
    memory = ExperientialMemory(tmp_path / "mem", encoder="hashing", config=MemoryConfig(retrieval="random", k_hints=2))
    with memory.store.write() as conn:
        for k in range(6):
            insert_hint(conn, f"hint number {k}", 2, origin="test")
    first = [h.id for h in memory.retrieve("some question").hints]
    assert len(first) == 2 and first == [h.id for h in memory.retrieve("some question").hints]
    assert any([h.id for h in memory.retrieve(f"question {k}").hints] != first for k in range(10))
    memory.close()
