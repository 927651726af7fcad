"""The plan-stage seam: where an experiential prior Δ_q comes from.

The `mapreduce` tool's first call (the plan stage) asks a `PriorProvider` for advice on the
manager's draft decision Θ⁽⁰⁾. The experiential memory (`amapreduce.memory`) is the real
provider; `NoPrior` is the default when no memory is configured, so the plan stage still runs
(it validates Θ⁽⁰⁾ and shows the batch plan) with nothing learnt to add.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from amapreduce.decision.model import Decision

__all__ = ["NoPrior", "Prior", "PriorProvider", "PriorRequest"]


@dataclass(frozen=True, kw_only=True)
class PriorRequest:
    """What the plan stage knows when it asks for a prior."""

    query: str
    """The user's wide-search question q."""
    decision: Decision | None = None
    """The manager's draft decision Θ⁽⁰⁾, validated (None: advice for the question alone, e.g.
    `amapreduce memory search`)."""
    task_id: str | None = None
    """Benchmark instance id, when known; records of the same task are excluded from retrieval."""


@dataclass(frozen=True, kw_only=True)
class Prior:
    """The experiential prior Δ_q handed to the manager, plus what produced it."""

    text: str
    """Δ_q as text: projected hints and the positive/negative exemplars."""
    hint_ids: tuple[str, ...] = ()
    """Hints that went into Δ_q; their scores are credited after the run is scored (Eq. 13)."""
    kept_hint_ids: tuple[str, ...] = ()
    """Of `hint_ids`, those the projection kept for this draft (cited by its bullets; all of them
    when no projection ran): `credit_rule: used` credits a hint without typed advice only then."""
    record_ids: tuple[str, ...] = ()
    """Records retrieved as the neighbourhood N(q)."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """Anything else worth tracing (similarities, scores); `details["advice"]` is the typed
    advice (`memory.advice.Advice.to_json()`) the plan stage shows beside the prose."""

    @property
    def advice(self) -> Mapping[str, Any] | None:
        """The typed advice computed for the draft, or None."""
        value = self.details.get("advice")
        return value if isinstance(value, Mapping) else None

    @property
    def advice_used(self) -> Mapping[str, Any] | None:
        """What the run applied of the advice (`{"by", "strategy", "batch_size"}`), or None."""
        value = self.details.get("advice_used")
        return value if isinstance(value, Mapping) else None

    def to_json(self) -> dict[str, Any]:
        """The prior as a run's `result.json` and an evaluation's journal keep it (`from_json`)."""
        return {"text": self.text, "hint_ids": list(self.hint_ids), "kept_hint_ids": list(self.kept_hint_ids),
                "record_ids": list(self.record_ids), "advice": None if self.advice is None else dict(self.advice),
                "advice_used": None if self.advice_used is None else dict(self.advice_used)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, query: str | None = None, task_id: str | None = None) -> Prior:
        """A prior `to_json` wrote (older files lack the newer keys). Raises `ValueError` when a
        list of ids is malformed."""
        def ids(key: str) -> tuple[str, ...]:
            value = data.get(key) or []
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"malformed {key}: {value!r}")
            return tuple(value)

        details: dict[str, Any] = {"query": query, "task_id": task_id}
        for key in ("advice", "advice_used"):
            if isinstance(data.get(key), Mapping):
                details[key] = dict(data[key])
        return cls(text=str(data.get("text") or ""), hint_ids=ids("hint_ids"), kept_hint_ids=ids("kept_hint_ids"),
                   record_ids=ids("record_ids"), details=details)


@runtime_checkable
class PriorProvider(Protocol):
    """Anything that can turn a plan-stage request into a prior."""

    def prior(self, request: PriorRequest) -> Prior:
        """Return the experiential prior for `request`."""
        ...


class NoPrior:
    """The provider used when no experiential memory is configured."""

    TEXT = "No experiential memory is configured; review the decision against the task yourself."

    def prior(self, request: PriorRequest) -> Prior:
        """Return an empty prior that says no memory is available."""
        return Prior(text=self.TEXT)
