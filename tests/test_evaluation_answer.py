"""The markdown-answer parser must behave exactly like the official `extract_dataframe`."""

from __future__ import annotations

from pathlib import Path

import pytest

from amapreduce.evaluation.answer import (
    AnswerParseError,
    extract_answer_dataframe,
    extract_table_text,
    norm_column,
    read_table_frame,
)

FENCE = "```"


def _fenced(body: str, lang: str = "markdown") -> str:
    return f"Here is the table.\n{FENCE}{lang}\n{body}\n{FENCE}\nDone."


def test_first_block_for_widesearch_last_for_deepwidesearch() -> None:
    text = _fenced("| A |\n|---|\n| draft |") + "\n" + _fenced("| A |\n|---|\n| final |")
    assert extract_answer_dataframe(text)["a"].tolist() == ["draft"]
    assert extract_answer_dataframe(text, benchmark="deepwidesearch")["a"].tolist() == ["final"]


def test_headers_normalised_and_outer_pipes_dropped() -> None:
    frame = extract_answer_dataframe(_fenced("|  HOME   PAGE  | Model_Name |\n|:--|--:|\n| x | y |"))
    assert frame is not None
    assert list(frame.columns) == ["homepage", "model_name"]
    assert norm_column("  Title (Value) ") == "title(value)"


def test_fenced_without_outer_pipes_keeps_every_column() -> None:
    frame = extract_answer_dataframe(_fenced("A | B\n--- | ---\n1 | 2"))
    assert frame is not None
    assert frame.to_dict("list") == {"a": ["1"], "b": ["2"]}


def test_pipe_fallback_needs_leading_pipes() -> None:
    with_pipes = "Answer:\n| Name | Year |\n|---|---|\n| X | 2019 |\nthanks"
    frame = extract_answer_dataframe(with_pipes)
    assert frame is not None
    assert frame.to_dict("list") == {"name": ["X"], "year": ["2019"]}
    # ```md is not a markdown fence: the fallback parses it (lines start with a pipe).
    assert extract_answer_dataframe(_fenced("| Name |\n|--|\n| X |\n| Y |", lang="md")) is not None
    # Without outer pipes and without a fence the first column is lost (official behaviour).
    lost = extract_answer_dataframe("Name | Year | Team\n--|--|--\nX | 2019 | T\nY | 2020 | U")
    assert lost is not None
    assert "name" not in lost.columns


def test_no_table_returns_none() -> None:
    assert extract_answer_dataframe("I could not find anything.") is None
    assert extract_answer_dataframe("a | b | c") is None  # fewer than 4 pipes
    assert extract_answer_dataframe(f"{FENCE}Markdown\nno pipes here\n{FENCE}") is None


def test_dtype_inference_then_str_reproduces_float_effect() -> None:
    ints = extract_answer_dataframe(_fenced("| Year |\n|---|\n| 2019 |\n| 2020 |"))
    floats = extract_answer_dataframe(_fenced("| Year |\n|---|\n| 2019 |\n| N/A |"))
    assert ints is not None and floats is not None
    assert ints["year"].tolist() == ["2019", "2020"]
    assert floats["year"].tolist() == ["2019.0", "nan"]  # bug B1, reproduced on purpose


def test_all_dash_row_and_separator_dropped_and_quotes_eaten() -> None:
    frame = extract_answer_dataframe(_fenced('| K | V |\n|---|---|\n| "18"box | a |\n| - | - |'))
    assert frame is not None
    assert len(frame) == 1
    assert frame["k"].tolist() == ["18box"]  # bug B12: read_csv treats the leading quote as quoting


def test_duplicate_headers_are_mangled() -> None:
    frame = extract_answer_dataframe(_fenced("| Title | Title |\n|--|--|\n| a | b |"))
    assert frame is not None
    assert list(frame.columns) == ["title", "title.1"]


def test_stray_pipe_in_later_row_raises_parse_error() -> None:
    with pytest.raises(AnswerParseError, match="stray"):
        extract_answer_dataframe(_fenced("| A | B |\n|--|--|\n| 1 | 2 |\n| 3 | x | y | z |"))


def test_cleaned_text_matches_official_steps() -> None:
    cleaned = extract_table_text(_fenced("| Col One | B |\n| :-- | --: |\n|  x  |  y  |\n\n"))
    assert cleaned == "|colone|b|\n|x|y|"


def test_round_trip_of_a_gold_table(benchmark_data: Path) -> None:
    gold = read_table_frame(benchmark_data / "widesearch" / "widesearch_gold" / "ws_en_018.csv")
    header = "| " + " | ".join(gold.columns) + " |"
    rows = ["| " + " | ".join(r) + " |" for r in gold.itertuples(index=False)]
    frame = extract_answer_dataframe(_fenced("\n".join([header, "|" + "---|" * gold.shape[1], *rows])))
    assert frame is not None
    assert list(frame.columns) == [norm_column(c) for c in gold.columns]
    assert frame.values.tolist() == gold.values.tolist()


def test_corrected_extraction_fixes_b11_and_b12() -> None:
    two = _fenced("| A |\n|---|\n| draft |") + "\n" + _fenced("| A |\n|---|\n| final |")
    fixed = extract_answer_dataframe(two, corrected=True)
    assert fixed is not None and fixed["a"].tolist() == ["final"]
    no_pipes = "Table:\nName | Year\n--- | ---\nX | 2019\n- | -\nthanks"
    frame = extract_answer_dataframe(no_pipes, corrected=True)
    assert frame is not None
    assert frame.to_dict("list") == {"name": ["X", "-"], "year": ["2019", "-"]}
    quoted = extract_answer_dataframe(
        _fenced('| K | Y |\n|---|---|\n| "18"box | 2019 |\n| b | N/A |'), corrected=True
    )
    assert quoted is not None
    assert quoted["k"].tolist() == ['"18"box', "b"]
    assert quoted["y"].tolist() == ["2019", "nan"]  # B1: integral floats stay integers
    assert quoted.attrs["b1_changed"] == 1 and quoted.attrs["b12_cells"] == 1
