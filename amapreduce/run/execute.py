"""Run a decision straight through the engine (no manager) and record it in a run directory.

This is `amapreduce mapreduce run`: for users who already know their entity list, like a
DocETL/LOTUS map operation, and the building block the manager's runs share.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amapreduce._atomic import atomic_write
from amapreduce.errors import RunCancelled
from amapreduce.run.progress import RunProgress
from amapreduce.run.rundir import RunDir
from amapreduce.run.wiring import InnerFactory, build_parts, new_meter
from amapreduce.settings import Settings
from amapreduce.table.render import to_csv, to_markdown
from amapreduce.table.table import Table

if TYPE_CHECKING:
    from smolagents import Tool

    from amapreduce.decision.model import Decision
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.mapreduce.result import MapReduceResult

__all__ = ["RunOutcome", "finish_run", "recording_failures", "run_decision", "run_timings", "usage_json", "write_outputs"]


@dataclass(kw_only=True)
class RunOutcome:
    """What a finished (or stopped) run produced."""

    result: MapReduceResult
    run_dir: RunDir
    status: str
    """`complete`, `incomplete` (cells still missing), or `stopped: <reason>`."""
    record: dict[str, Any]
    """The content of `result.json`."""
    meter: UsageMeter
    """Usage and cost of the run, by role."""


def usage_json(meter: UsageMeter) -> dict[str, Any]:
    """The `usage` object of the CLI's JSON outputs."""
    total = meter.total()
    return {
        "requests": total.requests,
        "prompt_tokens": total.input_tokens,
        "completion_tokens": total.output_tokens,
        "cost_usd": round(total.cost_usd, 6),
    }


def write_outputs(table: Table, markdown: str, *, out: Path | None, csv_out: Path | None) -> None:
    """Write the `--out` markdown and `--csv` copies a user asked for (atomically)."""
    if out is not None:
        atomic_write(out, markdown + "\n")
    if csv_out is not None:
        atomic_write(csv_out, to_csv(table))


def run_timings(started: float, executions: Sequence[Mapping[str, float]] = ()) -> dict[str, Any]:
    """The `timings` object of every `result.json`: one shape for `ask`, `demo` and `mapreduce run`.

    `wall_s` is the whole run (setup, manager, every execution, writing the table) measured from
    `started` (a `time.perf_counter()` value); `executions` holds each engine execution's own
    `map_s` / `patch_s` / `wall_s`, in order.
    """
    return {
        "wall_s": round(max(time.perf_counter() - started, 0.0), 6),
        "executions": [dict(t) for t in executions],
    }


def finish_run(
    run_dir: RunDir,
    table: Table,
    completeness: dict[str, Any],
    *,
    kind: str,
    query: str,
    status: str,
    meter: UsageMeter,
    started: float,
    executions: Sequence[Mapping[str, float]] = (),
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write `table.md`, `table.csv` and `result.json`; return the recorded object.

    `completeness` is the engine's summary (rows, missing cells, rounds, retries); `started` and
    `executions` give the `timings` (see `run_timings`).
    """
    run_dir.write_table(to_markdown(table), to_csv(table))
    record = {
        "kind": kind,
        "query": query,
        "status": status,
        "completeness": completeness,
        "table": table.to_json(),
        "usage": meter.to_json(),
        **(extra or {}),
        "timings": run_timings(started, executions),
    }
    run_dir.write_result(record)
    run_dir.trace.write("run_finished", status=status, usage=meter.to_json())
    return record


@contextlib.contextmanager
def recording_failures(run_dir: RunDir, *, kind: str, query: str, meter: UsageMeter, started: float) -> Iterator[None]:
    """Close `run_dir` on the way out; if the run raised before writing `result.json`, write one
    with status `failed` (or `stopped: interrupted` for Ctrl-C) and the error, then re-raise.

    Why: a run directory without `result.json` is invisible to `runs list` and says nothing about
    what went wrong (a bad search backend, an unreadable memory store, a bug). Every run the user
    started must leave a record.
    """
    try:
        yield
    except (Exception, KeyboardInterrupt) as exc:
        if not (run_dir.path / "result.json").exists():
            interrupted = isinstance(exc, KeyboardInterrupt)
            status = "stopped: interrupted" if interrupted else "failed"
            error = "interrupted" if interrupted else (str(exc) or type(exc).__name__)
            # A failure to record the failure (disk full ...) must not hide `exc`; it rides along as a note.
            try:
                run_dir.write_result(
                    {
                        "kind": kind,
                        "query": query,
                        "status": status,
                        "error": error,
                        "error_type": type(exc).__name__,
                        "completeness": {"rows": 0, "complete": False},
                        "usage": meter.to_json(),
                        "timings": run_timings(started),
                    }
                )
                run_dir.trace.write("run_finished", status=status, error=error, usage=meter.to_json())
            except Exception as record_exc:
                exc.add_note(f"(also: could not write the failed result.json in {run_dir.path}: {record_exc})")
        raise
    finally:
        run_dir.close()


def run_decision(
    decision: Decision,
    settings: Settings,
    *,
    label: str,
    inner: InnerFactory | None = None,
    web_tools: list[Tool] | None = None,
    show_progress: bool | None = None,
) -> RunOutcome:
    """Execute `decision` with sub-agents from `settings`; always leaves a complete run directory.

    A budget stop or Ctrl-C keeps the partial table (status `stopped: ...`).
    """
    started = time.perf_counter()
    run_dir = RunDir.create(settings.runs_dir, label)
    meter = new_meter(settings)
    with recording_failures(run_dir, kind="mapreduce_run", query=label, meter=meter, started=started):
        with RunProgress(meter, enabled=show_progress) as progress:
            parts = build_parts(
                settings, trace=run_dir.trace, meter=meter, progress=progress, inner=inner,
                web_tools=web_tools, roles=("subagent", "extraction"),
            )
            try:
                result = parts.engine.run(decision)
                status = "complete" if result.summary.complete else "incomplete"
            except RunCancelled as exc:
                result = exc.partial
                status = f"stopped: {exc}"
        record = finish_run(
            run_dir, result.table, result.summary.to_json(), kind="mapreduce_run", query=label, status=status,
            meter=meter, started=started, executions=[result.summary.timings],
            extra={"decision": decision.model_dump(mode="json"), "web": parts.web_usage()},
        )
    return RunOutcome(result=result, run_dir=run_dir, status=status, record=record, meter=meter)
