"""Progress: one event type for everything that reports how far it got.

The engine reports its phases, attempts and finished batches; an evaluation its instances
committed; `eval score` its tasks scored; a run directory's journal how many batches it holds.
Each is a `ProgressEvent`, and each surface has one renderer of them: the live bar and the plain
timestamped lines of `session.progress.RunProgress` (terminal, logs), the browser view's
timeline (read from the trace), OpenTelemetry spans (`telemetry`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ProgressEvent", "ProgressSink"]


@dataclass(frozen=True, kw_only=True)
class ProgressEvent:
    """How far some work got: `done` of `total` `unit` in `phase`, and what just happened (`kind`)."""

    kind: str
    """What happened: the engine's `phase`, `attempt`, `backup` (a straggler got a backup attempt)
    and `batch_done`; an evaluation's
    `committed`; `eval score`'s `scored`; a journal's `journaled`."""
    phase: str
    """Where the work is: the engine's `map`, `patch1`, ...; `evaluation`; `scoring`."""
    done: int
    total: int
    unit: str = "batches"
    data: Mapping[str, Any] = field(default_factory=dict)
    """Facts of the event (an attempt's number; an evaluation's trials, cost and mean Item F1)."""

    def line(self) -> str:
        """The event as plain text: `phase: done/total unit, fact value, ...`."""
        facts = "".join(f", {name} {value}" for name, value in self.data.items())
        return f"{self.phase}: {self.done}/{self.total} {self.unit}{facts}"


ProgressSink = Callable[[ProgressEvent], None]
"""Where work reports its progress (a renderer, or a test's list)."""
