"""What the run commands (`ask`, `mapreduce run`) hand the user besides the run directory.

Why here, at the command line: the `--out`/`--csv` copies and the `usage` object of `--json`
are the commands' output contract; the run directory itself is written by `run.lifecycle`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from amapreduce._atomic import atomic_write
from amapreduce.table.render import to_csv

if TYPE_CHECKING:
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.table.table import Table

__all__ = ["usage_json", "write_table_copies"]


def usage_json(meter: UsageMeter) -> dict[str, Any]:
    """The `usage` object of the CLI's JSON outputs."""
    total = meter.total()
    return {
        "requests": total.requests,
        "prompt_tokens": total.input_tokens,
        "completion_tokens": total.output_tokens,
        "cost_usd": round(total.cost_usd, 6),
    }


def write_table_copies(table: Table, markdown: str, *, out: Path | None, csv_out: Path | None) -> None:
    """Write the `--out` markdown and `--csv` copies a user asked for (atomically)."""
    if out is not None:
        atomic_write(out, markdown + "\n")
    if csv_out is not None:
        atomic_write(csv_out, to_csv(table))
