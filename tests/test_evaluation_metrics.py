"""Cell metrics: the official rules (docs/scorer-rules.md §5) and the corrected variants."""

from __future__ import annotations

import datetime as dt

import pytest

from amapreduce.evaluation.metrics import MetricError, MetricSet, exact_match, number_near, url_match
from amapreduce.evaluation.preprocess import DateContext


@pytest.mark.parametrize(
    ("resp", "target", "criterion", "expected"),
    [
        ("105", "100", 0.05, 1.0),  # inclusive
        ("105.01", "100", 0.05, 0.0),
        ("0", "0", 0.0, 1.0),
        ("0.001", "0", 0.5, 0.0),  # relative to gold 0: exact only
        ("25%", "0.25", 0.0, 1.0),
        ("25%", "25", 0.1, 0.0),  # % divided on one side only (B11)
        ("NULL", "NULL", 0.05, 1.0),
        ("NULL", "abc", 0.05, 0.0),
    ],
)
def test_number_near(resp: str, target: str, criterion: float, expected: float) -> None:
    assert number_near(resp, target, criterion)[0] == expected


def test_number_near_without_criterion_fails_like_official() -> None:
    assert number_near("NULL", "NULL", None)[0] == 1.0
    with pytest.raises(MetricError, match="NoneType"):
        number_near("1", "1", None)


def test_url_match_compares_hosts_only() -> None:
    assert url_match("https://www.harvard.edu/apply", "see https://www.harvard.edu/")[0] == 1.0
    assert url_match("harvard.edu", "https://www.harvard.edu/")[0] == 0.0
    assert exact_match("ABC", "abc")[0] == 1.0


def test_date_near_official_and_corrected() -> None:
    ref = dt.date(2026, 11, 21)
    official = MetricSet(DateContext(reference=ref))
    assert official.score("date_near", "2020-01-01", "2020-01-31", None)[0] == 1.0
    assert official.score("date_near", "2020-01-01", "2020-03-01", None)[0] == 0.0
    assert official.score("date_near", "", "", None)[0] == 1.0  # both unparseable
    fixed = MetricSet(DateContext(reference=ref, corrected=True), corrected=True)
    assert fixed.score("date_near", "unknown", "tbd", None)[0] == 0.0
    assert fixed.score("date_near", "tbd", "TBD", None)[0] == 1.0
    assert fixed.score("number_near", "25%", "25", 0.0)[0] == 1.0
    assert not official.known("llm_judge")
