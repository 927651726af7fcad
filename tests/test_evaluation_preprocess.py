"""Preprocess functions: the official rules (docs/scorer-rules.md §4) and their fixes."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amapreduce.evaluation.preprocess import (
    DateCache,
    DateContext,
    Preprocessor,
    extract_number,
    extract_number_corrected,
    fast_date,
    norm_str,
    norm_str_corrected,
)


def test_norm_str_keeps_newlines_and_punctuation() -> None:
    assert norm_str("  **Foo Bar**  ") == "foobar"
    assert norm_str("A\nB") == "a\nb"
    assert norm_str_corrected("A\nB\u3000C<br/>D") == "abcd"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$1,234.5M", "1234.5"),
        ("Top 3: 1,234", "3"),
        ("-2.5%", "-2.5%"),
        ("1.2e3", "1.2"),
        ("none", "NULL"),
        (".5", ".5"),
    ],
)
def test_extract_number(text: str, expected: str) -> None:
    assert extract_number(text) == expected


def test_extract_number_corrected_keeps_exponent() -> None:
    assert extract_number_corrected("1.2e3") == "1.2e3"
    assert extract_number_corrected("$1,234.5M") == "1234.5"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024", "2024-11-01"),
        ("Oct 15", "2026-10-15"),
        ("-, 1994", "1994-11-01"),
        ("nan", "2026-08-01"),
        ("n/a", "2026-11-19"),
        ("bar", "2026-11-16"),
        ("", ""),
        ("2019-05-03", "2019-05-03"),
    ],
)
def test_norm_date_with_pinned_reference(text: str, expected: str) -> None:
    assert DateContext(reference=dt.date(2026, 11, 21)).norm_date(text) == expected


def test_reference_date_changes_year_only_dates() -> None:
    assert DateContext(reference=dt.date(2025, 3, 9)).norm_date("2024") == "2024-03-01"


def test_corrected_dates_are_clock_free_and_strict() -> None:
    ctx = DateContext(reference=dt.date(2026, 11, 21), corrected=True)
    assert ctx.norm_date("2024") == "2024-01-01"
    assert ctx.norm_date("nan") == "nan"
    assert ctx.norm_date("March 2020") == "2020-03-01"


def test_preprocessor_dispatch_and_unknown_name() -> None:
    pre = Preprocessor(DateContext(reference=dt.date(2026, 1, 1)))
    assert pre.apply("norm_str", "A B") == "ab"
    assert pre.apply("extract_number", "x 12") == "12"
    assert not pre.known("lowercase")
    with pytest.raises(KeyError):
        pre.apply("lowercase", "x")


def test_fast_date_equals_dateparser_on_every_gold_date(benchmark_data: Path) -> None:
    """The dateparser-free fast path must give dateparser's answer on every string it accepts."""
    import dateparser

    from amapreduce.evaluation.loaders import load_gold, load_tasks

    values: set[str] = set()
    for bench, tasks_file, gold in (
        ("widesearch", "widesearch/widesearch.jsonl", "widesearch/widesearch_gold"),
        ("deepwidesearch", "deepwidesearch/overall_20250916.jsonl", "deepwidesearch/overall_20250916_tables"),
    ):
        for task in load_tasks(benchmark_data / tasks_file, bench).values():  # type: ignore[arg-type]
            date_cols = [
                c
                for c in task.evaluation.required
                if "norm_date" in getattr(task.evaluation.eval_pipeline.get(c), "preprocess", [])
            ]
            if date_cols:
                table = load_gold(benchmark_data / gold, task)
                for col in date_cols:
                    values.update(table.cells[table.columns.index(col)])
    accepted = [v for v in sorted(values) if fast_date(v) is not None]
    assert len(accepted) > 400
    for base in (dt.datetime(2026, 11, 21), dt.datetime(2025, 2, 3)):
        settings = {"PREFER_DAY_OF_MONTH": "first", "RELATIVE_BASE": base}
        wrong = [v for v in accepted if dateparser.parse(v, settings=settings) != fast_date(v)]
        assert wrong == []
    assert fast_date("2019-02-30") is None and fast_date("Sept 3, 2019") is None


def test_date_cache_round_trip(tmp_path: Path) -> None:
    first = DateContext(reference=dt.date(2026, 11, 21), store=DateCache(tmp_path))
    assert first.norm_date("nan") == "2026-08-01"
    assert first.norm_date("not a date") == "not a date"
    first.store.save()  # type: ignore[union-attr]
    again = DateCache(tmp_path)
    assert again.get("2026-11-21\x1fnan") == (True, dt.datetime(2026, 8, 1))
    assert again.get("2026-11-21\x1fnot a date") == (True, None)
    assert again.get("2026-11-22\x1fnan") == (False, None)  # another reference day is another key
    (tmp_path / again.path.name).write_text("{broken", encoding="utf-8")
    assert DateCache(tmp_path).get("2026-11-21\x1fnan") == (False, None)


@settings(max_examples=60, deadline=None)
@given(
    day=st.dates(min_value=dt.date(1900, 1, 1), max_value=dt.date(2099, 12, 31)),
    form=st.sampled_from(
        ["%Y-%m-%d", "%Y/%m/%d", "{y}/{m}/{d}", "%Y-%m", "{y}年{m}月", "%B {d}, %Y", "%b {d}, %Y"]
    ),
)
def test_fast_date_agrees_with_dateparser_on_generated_dates(day: dt.date, form: str) -> None:
    import dateparser

    text = day.strftime(form.format(y=day.year, m=day.month, d=day.day))
    expected = dateparser.parse(
        text, settings={"PREFER_DAY_OF_MONTH": "first", "RELATIVE_BASE": dt.datetime(2026, 11, 21)}
    )
    assert fast_date(text) == expected, text
