"""Online update (Eq. 13/22), pass rules, infrastructure failures and the distillation schedule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_memory_fixtures import FAIL, PASS, QUERY, ranked_store

from amapreduce.decision import Decision
from amapreduce.mapreduce.prior import PriorRequest
from amapreduce.memory import MemoryConfig
from amapreduce.memory.io import export_jsonl, import_file
from amapreduce.memory.labels import REFERENCE_AVERAGES, infrastructure_failure_reason, label
from amapreduce.memory.records import DecisionSummary
from amapreduce.memory.store import MemoryStore, get_hint, hint_provenance
from amapreduce.testing.scripted import FunctionModel

DECISION = Decision.parse({"task_matrix": [["a", "b"], ["c", "d"]], "template": "find __0__ in __1__",
                          "json_schema": {"properties": {"x": {}, "y": {}}},
                          "batch_strategy": {"type": "by_attr", "attribute_index": 1, "max_group_size": 2}})


def _weights(mem) -> dict[str, int]:  # type: ignore[no-untyped-def]
    with mem.store.read() as conn:
        return {r[0]: int(r[1]) for r in conn.execute("SELECT id, w FROM hints")}


def test_pass_adds_two_to_the_prior_hints_and_extends_their_provenance(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path)
    prior = mem.prior(PriorRequest(query=QUERY, decision=DECISION))
    before = _weights(mem)
    result = mem.update(prior, query=QUERY, decision=DECISION, metrics=PASS, task_id="new")
    after = _weights(mem)
    assert result.label is True and result.credited == {"hB": 8, "hE": 5, "hA": 3}
    assert {k: after[k] - before[k] for k in before} == {"hA": 2, "hB": 2, "hC": 0, "hD": 0, "hE": 2}
    with mem.store.read() as conn:
        assert result.record_id in hint_provenance(conn, "hB")
        assert result.record_id not in hint_provenance(conn, "hC")
    record = mem.store.record(result.record_id or "")
    assert record is not None and record.task_id == "new" and record.decision.rows == 2
    assert record.decision.strategy == "by_attr" and record.decision.batch_size == 2


def test_fail_subtracts_one_and_prunes_hints_reaching_zero(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path)
    prior = mem.prior(PriorRequest(query=QUERY, decision=DECISION))
    result = mem.update(prior, query=QUERY, decision=DECISION, metrics=FAIL)
    assert result.label is False
    assert result.credited == {"hB": 5, "hE": 2, "hA": 0}
    assert result.pruned == ("hA",)
    with mem.store.read() as conn:
        assert get_hint(conn, "hA") is None
        kinds = [r[0] for r in conn.execute("SELECT kind FROM events WHERE hint_id = 'hA' ORDER BY seq")]
    assert kinds == ["hint_added", "hint_credited", "hint_pruned"]


def test_the_new_record_is_retrievable_at_once(tmp_path: Path) -> None:
    mem, enc = ranked_store(tmp_path)
    enc.vectors["fresh"] = enc.at(0.95)
    mem.retrieve(QUERY)  # index synced before the write
    result = mem.update(None, query="fresh", decision=DECISION, metrics=PASS)
    assert mem.retrieve(QUERY).positives[0].id == result.record_id


@pytest.mark.parametrize("metrics,failure", [
    (None, None), ({"score": None, "f1_by_row": 0.5, "f1_by_item": 0.5}, None),
    ({"score": 0, "f1_by_row": float("nan"), "f1_by_item": 0.1}, None), ({"error": "judge timeout"}, None),
    (PASS, "agent crashed"),
])
def test_infrastructure_failures_are_never_written(tmp_path: Path, metrics, failure) -> None:  # type: ignore[no-untyped-def]
    mem, _ = ranked_store(tmp_path)
    prior = mem.prior(PriorRequest(query=QUERY, decision=DECISION))
    before = (mem.store.counts(), _weights(mem))
    result = mem.update(prior, query=QUERY, decision=DECISION, metrics=metrics, failure=failure)
    assert result.record_id is None and result.skipped
    assert (mem.store.counts(), _weights(mem)) == before


@pytest.mark.parametrize("metrics,expected", [
    ({"score": 1, "f1_by_row": 0, "f1_by_item": 0}, True),
    ({"score": 0, "f1_by_row": 0.7, "f1_by_item": 0}, True),
    ({"score": 0, "f1_by_row": 0.69, "f1_by_item": 0.69}, False),
    ({"score": 0, "f1_by_row": 0.45, "f1_by_item": 0.7}, True),
    ({"score": 0, "f1_by_row": 0.44, "f1_by_item": 0.99}, False),
])
def test_widesearch_rule_matches_the_reference(metrics, expected) -> None:  # type: ignore[no-untyped-def]
    assert label(metrics, "widesearch") is expected


def test_reference_average_rule_uses_table1_averages_and_its_scalings() -> None:
    assert REFERENCE_AVERAGES["f1_by_item"] == pytest.approx(0.50731)
    assert REFERENCE_AVERAGES["f1_by_row"] == pytest.approx(0.28778)
    just_above = {"score": 0, "f1_by_row": 0.29, "f1_by_item": 0.51}
    assert label(just_above, "reference-average") is True
    assert label(just_above, "reference-average-high") is False
    assert label({"score": 0, "f1_by_row": 0.24, "f1_by_item": 0.41}, "reference-average-low") is True
    assert label({"score": 1, "f1_by_row": 0.2, "f1_by_item": 0.9}, "reference-average") is False


def test_label_rule_is_configurable_per_memory(tmp_path: Path) -> None:
    mem, enc = ranked_store(tmp_path, MemoryConfig(label_rule="reference-average"))
    enc.vectors["q2"] = enc.at(0.3)
    result = mem.update(None, query="q2", decision=DecisionSummary(), metrics={"score": 0, "f1_by_row": 0.3, "f1_by_item": 0.55})
    assert result.label is True  # the widesearch rule would say False (row 0.3 < 0.45)
    with pytest.raises(ValueError, match="label_rule"):
        MemoryConfig(label_rule="nope")


def test_failure_reason_names_the_missing_metric() -> None:
    assert infrastructure_failure_reason({"score": 1, "f1_by_row": 1}) == "metric `f1_by_item` is missing"
    assert infrastructure_failure_reason(PASS) is None


def test_schedule_claims_refine_and_merge_slots_once(tmp_path: Path) -> None:
    config = MemoryConfig(distill_start=10, distill_every=2, merge_every=4)
    mem, enc = ranked_store(tmp_path, config)  # 8 records already
    seen = []
    for i in range(8):
        enc.vectors[f"s{i}"] = enc.at(0.1 + i / 100)
        seen.append(mem.update(None, query=f"s{i}", decision=DecisionSummary(), metrics=PASS, auto_distill=False).distill)
    # records 9..16: first claim at 10 (both), then refine every 2, merge every 4
    assert seen == [None, "refine+merge", None, "refine", None, "refine+merge", None, "refine"]


def test_due_distillation_runs_with_the_model_and_is_logged(tmp_path: Path) -> None:
    config = MemoryConfig(distill_start=9, distill_every=5, merge_every=100)
    mem, enc = ranked_store(tmp_path, config)
    mem.model = FunctionModel(lambda m, i: "ADD: Group rows that share a source page into one batch.")
    enc.vectors["ninth"] = enc.at(0.2)
    result = mem.update(None, query="ninth", decision=DecisionSummary(), metrics=PASS)
    assert result.distill == "refine+merge"
    with mem.store.read() as conn:
        texts = [r[0] for r in conn.execute("SELECT text FROM hints WHERE origin = 'distill'")]
        kinds = {r[0] for r in conn.execute("SELECT kind FROM events")}
    assert texts == ["Group rows that share a source page into one batch."]
    assert {"distill_due", "clustered", "distilled"} <= kinds


def test_a_failing_scheduled_distillation_keeps_the_record(tmp_path: Path) -> None:
    config = MemoryConfig(distill_start=9)
    mem, enc = ranked_store(tmp_path, config)

    def boom(messages, info):  # type: ignore[no-untyped-def]
        raise RuntimeError("provider 500")

    mem.model = FunctionModel(boom)
    enc.vectors["ninth"] = enc.at(0.2)
    result = mem.update(None, query="ninth", decision=DecisionSummary(), metrics=PASS)
    assert result.distill is not None and result.distill.startswith("failed: RuntimeError")
    assert mem.store.record(result.record_id or "") is not None


def test_update_takes_query_and_task_from_the_prior_and_records_the_trace(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path)
    prior = mem.prior(PriorRequest(query=QUERY, decision=DECISION, task_id="T-7"))
    result = mem.update(prior, decision=DECISION, metrics=PASS,
                        trace={"batches": 2, "retries": 1, "patch_rounds": 1, "cost_usd": 0.12, "delay_s": 40.5})
    record = mem.store.record(result.record_id or "")
    assert record is not None and (record.query, record.task_id) == (QUERY, "T-7")
    assert record.trace.retries == 1 and record.trace.delay_s == 40.5
    assert "(2 batches)" in record.decision.pattern
    with pytest.raises(Exception, match="needs the run's query"):
        mem.update(None, decision=DECISION, metrics=PASS)


@pytest.mark.parametrize(("decision", "pattern"), [
    (Decision.parse({"task_matrix": [["Peru"]], "template": "Find __0__", "json_schema": ["country"], "batch_size": 5}),
     "1x1 task matrix; 1 output columns (country); batching per_atom with up to 5 rows per batch; "
     "template: 'Find __0__'"),
    (DecisionSummary(template="Find __0__", batch_size=5), "0x0 task matrix; template: 'Find __0__'"),
])
def test_every_stored_decision_gets_a_pattern_summary(tmp_path: Path, decision: Decision | DecisionSummary,
                                                      pattern: str) -> None:
    """Δ_q and the distillation prompts show `pattern`; it is never left empty."""
    summary = DecisionSummary.of(decision)
    assert summary.pattern == pattern and summary.batch_size == 5
    mem, enc = ranked_store(tmp_path)
    enc.vectors["tenth"] = enc.at(0.3)
    result = mem.update(None, query="tenth", decision=decision, metrics=PASS)
    record = mem.store.record(result.record_id or "")
    assert record is not None and record.decision.pattern == summary.pattern


def test_an_exported_summary_is_imported_as_it_was(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path / "a")
    out = tmp_path / "export.jsonl"
    export_jsonl(mem.store, out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    stored = (DecisionSummary(rows=3, pattern="three rows, one batch each"), DecisionSummary())
    records = [line for line in lines if line["type"] == "record"][: len(stored)]
    for line, summary in zip(records, stored, strict=True):
        line["decision"] = summary.model_dump(mode="json")
    out.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    copy = MemoryStore(tmp_path / "b", encoder=mem.store.encoder)
    import_file(copy, out)
    for line, summary in zip(records, stored, strict=True):
        record = copy.record(line["id"])
        assert record is not None and record.decision == summary  # an export is re-imported as it was


def test_a_discover_decision_is_recorded_with_how_its_matrix_is_found(tmp_path: Path) -> None:
    """A decision that discovers its matrix has none when the memory records it: recording it
    used to raise IndexError (`task_matrix[0]`) and lose the run's lesson."""
    decision = Decision.parse({
        "discover": {"sources": ["https://a.example/list-1", "https://a.example/list-2"],
                     "template": "List every city on __0__", "json_schema": ["City", "Country"],
                     "key_columns": ["City", "Country"], "merge": "model"},
        "template": "Population of __0__ (__1__)", "json_schema": ["City", "Country", "Population"]})
    summary = DecisionSummary.of(decision)
    assert (summary.rows, summary.cols) == (0, 2)
    assert summary.describe().startswith("task matrix discovered from 2 sources (model merge, key City, Country);")
    mem, enc = ranked_store(tmp_path)
    enc.vectors["every big city"] = enc.at(0.3)
    result = mem.update(None, query="every big city", decision=decision, metrics=PASS)
    assert result.label is True
