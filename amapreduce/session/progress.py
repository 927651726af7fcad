"""Progress on stderr, the one renderer of `ProgressEvent`s on a terminal and in logs: stage,
work done/total, retries, tokens and cost (a run's); instances, trials and cost (an evaluation's).

Progress goes to stderr so `--json` output on stdout stays exactly one JSON document. On a
terminal it is a live rich bar. Without one (CI logs, pipes, `nohup`) a redrawn bar would be
noise, but silence for minutes is worse: a logged run must show it is alive. So there it is
plain, timestamped lines, at a bounded rate: one at each stage change and, in between, at most
one per `interval_s` (10 s), written by a heartbeat thread even while no event arrives (a long
manager step).

"retries" means one thing everywhere: batch attempts after a batch's first, which is what the
run's summary counts (`RunSummary.retries`, `completeness.retries` of `result.json`). A provider
call repeated after a 429 or a 5xx is not one; it is shown apart, as "provider retries", when
there were any.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TextIO

if TYPE_CHECKING:
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.llm.retry import ProviderRetry
    from amapreduce.progress import ProgressEvent, ProgressSink

__all__ = ["LINE_INTERVAL_S", "ProgressMode", "RunProgress"]

LINE_INTERVAL_S = 10.0
"""Seconds between two plain progress lines when the stage has not changed."""
SLOW_CALL_S = 10.0
"""A model call in flight this long is named in progress ("waiting for the model: ...")."""

ProgressMode = Literal["live", "lines", "off"]
"""`live`: a rich bar (a terminal); `lines`: plain timestamped lines; `off`: nothing."""


class RunProgress:
    """Progress fed by `ProgressEvent`s (an engine's, an evaluation's, a scoring's), provider
    retries and, for a run, its usage meter.

    Pass the instance as the engine's progress callback and `on_provider_retry` as the models'
    retry callback (`build_parts(progress=..., on_provider_retry=...)`).

    Args:
        meter: the run's usage meter (tokens and cost); None: the events' own facts are shown
            (an evaluation's, whose trials meter themselves).
        enabled: False shows nothing; True forces the live bar; None (default) picks the live bar
            when `stream` is a terminal and plain lines otherwise.
        stream: where progress goes (default: stderr).
        clock: monotonic seconds, for the line rate and the elapsed time (tests inject a fake).
        wall: seconds since the epoch, for the lines' timestamps (tests inject a fixed one).
        interval_s: seconds between two lines of one stage.
        wait: how the heartbeat waits `s` seconds; returns True when it should stop (default: the
            stop event's `wait`; tests inject one that moves their fake clock).
        sink: also gets every event, whatever `enabled` says (an MCP client's progress notifications).
    """

    def __init__(
        self,
        meter: UsageMeter | None,
        *,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        interval_s: float = LINE_INTERVAL_S,
        wait: Callable[[float], bool] | None = None,
        sink: ProgressSink | None = None,
    ) -> None:
        self.meter = meter
        self._sink = sink
        self.stream: TextIO = stream if stream is not None else sys.stderr
        if enabled is False:
            self.mode: ProgressMode = "off"
        elif enabled is True or _is_terminal(self.stream):
            self.mode = "live"
        else:
            self.mode = "lines"
        self.enabled = self.mode != "off"
        self.interval_s = interval_s
        self._clock = clock
        self._wall = wall
        self._stop = threading.Event()
        self._wait = wait if wait is not None else self._stop.wait
        self._lock = threading.Lock()
        self._retries = 0
        self._provider_retries = 0
        self._backups = 0
        self._done: int | None = None
        self._total: int | None = None
        self._unit = "batches"
        self._event_facts: str = ""
        self._started = clock()
        self._last_line: float | None = None
        self._last_stage: str | None = None
        self._heartbeat: threading.Thread | None = None
        self._active = False
        """Between `__enter__` and `__exit__`: plain lines are written only then."""
        self._progress: Any = None
        self._task: Any = None
        self.stage = "starting"

    @property
    def retries(self) -> int:
        """Batch retries seen so far: attempts after a batch's first, as the run's summary counts them."""
        with self._lock:
            return self._retries

    @property
    def provider_retries(self) -> int:
        """Provider calls repeated so far (429, 5xx, ...); not counted in `retries`."""
        with self._lock:
            return self._provider_retries

    def __enter__(self) -> RunProgress:
        self._started = self._clock()
        if self.mode == "live":
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.fields[stage]}", style="bold", markup=False),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[facts]}", markup=False),
                TimeElapsedColumn(),
                console=Console(stderr=True) if self.stream is sys.stderr else Console(file=self.stream),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("run", total=None, stage=self.stage, facts=self._facts())
            self._stop.clear()  # the bar's facts (a call waiting on a slow model) change between events too
            self._heartbeat = threading.Thread(target=self._beat, name="amapreduce-progress", daemon=True)
            self._heartbeat.start()
        elif self.mode == "lines":
            with self._lock:
                self._active = True
            self._stop.clear()
            self._heartbeat = threading.Thread(target=self._beat, name="amapreduce-progress", daemon=True)
            self._heartbeat.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        with self._lock:
            self._active = False
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def set_stage(self, stage: str) -> None:
        """Show a new stage name (e.g. `manager`)."""
        with self._lock:
            self.stage = stage
            self._refresh()

    def __call__(self, event: ProgressEvent) -> None:
        """The progress callback: an engine's events (phases, attempts, batches) and any other
        work's (`unit` other than batches: its facts are shown, and its last event gets a line)."""
        with self._lock:
            if event.kind == "attempt" and event.data.get("attempt", 1) > 1 and not event.data.get("backup"):
                self._retries += 1
            if event.kind == "backup":
                self._backups += 1
            other = event.unit != "batches"
            if event.kind in ("phase", "batch_done") or other:
                self.stage = event.phase
                self._done, self._total, self._unit = event.done, event.total, event.unit
            if other:
                self._event_facts = ", ".join(f"{name} {value}" for name, value in event.data.items())
            self._refresh(last=other and event.done == event.total)
        if self._sink is not None:
            self._sink(event)

    def on_provider_retry(self, retry: ProviderRetry) -> None:
        """Models' retry callback: a provider call repeated (429, 5xx, ...), shown apart from
        the batch retries."""
        with self._lock:
            self._provider_retries += 1
            self._refresh()

    def tick(self) -> None:
        """Write a plain line when one is due (`interval_s` since the last); the heartbeat calls this."""
        with self._lock:
            if self._progress is not None:
                self._refresh()
            elif self._active and self._due() <= 0:
                self._write_line()

    def _beat(self) -> None:
        """The heartbeat thread: a line every `interval_s` while nothing else writes one."""
        delay = self.interval_s
        while not self._wait(delay):
            self.tick()
            with self._lock:
                delay = max(self._due(), 0.0) or self.interval_s

    def _due(self) -> float:
        """Seconds until the next line of the current stage is due (<= 0: due now)."""
        last = self._started if self._last_line is None else self._last_line
        return last + self.interval_s - self._clock()

    def _facts(self) -> str:
        """Retries, tokens and cost; no cost before the first model call, when it is not yet
        known whether the run's models are priced ("$0.0000" would then read as a price)."""
        if self.meter is None:
            return self._event_facts
        total = self.meter.total()
        provider = f" · provider retries {self._provider_retries}" if self._provider_retries else ""
        provider += f" · backups {self._backups}" if self._backups else ""
        cost = f" · {self.meter.cost_text()}" if total.requests else ""
        return f"retries {self._retries}{provider} · {total.total_tokens} tokens{cost}{self._waiting()}"

    def _waiting(self) -> str:
        """" · waiting for the model: N calls in flight for S s" once the oldest call has waited
        `SLOW_CALL_S`: a slow endpoint (a CPU server computing one request per slot) is shown as
        such, not as a run that stalled."""
        if self.meter is None:
            return ""
        count, age = self.meter.in_flight()
        if count == 0 or age < SLOW_CALL_S:
            return ""
        calls = "1 call" if count == 1 else f"{count} calls"
        return f" · waiting for the model: {calls} in flight for {int(age)} s"

    def _write_line(self) -> None:
        """One plain progress line (the lock held)."""
        now = self._clock()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self._wall()))
        counts = f" · {self._unit} {self._done}/{self._total}" if self._total else ""
        facts = f" · {facts}" if (facts := self._facts()) else ""
        elapsed = int(now - self._started)
        self.stream.write(f"{stamp} {self.stage}{counts}{facts} · {elapsed}s elapsed\n")
        self.stream.flush()
        self._last_line, self._last_stage = now, self.stage

    def _refresh(self, *, last: bool = False) -> None:
        """Show the new state (the lock held): update the live bar, or write a line at a stage
        change, when one is due, or at the `last` event of a piece of work."""
        if self.mode == "lines":
            if self._active and (last or self.stage != self._last_stage or self._due() <= 0):
                self._write_line()
            return
        if self._progress is None:
            return
        counts = {} if self._total is None else {"completed": self._done, "total": self._total}
        self._progress.update(self._task, stage=self.stage, facts=self._facts(), **counts)


def _is_terminal(stream: TextIO) -> bool:
    """Whether `stream` is a terminal (a closed or replaced stream is not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
