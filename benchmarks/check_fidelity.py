"""Table fidelity: with perfect sub-agents, does every benchmark table score what its gold scores?

For each WideSearch / DeepWideSearch task this runs the real pipeline, a `mapreduce run` through
`amapreduce.session.Session` (`RunOptions(kind=MAPREDUCE_RUN, decision=..., solver=...)`), on a
decision with one sub-question per gold row (its key cells fixed by the task matrix), whose
sub-agents are an oracle: a `BatchSolver` answering each numbered sub-question with the cells of
its gold row, written as the gold CSV holds them (a blank gold cell is a JSON null: "not found").
The run's markdown answer is then scored with the offline scorer (exact judge, identity key
alignment, a pinned date) against the gold, beside the gold table itself rendered as an answer;
a task is **lossless** when the run's answer scores what the gold scores on every official
metric, or higher on some and lower on none with every differing cell differing only by `"`:
the gold rendered as an answer (`gold_as_markdown`, "the gold pass") itself loses cells to the
official parser (bug B12: a cell starting with `"` loses its quotes), where the pipeline's
renderer CSV-quotes such a cell and keeps it. Such tasks are listed as "higher" with the cells.

It bypasses smolagents and HTTP (`web_tools=[]`, and `inner` role models that fail if called):
it measures table fidelity (what the parser, the reducer, the re-asks and the renderer do to
values and keys), not speed; `bench_oracle.py` measures the path through the HTTP client.

Exempt: a task whose gold holds disagreeing rows under one key (after the table's key
normalisation), since no one table can repeat both; such a task is listed, never counted lost.

Run: `PYTHONPATH=. .venv/bin/python benchmarks/check_fidelity.py --data ../shared/data`
(`--benchmark widesearch|deepwidesearch|both`, `--strategies per_atom,open`, `--ids ws_en_001,...`,
`--limit N`; `--smoke` for the smallest run). Prints, per benchmark and strategy: tasks lossless / total, cells lost, and per
failing task the cause (the cells that differ, and how the run ended).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from amapreduce.decision.model import Decision
from amapreduce.errors import AmapreduceError
from amapreduce.evaluation.answer import norm_column
from amapreduce.evaluation.deepwide import configure_protocol
from amapreduce.evaluation.judges import ExactJudge, IdentityAligner
from amapreduce.evaluation.loaders import TaskSpec, gold_as_markdown, load_gold, load_tasks
from amapreduce.evaluation.preprocess import DateContext
from amapreduce.evaluation.score import METRIC_FIELDS, ScoreConfig, TableResult, score_table
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.solver import BatchRequest, SolverReply
from amapreduce.session import RunOptions, Session
from amapreduce.session.journal import RunKind
from amapreduce.settings import load_settings
from amapreduce.table.keys import normalize_key
from amapreduce.testing.scripted import FunctionModel, ModelInfo

Benchmark = Literal["widesearch", "deepwidesearch"]
BENCHMARKS: dict[Benchmark, tuple[str, str]] = {
    "widesearch": ("widesearch/widesearch.jsonl", "widesearch/widesearch_gold"),
    "deepwidesearch": ("deepwidesearch/overall_20250916.jsonl", "deepwidesearch/overall_20250916_tables"),
}
STRATEGIES: dict[str, dict[str, Any]] = {
    "per_atom": {"type": "per_atom", "rationale": "one gold row per sub-question"},
    "open": {"type": "open", "chunk_size": 5, "rationale": "five gold rows per sub-question batch"},
}
REFERENCE_DATE = dt.date(2026, 1, 15)
_ROW = re.compile(r"\[gold row (\d+)\]")


@dataclass(frozen=True)
class GoldRows:
    """A gold table as a person wrote it: its CSV headers and its cells as text ("" when blank)."""

    headers: list[str]
    rows: list[dict[str, str]]
    keys: list[str]
    """The headers of the task's `unique_columns`."""


def read_gold_rows(gold_dir: Path, task: TaskSpec) -> GoldRows:
    """The gold CSV as text, cell by cell (no NaN, no float conversion), in `required` order."""
    frame = pd.read_csv(gold_dir / f"{task.instance_id}.csv", dtype=str, keep_default_na=False)
    by_norm = {norm_column(str(h).strip()): str(h) for h in frame.columns}
    headers = [by_norm[c] for c in task.evaluation.required]
    rows = [{h: str(record[h]) for h in headers} for record in frame.to_dict("records")]
    return GoldRows(headers=[h.strip() for h in headers],
                    rows=[{h.strip(): v for h, v in row.items()} for row in rows],
                    keys=[by_norm[c].strip() for c in task.evaluation.unique_columns])


def gold_decision(gold: GoldRows, strategy: str) -> Decision:
    """One sub-question per gold row: its key cells fixed by the matrix, its row number as context."""
    width = len(gold.keys)
    asks = " and ".join(f"{k} is __{j}__" for j, k in enumerate(gold.keys))
    return Decision.parse({
        "task_matrix": [[row[k] for k in gold.keys] + [str(i)] for i, row in enumerate(gold.rows)],
        "template": f"[gold row __{width}__] Give every column of the row whose {asks}.",
        "json_schema": {"type": "object", "properties": {h: {"type": "string"} for h in gold.headers}},
        "key_columns": gold.keys,
        "matrix_columns": [*gold.keys, None],
        "batch_strategy": STRATEGIES[strategy],
    })


class GoldOracle:
    """A perfect sub-agent: each numbered sub-question answered with its gold row's cells."""

    def __init__(self, gold: GoldRows) -> None:
        self.gold = gold

    def solve(self, request: BatchRequest) -> SolverReply:
        rows = []
        for number, text in enumerate(request.tasks, 1):
            found = _ROW.search(text)
            if found is None:
                raise AssertionError(f"a sub-question names no gold row: {text[:120]!r}")
            gold = self.gold.rows[int(found.group(1))]
            row: dict[str, Any] = {"task": number, "source": f"https://gold.example/row/{found.group(1)}"}
            row |= {spec.name: gold[spec.name] or None for spec in request.column_specs if spec.name in gold}
            rows.append(row)
        return SolverReply(output=rows, usage=Usage(requests=1))


def _never(messages: list[Any], info: ModelInfo) -> Any:
    raise AssertionError("the fidelity check's sub-agents are its oracle: no model may be called")


def _unused_model(role: str) -> FunctionModel:
    return FunctionModel(_never, model_id=f"sim/unused-{role}")


def run_pipeline(gold: GoldRows, strategy: str, runs_dir: Path) -> tuple[str, str]:
    """(the run's markdown answer, how it ended) for a `mapreduce run` answered by the oracle."""
    decision = gold_decision(gold, strategy)
    settings = load_settings({}, model="sim/fidelity", runs_dir=runs_dir, extraction_model="none", workers=8)
    options = RunOptions(kind=RunKind.MAPREDUCE_RUN, query="fidelity", decision=decision, solver=GoldOracle(gold),
                         web_tools=[], inner=_unused_model, show_progress=False)
    with Session(settings, options) as session:
        outcome = session.run()
    return outcome.markdown, outcome.status


def score_config(benchmark: Benchmark) -> ScoreConfig:
    """The offline scorer: exact judge, identity key alignment, a pinned date (DeepWideSearch: AIDC fixes)."""
    cfg = ScoreConfig(benchmark=benchmark, judge=ExactJudge(), aligner=IdentityAligner(),
                      dates=DateContext(reference=REFERENCE_DATE))
    return configure_protocol(cfg, "aidc") if benchmark == "deepwidesearch" else cfg


def disagreeing_keys(gold: GoldRows) -> list[str]:
    """Keys (after the table's key normalisation) under which the gold holds rows that differ."""
    seen: dict[tuple[str, ...], dict[str, str]] = {}
    clash: list[str] = []
    for row in gold.rows:
        key = normalize_key([row[k] for k in gold.keys])
        if key in seen and seen[key] != row:
            clash.append(" / ".join(row[k] for k in gold.keys))
        seen.setdefault(key, row)
    return clash


def _items(result: TableResult, columns: int) -> int:
    return round(result.recall_by_item * result.gold_rows * columns)


@dataclass
class TaskFidelity:
    """One task under one strategy."""

    instance_id: str
    verdict: Literal["equal", "higher", "lower"]
    cells_lost: int = 0
    """Cells the gold's answer matches and the run's answer does not (negative: gained)."""
    exempt: bool = False
    cause: str = ""

    @property
    def lossless(self) -> bool:
        return self.verdict != "lower"


@dataclass
class Tally:
    """A benchmark × strategy summary."""

    total: int = 0
    lossless: int = 0
    cells_lost: int = 0
    failing: list[TaskFidelity] = field(default_factory=list)
    exempt: list[TaskFidelity] = field(default_factory=list)
    higher: list[TaskFidelity] = field(default_factory=list)

    def add(self, task: TaskFidelity) -> None:
        self.total += 1
        self.lossless += task.lossless
        if task.verdict == "higher":
            self.higher.append(task)
        elif task.exempt:
            self.exempt.append(task)
        elif not task.lossless:
            self.cells_lost += max(task.cells_lost, 0)
            self.failing.append(task)


def _by_key(table: Any, keys: Sequence[str]) -> dict[tuple[str, ...], dict[str, str]]:
    """An answer's rows by key, the first of a duplicate key kept (the scorer's rule); `"` is
    left out of the key so that a quoted key meets its B12-stripped spelling."""
    rows: dict[tuple[str, ...], dict[str, str]] = {}
    for i in range(table.n_rows):
        row = {c: str(table.cells[j][i]) for j, c in enumerate(table.columns)}
        rows.setdefault(tuple(row.get(k, "").replace('"', "") for k in keys), row)
    return rows


def compare(ours: str, gold_md: str, status: str, task: TaskSpec, benchmark: Benchmark) -> tuple[str, int]:
    """(the cells that differ between the run's answer and the gold's, in words; how many of them
    differ by more than `"` characters, the one thing the gold's own answer loses: bug B12)."""
    from amapreduce.evaluation.answer import parse_answer_table

    mine, theirs = (parse_answer_table(t, benchmark=benchmark) for t in (ours, gold_md))
    if mine is None or theirs is None:
        return f"run {status}; the answer has no readable table", 1
    keys = list(task.evaluation.unique_columns)
    ours_rows, gold_rows = _by_key(mine, keys), _by_key(theirs, keys)
    unmatched = set(ours_rows) ^ set(gold_rows)
    diffs = [f"{len(unmatched)} keys not in both, e.g. {sorted(unmatched)[0]!r}"] if unmatched else []
    unexplained = len(unmatched)
    for key in (k for k in gold_rows if k in ours_rows):
        for column, gold_value in gold_rows[key].items():
            value = ours_rows[key].get(column)
            if value != gold_value:
                diffs.append(f"{' / '.join(key)} {column!r}: gold {gold_value!r}, ours {value!r}")
                unexplained += (value or "").replace('"', "") != gold_value.replace('"', "")
    shown = "; ".join(diffs[:3]) + (f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else "")
    return f"run {status}; " + (shown or "same cells, different score"), unexplained


def check_task(task: TaskSpec, gold_dir: Path, benchmark: Benchmark, strategy: str, runs_dir: Path) -> TaskFidelity:
    """Run `task`'s gold through the pipeline and compare its score with the gold's own."""
    gold = read_gold_rows(gold_dir, task)
    scored_gold = load_gold(gold_dir, task)
    cfg = score_config(benchmark)
    gold_md = gold_as_markdown(scored_gold)
    expected = score_table(task, scored_gold, gold_md, cfg)
    try:
        markdown, status = run_pipeline(gold, strategy, runs_dir)
    except (AmapreduceError, ValueError) as exc:
        return TaskFidelity(task.instance_id, "lower", _items(expected, len(gold.headers)), cause=f"refused: {exc}")
    got = score_table(task, scored_gold, markdown, cfg)
    deltas = [getattr(got, m) - getattr(expected, m) for m in METRIC_FIELDS]
    verdict: Literal["equal", "higher", "lower"] = (
        "equal" if all(abs(d) < 1e-9 for d in deltas) else "lower" if any(d < -1e-9 for d in deltas) else "higher")
    lost = _items(expected, len(gold.headers)) - _items(got, len(gold.headers))
    result = TaskFidelity(task.instance_id, verdict, lost)
    if verdict != "equal":
        clash = disagreeing_keys(gold)
        cause, unexplained = compare(markdown, gold_md, status, task, benchmark)
        if verdict == "higher" and unexplained:  # a gain hiding a loss
            result.verdict = "lower"
        result.exempt = bool(clash)
        result.cause = (f"gold has disagreeing rows under one key ({clash[0]!r}); " if clash else "") + cause
        if result.verdict == "higher":
            result.cause += " (only `\"` differs: the gold's own answer loses it to the scorer's bug B12)"
    return result


def check(data: Path, benchmark: Benchmark, strategy: str, ids: Iterable[str] | None = None,
          limit: int | None = None) -> Tally:
    """The fidelity of `benchmark`'s tasks (all, `ids`, or the first `limit`) under `strategy`."""
    tasks_file, gold_folder = BENCHMARKS[benchmark]
    tasks = load_tasks(data / tasks_file, benchmark)
    chosen = list(ids) if ids is not None else sorted(tasks)
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp:
        for iid in chosen[:limit]:
            tally.add(check_task(tasks[iid], data / gold_folder, benchmark, strategy, Path(tmp) / iid))
    return tally


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data",
                        help="folder holding widesearch/ and deepwidesearch/")
    parser.add_argument("--benchmark", choices=["widesearch", "deepwidesearch", "both"], default="both")
    parser.add_argument("--strategies", default="per_atom,open", help="per_atom and/or open (chunk_size 5)")
    parser.add_argument("--ids", default=None, help="comma-separated instance ids (default: all)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run (checks that it runs): --benchmark widesearch --strategies per_atom --limit 3")
    args = parser.parse_args(argv)
    if args.smoke:
        args.benchmark, args.strategies, args.limit = "widesearch", "per_atom", 3
    if not args.data.is_dir():
        parser.error(f"--data {args.data} is not a folder")
    benchmarks: list[Benchmark] = ["widesearch", "deepwidesearch"] if args.benchmark == "both" else [args.benchmark]
    ids = args.ids.split(",") if args.ids else None
    all_lossless = True
    for benchmark in benchmarks:
        for strategy in args.strategies.split(","):
            if strategy not in STRATEGIES:
                parser.error(f"unknown strategy {strategy!r}: use per_atom and/or open")
            start = time.perf_counter()
            tally = check(args.data, benchmark, strategy, ids, args.limit)
            print(f"{benchmark} {strategy}: lossless {tally.lossless}/{tally.total}, cells lost {tally.cells_lost}"
                  f" ({len(tally.higher)} higher than the gold's own answer, {len(tally.exempt)} exempt: the gold"
                  f" disagrees with itself; {time.perf_counter() - start:.1f} s)")
            for task in tally.failing:
                print(f"  LOST {task.instance_id}: {task.cells_lost} cells; {task.cause}")
            for task in tally.higher:
                print(f"  higher {task.instance_id}: {-task.cells_lost} cells the gold's answer loses; {task.cause}")
            for task in tally.exempt:
                print(f"  exempt {task.instance_id}: {task.cause}")
            all_lossless &= not tally.failing
    return 0 if all_lossless else 1


if __name__ == "__main__":
    sys.exit(main())
