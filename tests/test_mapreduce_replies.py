"""Reply parsing and projection: every parse route, key folding, no invented values."""

from __future__ import annotations

import pytest

from amapreduce.mapreduce.replies import cell_text, parse_reply, project_row


@pytest.mark.parametrize(
    ("reply", "method"),
    [
        ([{"a": 1}], "object"),
        ({"rows": [{"a": 1}]}, "object"),
        ('[{"a": 1}]', "json"),
        ('Here you go:\n```json\n[{"a": 1}]\n```\nDone.', "fence"),
        ('Result: [{"a": 1}] as requested', "array_slice"),
        ('The row is {"a": 1} — hope it helps', "object_slice"),
        ('[{"a": 1}, {"a": 2,}', "json_repair"),
    ],
)
def test_parse_routes(reply: object, method: str) -> None:
    parsed = parse_reply(reply)
    assert parsed.method == method
    assert parsed.error is None
    assert parsed.rows[0]["a"] == 1


def test_parse_object_slice_after_failed_array_slice() -> None:
    # The reference never tried the {} slice once a [] slice existed and failed.
    parsed = parse_reply('note [see below] {"a": "x"}')
    assert parsed.method == "object_slice" and parsed.rows == [{"a": "x"}]


@pytest.mark.parametrize("reply", ["", "I could not find anything.", "[1, 2, 3]", None])
def test_unparseable_replies_report_an_error(reply: object) -> None:
    parsed = parse_reply(reply)
    assert parsed.rows == [] and parsed.error


def test_projection_folds_keys_and_stringifies() -> None:
    row = project_row(
        {"Net Worth": 12.5, "NAME": "  Ada\nLovelace ", "task": "2", "Source URL": ["https://a.example", "https://b"], "x": 1},
        ["name", "net_worth", "age"],
    )
    assert row.values == {"name": "Ada Lovelace", "net_worth": "12.5", "age": ""}
    assert row.task == 2
    assert row.source == "https://a.example"
    assert row.extra == {"x": 1}


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, ""), (True, "true"), (3, "3"), (2.0, "2.0"), (["a", None, 2], "a, 2"), ({"k": "v"}, '{"k": "v"}')],
)
def test_cell_text(value: object, text: str) -> None:
    assert cell_text(value) == text


def test_projection_never_copies_other_values() -> None:
    row = project_row({"unrelated": "France"}, ["country", "capital"])
    assert row.values == {"country": "", "capital": ""}
