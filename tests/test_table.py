"""The reducer table and its renderers; markdown is read back by the official WideSearch rules."""

from __future__ import annotations

import csv
import io
import json

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from amapreduce.evaluation.answer import extract_answer_dataframe
from amapreduce.table.render import markdown_cell, to_csv, to_jsonl, to_markdown
from amapreduce.table.table import CellStatus, Table


def test_upsert_merges_by_normalised_key_and_records_conflicts() -> None:
    t = Table(["name", "year", "worth"], ["name", "year"])
    t.upsert({"name": "Elon Musk", "year": "2020", "worth": ""}, task_index=0, source="https://a")
    t.upsert({"name": "elon  MUSK", "year": "2020", "worth": "24.6"}, task_index=1, source="https://b")
    t.upsert({"name": "**Elon Musk**", "year": "2020", "worth": "25"}, task_index=2, source="https://c")
    assert len(t) == 1
    cell = t.rows[0].cells["worth"]
    assert (cell.value, cell.source, cell.status) == ("24.6", "https://b", CellStatus.CONFLICT)
    assert cell.alternatives == ["25"]
    assert t.rows[0].cells["name"].value == "Elon Musk"  # the first spelling is kept


def test_rows_without_key_are_refused_and_markers_are_asked_again() -> None:
    t = Table(["name", "worth"], ["name"])
    assert t.upsert({"name": "N/A", "worth": "1"}, task_index=0) is None
    row = t.upsert({"name": "Ada", "worth": "unknown"}, task_index=0)
    assert row is not None and row.to_ask() == ["worth"] and row.missing() == []
    assert row.cells["worth"].status is CellStatus.MARKER and row.cells["worth"].value == "unknown"
    assert t.missing_cells() == []
    row = t.upsert({"name": "Ada", "worth": ""}, task_index=0)  # an explicit "not found" keeps the marker
    assert row is not None and row.cells["worth"].value == "unknown"


def test_merge_row_keeps_conflicts_and_ignores_foreign_columns() -> None:
    a = Table(["k", "v"], ["k"])
    a.upsert({"k": "x", "v": "1"}, task_index=3)
    a.upsert({"k": "x", "v": "2"}, task_index=3)
    b = Table(["k", "v", "extra"], ["k"])
    merged = b.merge_row(a.rows[0])
    assert merged is not None and merged.cells["v"].alternatives == ["2"]
    c = Table(["k"], ["k"])
    assert c.merge_row(b.rows[0]) is not None and c.records() == [{"k": "x"}]


def test_csv_and_jsonl() -> None:
    t = Table(["a", "b"], ["a"])
    t.upsert({"a": 'say "hi", ok', "b": ""}, task_index=0, source="https://s")
    assert list(csv.reader(io.StringIO(to_csv(t)))) == [["a", "b"], ['say "hi", ok', ""]]
    line = json.loads(to_jsonl(t, with_status=True))
    assert line == {"a": 'say "hi", ok', "b": "", "_missing": ["b"], "_conflicts": {}, "_sources": ["https://s"],
                    "_quotes": {}, "_evidence": {"a": "no_evidence"}, "_confidence": {"a": 0.6}}


def test_backtick_fence_in_a_cell_cannot_end_the_table() -> None:
    t = Table(["name", "code"], ["name"])
    t.upsert({"name": "a", "code": "x```y"}, task_index=0)
    t.upsert({"name": "b", "code": "z"}, task_index=1)
    frame = extract_answer_dataframe(to_markdown(t))
    assert frame is not None and frame.values.tolist() == [["a", "x``y"], ["b", "z"]]


def test_markdown_cell_quoting() -> None:
    assert markdown_cell("a | b") == '"a|b"'
    assert markdown_cell('"Quoted" title') == '"""Quoted"" title"'
    assert markdown_cell("line one\nline two") == "line one line two"


NA_LIKE = {"", "na", "n/a", "nan", "null", "none", "true", "false", "#n/a", "<na>", "-nan", "1.#ind", "1.#qnan",
           "#na", "-1.#ind", "-1.#qnan", "#n/a n/a", "-na"}
text = st.text(alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "Zs", "S")), min_size=1, max_size=20)
cells = st.builds(lambda head, tail: head + tail, st.sampled_from("abcXYZéü北"), text)


def expected_cell(value: str) -> str:
    # What the official parser keeps: every inner space as written (U+3000, U+00A0 ... included),
    # none at the ends or around an inner `|`.
    import re

    return re.sub(r"\s*\|\s*", "|", re.sub(r"`{3,}", "``", value.strip()))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(cells, min_size=3, max_size=3), min_size=1, max_size=6, unique_by=lambda r: r[0].casefold()))
def test_markdown_round_trips_through_the_widesearch_parser(rows: list[list[str]]) -> None:
    for row in rows:
        for v in row:
            assume(" ".join(v.split()).casefold() not in NA_LIKE)
            assume(v.strip() and not set(v.strip()) <= set("|-: "))
    names = ["Entity Name", "Capital", "Notes"]
    t = Table(names, ["Entity Name"])
    for i, row in enumerate(rows):
        t.upsert(dict(zip(names, row, strict=True)), task_index=i)
    assume(len(t) == len(rows))
    frame = extract_answer_dataframe("Answer:\n" + to_markdown(t) + "\nThanks.")
    assert frame is not None
    assert list(frame.columns) == ["entityname", "capital", "notes"]
    assert frame.values.tolist() == [[expected_cell(t.rows[i].cells[c].value) for c in names] for i in range(len(t))]


def test_missing_cells_read_like_empty_gold_cells() -> None:
    t = Table(["name", "capital"], ["name"])
    t.upsert({"name": "France", "capital": "Paris"}, task_index=0)
    t.upsert({"name": "Atlantis"}, task_index=1)
    frame = extract_answer_dataframe(to_markdown(t))
    assert frame is not None
    assert frame.values.tolist() == [["France", "Paris"], ["Atlantis", "nan"]]


def test_a_cells_confidence_follows_the_documented_rule() -> None:
    """`cell_confidence`: nothing 0, the matrix's 1, else by the quote's evidence, halved by a conflict,
    at most 0.5 for a marker, raised by each later reply that gave the same value (issue 27 point 4)."""
    from amapreduce.table.evidence import Evidence
    from amapreduce.table.table import Cell, CellStatus, cell_confidence

    found = CellStatus.FOUND
    assert cell_confidence(Cell()) == 0.0
    assert cell_confidence(Cell(value="Oslo", status=found, source="task_matrix")) == 1.0
    assert [cell_confidence(Cell(value="Oslo", status=found, evidence=e))
            for e in (Evidence.VERIFIED, Evidence.NO_EVIDENCE, Evidence.UNVERIFIED)] == [0.9, 0.6, 0.3]
    assert cell_confidence(Cell(value="Oslo", status=CellStatus.CONFLICT, alternatives=["Bergen"],
                                evidence=Evidence.VERIFIED)) == 0.45
    assert cell_confidence(Cell(value="Unknown", status=CellStatus.MARKER, evidence=Evidence.VERIFIED)) == 0.5
    assert [cell_confidence(Cell(value="Oslo", status=found, agreements=n)) for n in (1, 2, 5)] == [0.8, 0.9, 0.9]


def test_a_later_reply_with_the_same_value_counts_as_an_agreement_and_survives_a_merge() -> None:
    from amapreduce.table.evidence import Evidence

    table = Table(["country", "capital"], ["country"])
    table.upsert({"country": "Norway", "capital": "Oslo"}, task_index=0, source="u1")
    table.upsert({"country": "Norway", "capital": "oslo"}, task_index=0, source="u2")  # the same value, normalised
    table.upsert({"country": "Norway", "capital": "Oslo"}, task_index=0, evidence={"capital": Evidence.UNVERIFIED})
    capital = table.rows[0].cells["capital"]
    assert capital.agreements == 1 and capital.confidence == 0.8  # an unverified repeat is no agreement
    whole = Table(["country", "capital"], ["country"])
    whole.upsert({"country": "Norway", "capital": "Oslo"}, task_index=0, source="u3")
    whole.merge_row(table.rows[0])
    assert whole.rows[0].cells["capital"].agreements == 2 and whole.rows[0].cells["capital"].to_json()["agreements"] == 2
