"""Live progress on stderr: stage, batches done/total, retries, tokens and cost.

Progress goes to stderr so `--json` output on stdout stays exactly one JSON document. It is
switched off when stderr is not a terminal (CI logs, pipes) unless forced.
"""

from __future__ import annotations

import sys
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.llm.retry import ProviderRetry
    from amapreduce.mapreduce.engine import ProgressEvent

__all__ = ["RunProgress"]


class RunProgress:
    """A rich progress bar fed by engine events, provider retries and the run's usage meter.

    Pass the instance as the engine's progress callback and `on_provider_retry` as the models'
    retry callback (`build_parts(progress=..., on_provider_retry=...)`).
    """

    def __init__(self, meter: UsageMeter, *, enabled: bool | None = None) -> None:
        self.meter = meter
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._lock = threading.Lock()
        self._retries = 0
        self._progress: Any = None
        self._task: Any = None
        self.stage = "starting"

    @property
    def retries(self) -> int:
        """Batch retries plus provider retries seen so far."""
        with self._lock:
            return self._retries

    def __enter__(self) -> RunProgress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.fields[stage]}", style="bold", markup=False),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("retries {task.fields[retries]} · {task.fields[tokens]} tokens · ${task.fields[cost]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("run", total=None, stage=self.stage, retries=0, tokens=0, cost="0.0000")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def set_stage(self, stage: str) -> None:
        """Show a new stage name (e.g. `manager: discovering entities`)."""
        self.stage = stage
        self._refresh()

    def __call__(self, event: ProgressEvent) -> None:
        """Engine progress callback."""
        with self._lock:
            if event.kind == "attempt" and event.data.get("attempt", 1) > 1:
                self._retries += 1
            if event.kind in ("phase", "batch_done"):
                self.stage = event.phase
                self._refresh(completed=event.batches_done, total=event.batches_total)
            else:
                self._refresh()

    def on_provider_retry(self, retry: ProviderRetry) -> None:
        """Models' retry callback: a provider call repeated (429, 5xx, ...) counts as a retry,
        in the same counter as a batch re-asked by the engine."""
        with self._lock:
            self._retries += 1
            self._refresh()

    def _refresh(self, **counts: int) -> None:
        if self._progress is None:
            return
        total = self.meter.total()
        self._progress.update(
            self._task,
            stage=self.stage,
            retries=self._retries,
            tokens=total.total_tokens,
            cost=f"{total.cost_usd:.4f}",
            **counts,
        )
