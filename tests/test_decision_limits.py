"""Decision validation refuses what only looks valid (issue 17, item 8): key cells with no visible
character, placeholders written with non-ASCII digits, and numbers no batch plan can mean. Each is
one `error:` line naming the field, exit 2; the bounds are said in the message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from amapreduce.cli.app import main
from amapreduce.decision import Decision
from amapreduce.decision.model import MAX_ROWS_PER_TASK
from amapreduce.decision.strategy import MAX_BATCH_SIZE
from amapreduce.errors import DecisionError


def make(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "task_matrix": [["France", "Europe"], ["Japan", "Asia"], ["Kenya", "Africa"]],
        "template": "Capital of __0__ (__1__)?",
        "json_schema": ["country", "continent", "capital"],
        "matrix_columns": ["country", None],
    }
    base.update(over)
    return base


def plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> tuple[int, str]:
    """`mapreduce plan` (human output) of a decision file holding `text`: exit code and stderr."""
    path = tmp_path / "d.json"
    path.write_text(text, encoding="utf-8")
    code = main(["mapreduce", "plan", str(path)])
    captured = capsys.readouterr()
    if code == 2:
        assert captured.out == "" and captured.err.startswith("error: ") and len(captured.err.splitlines()) == 1
    return code, captured.err


# -- invisible key cells ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cell",
    ["\u200b", "\u200d", "\ufeff", "\u00a0", "\u3000", " \u200b\t", "\u2060\u00ad", "\u3164", "\u2800", "\x07"],
    ids=["zwsp", "zwj", "bom", "nbsp", "ideographic-space", "mixed", "word-joiner+shy", "hangul-filler", "braille-blank", "bell"],
)
def test_a_key_cell_with_no_visible_character_is_refused(cell: str) -> None:
    # White space alone is "an empty cell"; anything else "a cell with no visible character".
    shown = r"an empty cell" if not cell.strip() else r"a cell with no visible character .*"
    with pytest.raises(DecisionError, match=rf"row 1 .* has {shown} for key column 'country' \(task_matrix\[1\]\[0\]\)"):
        Decision.parse(make(task_matrix=[["France", "Europe"], [cell, "Asia"]]))


def test_an_empty_key_cell_is_still_called_empty() -> None:
    with pytest.raises(DecisionError, match=r"has an empty cell for key column 'country'"):
        Decision.parse(make(task_matrix=[["France", "Europe"], ["  ", "Asia"]]))


def test_invisible_characters_around_a_name_and_in_context_cells_are_accepted() -> None:
    """Only a key cell that shows nothing is refused: a name with a zero-width joiner inside (as in
    some scripts and emoji) names something, and a context-only cell may be empty."""
    decision = Decision.parse(make(task_matrix=[["Fr\u200dance", "\u200b"], ["\U0001f1eb\U0001f1f7", ""]]))
    assert decision.task_matrix[0] == ["Fr\u200dance", "\u200b"]


def test_a_column_name_with_no_visible_character_is_refused() -> None:
    with pytest.raises(DecisionError, match=r"column name must be a string with a visible character, got '\\u200b'"):
        Decision.parse(make(json_schema=["country", "\u200b", "capital"]))


def test_plan_refuses_a_zero_width_space_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's reproduction: `mapreduce plan` accepted a key cell that is only U+200B."""
    code, err = plan(tmp_path, capsys, json.dumps({
        "task_matrix": [["\u200b"], ["Spain"]], "template": "capital of __0__", "json_schema": ["country", "capital"],
    }))
    assert code == 2 and "no visible character" in err and "'\\u200b'" in err


# -- placeholders ----------------------------------------------------------------------------------


@pytest.mark.parametrize("placeholder", ["__\uff10__", "__\u0660__", "__\u0966__", "__1\uff11__"],
                         ids=["fullwidth-0", "arabic-indic-0", "devanagari-0", "ascii+fullwidth"])
def test_a_placeholder_with_non_ascii_digits_is_refused(placeholder: str) -> None:
    with pytest.raises(DecisionError, match=rf"template has '{placeholder}', a placeholder whose digits are not ASCII 0-9"):
        Decision.parse(make(template=f"Capital of __0__ and {placeholder}?"))


def test_plan_refuses_a_fullwidth_placeholder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's reproduction: `__０__` used to fill like `__0__` (Python's `\\d` matches it)."""
    code, err = plan(tmp_path, capsys, json.dumps({
        "task_matrix": [["France"], ["Spain"]], "template": "capital of __\uff10__", "json_schema": ["country", "capital"],
    }, ensure_ascii=False))
    assert code == 2 and "digits are not ASCII 0-9" in err


def test_a_placeholder_with_thousands_of_digits_is_out_of_range_not_a_crash() -> None:
    with pytest.raises(DecisionError, match=r"template uses __9{10,}… but task_matrix rows have 2 cells"):
        Decision.parse(make(template="Capital of __0__ __" + "9" * 5000 + "__?"))


def test_leading_zeros_still_name_the_column() -> None:
    assert Decision.parse(make(template="Capital of __00__ (__001__)?")).task_text(0) == "Capital of France (Europe)?"


# -- absurd integers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ({"rows_per_task": 10**18}, r"rows_per_task: 1000000000000000000 is too large; at most 10,000 rows per task"),
        ({"rows_per_task": 1e18}, r"rows_per_task: 1e\+18 is too large; at most 10,000 rows per task"),
        ({"batch_size": int("9" * 4000)}, r"batch_size: a number of about 4,000 digits is too large; at most 1,000 tasks per batch"),
        ({"batch_size": "9" * 4000}, r"batch_size: 9{20,}… is too large; at most 1,000 tasks per batch"),
        ({"batch_size": MAX_BATCH_SIZE + 1}, r"batch_size: 1001 is too large; at most 1,000 tasks per batch"),
        ({"batch_strategy": {"type": "open", "chunk_size": 10**30}}, r"open\.chunk_size: a number of about 30 digits is too large; at most 1,000"),
        ({"batch_strategy": {"type": "by_attr", "attribute_index": 1, "max_group_size": 2**90}},
         r"by_attr\.max_group_size: a number of about 27 digits is too large; at most 1,000"),
        ({"batch_strategy": {"type": "by_attr", "attribute_index": 10**4000}}, r"attribute_index a number of about 4,000 digits is out of range"),
        ({"batch_strategy": {"type": "open", "groups": [{"indices": [0, 10**50]}]}}, r"indices has a number of about 50 digits, out of range for 3 rows"),
    ],
)
def test_absurd_integers_are_refused_with_their_bound(override: dict[str, Any], pattern: str) -> None:
    with pytest.raises(DecisionError, match=pattern) as caught:
        Decision.parse(make(**override))
    assert len(str(caught.value)) < 400  # the number is abbreviated, never printed in full


def test_the_bounds_themselves_are_accepted() -> None:
    decision = Decision.parse(make(batch_size=MAX_BATCH_SIZE, rows_per_task=MAX_ROWS_PER_TASK, key_columns=["country", "capital"]))
    assert decision.batch_size == 1_000 and decision.rows_per_task == 10_000


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ('"rows_per_task": 1000000000000000000', "at most 10,000 rows per task"),
        ('"rows_per_task": 1e18', "at most 10,000 rows per task"),
        ('"batch_size": ' + "9" * 4000, "at most 1,000 tasks per batch"),
        ('"batch_size": ' + "9" * 5000, "4300 digits"),  # beyond what Python's JSON reader reads
    ],
    ids=["rows-per-task-int", "rows-per-task-float", "batch-size-4000-digits", "batch-size-5000-digits"],
)
def test_plan_refuses_absurd_integers(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, reason: str) -> None:
    """The issue's reproductions: `rows_per_task` of 1e18 and a 4,000-digit `batch_size` were planned."""
    text = '{"task_matrix": [["France"], ["Spain"]], "template": "capital of __0__", "json_schema": ["country", "capital"], ' + extra + "}"
    code, err = plan(tmp_path, capsys, text)
    assert code == 2 and reason in err and len(err) < 400
