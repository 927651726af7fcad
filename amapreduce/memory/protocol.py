"""The evaluation protocol of paper App. D.5: one frozen snapshot per instance, one committed trial.

For each benchmark instance, all N trials read the *same* frozen snapshot M_i of the memory (no
cross-trial leakage, trials i.i.d. given M_i); after they finish, exactly one canonical trial,
chosen by a fixed quality rule, is committed to the live memory. The other trials are reported
but never become retrieval references.

    session = InstanceSession(memory, task_id="ws_en_001", query=q)
    priors = [session.snapshot.prior(PriorRequest(...)) for each trial]   # in parallel
    session.commit([TrialOutcome(...), ...])                              # once
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from amapreduce.decision.model import Decision
from amapreduce.errors import UserError
from amapreduce.mapreduce.prior import Prior
from amapreduce.memory.core import ExperientialMemory
from amapreduce.memory.labels import confidence, infrastructure_failure_reason
from amapreduce.memory.records import DecisionSummary, TraceSummary
from amapreduce.memory.update import UpdateResult

__all__ = ["InstanceSession", "TrialOutcome", "canonical_trial"]


@dataclass(frozen=True, kw_only=True)
class TrialOutcome:
    """One trial's result as the update needs it."""

    trial: int
    prior: Prior | None
    decision: Decision | DecisionSummary
    """The decision the trial executed (summarised when recorded), or its stored summary."""
    metrics: Mapping[str, Any] | None
    trace: Mapping[str, Any] | TraceSummary | None = None
    failure: str | None = None
    utility: float | None = None
    """u of paper Eq. 1 (`memory.labels.utility`); None: the quality score alone (λ_c = λ_t = 0)."""


def canonical_trial(outcomes: Sequence[TrialOutcome]) -> TrialOutcome | None:
    """The fixed commit rule: the trial with the highest utility u, ties to the lowest trial number;
    trials that failed for infrastructure reasons are never chosen.

    u is the quality score 0.6·SR + 0.3·rowF1 + 0.1·itemF1 minus the configured cost and delay
    terms (`memory.labels.utility`); with the paper's weights (0, 0) it is the quality score, the
    reference's rule. Fixed in advance, as D.5 requires: it does not depend on which trial ran
    first or on anything the trials saw.
    """
    valid = [o for o in outcomes if not o.failure and infrastructure_failure_reason(o.metrics) is None]
    if not valid:
        return None

    def value(o: TrialOutcome) -> float:
        return o.utility if o.utility is not None else confidence(o.metrics or {})

    return min(valid, key=lambda o: (-value(o), o.trial))


class InstanceSession:
    """Snapshot-then-commit for one instance."""

    def __init__(self, memory: ExperientialMemory, *, task_id: str, query: str) -> None:
        self.memory = memory
        self.task_id = task_id
        self.query = query
        self.snapshot = memory.snapshot()
        """The frozen, read-only memory every trial of this instance reads."""
        self._committed = False

    def commit(self, outcomes: Sequence[TrialOutcome], *, record_id: str | None = None,
               auto_distill: bool = True) -> UpdateResult | None:
        """Commit the canonical trial to the live memory (once); None when every trial failed.

        `record_id` makes the commit idempotent in the store: a record of that id that already
        exists (a resumed evaluation that crashed after committing) is not written again. With
        `auto_distill=False` a distillation that falls due is only reported (`UpdateResult.distill`),
        for a caller that runs it itself to keep its report.

        Raises:
            UserError: called twice for the same instance.
        """
        if self._committed:
            raise UserError(f"instance {self.task_id!r} was already committed; a session commits exactly once.")
        self._committed = True
        self.snapshot.close()
        chosen = canonical_trial(outcomes)
        if chosen is None:
            return None
        return self.memory.update(chosen.prior, query=self.query, decision=chosen.decision, metrics=chosen.metrics,
                                  trace=chosen.trace, task_id=self.task_id, record_id=record_id,
                                  auto_distill=auto_distill)
