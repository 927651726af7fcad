"""The model stack's events: one per model call and one per hedged call (a retry is
`llm.retry.ProviderRetry`), emitted once on the stack's stream (`wrappers.trace.CallEvents`),
which the run's trace subscribes to (`events.trace_channel`).

Each carries the role, the model id and the labels of the usage scope that was open (the batch
and attempt, or the merge node), so its trace line says which attempt made the call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from amapreduce.events import Event

__all__ = ["ModelCalled", "ModelHedged"]


@dataclass(frozen=True, kw_only=True)
class _ModelEvent(Event):
    role: str
    """What the model is used for (`manager`, `subagent`, ...)."""
    model_id: str | None
    labels: Mapping[str, Any] = field(default_factory=dict)
    """The open usage scope's labels (`batch_id`, `attempt`; a merge node's `node`, `level`, `index`)."""

    def trace_fields(self) -> dict[str, Any]:
        own = {k: v for k, v in super().trace_fields().items() if k not in ("role", "model_id", "labels")}
        return {"role": self.role, "model_id": self.model_id, **self.labels, **own}


@dataclass(frozen=True, kw_only=True)
class ModelCalled(_ModelEvent):
    """One model call, after its retries: its latency, the waits before the retries, its priced
    usage (None when it failed) or its error."""

    trace_event: ClassVar[str | None] = "model_call"
    latency_s: float
    retries: int
    retry_waits: tuple[Mapping[str, Any], ...] = ()
    usage: Mapping[str, Any] | None = None
    error: str | None = None

    def trace_fields(self) -> dict[str, Any]:
        return {**super().trace_fields(), "retry_waits": [dict(w) for w in self.retry_waits]}


@dataclass(frozen=True, kw_only=True)
class ModelHedged(_ModelEvent):
    """A hedged call settled: which copy won, how many extra were sent and how the losers ended."""

    trace_event: ClassVar[str | None] = "model_hedge"
    winner: str
    """`first` (the original request answered first) or `hedge`."""
    hedges: int
    after_s: float
    threshold_s: float
    losers: tuple[str, ...] = ()
    usage: Mapping[str, Any] = field(default_factory=dict)
    hedge_error: str | None = None

    def trace_fields(self) -> dict[str, Any]:
        return {**super().trace_fields(), "losers": list(self.losers)}
