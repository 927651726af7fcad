"""What the run commands (`ask`, `mapreduce run`) hand the user besides the run directory.

Why here, at the command line: the `--out`/`--csv` copies and the `usage` object of `--json`
are the commands' output contract; the run directory itself is written by `session.lifecycle`.
Nothing beyond the standard library is imported at module level (the command modules import
this one, and `amapreduce --help` must not load the meter or the table code).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.session.outcome import RunOutcome
    from amapreduce.session.record import CompletenessRecord
    from amapreduce.table.table import Table

__all__ = ["cost_cell", "counted", "effort_text", "hand_over", "resume_line", "usage_json", "write_table_copies"]


def usage_json(meter: UsageMeter) -> dict[str, Any]:
    """The `usage` object of the CLI's JSON outputs: the run's total in `result.json`'s words
    (`Usage.to_json`), plus `unpriced_models`.

    `cost_usd` is null when a model without a known price was used, and `unpriced_models` names
    those models (empty when every call was priced): a script must not read an unknown cost as $0.
    """
    cost = meter.cost_usd()
    return {
        **meter.total().to_json(),
        "cost_usd": None if cost is None else round(cost, 6),
        "unpriced_models": meter.unpriced(),
    }


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` and `noun` in the right number: `1 patch round`, `2 patch rounds`, `0 retries`."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {plural or (noun[:-1] + 'ies' if noun.endswith('y') and noun[-2:-1] not in 'aeiou' else noun + 's')}"


def effort_text(completeness: CompletenessRecord) -> str:
    """How hard a run worked, from its record's `completeness`:
    `12 batches, 3 retries, 2 patch rounds`, or, when the run executed several decisions,
    `... 4 patch rounds over 2 executions` (patch rounds are run per execution, up to
    `AMAPREDUCE_PATCH_ROUNDS` each, and summed over the run)."""
    c = completeness
    text = (f"{counted(c.batches, 'batch', 'batches')}, {counted(c.retries, 'retry')}, "
            f"{counted(c.patch_rounds, 'patch round')}")
    return text + (f" over {counted(c.executions, 'execution')}" if c.executions > 1 else "")


def cost_cell(row: Mapping[str, Any]) -> str:
    """The cost of one `runs list` row (`session.rundir.list_runs`) as the table shows it: `$0.0123`,
    `unpriced (model ids)`, or empty for a run that recorded no usage (a failed start, a journal
    without a result yet); the words are `llm.meter.format_recorded_cost`'s, which the web UI shows too."""
    from amapreduce.llm.meter import format_recorded_cost

    return format_recorded_cost(row.get("cost_usd"), row.get("unpriced_models"))


def write_table_copies(
    table: Table, markdown: str, *, out: Path | None, csv_out: Path | None, evidence: bool = False
) -> None:
    """Write the `--out` markdown and `--csv` copies a user asked for (atomically); with
    `evidence` (`--evidence`), the CSV holds each cell's quote and evidence too."""
    from amapreduce._atomic import atomic_write
    from amapreduce.table.render import to_csv

    if out is not None:
        atomic_write(out, markdown + "\n")
    if csv_out is not None:
        atomic_write(csv_out, to_csv(table, evidence=evidence))


def resume_line(outcome: RunOutcome) -> str | None:
    """The command that goes on with a run that ended early (stopped, interrupted, failed) from
    its journal; None for a run that finished."""
    if not outcome.ending.status.ended_early:
        return None
    return f"amapreduce runs resume {shlex.quote(str(outcome.run_dir.path))}"


def hand_over(
    outcome: RunOutcome, table: Table, markdown: str, *, as_json: bool, fields: dict[str, Any],
    counts: str, tail: str, out: Path | None, csv_out: Path | None, evidence: bool,
) -> None:
    """Hand a finished (or stopped) run to the user, the one output contract of `ask`, `mapreduce run`
    and `runs resume`: the table copies asked for (`write_table_copies`); then with `as_json` one
    JSON object (the command's `fields`, then `table_markdown`, `usage`, `run_dir`, `status` and
    `error`), else the table on stdout and on stderr `counts (status: error)tail`; and the exit code
    of how the run ended (`exit_for_run`)."""
    from amapreduce.cli.exit_codes import exit_for_run

    write_table_copies(table, markdown, out=out, csv_out=csv_out, evidence=evidence)
    error = outcome.ending.error
    resume = resume_line(outcome)
    if as_json:
        typer.echo(json.dumps({
            **fields, "table_markdown": markdown, "usage": usage_json(outcome.meter),
            "run_dir": str(outcome.run_dir.path), "status": outcome.status, **({"error": error} if error else {}),
            **({"resume": resume} if resume else {}),
        }, ensure_ascii=False))
    else:
        typer.echo(markdown)
        typer.echo(f"{counts} ({outcome.status}{f': {error}' if error else ''}){tail}"
                   f"{f'. Continue it with: {resume}' if resume else ''}", err=True)
    exit_for_run(outcome.ending.status)
