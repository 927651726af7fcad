"""Where a run's work goes: `--executor local|ray[:ADDRESS]` (`Settings.executor`, `AMAPREDUCE_EXECUTOR`).

`session/` defines what an executor is (`Executor`) and parses the setting (`parse_executor`);
`cluster/` implements it for Ray (`cluster.executor_for`), and the interface layer (the CLI, the
Python API, `bench/`'s trials) hands the one it built to a `Session`. So a session never imports
Ray, and a local run needs no executor at all: its executions run in this process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from amapreduce.errors import ConfigError

if TYPE_CHECKING:
    from amapreduce.decision.model import Decision
    from amapreduce.journal import JournalEntry
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.mapreduce.batching import BatchPlan
    from amapreduce.mapreduce.checkpoint import EntrySink
    from amapreduce.mapreduce.result import MapReduceResult
    from amapreduce.settings import Settings
    from amapreduce.trace import Trace

__all__ = ["EXECUTOR_VARIABLE", "Executor", "ExecutorSpec", "WideRun", "parse_executor"]

EXECUTOR_VARIABLE = "AMAPREDUCE_EXECUTOR"
"""The environment variable read when `--executor` is not given (`Settings.executor`)."""


@dataclass(frozen=True)
class ExecutorSpec:
    """A parsed `--executor` value."""

    kind: Literal["local", "ray"]
    address: str | None = None
    """The Ray cluster to join (None: start one here, or the one `RAY_ADDRESS` names)."""


def parse_executor(text: str, *, source: str = "--executor") -> ExecutorSpec:
    """`local`, `ray` or `ray:ADDRESS`.

    Raises:
        ConfigError: anything else (the message names `source`, the flag or the variable).
    """
    value = text.strip()
    if value == "local":
        return ExecutorSpec("local")
    if value == "ray":
        return ExecutorSpec("ray")
    if value.startswith("ray:") and value[4:].strip():
        return ExecutorSpec("ray", value[4:].strip())
    raise ConfigError(f"{source} {text!r}: use local, ray (a Ray instance on this machine) or ray:ADDRESS "
                      "(a running cluster, e.g. ray:auto or ray:HOST:6379).")




@dataclass(frozen=True, kw_only=True)
class WideRun:
    """A wide run's merged result and what the driver records of it."""

    result: MapReduceResult
    web: dict[str, Any]
    chunks: int
    """Chunks the plan was cut into."""
    finished: int
    """Chunks whose rows are in the table."""


class Executor(Protocol):
    """Runs a plain decision's plan in chunks away from this process (`cluster.RayExecutor`)."""

    spec: ExecutorSpec

    def check(self) -> None:
        """Refuse an executor that cannot be used here, before a run directory is made.

        Raises:
            ConfigError: its extra is missing, or its cluster cannot be reached.
        """

    def chunk_batches(self, settings: Settings) -> int:
        """Batches per chunk: a plan of more batches than this runs in chunks."""

    def attach(self, meter: UsageMeter) -> contextlib.AbstractContextManager[UsageMeter]:
        """Inside: the cluster joined for one run whose models are built inside, drawing on one
        limiter and budget; yields the run's meter (charged to the cluster's budget)."""

    def run_wide(self, decision: Decision, plan: BatchPlan, settings: Settings, *, meter: UsageMeter,
                 trace: Trace, journal: EntrySink | None = None, saved: Sequence[JournalEntry] = (),
                 size: int | None = None) -> WideRun:
        """Run `decision`'s `plan` in chunks and merge them (inside `attach`: on its limiter)."""
