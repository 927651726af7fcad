"""Utility u → label ℓ(u): which scored runs count as positive records (paper Eq. 21).

The rules offered:

* the reference implementation's hard-coded OR-rules (`widesearch`, `deepwidesearch`; docs/reference-audit.md §3.1),
  the default because published stores were built with them;
* the paper's "exceeds the average of the reference systems on every metric" rule
  (`reference-average`, with the low/high scalings of Tab. 11);
* `success`: only an exactly right table (SR = 1) is positive. The sandbox benchmark uses it: its
  simulated sub-agents lose rows in oversized batches, and a lenient rule would store a lossy
  batching as a success for the memory to recommend;
* `utility`: positive when the run's utility `metrics["utility"]` reaches a threshold
  (`MemoryConfig.utility_threshold`, default 0.5). `amapreduce memory learn RUN --utility U` uses it:
  there the user, not a scorer, says how good an `ask` run was.

A run whose metrics are missing is an infrastructure failure, not a weak decision, so
`infrastructure_failure_reason` lets the writer refuse to store it as a negative record (the
reference does, and pollutes I⁻ with crashes). Which metrics must be there depends on the rule
(`required_metrics`): the scorer's for the scorer rules, the utility for `utility`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_UTILITY_THRESHOLD",
    "REFERENCE_AVERAGES",
    "RULES",
    "UTILITY_RULE",
    "UtilityWeights",
    "confidence",
    "infrastructure_failure_reason",
    "label",
    "required_metrics",
    "utility",
]

Metrics = Mapping[str, Any]

# Table 1 of the paper, Avg@4 of the ten systems reported by the WideSearch paper (†):
# (item F1 %, row F1 %, success rate %).
_TABLE1_REFERENCE: tuple[tuple[float, float, float], ...] = (
    (57.89, 31.69, 2.25),
    (50.98, 30.00, 1.50),
    (52.61, 34.00, 4.50),
    (54.36, 29.67, 1.12),
    (41.26, 20.66, 0.37),
    (48.27, 29.90, 2.63),
    (48.97, 27.21, 1.00),
    (48.40, 24.11, 2.50),
    (59.05, 36.63, 4.25),
    (45.52, 23.91, 3.00),
)
REFERENCE_AVERAGES: dict[str, float] = {
    "f1_by_item": sum(r[0] for r in _TABLE1_REFERENCE) / len(_TABLE1_REFERENCE) / 100,
    "f1_by_row": sum(r[1] for r in _TABLE1_REFERENCE) / len(_TABLE1_REFERENCE) / 100,
}
"""Per-metric reference level δ. Success rate is left out on purpose: per record it is 0 or 1, so
"above the 2.3 % average" would mean "exact success only" and make almost every record negative."""

_REQUIRED = ("score", "f1_by_row", "f1_by_item")
UTILITY_RULE = "utility"
DEFAULT_UTILITY_THRESHOLD = 0.5
"""The default pass level of the `utility` rule (`MemoryConfig.utility_threshold`)."""


def _value(metrics: Metrics, key: str) -> float:
    raw = metrics.get(key)
    return float(raw) if raw is not None else 0.0


def _widesearch(metrics: Metrics) -> bool:
    row, item = _value(metrics, "f1_by_row"), _value(metrics, "f1_by_item")
    return _value(metrics, "score") >= 0.5 or row >= 0.7 or (row >= 0.45 and item >= 0.7)


def _deepwidesearch(metrics: Metrics) -> bool:
    row, item = _value(metrics, "f1_by_row"), _value(metrics, "f1_by_item")
    column = _value(metrics, "column_f1")
    return (
        _value(metrics, "score") >= 0.5
        or row >= 0.5
        or (row >= 0.35 and item >= 0.55 and column >= 0.65)
    )


def _reference_average(scale: float) -> Callable[[Metrics], bool]:
    def rule(metrics: Metrics) -> bool:
        return all(_value(metrics, k) > v * scale for k, v in REFERENCE_AVERAGES.items())

    return rule


def _success(metrics: Metrics) -> bool:
    return _value(metrics, "score") >= 1.0


def _utility_at(threshold: float) -> Callable[[Metrics], bool]:
    def rule(metrics: Metrics) -> bool:
        return _value(metrics, "utility") >= threshold

    return rule


RULES: dict[str, Callable[[Metrics], bool]] = {
    "widesearch": _widesearch,
    "success": _success,
    "deepwidesearch": _deepwidesearch,
    "reference-average": _reference_average(1.0),
    "reference-average-low": _reference_average(0.8),
    "reference-average-high": _reference_average(1.2),
    UTILITY_RULE: _utility_at(DEFAULT_UTILITY_THRESHOLD),
}
"""Every pass rule by name (`utility` at its default threshold; `label` takes another)."""


def required_metrics(rule: str | None = None) -> tuple[str, ...]:
    """The metrics `rule` reads and a record therefore must have: `utility` for the `utility`
    rule, the scorer's SR, row F1 and item F1 for every other rule (and for None, a caller that
    knows no rule)."""
    return (UTILITY_RULE,) if rule == UTILITY_RULE else _REQUIRED


def infrastructure_failure_reason(metrics: Metrics | None, rule: str | None = None) -> str | None:
    """Why these metrics cannot label a record under `rule`, or None when they can.

    Missing, None or NaN metrics mean the scorer or the agent failed; such runs say nothing about
    the decision and must never become negative records. Only the metrics the rule reads are
    required (`required_metrics`): a user's utility needs no scorer metrics, and the reverse.
    """
    if metrics is None:
        return "no metrics (the run or the scorer failed)"
    if metrics.get("error"):
        return f"scorer error: {metrics['error']}"
    for key in required_metrics(rule):
        raw = metrics.get(key)
        if raw is None:
            return f"metric `{key}` is missing"
        try:
            value = float(raw)
        except (TypeError, ValueError):
            return f"metric `{key}` is not a number: {raw!r}"
        if math.isnan(value):
            return f"metric `{key}` is NaN"
    return None


def label(metrics: Metrics, rule: str = "widesearch", *,
          utility_threshold: float = DEFAULT_UTILITY_THRESHOLD) -> bool:
    """ℓ(u): True when the run counts as a positive record under `rule` (`utility_threshold`:
    the pass level of the `utility` rule; the other rules ignore it)."""
    if rule == UTILITY_RULE:
        return _utility_at(utility_threshold)(metrics)
    return RULES[rule](metrics)


def confidence(metrics: Metrics) -> float:
    """The reference's quality score 0.6·SR + 0.3·rowF1 + 0.1·itemF1, used to pick a canonical trial."""
    return (
        0.6 * _value(metrics, "score")
        + 0.3 * _value(metrics, "f1_by_row")
        + 0.1 * _value(metrics, "f1_by_item")
    )


@dataclass(frozen=True, kw_only=True)
class UtilityWeights:
    """λ_c and λ_t of paper Eq. 1, u = Q − λ_c·C − λ_t·D, with the units they weigh.

    C is the run's tokens (prompt + completion, every role) in **millions**: tokens are known for
    every model, priced or not, so the utility never depends on a price table. D is the run's
    wall time in **seconds**. The paper used λ_c = λ_t = 0 (quality only), the default.
    """

    cost: float = 0.0
    """λ_c, per million tokens."""
    delay: float = 0.0
    """λ_t, per second."""

    def to_json(self) -> dict[str, Any]:
        """How `results.json` records the weights used."""
        return {"quality": "0.6*score + 0.3*f1_by_row + 0.1*f1_by_item", "cost_weight": self.cost,
                "cost_unit": "million tokens (prompt + completion)", "delay_weight": self.delay,
                "delay_unit": "seconds of wall time"}


def utility(metrics: Metrics, *, tokens: int, delay_s: float, weights: UtilityWeights) -> float:
    """u = Q − λ_c·C − λ_t·D, with Q the fixed quality score (`confidence`) of the scorer's metrics.

    With the paper's weights (0, 0) u is the quality score, so picking the trial with the highest
    u is exactly the fixed quality rule.
    """
    return confidence(metrics) - weights.cost * tokens / 1_000_000 - weights.delay * delay_s
