"""Score one answer against one gold table, step for step like `evaluate_single_query`.

Why not call pandas merges like the official code: the official pipeline is a handful of
set/dict operations on string cells, and doing them in plain Python on column lists is several
times faster while giving the same numbers (docs/scorer-rules.md §2, §6, §13). Every
official early exit and crash is reproduced as the same all-zero result with a `msg`, so a
score here equals the official score for the same stand-in judges.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from amapreduce.evaluation.answer import (
    AnswerParseError,
    CellTable,
    extract_table_text,
    parse_answer_table,
    reconcile_column,
)
from amapreduce.evaluation.judges import Aligner, ColumnJudge
from amapreduce.evaluation.loaders import ColumnRule, GoldTable, TaskSpec
from amapreduce.evaluation.metrics import MetricSet
from amapreduce.evaluation.preprocess import DateContext, Preprocessor

__all__ = ["ScoreConfig", "TableResult", "explain_corrections", "score_table"]

METRIC_FIELDS = (
    "score",
    "precision_by_row",
    "recall_by_row",
    "f1_by_row",
    "precision_by_item",
    "recall_by_item",
    "f1_by_item",
)


_BUG_EFFECTS = {
    "B1": "one blank in an integer column turns its cells into floats (`213.0` is not `213`)",
    "B2": "near-duplicate keys join one gold row twice",
    "B5": "newlines, tabs and full-width spaces stay in compared strings",
    "B6": "partial dates take today's month or year",
    "B11": "tables and numbers are read by the first fence or first number only",
    "B12": "a cell starting with a quote loses its quotes",
    "B13": "one word in a column of numbers keeps that table's whole column as text (`+55` is not `55`)",
}
"""What each official bug does to a score, in a clause (docs/scorer-rules.md, "Known bugs")."""


def explain_corrections(corrections: dict[str, int]) -> str:
    """One line on why a `--corrected` score differs from the official one, from a table's
    non-zero correction counts (`TableResult.corrections`, keyed `"B1 cells rendered as
    integers"`): which official bugs changed how many cells, and what each does."""
    parts = []
    for what, n in corrections.items():
        bug = what.split()[0].split("/")[0]
        effect = _BUG_EFFECTS.get(bug)
        parts.append(f"{what}: {n}" + (f" ({bug}: {effect})" if effect else ""))
    if not parts:
        return "the official scorer's known bugs (docs/scorer-rules.md) change this table's score."
    return ("the official scorer keeps its known bugs, so published numbers stay comparable; here "
            + "; ".join(parts) + ".")


@dataclass
class ScoreConfig:
    """Everything that decides how a table is scored.

    Attributes:
        benchmark: which extraction rule (first or last markdown block).
        judge: scores `llm_judge` columns.
        aligner: maps response headers and keys to the gold's (`primary_key_preprocess`).
        dates: the date reference (pin it for reproducible `norm_date`/`date_near`).
        corrected: apply the B1, B2, B5, B6, B11, B12, B13 fixes.
        default_criterion: `number_near` tolerance when a column has none (DeepWideSearch fix
            of D2); None keeps the official `TypeError`.
        normalize_pipeline_keys: pass `eval_pipeline` keys through `norm_column` (fix of D3).
        details: keep per-row detail records for `--details`.
    """

    benchmark: Literal["widesearch", "deepwidesearch"]
    judge: ColumnJudge
    aligner: Aligner
    dates: DateContext
    corrected: bool = False
    default_criterion: float | None = None
    normalize_pipeline_keys: bool = False
    details: bool = False
    _pre: Preprocessor | None = field(default=None, repr=False)
    _legacy_pre: Preprocessor | None = field(default=None, repr=False)
    _metrics: MetricSet | None = field(default=None, repr=False)

    def preprocessor(self) -> Preprocessor:
        """The (memoised) preprocessor of this configuration."""
        if self._pre is None:
            self._pre = Preprocessor(self.dates, corrected=self.corrected)
        return self._pre

    def legacy_preprocessor(self) -> Preprocessor:
        """The official preprocessor on the same clock (to count what corrections change)."""
        if self._legacy_pre is None:
            self._legacy_pre = Preprocessor(DateContext(reference=self.dates.reference), corrected=False)
        return self._legacy_pre

    def metrics(self) -> MetricSet:
        """The deterministic metrics of this configuration."""
        if self._metrics is None:
            self._metrics = MetricSet(self.dates, corrected=self.corrected)
        return self._metrics


@dataclass
class TableResult:
    """One task, one trial: the official `EvaluationResult` fields plus join counts.

    `joined`, `pred_rows`, `gold_rows` and the key sets feed DeepWideSearch's column F1.
    """

    instance_id: str
    score: float = 0.0
    precision_by_row: float = 0.0
    recall_by_row: float = 0.0
    f1_by_row: float = 0.0
    precision_by_item: float = 0.0
    recall_by_item: float = 0.0
    f1_by_item: float = 0.0
    msg: str = ""
    evaluated: bool = False
    parse_failed: bool = False
    joined: int = 0
    pred_rows: int = 0
    gold_rows: int = 0
    pred_keys: set[tuple[str, ...]] = field(default_factory=set)
    gold_keys: set[tuple[str, ...]] = field(default_factory=set)
    corrections: Counter[str] = field(default_factory=Counter)
    details: list[dict[str, Any]] | None = None

    def metrics(self) -> dict[str, Any]:
        """The official result fields, as written to `per_task` in the results JSON."""
        out: dict[str, Any] = {name: float(getattr(self, name)) for name in METRIC_FIELDS}
        out["msg"] = self.msg
        return out


class _EvaluatorError(Exception):
    """Mirrors an exception the official code would raise inside its `try` (-> all zeros)."""


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall > 1e-9 else 0.0


def _dedup(columns: list[list[str]], key_idx: list[int]) -> list[list[str]]:
    """`drop_duplicates(subset=keys)` keeping the first row, on column-major data."""
    seen: set[tuple[str, ...]] = set()
    keep: list[int] = []
    for row in range(len(columns[0]) if columns else 0):
        key = tuple(columns[k][row] for k in key_idx)
        if key not in seen:
            seen.add(key)
            keep.append(row)
    if len(keep) == (len(columns[0]) if columns else 0):
        return columns
    return [[col[i] for i in keep] for col in columns]


def _pipeline(task: TaskSpec, cfg: ScoreConfig) -> dict[str, ColumnRule]:
    pipeline = task.evaluation.eval_pipeline
    if cfg.normalize_pipeline_keys:
        from amapreduce.evaluation.answer import norm_column

        return {norm_column(k): v for k, v in pipeline.items()}
    return pipeline


def score_table(task: TaskSpec, gold: GoldTable, response: str | None, cfg: ScoreConfig) -> TableResult:
    """Score one answer text against its gold table (docs/scorer-rules.md §2 steps 1–13).

    Returns:
        The result; official early exits (`response is None`, `response_df is None`, column
        mismatch) and official crashes ("evaluator error") are all-zero results with `msg`.
    """
    result = TableResult(instance_id=task.instance_id)
    if response is None:
        result.msg = "response is None"
        return result
    try:
        frame = parse_answer_table(response, benchmark=cfg.benchmark, corrected=cfg.corrected)
    except AnswerParseError as exc:
        result.msg = f"evaluator error: {exc}"
        result.parse_failed = True
        return result
    if frame is None:
        result.msg = "response_df is None"
        return result
    if cfg.corrected:
        _count_extraction_changes(response, frame, cfg, result)
    try:
        _score_frame(task, gold, frame, cfg, result)
    except _EvaluatorError as exc:
        kept = result.corrections
        result = TableResult(instance_id=task.instance_id, msg=f"evaluator error: {exc}", corrections=kept)
    return result


def _count_extraction_changes(response: str, frame: CellTable, cfg: ScoreConfig, result: TableResult) -> None:
    legacy = extract_table_text(response, benchmark=cfg.benchmark)
    corrected = extract_table_text(response, benchmark=cfg.benchmark, corrected=True)
    if legacy is None or corrected is None:
        result.corrections["B11 table extraction changed"] += int(legacy != corrected)
    else:
        strip = [line.strip("|") for line in legacy.split("\n")]
        result.corrections["B11 table extraction changed"] += int(strip != corrected.split("\n"))
    result.corrections["B1 cells rendered as integers"] += frame.b1_changed
    result.corrections["B12 cells with a literal leading quote"] += frame.b12_cells


def _score_frame(
    task: TaskSpec, gold: GoldTable, frame: CellTable, cfg: ScoreConfig, result: TableResult
) -> None:
    required = list(task.evaluation.required)
    unique = list(task.evaluation.unique_columns)
    columns = list(frame.columns)
    if set(required) != set(columns):
        mapping = cfg.aligner.align(columns, required)
        columns = [mapping.get(c, c) for c in columns]
    if set(required) != set(columns):
        result.msg = f"required_columns {required} != response_df {columns}"
        return
    if len(columns) != len(set(columns)):
        raise _EvaluatorError(f"duplicate response columns after renaming: {columns}")
    missing_keys = [c for c in unique if c not in required]
    if missing_keys:
        raise _EvaluatorError(f"KeyError: {missing_keys[0]!r} (unique column not required)")
    resp = [list(frame.cells[columns.index(c)]) for c in required]
    gold_cols = [list(col) for col in gold.cells]
    if cfg.corrected:
        _read_columns_alike(frame, [columns.index(c) for c in required], gold, resp, gold_cols, result)
    key_idx = [required.index(c) for c in unique]
    raw_unique = 0
    if not cfg.corrected:
        resp = _dedup(resp, key_idx)
        gold_cols = _dedup(gold_cols, key_idx)
    else:  # B2 fix: deduplicate after key mapping and preprocess (below); count the difference
        raw_unique = len(_dedup(resp, key_idx)[0]) + len(_dedup(gold_cols, key_idx)[0])

    pipeline = _pipeline(task, cfg)
    before_map: dict[str, list[str]] = {}
    for col in unique:
        rule = pipeline.get(col)
        if rule is None or not ("llm_judge" in rule.metric or "exact_match" in rule.metric):
            continue
        ci = required.index(col)
        mapping = cfg.aligner.align(list(resp[ci]), list(gold_cols[ci]))
        before_map[col] = resp[ci]
        resp[ci] = [mapping.get(v, v) for v in resp[ci]] if mapping else list(resp[ci])

    pre = cfg.preprocessor()
    for col, rule in pipeline.items():
        if col not in required:
            raise _EvaluatorError(f"KeyError: {col!r}")
        ci = required.index(col)
        for name in rule.preprocess:
            if not pre.known(name):
                raise _EvaluatorError(
                    f"AssertionError: preprocess_func_name {name} not in preprocess_function_registry"
                )
            if cfg.corrected:
                _count_preprocess_changes(cfg, name, resp[ci] + gold_cols[ci], result)
            try:
                resp[ci] = [pre.apply(name, v) for v in resp[ci]]
                gold_cols[ci] = [pre.apply(name, v) for v in gold_cols[ci]]
            except Exception as exc:  # dateparser may raise on odd input; the official code crashes too
                raise _EvaluatorError(f"{type(exc).__name__}: {exc}") from exc
    if cfg.corrected:
        if before_map:
            # keep before-map values aligned with the rows that survive deduplication
            resp = _dedup([*resp, *before_map.values()], key_idx)
            for offset, col in enumerate(before_map):
                before_map[col] = resp[len(required) + offset]
            resp = resp[: len(required)]
        else:
            resp = _dedup(resp, key_idx)
        gold_cols = _dedup(gold_cols, key_idx)
        result.corrections["B2 rows merged after preprocess"] += raw_unique - len(resp[0]) - len(gold_cols[0])

    n_pred, n_gold = len(resp[0]), len(gold_cols[0])
    temp_score = 0.0
    if not before_map and n_pred == n_gold and columns == required:
        if sorted(zip(*resp, strict=True)) == sorted(zip(*gold_cols, strict=True)):
            temp_score = 1.0

    resp_keys = list(zip(*(resp[k] for k in key_idx), strict=True))
    gold_keys = list(zip(*(gold_cols[k] for k in key_idx), strict=True))
    by_key: dict[tuple[str, ...], list[int]] = {}
    for ri, key in enumerate(resp_keys):
        by_key.setdefault(key, []).append(ri)
    pairs = [(gi, ri) for gi, key in enumerate(gold_keys) for ri in by_key.get(key, ())]

    scores: dict[str, list[float]] = {}
    messages: dict[str, list[str]] = {}
    metric_set = cfg.metrics()
    for col in required:
        if col in unique:
            scores[f"{col}_exact_match"] = [1.0] * len(pairs)
            messages[f"{col}_exact_match_eval_msg"] = ["key_match"] * len(pairs)
            continue
        rule = pipeline.get(col)
        if rule is None:
            raise _EvaluatorError(f"KeyError: {col!r}")
        criterion = rule.criterion
        if criterion is None and cfg.default_criterion is not None and "number_near" in rule.metric:
            criterion = cfg.default_criterion
        ci = required.index(col)
        resp_vals = [resp[ci][ri] for _, ri in pairs]
        gold_vals = [gold_cols[ci][gi] for gi, _ in pairs]
        for name in rule.metric:
            if name == "llm_judge":
                judged = cfg.judge.judge_column(resp_vals, gold_vals, criterion) if pairs else []
            elif metric_set.known(name):
                if not pairs:
                    raise _EvaluatorError(
                        "ValueError: Cannot set a DataFrame with multiple columns to the single column "
                        f"{col}_{name} (empty inner join, bug B4)"
                    )
                try:
                    judged = [
                        metric_set.score(name, r, t, criterion)
                        for r, t in zip(resp_vals, gold_vals, strict=True)
                    ]
                except Exception as exc:
                    raise _EvaluatorError(
                        f"{type(exc).__name__}: {exc} (column {col}, metric {name})"
                    ) from exc
            else:
                raise _EvaluatorError(
                    f"AssertionError: metric_func_name {name} not in metric_function_registry"
                )
            scores[f"{col}_{name}"] = [s for s, _ in judged]
            messages[f"{col}_{name}_eval_msg"] = [m for _, m in judged]
            if cfg.corrected:
                result.corrections["B6/B11 cells rescued by a corrected metric"] += sum(
                    1 for _, m in judged if m.startswith(("number near ignoring", "neither is a date"))
                )

    score_lists = list(scores.values())
    tp_row = sum(min(col[p] for col in score_lists) for p in range(len(pairs))) if score_lists else 0.0
    tp_item = sum(sum(col) for col in score_lists)
    n_cols = len(required)
    result.precision_by_row = tp_row / n_pred if n_pred > 0 else 0.0
    result.recall_by_row = tp_row / n_gold if n_gold > 0 else 0.0
    result.precision_by_item = tp_item / (n_pred * n_cols) if n_pred * n_cols > 0 else 0.0
    result.recall_by_item = tp_item / (n_gold * n_cols) if n_gold * n_cols > 0 else 0.0
    result.f1_by_row = _f1(result.precision_by_row, result.recall_by_row)
    result.f1_by_item = _f1(result.precision_by_item, result.recall_by_item)
    result.score = temp_score
    result.msg = f"joined {len(pairs)} rows (response {n_pred}, gold {n_gold})"
    if (
        result.precision_by_item == result.recall_by_item == result.f1_by_item == 1.0
        and result.precision_by_row == result.recall_by_row == result.f1_by_row == 1.0
    ):
        result.msg += "\nAll items match perfectly."
        result.score = 1.0
    result.evaluated = True
    result.joined, result.pred_rows, result.gold_rows = len(pairs), n_pred, n_gold
    result.pred_keys, result.gold_keys = set(resp_keys), set(gold_keys)
    if cfg.details:
        from amapreduce.evaluation.details import detail_records

        result.details = detail_records(
            required, unique, resp, gold_cols, before_map, pairs, scores, messages, resp_keys, gold_keys
        )


def _read_columns_alike(
    frame: CellTable, order: list[int], gold: GoldTable, resp: list[list[str]], gold_cols: list[list[str]],
    result: TableResult,
) -> None:
    """B13 fix: a column read as numbers on one side and as text on the other is text on both."""
    if frame.kinds is None or frame.as_text is None or gold.kinds is None or gold.as_text is None:
        return
    for ci, fi in enumerate(order):
        resp[ci], gold_cols[ci], changed = reconcile_column(
            resp[ci], frame.kinds[fi], frame.as_text[fi], gold_cols[ci], gold.kinds[ci], gold.as_text[ci]
        )
        result.corrections["B13 cells read as text like the other table's column"] += changed


def _count_preprocess_changes(cfg: ScoreConfig, name: str, values: list[str], result: TableResult) -> None:
    pre, legacy = cfg.preprocessor(), cfg.legacy_preprocessor()
    label = {"norm_str": "B5", "extract_number": "B11", "norm_date": "B6"}.get(name, name)
    result.corrections[f"{label} cells changed by corrected {name}"] += sum(
        1 for v in values if pre.apply(name, v) != legacy.apply(name, v)
    )
