"""Decision Θ validation: every error names the exact problem; good input is normalised."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from amapreduce.decision import (
    ByAttr,
    ColumnType,
    Decision,
    OpenStrategy,
    PerAtom,
    columns_from_schema,
    load_decision,
    render,
)
from amapreduce.errors import DecisionError


def make(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "task_matrix": [["France", "Europe"], ["Japan", "Asia"], ["Kenya", "Africa"]],
        "template": "Capital of __0__ (__1__)?",
        "json_schema": {"type": "object", "properties": {"country": {}, "continent": {}, "capital": {}}},
    }
    base.update(over)
    return base


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ({"task_matrix": []}, r"task_matrix is empty"),
        ({"task_matrix": [[]]}, r"row 0 has no cells"),
        ({"task_matrix": [["a", "b"], ["c"]]}, r"ragged: row 1 has 1 cells but row 0 has 2"),
        ({"template": "Capital of __2__?"}, r"template uses __2__ but task_matrix rows have 2 cells"),
        ({"template": "Capital?"}, r"no __0__ … placeholder"),
        ({"template": "  "}, r"template is empty"),
        ({"task_matrix": [["France", "Europe"], ["france ", "EUROPE"]]}, r"rows 0 and 1 are duplicates"),
        ({"task_matrix": [["Fr__1__", "Europe"], ["Japan", "Asia"]]}, r"task_matrix\[0\]\[0\].*contains the placeholder '__1__'"),
        ({"task_matrix": [["France", None], ["Japan", "Asia"]]}, r"task_matrix\[0\]\[1\] must be a string"),
        ({"batch_strategy": {"type": "diagonal"}}, r"unknown batch strategy 'diagonal'"),
        ({"batch_strategy": "sideways"}, r"unknown batch strategy 'sideways'"),
        ({"batch_strategy": {"type": "by_attr"}}, r"exactly one of `attribute_index` or `attribute_name`"),
        ({"batch_strategy": {"type": "by_attr", "attribute_index": 5}}, r"attribute_index 5 is out of range: rows have 2 cells"),
        ({"batch_strategy": {"type": "by_attr", "attribute_name": "capital"}}, r"attribute_name 'capital' is not a matrix column"),
        ({"batch_strategy": {"type": "open", "groups": [{"indices": [0, 7]}]}}, r"groups\[0\]\.indices has 7, out of range for 3 rows"),
        ({"batch_strategy": {"type": "open", "groups": [{"indices": [0]}, {"indices": [1, 0]}]}}, r"row 0 is in batch_strategy.groups\[0\] and groups\[1\]"),
        ({"batch_strategy": {"type": "open", "groups": [{"attribute_index": 1, "attribute_value": "Mars"}]}}, r"matches no row"),
        ({"batch_strategy": {"type": "open", "groups": [{"indices": []}]}}, r"indices` must not be empty"),
        ({"batch_strategy": {"type": "open", "groups": [{"indices": [0], "attribute_value": "x"}]}}, r"exactly one of `indices` or `attribute_value`"),
        ({"batch_size": 0}, r"batch_size: Input should be greater than or equal to 1"),
        ({"json_schema": {"type": "object"}}, r"json_schema has no `properties`"),
        ({"json_schema": []}, r"defines no columns"),
        ({"json_schema": ["country", "Country"]}, r"'country' and 'Country' are the same name"),
        ({"json_schema": ["country"]}, r"rows have 2 cells but json_schema has only 1 columns"),
        ({"key_columns": ["population"]}, r"key_columns names 'population', which is not an output column"),
        ({"key_columns": []}, r"key_columns is empty"),
        ({"matrix_columns": ["country"]}, r"matrix_columns has 1 entries but task_matrix rows have 2 cells"),
        ({"matrix_columns": ["country", "country"]}, r"maps two matrix columns to the same output column"),
        ({"surprise": True}, r"surprise: unknown field; allowed decision fields are"),
        # An unknown field inside the strategy lists that strategy's (or group's) fields, not the decision's.
        ({"batch_strategy": {"type": "per_atom", "extra": 1}}, r"per_atom\.extra: unknown field; allowed per_atom batch_strategy fields are rationale, type\.$"),
        ({"batch_strategy": {"type": "by_attr", "attribute_index": 0, "q": 1}}, r"allowed by_attr batch_strategy fields are attribute_index, .*max_group_size"),
        ({"batch_strategy": {"type": "open", "groupz": []}}, r"open\.groupz: unknown field; allowed open batch_strategy fields are .*chunk_size, groups"),
        ({"batch_strategy": {"type": "open", "groups": [{"indices": [0], "zz": 1}]}}, r"groups\.0\.zz: unknown field; allowed open group fields are attribute_index, .*indices, .*shared_context\.$"),
        ({"batch_strategy": {"rationale": "x"}}, r"batch_strategy: batch strategy has no `type`; give one of 'per_atom'"),
        # JSON booleans are not integers, even though Python's bool is one.
        ({"batch_size": True}, r"batch_size: expected a whole number, got the boolean true"),
        ({"rows_per_task": False}, r"rows_per_task: expected a whole number, got the boolean false"),
        ({"batch_strategy": {"type": "by_attr", "attribute_index": True}}, r"by_attr\.attribute_index: expected a whole number"),
        ({"batch_strategy": {"type": "by_attr", "attribute_index": 0, "max_group_size": True}}, r"max_group_size: expected a whole number"),
        ({"batch_strategy": {"type": "open", "chunk_size": True}}, r"open\.chunk_size: expected a whole number"),
        ({"batch_strategy": {"type": "open", "groups": [{"indices": [0, True]}]}}, r"groups\.0\.indices\.1: expected a whole number"),
    ],
)
def test_invalid_decisions_name_the_problem(override: dict[str, Any], pattern: str) -> None:
    with pytest.raises(DecisionError, match=pattern):
        Decision.parse(make(**override))


def test_not_an_object() -> None:
    with pytest.raises(DecisionError, match="must be a JSON object, got list"):
        Decision.parse([1, 2])


def test_defaults_and_derived_views() -> None:
    d = Decision.parse(make(task_matrix=[["France", 1], ["Japan", 2.5]]))
    assert d.task_matrix == [["France", "1"], ["Japan", "2.5"]]  # numbers coerced to text
    assert isinstance(d.batch_strategy, PerAtom)
    assert d.columns == ("country", "continent", "capital")
    assert d.resolved_matrix_columns == ("country", "continent")
    assert d.resolved_key_columns == ("country", "continent")
    assert d.one_row_per_task
    assert d.task_text(1) == "Capital of Japan (2.5)?"
    assert d.forced_values(0) == {"country": "France", "continent": "1"}


def test_strategy_shorthands_are_normalised() -> None:
    assert isinstance(Decision.parse(make(batch_strategy="PER_ATOM")).batch_strategy, PerAtom)
    s = Decision.parse(make(batch_strategy={"type": " By_Attr ", "attribute_name": "continent"})).batch_strategy
    assert isinstance(s, ByAttr) and s.attribute_name == "continent"
    assert isinstance(Decision.parse(make(batch_strategy={"type": "open"})).batch_strategy, OpenStrategy)


def test_context_only_matrix_column_and_multi_row_key() -> None:
    d = Decision.parse(
        make(
            task_matrix=[["2019", "https://forbes.example/2019"], ["2020", "https://forbes.example/2020"]],
            template="Top billionaires of __0__ (see __1__)",
            json_schema=["year", "rank", "name"],
            matrix_columns=["year", None],
            key_columns=["year", "rank"],
            rows_per_task=10,
        )
    )
    assert d.forced_values(1) == {"year": "2020"}
    assert not d.one_row_per_task


def test_empty_key_cells_are_refused_naming_the_row() -> None:
    """Key columns the matrix fills are copied into the table, never asked of a sub-agent:
    an empty one is a row nobody can identify (the precondition was only in the prompt)."""
    with pytest.raises(DecisionError, match=r"task_matrix row 1 .* empty cell for key column 'country' \(task_matrix\[1\]\[0\]\)"):
        Decision.parse(make(task_matrix=[["France", "Europe"], ["", "Asia"]]))
    with pytest.raises(DecisionError, match=r"row 2 .*key column 'continent'"):
        Decision.parse(make(task_matrix=[["France", "Europe"], ["Japan", "Asia"], ["Kenya", "  "]]))
    # Cells outside the key may be empty: a non-key mapped column, or a context-only column.
    Decision.parse(make(task_matrix=[["France", "Europe"], ["Japan", ""]], key_columns=["country"]))
    Decision.parse(make(task_matrix=[["France", "Europe"], ["Japan", ""]], matrix_columns=["country", None]))


def test_schema_shapes() -> None:
    props = columns_from_schema({"properties": {"a": {"type": ["string", "null"], "description": "A"}}})
    assert props[0].name == "a" and props[0].type is ColumnType.TEXT and props[0].description == "A"
    assert [c.name for c in columns_from_schema({"a": {"type": "string"}, "b": {}})] == ["a", "b"]
    assert [c.name for c in columns_from_schema([" a ", "b"])] == ["a", "b"]
    with pytest.raises(DecisionError, match="must map to an object"):
        columns_from_schema({"properties": {"a": "string"}})


def test_render_is_single_pass() -> None:
    assert render("__0__ and __1__", ["__1__", "x"]) == "__1__ and x"
    assert render("__0____0__", ["ab"]) == "abab"


def test_load_decision_errors(tmp_path: Path) -> None:
    with pytest.raises(DecisionError, match="does not exist"):
        load_decision(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(DecisionError, match=r"not valid JSON: .* line 1, column 2"):
        load_decision(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(make()), encoding="utf-8")
    assert len(load_decision(good).task_matrix) == 3


def test_example_decision_is_valid(repo_root: Path) -> None:
    d = load_decision(repo_root / "examples" / "decision.json")
    assert d.resolved_key_columns == ("country",)
    assert isinstance(d.batch_strategy, ByAttr)


def test_integer_fields_still_accept_integral_text() -> None:
    """Only booleans are refused: `"2"` from a model still means 2 (pydantic's lax int)."""
    assert Decision.parse(make(batch_size="2", rows_per_task=3)).batch_size == 2


def test_unknown_key_with_a_newline_stays_on_one_line() -> None:
    with pytest.raises(DecisionError) as info:
        Decision.parse(make(**{"foo\nbar": 1}))
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("invalid decision: 'foo\\nbar': unknown field; allowed decision fields")


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(make()).encode("utf-8"))
    assert len(load_decision(path).task_matrix) == 3


def _unreadable(tmp_path: Path, kind: str) -> Path:
    if kind == "name too long":
        return tmp_path / ("x" * 300 + ".json")
    if kind == "symlink loop":
        os.symlink(tmp_path / "b", tmp_path / "a")
        os.symlink(tmp_path / "a", tmp_path / "b")
        return tmp_path / "a"
    if kind == "directory":
        return tmp_path
    path = tmp_path / "d.json"
    if kind == "deep nesting":
        path.write_text("[" * 200_000 + "]" * 200_000, encoding="utf-8")
    elif kind == "huge integer":
        path.write_text('{"batch_size": ' + "1" * 5000 + "}", encoding="utf-8")
    else:  # not UTF-8
        path.write_bytes(b"\xff\xfe{}")
    return path


@pytest.mark.parametrize(
    ("kind", "pattern"),
    [
        ("name too long", r"cannot read decision file .*File name too long"),
        ("symlink loop", r"cannot read decision file .*symbolic links"),
        ("directory", r"cannot read decision file .*Is a directory"),
        ("deep nesting", r"cannot be read as a decision: it is nested too deeply"),
        ("huge integer", r"cannot be read as a decision: Exceeds the limit"),
        ("not utf-8", r"cannot read decision file .*can't decode byte 0xff"),
    ],
)
def test_unreadable_files_raise_decision_error(tmp_path: Path, kind: str, pattern: str) -> None:
    """Every way a file can fail to read is a `DecisionError` (exit 2 in the CLI), never a traceback."""
    with pytest.raises(DecisionError, match=pattern) as info:
        load_decision(_unreadable(tmp_path, kind))
    assert "\n" not in str(info.value)


def test_deeply_nested_data_is_a_decision_error() -> None:
    nested: list[Any] = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(DecisionError, match="nested too deeply"):
        Decision.parse(make(json_schema={"properties": {"country": nested, "continent": {}}}))
