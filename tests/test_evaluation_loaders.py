"""Loaders: the official file formats, and clear errors for malformed input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amapreduce.errors import UserError
from amapreduce.evaluation.answer import extract_answer_dataframe
from amapreduce.evaluation.loaders import (
    gold_as_markdown,
    load_gold,
    load_predictions_dir,
    load_predictions_jsonl,
    load_tasks,
)


def test_widesearch_tasks_decode_the_evaluation_string(benchmark_data: Path) -> None:
    tasks = load_tasks(benchmark_data / "widesearch" / "widesearch.jsonl", "widesearch")
    assert len(tasks) == 200
    first = tasks["ws_en_001"]
    assert first.evaluation.unique_columns == ["subject", "university"]
    assert set(first.evaluation.required) == set(first.evaluation.eval_pipeline)
    assert sum(len(t.evaluation.required) for t in tasks.values()) == 1244


def test_deepwidesearch_tasks_use_question_and_entity(benchmark_data: Path) -> None:
    tasks = load_tasks(benchmark_data / "deepwidesearch" / "overall_20250916.jsonl", "deepwidesearch")
    assert len(tasks) == 220
    assert all(t.query for t in tasks.values())
    assert all(t.entity for t in tasks.values())


def test_gold_is_stringified_like_pandas_2(benchmark_data: Path) -> None:
    root = benchmark_data / "widesearch"
    tasks = load_tasks(root / "widesearch.jsonl", "widesearch")
    gold = load_gold(root / "widesearch_gold", tasks["ws_en_054"])
    ci = gold.columns.index("completionyear")
    assert {r[ci] for r in gold.rows} >= {"2022.0", "nan"}
    fixed = load_gold(root / "widesearch_gold", tasks["ws_en_054"], corrected=True)
    assert "2022" in {r[ci] for r in fixed.rows}
    parsed = extract_answer_dataframe(gold_as_markdown(gold))
    assert parsed is not None and list(parsed.columns) == gold.columns


def test_malformed_task_lines(tmp_path: Path) -> None:
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"instance_id": "a", "evaluation": "{not json"}\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"t.jsonl:1"):
        load_tasks(bad, "widesearch")
    bad.write_text(
        json.dumps({"instance_id": "a", "evaluation": json.dumps({"required": ["x"]})}) + "\n",
        encoding="utf-8",
    )
    with pytest.raises(UserError, match="unique_columns"):
        load_tasks(bad, "widesearch")
    with pytest.raises(UserError, match="not found"):
        load_tasks(tmp_path / "missing.jsonl", "widesearch")


def test_gold_missing_or_lacking_columns(tmp_path: Path, benchmark_data: Path) -> None:
    tasks = load_tasks(benchmark_data / "widesearch" / "widesearch.jsonl", "widesearch")
    task = tasks["ws_en_018"]
    with pytest.raises(UserError, match="gold table not found"):
        load_gold(tmp_path, task)
    (tmp_path / "ws_en_018.csv").write_text("Fiscal Year,Other\nFY2015,1\n", encoding="utf-8")
    with pytest.raises(UserError, match="lacks required column"):
        load_gold(tmp_path, task)


def test_predictions(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("answer a", encoding="utf-8")
    assert load_predictions_dir(tmp_path, ["a", "b"]) == {"a": "answer a", "b": None}
    with pytest.raises(UserError, match="not a folder"):
        load_predictions_dir(tmp_path / "nope", ["a"])
    jl = tmp_path / "p.jsonl"
    jl.write_text(
        '{"instance_id": "a", "trial": 1, "response": "x"}\n{"instance_id": "a", "trial": 2, "response": null}\n',
        encoding="utf-8",
    )
    assert load_predictions_jsonl(jl) == {"1": {"a": "x"}, "2": {"a": None}}
    jl.write_text(
        '{"instance_id": "a", "trial": 1, "response": "x"}\n{"instance_id": "a", "trial": 1, "response": "y"}\n',
        encoding="utf-8",
    )
    with pytest.raises(UserError, match="duplicate prediction"):
        load_predictions_jsonl(jl)
    jl.write_text('{"instance_id": "a", "trial": 1, "respons": "x"}\n', encoding="utf-8")
    with pytest.raises(UserError, match="p.jsonl:1: `response`"):  # a misspelt key is still an error
        load_predictions_jsonl(jl)


def test_prediction_lines_may_carry_extra_keys(tmp_path: Path) -> None:
    """Official / DeepWideSearch output records carry `messages`, `trial_idx`, ...: load them as they are."""
    jl = tmp_path / "p.jsonl"
    jl.write_text(
        '{"instance_id": "a", "trial": 1, "response": "x", "messages": [], "trial_idx": 1, "prediction": "x"}\n',
        encoding="utf-8",
    )
    assert load_predictions_jsonl(jl) == {"1": {"a": "x"}}
