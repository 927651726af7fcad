"""Backup attempts for stragglers: when to start a second attempt of a batch that runs too long.

Why: a wide run's wall time is its slowest batch of the last wave, and search sub-agents have a
heavy latency tail (one that searches eight times or meets a slow page takes ten times the
median). MapReduce met the same tail with backup tasks: near the end of a phase, run a second
copy of each straggling task and take whichever finishes first (Dean and Ghemawat, 2004).

The rule here: an attempt is a straggler once it has run longer than `BackupPolicy.multiple`
times the 75th percentile of the attempts this run has finished (never less than `floor_s`, and
only after `min_samples` attempts finished). A straggler gets one backup, the same request on a
fresh sub-agent, when

* backups are on (`AMAPREDUCE_BACKUP=auto`),
* no attempt waits for a worker slot and one is free (a backup never delays real work),
* the run's extra model calls stay within `max_extra` of the calls it needs (`AMAPREDUCE_BACKUP_MAX_EXTRA`):
  the calls it needs are its planned batches times the calls a finished attempt made; a backup
  reserves an attempt's calls while it runs, and once one copy wins, the calls the cancelled copy
  made (plus the one it had in flight) are what the backup cost,
* and the run's `BackupGate` admits one more attempt of the usual size: the provider's limiter
  would not make it wait, its breaker is closed, and `--max-cost`/`--max-tokens` would not be crossed.

The extra calls are one budget of the run (`llm.hedge.ExtraCalls`), shared with the hedges of
late model calls (`llm.hedge`): each attempt's usage scope carries it to the model client. A run
whose model hedges leaves stragglers to its hedges and starts no backup (a backup repeats every
call of an attempt, a hedge only the late one); `Stragglers` keeps the budget's `needed` calls and
the calls hedges leave for the end of the run (`TAIL_WAVES`) current.

The engine (`mapreduce.engine`) owns the attempts; `Stragglers` only keeps the durations, the
counts and the decision, so it is testable without threads.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable

from pydantic import BaseModel, ConfigDict, Field

from amapreduce.llm.hedge import ExtraCalls, p75
from amapreduce.llm.usage import Usage
from amapreduce.settings import BackupMode, default_setting

__all__ = ["TAIL_WAVES", "BackupGate", "BackupPolicy", "Stragglers"]

TAIL_WAVES = 4
"""Waves of attempts at the end of a run whose late calls hedges keep budget for: a late call
there (a tenfold straggler outlasts several attempts) delays the whole run, where an earlier one
delays only its worker while the others take the batches that wait."""

BackupGate = Callable[[Usage], bool]
"""Whether one more sub-agent attempt of about this usage may start now (the provider's limiter
would not hold it, its breaker is closed, the run's budget would not be crossed)."""


class BackupPolicy(BaseModel):
    """When a straggling attempt gets a backup (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: BackupMode = default_setting("backup")
    max_extra: float = Field(default=default_setting("backup_max_extra"), ge=0, le=1)
    """Extra model calls allowed for backups, as a share of the calls the run needs (map and patch rounds)."""
    multiple: float = Field(default=1.5, ge=1)
    """An attempt is a straggler past this multiple of the finished attempts' 75th percentile."""
    floor_s: float = Field(default=0.5, ge=0)
    """The shortest run time that makes an attempt a straggler, whatever the percentile says."""
    min_samples: int = Field(default=3, ge=1)
    """Finished attempts needed before the percentile is trusted."""


class Stragglers:
    """One run's backup bookkeeping: finished attempts' durations and usage, batches planned,
    backups started. Used from the engine's loop only (no lock)."""

    def __init__(self, policy: BackupPolicy, gate: BackupGate | None = None, *, workers: int = 1) -> None:
        self.policy = policy
        self.workers = workers
        self._gate = gate
        self._durations: list[float] = []
        self._usage = Usage()
        self._measured = 0
        self._threshold: float | None = None
        self.planned = 0
        """Batches the run planned so far (each phase adds its own)."""
        self.started = 0
        """Backups started so far."""
        self.extra = ExtraCalls(policy.max_extra)
        """The run's extra calls, shared with the hedges of its late model calls (`llm.hedge`)."""
        self._reservations: deque[float] = deque()
        """Backups whose race is not decided yet, each holding a typical attempt's calls."""

    @property
    def extra_calls(self) -> float:
        """Extra model calls made so far: the calls of each cancelled copy and each hedged request."""
        return self.extra.spent

    @property
    def enabled(self) -> bool:
        """Whether backups may start at all in this run."""
        return self.policy.mode == "auto"

    def _calls(self) -> int:
        """Model calls the finished attempts needed (their hedges' extra requests left out)."""
        return max(0, self._usage.requests - self.extra.hedges)

    def _calls_per_attempt(self) -> float:
        calls = self._calls()
        return calls / self._measured if self._measured and calls else 1.0

    @property
    def cap(self) -> float:
        """The most extra calls the run may spend on backups: `max_extra` of the calls it needs
        (batches planned times a finished attempt's calls)."""
        return self.extra.cap

    def _needed(self) -> None:
        """Keep the shared budget current: the calls the run needs, and the calls hedges leave for
        the late calls expected at the end of the run (the share of calls found late so far, times
        the calls of its last `TAIL_WAVES` waves of attempts or the calls still to make if fewer)."""
        per = self._calls_per_attempt()
        self.extra.needed = self.planned * per
        tail = min(max(0.0, self.extra.needed - self.extra.calls), TAIL_WAVES * self.workers * per)
        self.extra.held_back = self.extra.late_share() * tail

    def waiting(self, waiting: bool) -> None:
        """Whether attempts wait for a worker slot now (hedges then leave `ExtraCalls.held_back`)."""
        self.extra.waiting = waiting

    def plan(self, batches: int) -> None:
        """A phase of `batches` batches begins."""
        self.planned += batches
        self._needed()

    def finished(self, elapsed_s: float, usage: Usage) -> None:
        """An attempt returned a reply after `elapsed_s` seconds, using `usage`."""
        self._durations.append(elapsed_s)
        self._usage = self._usage + usage
        self._measured += 1
        self._threshold = None
        self._needed()

    @property
    def threshold_s(self) -> float | None:
        """How long an attempt may run before it is a straggler; None before `min_samples`."""
        if len(self._durations) < self.policy.min_samples:
            return None
        if self._threshold is None:
            self._threshold = max(self.policy.floor_s, self.policy.multiple * p75(self._durations))
        return self._threshold

    def typical_usage(self) -> Usage:
        """The mean usage of a finished attempt: what a backup is expected to spend."""
        n = max(1, self._measured)
        u = self._usage
        return Usage(requests=math.ceil(u.requests / n), input_tokens=math.ceil(u.input_tokens / n),
                     output_tokens=math.ceil(u.output_tokens / n), cached_tokens=math.ceil(u.cached_tokens / n),
                     cost_usd=u.cost_usd / n)

    def room(self) -> bool:
        """Whether one more backup fits the cap, counting a typical attempt's calls for it and
        for each backup still racing."""
        # A run whose model hedges its late calls (`llm.hedge`) leaves stragglers to them: a backup
        # redoes every call of an attempt, where a hedge repeats only the late one.
        return self.enabled and not self.extra.hedges and self.extra.fits(self._calls_per_attempt())

    def settled(self, wasted_calls: int) -> None:
        """A straggler's race is decided; the copy that lost made `wasted_calls` model calls
        (0 when the first copy to answer failed, since the other then does a retry's work)."""
        self.extra.settle(self._reservations.popleft() if self._reservations else 0.0, wasted_calls)

    def due(self, now: float, started_at: Iterable[float]) -> float | None:
        """The earliest time one of the attempts started at `started_at` becomes a straggler
        (None: none will, or no backup may start)."""
        threshold = self.threshold_s
        if threshold is None or not self.room():
            return None
        return min((s + threshold for s in started_at), default=None)

    def is_straggler(self, now: float, started_at: float) -> bool:
        """Whether an attempt started at `started_at` has run past the threshold at `now`."""
        threshold = self.threshold_s
        return threshold is not None and now - started_at >= threshold

    def admit(self) -> bool:
        """Reserve one backup under the cap if the gate admits an attempt of the usual usage
        (`settled` gives the reservation back)."""
        if not self.room():
            return False
        if self._gate is not None and not self._gate(self.typical_usage()):
            return False
        reserve = self._calls_per_attempt()
        if not self.extra.reserve(reserve):
            return False
        self._reservations.append(reserve)
        self.started += 1
        return True
