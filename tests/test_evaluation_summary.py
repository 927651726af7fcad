"""Summary aggregation (calc_summary_results) and the detail CSV."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from amapreduce.evaluation.details import write_details_csv
from amapreduce.evaluation.summary import render_per_task, render_summary, summarize


def test_macro_average_of_per_task_mean_max_min() -> None:
    per_task = {
        "a": [{"score": 1.0, "f1": 1.0}, {"score": 0.0, "f1": 0.5}],
        "b": [{"score": 0.0, "f1": 0.2}, {"score": 0.0, "f1": 0.4}],
    }
    summary = summarize(per_task, ["score", "f1"])
    assert summary["score"] == {"avg_n": 0.25, "max_n": 0.5, "min_n": 0.0}
    assert summary["f1"]["avg_n"] == pytest.approx((0.75 + 0.3) / 2)
    assert summary["f1"]["max_n"] == pytest.approx((1.0 + 0.4) / 2)
    assert summary["f1"]["min_n"] == pytest.approx((0.5 + 0.2) / 2)
    assert summarize({}, ["score"]) == {}
    with pytest.raises(ValueError, match="no trial"):
        summarize({"a": []}, ["score"])
    table = render_summary(summary, tasks=2, trials=2, successes=[1, 0], title="t")
    assert table.row_count == 2
    rows = {"a": [{"score": 1.0, "f1_by_row": 1.0, "f1_by_item": 1.0}]}
    per_task = render_per_task(rows, ["trial-1"])
    assert per_task.row_count == 1 and [str(c.header) for c in per_task.columns] == ["instance_id", "trial-1"]


def test_per_task_table_prints_ids_and_labels_verbatim() -> None:
    from rich.console import Console

    rows = {"see [/x] :smile:": [{"score": 1.0, "f1_by_row": 1.0, "f1_by_item": 1.0}]}
    console = Console(record=True, width=200)
    console.print(render_per_task(rows, ["run[bold]"]))  # markup here used to raise MarkupError
    text = console.export_text()
    assert "see [/x] :smile:" in text and "run[bold]" in text


def test_details_csv_orders_key_columns_first(tmp_path: Path) -> None:
    records = [
        {"z_response": "1", "name": "a", "z_query": "1", "name_before_map": "A"},
        {"name": "b", "exist_flag_gt": 1},
    ]
    path = tmp_path / "d" / "x.csv"
    write_details_csv(path, records, ["name"])
    with path.open(encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == [
            "exist_flag_gt",
            "exist_flag_response",
            "name",
            "name_before_map",
            "z_query",
            "z_response",
        ]
        rows = list(reader)
    assert rows[1]["exist_flag_gt"] == "1"
