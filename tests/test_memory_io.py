"""Export/import: versioned JSONL round trip, the reference's insights.json, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_memory_fixtures import PASS, QUERY, ranked_store

from amapreduce.decision import Decision
from amapreduce.errors import UserError
from amapreduce.memory import ExperientialMemory, MemoryStore
from amapreduce.memory.inspection import list_items, show_item
from amapreduce.memory.io import FORMAT_VERSION, export_jsonl, import_file
from amapreduce.memory.records import DecisionSummary
from amapreduce.memory.store import hint_provenance


def _snapshot(store: MemoryStore) -> tuple[list[dict], list[tuple]]:  # type: ignore[type-arg]
    with store.read() as conn:
        records = [dict(r) for r in conn.execute(
            "SELECT id, task_id, query, label, decision, trace, metrics, embedding FROM records ORDER BY rowid")]
        hints = [(r[0], r[1], r[2], tuple(hint_provenance(conn, r[0])))
                 for r in conn.execute("SELECT id, text, w FROM hints ORDER BY seq")]
    return records, hints


def test_export_import_round_trip_is_lossless(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path / "a")
    mem.update(None, query=QUERY, decision=Decision.parse({"task_matrix": [["x"]], "template": "t", "json_schema": ["x"]}),
               metrics=PASS, trace={"batches": 3, "retries": 1, "cost_usd": 0.5}, task_id="T9", record_id="R9")
    out = tmp_path / "export.jsonl"
    assert export_jsonl(mem.store, out) == {"records": 9, "hints": 5}
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[0]["version"] == FORMAT_VERSION
    record = next(line for line in lines if line.get("id") == "R9")
    assert set(record) >= {"type", "id", "query", "label", "decision", "metrics"} and record["label"] is True
    hint = next(line for line in lines if line.get("id") == "hA")
    assert hint == {"type": "hint", "id": "hA", "text": "hint hA.", "score": 1, "provenance": ["P1", "P2", "P3"]}

    copy = MemoryStore(tmp_path / "b", encoder=mem.store.encoder)
    assert import_file(copy, out) == {"records": 9, "hints": 5, "skipped": 0}
    assert _snapshot(copy) == _snapshot(mem.store)
    assert import_file(copy, out) == {"records": 0, "hints": 0, "skipped": 14}  # idempotent
    again = tmp_path / "again.jsonl"
    export_jsonl(copy, again)
    strip = [line for line in again.read_text().splitlines()[1:]]
    assert strip == out.read_text().splitlines()[1:]


def test_reference_insights_json_links_questions_now_and_later(tmp_path: Path) -> None:
    mem, enc = ranked_store(tmp_path / "s")
    ref = tmp_path / "insights.json"
    ref.write_text(json.dumps([
        {"rule": "Use per_atom for small matrices.", "score": 5, "correlation_tasks": ["question P2", "later q"]},
        {"rule": "Batch by attribute.", "score": 2, "correlation_tasks": []},
    ]), encoding="utf-8")
    assert import_file(mem.store, ref) == {"records": 0, "hints": 2, "skipped": 0, "linked": 1}
    hint = next(i for i in list_items(mem.store, records=False) if i["text"].startswith("Use per_atom"))
    assert hint["w"] == 5 and hint["support"] == 1
    enc.vectors["Later  Q"] = enc.at(0.2)
    result = mem.update(None, query="Later  Q", decision=DecisionSummary(), metrics=PASS)  # same question, other spacing/case
    with mem.store.read() as conn:
        assert hint_provenance(conn, hint["id"]) == ["P2", result.record_id]
    assert import_file(mem.store, ref)["skipped"] == 2


@pytest.mark.parametrize("content,match", [
    ('{"type": "record", "id": "x"}\n', "field `query`"),
    ('{"type": "record", "id": "x", "query": "q", "label": true, "bogus": 1}\n', "field `bogus`"),
    ('{"type": "widget"}\n', "unknown line type"),
    ("not json\n", "not valid JSON"),
    ('{"type": "header", "format": "amapreduce-memory", "version": 99}\n', "newer"),
    ('{"type": "hint", "id": "h", "text": "t", "score": 1, "provenance": ["nope"]}\n', "not in the file or store"),
])
def test_bad_import_files_are_user_errors_naming_the_line(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    store = MemoryStore(tmp_path / "s", encoder="hashing:64")
    with pytest.raises(UserError, match=match):
        import_file(store, path)
    assert store.counts() == {"records": 0, "positive": 0, "negative": 0, "hints": 0}


def test_import_into_a_store_with_another_encoder_re_embeds(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path / "a")
    out = tmp_path / "e.jsonl"
    export_jsonl(mem.store, out)
    other = ExperientialMemory(tmp_path / "b", encoder="hashing:64")
    import_file(other.store, out)
    assert other.store.counts()["records"] == 8
    assert other.retrieve("question P3").positives[0].id == "P3"


def test_question_level_provenance_survives_export_and_import(tmp_path: Path) -> None:
    """A reference hint keeps its questions through a JSONL round trip, so in the new store it
    still gains the records that later ask them (otherwise it could never be retrieved)."""
    mem, enc = ranked_store(tmp_path / "a")
    ref = tmp_path / "insights.json"
    ref.write_text(json.dumps([{"rule": "Use per_atom.", "score": 5, "correlation_tasks": ["question P2", "Later Q"]}]))
    import_file(mem.store, ref)
    out = tmp_path / "export.jsonl"
    export_jsonl(mem.store, out)
    line = next(json.loads(raw) for raw in out.read_text().splitlines() if "per_atom" in raw)
    assert line["provenance"] == ["P2"] and line["provenance_questions"] == ["later q", "question p2"]
    copy = ExperientialMemory(tmp_path / "b", encoder=enc)
    import_file(copy.store, out)
    assert show_item(copy.store, line["id"])["provenance_questions"] == ["later q", "question p2"]
    enc.vectors["later  q"] = enc.at(0.2)
    result = copy.update(None, query="later  q", decision=DecisionSummary(), metrics=PASS)
    with copy.store.read() as conn:
        assert hint_provenance(conn, line["id"]) == ["P2", result.record_id]
    again = tmp_path / "again.jsonl"
    export_jsonl(copy.store, again)
    assert [raw for raw in again.read_text().splitlines() if "per_atom" in raw] == [
        json.dumps({**line, "provenance": ["P2", result.record_id]}, ensure_ascii=False)]


def test_every_question_level_link_is_an_event(tmp_path: Path) -> None:
    """Provenance added through a question (at import, and when a later record asks it) is logged."""
    mem, enc = ranked_store(tmp_path)
    ref = tmp_path / "insights.json"
    ref.write_text(json.dumps([{"rule": "Use per_atom.", "score": 5, "correlation_tasks": ["question P2", "later q"]}]))
    import_file(mem.store, ref)
    hint_id = next(i["id"] for i in list_items(mem.store, records=False) if i["text"] == "Use per_atom.")
    enc.vectors["Later Q"] = enc.at(0.2)
    rid = mem.update(None, query="Later Q", decision=DecisionSummary(), metrics=PASS).record_id
    hint = show_item(mem.store, hint_id)
    assert hint["provenance"] == ["P2", rid]
    events = [(e["kind"], e.get("record_id")) for e in hint["events"]]
    assert events == [("hint_added", None), ("hint_linked", "P2"), ("hint_linked", rid)]
    assert hint["events"][0]["provenance_questions"] == ["question P2", "later q"]
    record = show_item(mem.store, rid or "")
    assert record["events"][0]["kind"] == "record_added" and record["events"][0]["linked_hints"] == [hint_id]
    # ... and its commit (issue 29: what the commit did, for a resume that commits it again)
    assert [(e["kind"], e.get("hint_id")) for e in record["events"]] == [
        ("record_added", None), ("hint_linked", hint_id), ("record_committed", None)]
