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
    record_ids: tuple[str, ...] = ()
    """Records retrieved as the neighbourhood N(q)."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """Anything else worth tracing (similarities, scores)."""


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
