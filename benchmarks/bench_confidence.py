"""Confidence benchmark: does a cell's confidence rank the wrong cells below the right ones?

Runs the sandbox tasks through `amapreduce demo`'s path (`run_demo`: the simulated model, which is
deterministic code, not an LLM, and reaches its facts only through the real search and crawl
tools) with `--wrong-values`: a seeded share of the simulated sub-agents' cells is answered wrong,
each with a made-up quote, and the fault plan records every cell it corrupted. A table cell is
**wrong** when its value is one of those corrupted answers (its source, column and value), else
right; the matrix's own cells (confidence 1 by rule) are left out, as no sub-agent answered them.

It prints, per run and in total: the answered cells, how many are wrong, the mean confidence of
right and of wrong cells, and the AUROC of the confidence (the chance that a right cell is more
confident than a wrong one, ties counting half; 1.0 is a perfect ranking, 0.5 chance). The rule is
`amapreduce.table.table.cell_confidence`; the goal in issue 27 is AUROC >= 0.9 at `--wrong-values 0.1`.

Run: `.venv/bin/python benchmarks/bench_confidence.py` (every sandbox wide-search task, seeds 1-2,
wrong values 0.1); `--tasks ID,...`, `--seeds S`, `--wrong-values R`, `--json`; `--smoke` is the
smallest run (two tasks, one seed). Nothing leaves the process; the run folders go to a temporary
folder that is removed.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from amapreduce.demo.faults import FaultPlan
from amapreduce.demo.run import load_sandbox_tasks, run_demo
from amapreduce.session.record import RunRecord
from amapreduce.settings import load_settings
from amapreduce.table.table import MATRIX_SOURCE

SMOKE = ["--tasks", "sbx_en_001,sbx_en_031", "--seeds", "1"]


def auroc(right: Sequence[float], wrong: Sequence[float]) -> float | None:
    """P(a right cell's confidence > a wrong cell's), ties counting half; None without both kinds."""
    if not right or not wrong:
        return None
    above = sum((r > w) + 0.5 * (r == w) for r in right for w in wrong)
    return above / (len(right) * len(wrong))


def cells_of(record: RunRecord, corrupted: set[tuple[str, str, str]]) -> list[tuple[float, bool]]:
    """(confidence, wrong) of every answered cell of a run's recorded table, the matrix's aside."""
    out: list[tuple[float, bool]] = []
    for row in record.table.rows if record.table is not None else []:
        for column, cell in row.cells.items():
            if not cell.value or cell.source == MATRIX_SOURCE:
                continue
            out.append((cell.confidence, (str(cell.source), column, cell.value) in corrupted))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", default="", help="comma-separated sandbox task ids (default: every wide-search task)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds 1..S of the fault plan: one run per task each")
    parser.add_argument("--wrong-values", type=float, default=0.1, help="share of answered cells made wrong (0-1)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--smoke", action="store_true", help="the smallest run: " + " ".join(SMOKE))
    args = parser.parse_args()
    if args.smoke:
        args = parser.parse_args([*SMOKE, *(["--json"] if args.json else [])])
    with tempfile.TemporaryDirectory(prefix="bench_confidence_") as tmp:
        settings = load_settings(runs_dir=Path(tmp) / "runs", cache_dir=Path(tmp) / "cache", workers=8)
        tasks, _ = load_sandbox_tasks(settings)
        ids = args.tasks.split(",") if args.tasks else sorted(t for t in tasks if not t.startswith("sbx_disc_"))
        runs: list[dict[str, Any]] = []
        every: list[tuple[float, bool]] = []
        for seed in range(1, args.seeds + 1):
            for task_id in ids:
                outcome = run_demo(task_id, settings, faults=FaultPlan(rate=0.0, seed=seed, wrong_values=args.wrong_values))
                corrupted = {(w.source, w.column, w.value) for w in outcome.wrong_cells}
                cells = cells_of(outcome.ask.record, corrupted)
                every += cells
                right = [c for c, bad in cells if not bad]
                wrong = [c for c, bad in cells if bad]
                runs.append({"task_id": task_id, "seed": seed, "cells": len(cells), "wrong": len(wrong),
                             "mean_right": sum(right) / len(right) if right else None,
                             "mean_wrong": sum(wrong) / len(wrong) if wrong else None, "auroc": auroc(right, wrong)})
    right = [c for c, bad in every if not bad]
    wrong = [c for c, bad in every if bad]
    total = {"cells": len(every), "wrong": len(wrong), "mean_right": sum(right) / len(right) if right else None,
             "mean_wrong": sum(wrong) / len(wrong) if wrong else None, "auroc": auroc(right, wrong),
             "wrong_values": args.wrong_values, "runs": len(runs)}
    if args.json:
        print(json.dumps({"total": total, "runs": runs}))
        return

    def shown(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    print(f"confidence per cell on the sandbox (simulated model, --wrong-values {args.wrong_values}, "
          f"seeds 1-{args.seeds}); AUROC = P(right cell more confident than a wrong one)")
    print(f"{'task':<16}{'seed':>5}{'cells':>7}{'wrong':>7}{'mean right':>12}{'mean wrong':>12}{'AUROC':>8}")
    for run in runs:
        print(f"{run['task_id']:<16}{run['seed']:>5}{run['cells']:>7}{run['wrong']:>7}{shown(run['mean_right']):>12}"
              f"{shown(run['mean_wrong']):>12}{shown(run['auroc']):>8}")
    print(f"{'total':<16}{'':>5}{total['cells']:>7}{total['wrong']:>7}{shown(total['mean_right']):>12}"
          f"{shown(total['mean_wrong']):>12}{shown(total['auroc']):>8}")


if __name__ == "__main__":
    main()
