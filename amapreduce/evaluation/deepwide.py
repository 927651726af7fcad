"""DeepWideSearch scoring: the core-entity judge, column F1 and the two protocols.

Why two protocols (docs/scorer-rules.md §9, docs/reference-audit.md §5.2):

* `aidc` — the AIDC evaluator as its authors intended: the entity judge runs first and is a
  gate (a wrong entity zeroes every table metric), column F1 = |J|/|P| and |J|/|G| (bug D6
  kept). Its crash bugs are fixed: D1 (the table is parsed from the answer, not from the judge
  reply), D2 (`number_near` without a criterion uses 0.05) and D3 (pipeline keys go through
  `norm_column`, so `No` matches `no`).
* `amapreduce` — the variant the A-MapReduce paper used: no gate, table scored regardless,
  `entity_acc` overridden to 1 whenever a table metric is > 0, column F1 on the *sets* of
  preprocessed keys, judge scores normalised to 0/1. Its data carried criterion 0.05 on every
  `number_near` column; D3 is kept as that code had it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from amapreduce.evaluation.judges import EntityJudge
from amapreduce.evaluation.loaders import GoldTable, TaskSpec
from amapreduce.evaluation.score import ScoreConfig, TableResult, _f1, score_table

__all__ = ["DEEPWIDE_FIELDS", "DeepWideResult", "Protocol", "configure_protocol", "score_deepwide"]

Protocol = Literal["aidc", "amapreduce"]

DEEPWIDE_FIELDS = ("entity_acc", "column_precision", "column_recall", "column_f1")
DEFAULT_TOLERANCE = 0.05


@dataclass
class DeepWideResult:
    """A table result plus the DeepWideSearch metrics."""

    table: TableResult
    entity_acc: float = 0.0
    column_precision: float = 0.0
    column_recall: float = 0.0
    column_f1: float = 0.0

    def metrics(self) -> dict[str, Any]:
        """The per-task JSON entry: the WideSearch fields plus entity and column metrics."""
        out = self.table.metrics()
        msg = out.pop("msg")
        out.update({name: float(getattr(self, name)) for name in DEEPWIDE_FIELDS})
        out["msg"] = msg
        return out


def configure_protocol(cfg: ScoreConfig, protocol: Protocol) -> ScoreConfig:
    """Set the protocol's data fixes on a score configuration (both use tolerance 0.05)."""
    cfg.default_criterion = DEFAULT_TOLERANCE
    cfg.normalize_pipeline_keys = protocol == "aidc"
    return cfg


def _column_scores(table: TableResult, protocol: Protocol) -> tuple[float, float, float]:
    if not table.evaluated:
        return 0.0, 0.0, 0.0
    if protocol == "aidc":
        precision = table.joined / table.pred_rows if table.pred_rows else 0.0
        recall = table.joined / table.gold_rows if table.gold_rows else 0.0
    else:
        tp = len(table.pred_keys & table.gold_keys)
        precision = tp / len(table.pred_keys) if table.pred_keys else 0.0
        recall = tp / len(table.gold_keys) if table.gold_keys else 0.0
    return precision, recall, _f1(precision, recall)


def score_deepwide(
    task: TaskSpec,
    gold: GoldTable,
    response: str | None,
    cfg: ScoreConfig,
    *,
    protocol: Protocol,
    entity_judge: EntityJudge,
) -> DeepWideResult:
    """Score one DeepWideSearch answer under `protocol` (see the module docstring)."""
    if response is None:
        return DeepWideResult(TableResult(instance_id=task.instance_id, msg="response is None"))
    if protocol == "aidc":
        if not entity_judge.judge(task.query, response, task.entity):
            return DeepWideResult(
                TableResult(
                    instance_id=task.instance_id,
                    msg="the entity is wrong, all the results are wrong, set as 0",
                )
            )
        table = score_table(task, gold, response, cfg)
        precision, recall, f1 = _column_scores(table, protocol)
        return DeepWideResult(table, 1.0, precision, recall, f1)

    table = score_table(task, gold, response, cfg)
    if table.parse_failed:
        # The AMapReduce copy parses before the judge: a parse crash leaves entity_acc at 0.
        return DeepWideResult(table)
    passed = entity_judge.judge(task.query, response, task.entity)
    precision, recall, f1 = _column_scores(table, protocol)
    result = DeepWideResult(table, 1.0 if passed else 0.0, precision, recall, f1)
    positive = table.evaluated and any(
        v > 0
        for v in (
            table.score,
            table.precision_by_row,
            table.recall_by_row,
            table.f1_by_row,
            table.precision_by_item,
            table.recall_by_item,
            table.f1_by_item,
            precision,
            recall,
            f1,
        )
    )
    if not passed and positive:
        result.entity_acc = 1.0
        table.msg = (table.msg + "\n" if table.msg else "") + "entity override: metrics > 0 despite llm=no"
    return result
