"""`amapreduce mapreduce ...`: validate a decision file and print its batch plan."""

from __future__ import annotations

import json

import typer

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, add_completion=False)


@app.command("plan")
def plan(
    decision_file: str = typer.Argument(..., metavar="DECISION.json", help="Decision file to validate."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object on stdout."),
    max_batches: int = typer.Option(50, "--max-batches", min=1, help="Largest batch plan accepted."),
) -> None:
    """Validate a decision file and print its batch plan.

    Invalid input (missing file, bad JSON, failed validation) exits 2 with a one-line reason.
    """
    from amapreduce.decision.model import load_decision
    from amapreduce.mapreduce.batching import plan_batches

    decision = load_decision(decision_file)
    batch_plan = plan_batches(decision, max_batches=max_batches)
    if as_json:
        typer.echo(json.dumps(batch_plan.to_json(), ensure_ascii=False))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"[bold]{batch_plan.num_rows}[/] atomic tasks → [bold]{len(batch_plan.batches)}[/] batches "
        f"([cyan]{batch_plan.strategy}[/]); columns: {', '.join(decision.column_names)}; "
        f"key: {', '.join(decision.keys)}"
    )
    table = Table("batch", "rows", "size", "rationale")
    for b in batch_plan.batches:
        shown = ", ".join(str(i) for i in b.indices[:12]) + (" …" if b.size > 12 else "")
        table.add_row(b.batch_id, shown, str(b.size), b.rationale)
    console.print(table)
    console.print(f"First sub-query: [italic]{decision.task_text(0)}[/]")
