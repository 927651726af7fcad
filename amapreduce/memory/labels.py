"""Utility u → label ℓ(u): which scored runs count as positive records (paper Eq. 21).

Two families of rules exist and both are offered:

* the reference implementation's hard-coded OR-rules (`widesearch`, `deepwidesearch`; docs/reference-audit.md §3.1),
  the default because published stores were built with them;
* the paper's "exceeds the average of the reference systems on every metric" rule
  (`reference-average`, with the low/high scalings of Tab. 11).

A run whose metrics are missing is an infrastructure failure, not a weak decision, so
`is_infrastructure_failure` lets the writer refuse to store it as a negative record (the reference
does, and pollutes I⁻ with crashes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "REFERENCE_AVERAGES",
    "RULES",
    "confidence",
    "infrastructure_failure_reason",
    "label",
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


RULES: dict[str, Callable[[Metrics], bool]] = {
    "widesearch": _widesearch,
    "deepwidesearch": _deepwidesearch,
    "reference-average": _reference_average(1.0),
    "reference-average-low": _reference_average(0.8),
    "reference-average-high": _reference_average(1.2),
}


def infrastructure_failure_reason(metrics: Metrics | None) -> str | None:
    """Why these metrics cannot label a record, or None when they can.

    Missing, None or NaN metrics mean the scorer or the agent failed; such runs say nothing about
    the decision and must never become negative records.
    """
    if metrics is None:
        return "no metrics (the run or the scorer failed)"
    if metrics.get("error"):
        return f"scorer error: {metrics['error']}"
    for key in _REQUIRED:
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


def label(metrics: Metrics, rule: str = "widesearch") -> bool:
    """ℓ(u): True when the run counts as a positive record under `rule`."""
    return RULES[rule](metrics)


def confidence(metrics: Metrics) -> float:
    """The reference's quality score 0.6·SR + 0.3·rowF1 + 0.1·itemF1, used to pick a canonical trial."""
    return (
        0.6 * _value(metrics, "score")
        + 0.3 * _value(metrics, "f1_by_row")
        + 0.1 * _value(metrics, "f1_by_item")
    )
