"""Credit that unlearns (issue 38): a followed hint that does worse is debited, refuted and pruned.

The paper's g(u) is +2 when the run passed and −1 when it failed, so a hint imported at w = 20
misleads twenty runs before it is pruned, and one whose runs pass expensively is credited every
time. `memory.update` judges a run that followed a hint's typed advice against the family's
records too (`memory.advice.worse_than_records`) and refutes a hint whose followed runs did worse
at least `refute_after` times and in at least half of them; `negative_floor` keeps a few failures
out of unrelated queries' neighbourhoods.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_memory_fixtures import QUERY, ranked_store

from amapreduce.bench.commit import hint_credits
from amapreduce.decision.model import Decision
from amapreduce.mapreduce.prior import Prior
from amapreduce.memory import ExperientialMemory, MemoryConfig
from amapreduce.memory.advice import AppliesWhen, HintAdvice, Outcome, compute_advice, worse_than_records
from amapreduce.memory.records import DecisionSummary, TraceSummary
from amapreduce.memory.store import get_hint, insert_hint
from amapreduce.memory.update import UpdateResult, track_record

PASS = {"score": 1.0, "f1_by_row": 1.0, "f1_by_item": 1.0}
FAIL = {"score": 0.0, "f1_by_row": 0.5, "f1_by_item": 0.5}
EIGHT = HintAdvice(strategy="per_atom", batch_size=8, applies_when=AppliesWhen(cols=(3, 7), matrix_cols=(1, 1)))


def decision(rows: int = 16, batch_size: int = 8) -> Decision:
    return Decision.parse({"task_matrix": [[f"e{i}"] for i in range(rows)], "template": "Facts of __0__",
                           "json_schema": ["name", "capital", "population"], "batch_size": batch_size})


def _memory(tmp_path: Path, config: MemoryConfig | None = None, *, w: int = 20,
            advice: HintAdvice = EIGHT) -> tuple[ExperientialMemory, str]:
    memory = ExperientialMemory(tmp_path / "mem", encoder="hashing", config=config or MemoryConfig())
    with memory.store.write() as conn:
        hint = insert_hint(conn, "Put 8 rows in each batch.", w, origin="import", advice=advice)
    return memory, hint


def _run(memory: ExperientialMemory, hint: str, metrics: dict[str, float], executed: Decision | None = None, *,
         advice: dict[str, Any] | None = None, tokens: int | None = None) -> UpdateResult:
    executed = executed or decision()
    prior = Prior(text="", hint_ids=(hint,), kept_hint_ids=(hint,),
                  details={"query": "countries", **({"advice": advice} if advice else {})})
    trace = TraceSummary(batches=-(-len(executed.task_matrix) // (executed.batch_size or 1)), tokens=tokens)
    return memory.update(prior, decision=executed, metrics=metrics, trace=trace)


def _w(memory: ExperientialMemory, hint: str) -> int | None:
    with memory.store.read() as conn:
        found = get_hint(conn, hint)
    return None if found is None else int(found["w"])


def test_a_hint_imported_at_twenty_is_refuted_by_the_second_failing_run_that_followed_it(tmp_path: Path) -> None:
    memory, hint = _memory(tmp_path)
    first = _run(memory, hint, FAIL)
    assert first.credited == {hint: 19} and first.before == {hint: 20} and first.refuted == () and first.pruned == ()
    second = _run(memory, hint, FAIL)
    assert second.refuted == (hint,) and second.pruned == (hint,)
    assert second.before == {hint: 19} and second.credited == {hint: 0}
    assert _w(memory, hint) is None
    with memory.store.read() as conn:
        kinds = [r[0] for r in conn.execute("SELECT kind FROM events WHERE hint_id = ? ORDER BY seq", (hint,))]
        refuted = json.loads(conn.execute("SELECT detail FROM events WHERE kind = 'hint_refuted'").fetchone()[0])
    assert kinds == ["hint_added", "hint_credited", "hint_credited", "hint_refuted", "hint_pruned"]
    assert refuted["worse"] == 2 and refuted["better"] == 0
    memory.close()


def test_the_papers_rule_costs_the_hint_one_point_per_failure(tmp_path: Path) -> None:
    memory, hint = _memory(tmp_path, MemoryConfig(relative_credit=False, refute_after=0))
    for _ in range(3):
        result = _run(memory, hint, FAIL)
    assert result.refuted == () and _w(memory, hint) == 17
    memory.close()


def test_a_hint_whose_followed_runs_mostly_passed_survives_two_failures(tmp_path: Path) -> None:
    memory, hint = _memory(tmp_path, w=2)
    for _ in range(3):
        _run(memory, hint, PASS)
    _run(memory, hint, FAIL)
    last = _run(memory, hint, FAIL)
    assert last.refuted == () and _w(memory, hint) == 6  # 2 + 3 x 2 - 2
    with memory.store.read() as conn:
        assert track_record(conn, hint) == (2, 3)
    memory.close()


def test_without_debits_nothing_is_refuted(tmp_path: Path) -> None:
    memory, hint = _memory(tmp_path, MemoryConfig(reward_pass=0, reward_fail=0))
    for _ in range(3):
        assert _run(memory, hint, FAIL).refuted == ()
    assert _w(memory, hint) == 20
    memory.close()


def test_a_failure_that_did_not_follow_the_hint_is_not_its_evidence(tmp_path: Path) -> None:
    memory, hint = _memory(tmp_path)
    for _ in range(3):  # the decision contradicted the hint (4 rows, not 8): no credit, no refutation
        result = _run(memory, hint, FAIL, decision(batch_size=4))
        assert result.credited == {} and result.refuted == ()
    assert _w(memory, hint) == 20
    memory.close()


def _records_advice(draft: Decision) -> dict[str, Any]:
    """The plan stage's advice for `draft` with two similar records that passed with 4 rows a batch
    at 100 tokens per row."""
    records = []
    for n in range(2):
        summary = DecisionSummary.of(decision(16, 4))
        records.append(Outcome(record_id=f"r{n}", decision=summary, label=True, metrics=PASS,
                               trace=TraceSummary(batches=4, tokens=1600)))
    return compute_advice(draft, records, MemoryConfig()).to_json()


def test_a_passing_run_that_cost_more_per_row_than_its_records_is_debited_and_says_why(tmp_path: Path) -> None:
    one = HintAdvice(strategy="per_atom", batch_size=1, applies_when=AppliesWhen(cols=(3, 3)))
    memory, hint = _memory(tmp_path, w=20, advice=one)
    advice = _records_advice(decision(16, 1))
    result = _run(memory, hint, PASS, decision(16, 1), advice=advice, tokens=16 * 300)
    assert result.label is True and result.credited == {hint: 19}  # passed, yet -1: 300 tokens a row against 100
    record = memory.store.record(result.record_id or "")
    assert record is not None and record.trace.worse is not None and "per_atom, 4 rows per batch" in record.trace.worse
    cheap = _run(memory, hint, PASS, decision(16, 1), advice=advice, tokens=16 * 102)  # within the 5 % margin
    assert cheap.credited == {hint: 21}
    memory.close()


def test_worse_than_records_compares_like_with_like() -> None:
    config = MemoryConfig()
    draft = decision(16, 1)
    advice = _records_advice(draft)
    summary = DecisionSummary.of(draft)
    assert worse_than_records(summary, TraceSummary(batches=16, tokens=16 * 300), advice, config) is not None
    assert worse_than_records(summary, TraceSummary(batches=16, tokens=16 * 90), advice, config) is None
    assert worse_than_records(summary, TraceSummary(batches=16, tokens=16 * 300), None, config) is None
    other_shape = DecisionSummary.of(decision(12, 1))  # 12 rows: not the shape the advice measured
    assert worse_than_records(other_shape, TraceSummary(batches=12, tokens=12 * 300), advice, config) is None
    four = DecisionSummary.of(decision(16, 4))  # the records' own choice is no alternative to itself
    assert worse_than_records(four, TraceSummary(batches=4, tokens=16 * 300), advice, config) is None
    by_batches = worse_than_records(summary, TraceSummary(batches=16), advice, config)  # no tokens: sub-agents
    assert by_batches is not None and "sub-agents per row" in by_batches


def test_hint_credits_report_w_before_and_the_refutation(tmp_path: Path) -> None:
    memory, hint = _memory(tmp_path)
    _run(memory, hint, FAIL)
    result = _run(memory, hint, FAIL)
    assert hint_credits(result, [hint, "h-gone"], memory.config) == [
        {"id": hint, "w_before": 19, "w_after": 0, "refuted": True},
        {"id": "h-gone", "w_before": None, "w_after": None}]
    memory.close()


def test_negatives_less_similar_than_every_positive_stay_out_of_the_neighbourhood(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path / "a", MemoryConfig(k_pos=2))  # positives .9 .8; negatives .85 .75
    assert [n.id for n in mem.retrieve(QUERY).negatives] == ["N1"]
    paper, _ = ranked_store(tmp_path / "b", MemoryConfig(k_pos=2, negative_floor="none"))
    assert [n.id for n in paper.retrieve(QUERY).negatives] == ["N1", "N2"]
    few, _ = ranked_store(tmp_path / "c", MemoryConfig(k_pos=10))  # I⁺ not full: no floor
    assert [n.id for n in few.retrieve(QUERY).negatives] == ["N1", "N2"]
    for memory in (mem, paper, few):
        memory.close()


def test_the_misleading_scenario_imports_like_a_user_export_and_is_offered_for_its_families(tmp_path: Path) -> None:
    """`bench_evolution.py --scenario misleading` seeds each memory arm through `memory import`'s code:
    typed hints at their imported score, with question-level provenance naming the family's tasks,
    which retrieval offers for those questions before any record exists."""
    from test_sandbox_batching import BENCH as bench

    from amapreduce._atomic import write_json_lines

    question = "List every country of Africa with its capital, currency code and calling code."
    source = tmp_path / "misleading.jsonl"
    write_json_lines(source, bench.misleading_lines({"codes": [question], "cities": ["Top 3 cities of Peru"]}))
    assert bench.seed_store(tmp_path / "mem", source, "hashing")["hints"] == len(bench.MISLEADING)
    memory = ExperientialMemory(tmp_path / "mem", encoder="hashing", config=MemoryConfig())
    offered = memory.retrieve(question).hints
    assert [h.w for h in offered] == [bench.MISLEADING_SCORE] * len(offered) and offered
    assert {json.dumps(h.advice.to_json() if h.advice else None, sort_keys=True) for h in offered} <= {
        json.dumps(m.advice.to_json(), sort_keys=True) for m in bench.MISLEADING}
    assert memory.retrieve("Something no export has seen").hints == ()
    memory.close()
