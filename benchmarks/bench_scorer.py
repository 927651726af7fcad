"""Wall time of the 200-task WideSearch gold pass with the exact judge, against a baseline.

Usage: .venv/bin/python benchmarks/bench_scorer.py [--data ../shared/data/widesearch] [--limit N | --smoke]

Three timings, all on the same machine in the same run:

1. **baseline** — the official `evaluate_single_query` flow written with pandas as the official
   code does it (per-table `astype(str)`, `drop_duplicates`, `Series.apply` preprocess without
   memoisation, inner + outer `pd.merge`, `DataFrame.apply(axis=1)` metrics), single process,
   with the docs/scorer-rules.md §10 stand-ins. It also cross-checks our numbers: both must agree to 1e-9.
2. **amapreduce (in-process)** — `score_table` over the same 200 tasks (empty memo caches).
   Both in-process timings run after dateparser's one-time locale loading, printed separately.
3. **amapreduce (CLI)** — `amapreduce eval score` in a fresh process on 200 answer files, once
   with an empty cache and once more with the dateparser results the first run cached (about
   2 s of the cold run is dateparser loading its ~200 locales for strings like "nan").

The official code itself (which needs pandarallel, an LLM and HF downloads) took about 25 s for
this pass on this machine (docs/scorer-rules.md §10); that figure is printed for reference.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from copy import deepcopy
from pathlib import Path
from typing import Any

OFFICIAL_SECONDS = 25.0
SMOKE_TASKS = 3
REPO = Path(__file__).resolve().parents[1]


def _baseline_task(task: Any, gold_frame: Any, text: str) -> tuple[float, float, float]:
    """The official flow, pandas-style (stand-ins: identity alignment, exact llm_judge)."""
    import dateparser
    import pandas as pd

    from amapreduce.evaluation.answer import extract_answer_dataframe
    from amapreduce.evaluation.metrics import MetricSet
    from amapreduce.evaluation.preprocess import DateContext, extract_number, norm_str

    def norm_date(x: str) -> str:
        d = dateparser.parse(x, settings={"PREFER_DAY_OF_MONTH": "first"})
        return x if d is None else d.strftime("%Y-%m-%d")

    pre = {"norm_str": norm_str, "extract_number": extract_number, "norm_date": norm_date}
    metrics = MetricSet(DateContext())
    required = task.evaluation.required
    unique = task.evaluation.unique_columns
    answer_df = gold_frame
    response_df = extract_answer_dataframe(text)
    if response_df is None or set(required) != set(response_df.columns):
        return 0.0, 0.0, 0.0
    for col in required:
        answer_df[col] = answer_df[col].astype(str)
        response_df[col] = response_df[col].astype(str)
    response_df = response_df.drop_duplicates(subset=unique)
    answer_df = answer_df.drop_duplicates(subset=unique)
    for col in unique:
        response_df[col + "_before_map"] = response_df[col]
    for col, rule in task.evaluation.eval_pipeline.items():
        for name in rule.preprocess:
            response_df[col] = response_df[col].apply(pre[name])
            answer_df[col] = answer_df[col].apply(pre[name])
    inner = pd.merge(answer_df, response_df, on=unique, how="inner", suffixes=("_query", "_response"))
    pd.merge(
        answer_df.assign(f=1),
        response_df.assign(g=1),
        on=unique,
        how="outer",
        suffixes=("_query", "_response"),
    )
    if inner.empty:
        return 0.0, 0.0, 0.0
    scores = pd.DataFrame(index=inner.index)
    for col in required:
        if col in unique:
            scores[col] = 1.0
            continue
        rule = task.evaluation.eval_pipeline[col]
        for name in rule.metric:
            if name == "llm_judge":
                scores[f"{col}_{name}"] = [
                    float(r.lower() == t.lower())
                    for r, t in zip(inner[col + "_response"], inner[col + "_query"], strict=True)
                ]
            else:
                scores[f"{col}_{name}"] = inner.apply(
                    lambda row, c=col, n=name, k=rule.criterion: metrics.score(
                        n, row[c + "_response"], row[c + "_query"], k
                    )[0],
                    axis=1,
                )
    tp_row, tp_item = scores.min(axis=1).sum(), scores.sum().sum()
    n_pred, n_gold, n_col = len(response_df), len(answer_df), len(required)
    p_row, r_row = tp_row / n_pred, tp_row / n_gold
    p_item, r_item = tp_item / (n_pred * n_col), tp_item / (n_gold * n_col)

    def f1(p: float, r: float) -> float:
        return 2 * p * r / (p + r) if p + r > 1e-9 else 0.0

    f1_row, f1_item = f1(p_row, r_row), f1(p_item, r_item)
    score = float(p_row == r_row == f1_row == 1.0 and p_item == r_item == f1_item == 1.0)
    return score, float(f1_row), float(f1_item)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "widesearch")
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    parser.add_argument("--smoke", action="store_true", help=f"the smallest run: {SMOKE_TASKS} tasks (checks that it runs)")
    args = parser.parse_args()
    if args.smoke:
        args.limit = SMOKE_TASKS
    tasks_file, gold_dir = args.data / "widesearch.jsonl", args.data / "widesearch_gold"
    if not tasks_file.is_file():
        raise SystemExit(f"no WideSearch data in {args.data} (pass --data DIR: the folder of widesearch.jsonl)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import pandas as pd
    from _cli import amapreduce_command, checkout_environment

    from amapreduce.evaluation.answer import norm_column, read_table_frame
    from amapreduce.evaluation.judges import ExactJudge, IdentityAligner
    from amapreduce.evaluation.loaders import gold_as_markdown, load_gold, load_tasks
    from amapreduce.evaluation.preprocess import DateContext
    from amapreduce.evaluation.score import ScoreConfig, score_table

    tasks = load_tasks(tasks_file, "widesearch")
    tasks = dict(list(tasks.items())[: args.limit]) if args.limit else tasks
    answers = {iid: gold_as_markdown(load_gold(gold_dir, t)) for iid, t in tasks.items()}

    # dateparser loads its ~200 locales once per process (about 2 s) on the first string that
    # is not an obvious date; pay that first so the two in-process timings compare scoring only.
    import dateparser

    start = time.perf_counter()
    dateparser.parse("nan", settings={"PREFER_DAY_OF_MONTH": "first"})
    t_warmup = time.perf_counter() - start

    start = time.perf_counter()
    cfg = ScoreConfig("widesearch", ExactJudge(), IdentityAligner(), DateContext())
    ours = {}
    for iid, task in tasks.items():
        r = score_table(task, load_gold(gold_dir, task), answers[iid], cfg)
        ours[iid] = (r.score, r.f1_by_row, r.f1_by_item)
    t_ours = time.perf_counter() - start

    start = time.perf_counter()
    baseline = {}
    for iid, task in tasks.items():
        frame: pd.DataFrame = read_table_frame(gold_dir / f"{iid}.csv")  # plain pd.read_csv + pandas-2 str
        frame.columns = [norm_column(str(c).strip()) for c in frame.columns]
        baseline[iid] = _baseline_task(task, deepcopy(frame[task.evaluation.required]), answers[iid])
    t_baseline = time.perf_counter() - start

    worst = max(abs(a - b) for iid in tasks for a, b in zip(ours[iid], baseline[iid], strict=True))
    with tempfile.TemporaryDirectory() as tmp:
        pred = Path(tmp) / "trial"
        pred.mkdir()
        for iid, text in answers.items():
            (pred / f"{iid}.md").write_text(text, encoding="utf-8")
        cmd = [
            *amapreduce_command(),
            "eval",
            "score",
            "--tasks",
            str(tasks_file),
            "--gold-dir",
            str(gold_dir),
            "--pred-dir",
            str(pred),
            "--out",
            str(Path(tmp) / "r.json"),
        ]
        env = {**checkout_environment(), "AMAPREDUCE_CACHE_DIR": str(Path(tmp) / "cache")}
        cli: list[float] = []
        for _ in range(1 if args.smoke else 2):  # first with an empty date cache, then with the cache it wrote
            start = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, env=env)
            cli.append(time.perf_counter() - start)

    n = len(tasks)
    print(
        f"tasks: {n}; successes ours {sum(v[0] for v in ours.values()):.0f}, baseline {sum(v[0] for v in baseline.values()):.0f}"
    )
    print(
        f"mean row F1 {sum(v[1] for v in ours.values()) / n:.4f}, item F1 {sum(v[2] for v in ours.values()) / n:.4f}; "
        f"max |ours - baseline| = {worst:.2e}"
    )
    print(f"baseline (official flow, pandas, 1 process): {t_baseline:6.2f} s")
    print(
        f"dateparser one-time locale loading:          {t_warmup:6.2f} s   (paid once per process, by both)"
    )
    print(
        f"amapreduce score_table (in-process):         {t_ours:6.2f} s   {t_baseline / t_ours:5.1f}x faster than baseline"
    )
    for label, seconds in zip(("CLI, fresh process, cold", "CLI, fresh process, date cache"), cli, strict=False):
        print(
            f"amapreduce eval score ({label}): {seconds:6.2f} s   "
            f"{(t_baseline + t_warmup) / seconds:5.1f}x vs baseline + locale loading, "
            f"{OFFICIAL_SECONDS / seconds:5.1f}x vs the official ~{OFFICIAL_SECONDS:.0f} s"
        )
    return 0 if worst <= 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
