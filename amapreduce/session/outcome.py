"""`RunOutcome`: how any run ended, one type for every kind of run.

`ask`, `mapreduce run`, `runs resume`, the Python API, the demo and an evaluation's trial all end
in a `RunOutcome` (`session.Session.finish`), and the CLI, the API, the UI's reader and the
evaluator read that one type: the table and its markdown, how the run ended, its completeness
over every decision it executed, its usage, its run directory and the content of `result.json`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amapreduce.decision.model import Decision
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.llm.usage import Usage
    from amapreduce.mapreduce.prior import Prior
    from amapreduce.mapreduce.result import Completeness, DiscoverySummary, MapReduceResult, RunEnding
    from amapreduce.session.estimate import Estimate
    from amapreduce.session.journal import RunKind
    from amapreduce.session.record import RunRecord
    from amapreduce.session.rundir import RunDir
    from amapreduce.table.table import Table

__all__ = ["RunOutcome"]


@dataclass(kw_only=True)
class RunOutcome:
    """What a finished (or stopped) run produced, whatever made it."""

    kind: RunKind
    """What made the run: the `kind` of `result.json` (`ask`, `mapreduce_run`, `demo`, `eval`)."""
    query: str
    """The question (or the decision file's name)."""
    table: Table
    """The run's table: every execution's rows reduced into one (an `answer` column when none ran)."""
    markdown: str
    """The table as WideSearch-readable markdown (or the manager's own answer when no table was built)."""
    ending: RunEnding
    """`COMPLETE`, `INCOMPLETE`, `NO_TABLE`, `STOPPED`, `INTERRUPTED` or `FAILED`, with the reason of a stop."""
    completeness: Completeness
    """The table against every decision the run executed (a discovery's: with the entities it found)."""
    run_dir: RunDir
    meter: UsageMeter
    """Usage and cost of the run, by role."""
    record: RunRecord
    """What `result.json` records."""
    decisions: list[Decision] = field(default_factory=list)
    """The decisions the run executed, in order (the manager's, or the user's one)."""
    results: list[MapReduceResult] = field(default_factory=list)
    """Each execution's own result, in order."""
    prior: Prior | None = None
    """The experiential prior the plan stage handed the manager (None: no plan stage ran)."""
    task_id: str | None = None
    answer: str | None = None
    """The manager's own final answer (None: no manager, or it did not answer)."""
    estimate: Estimate | None = None
    """An estimate-only `ask`'s estimate of the manager's decision (`RunOptions.estimate_only`)."""

    @property
    def status(self) -> str:
        """The `status` string of `result.json` (`ending.label`)."""
        return self.ending.label

    @property
    def result(self) -> MapReduceResult:
        """The run's one execution (a `mapreduce run`'s decision, composed or not).

        Raises:
            LookupError: the run executed no decision.
        """
        if not self.results:
            raise LookupError("the run executed no decision")
        return self.results[-1]

    @property
    def usage(self) -> Usage:
        """The run's total usage (every role)."""
        return self.meter.total()

    @property
    def discoveries(self) -> list[DiscoverySummary]:
        """One summary per execution that discovered its matrix."""
        return [r.discovery for r in self.results if r.discovery is not None]

    @property
    def evidence(self) -> dict[str, int]:
        """How many of the table's answered cells are `verified`, `unverified` or have `no_evidence`."""
        from amapreduce.table.table import CellStatus

        counts: Counter[str] = Counter(str(cell.evidence) for row in self.table.rows for cell in row.cells.values()
                                       if cell.status is not CellStatus.MISSING)
        return dict(counts)
