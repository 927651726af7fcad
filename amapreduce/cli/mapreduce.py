"""`amapreduce mapreduce ...`: validate and plan decisions (run arrives with the model layer)."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False)


@app.command("plan")
def plan(decision_file: str = typer.Argument(..., metavar="DECISION.json")) -> None:
    """Validate a decision file and print its batch plan."""
    raise typer.Exit(0)
