"""Differential check: the fast scorer against a pandas rendition of the official flow.

The pandas rendition (`benchmarks/bench_scorer.py::_baseline_task`) follows the official
`evaluate_single_query` line by line (astype(str), drop_duplicates, Series.apply, pd.merge,
DataFrame.apply). On tasks with number and date columns, under every docs/scorer-rules.md §11 perturbation, both
must give the same score, row F1 and item F1.
"""

from __future__ import annotations

import importlib.util
from copy import deepcopy
from pathlib import Path
from types import ModuleType

import pytest
from test_evaluation_score import variants

from amapreduce.evaluation.answer import AnswerParseError, norm_column, read_table_frame
from amapreduce.evaluation.judges import ExactJudge, IdentityAligner
from amapreduce.evaluation.loaders import load_gold, load_tasks
from amapreduce.evaluation.preprocess import DateContext
from amapreduce.evaluation.score import ScoreConfig, score_table


def _bench(repo_root: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_scorer", repo_root / "benchmarks" / "bench_scorer.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fast_scorer_equals_pandas_rendition(benchmark_data: Path, repo_root: Path) -> None:
    bench = _bench(repo_root)
    root = benchmark_data / "widesearch"
    tasks = load_tasks(root / "widesearch.jsonl", "widesearch")
    gold_dir = root / "widesearch_gold"
    chosen = [
        t
        for t in tasks.values()
        if any({"number_near", "date_near"} & set(r.metric) for r in t.evaluation.eval_pipeline.values())
    ][::12][:8]
    assert len(chosen) == 8
    cfg = ScoreConfig("widesearch", ExactJudge(), IdentityAligner(), DateContext())
    compared = 0
    for task in chosen:
        gold = load_gold(gold_dir, task)
        frame = read_table_frame(gold_dir / f"{task.instance_id}.csv")
        frame.columns = [norm_column(str(c).strip()) for c in frame.columns]
        frame = frame[task.evaluation.required]
        for name, text in variants(task, gold).items():
            ours = score_table(task, gold, text, cfg)
            try:
                theirs = bench._baseline_task(task, deepcopy(frame), text)
            except AnswerParseError:
                theirs = (0.0, 0.0, 0.0)
            assert (ours.score, ours.f1_by_row, ours.f1_by_item) == pytest.approx(theirs, abs=1e-9), (
                task.instance_id,
                name,
            )
            compared += 1
    assert compared == 8 * 15
