"""`amapreduce demo`: the whole pipeline offline, with a simulated model (not an LLM).

Only typer is imported at module level; the pipeline loads inside the command so
`amapreduce --help` stays fast.
"""

from __future__ import annotations

import json

import typer

__all__ = ["demo", "register"]

_NOTE = (
    "Simulated model (deterministic code, not an LLM) over the bundled sandbox atlas: the manager agent, "
    "mapreduce tool, engine, sub-agents and reducer are real; no network, no API key."
)


def demo(
    task_id: str | None = typer.Argument(None, help="Sandbox task id (default: sbx_en_001)."),
    faults: float = typer.Option(0.0, "--faults", min=0.0, max=1.0, help="Fault rate of the simulated model (0-1)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the fault injection."),
    workers: int | None = typer.Option(None, "--workers", min=1, help="Sub-agents running at once."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object on stdout."),
) -> None:
    """Run a sandbox task end to end with a simulated model, offline; print the table and its score."""
    from amapreduce.demo.faults import FaultPlan
    from amapreduce.demo.run import run_demo
    from amapreduce.settings import load_settings

    settings = load_settings(workers=workers)
    typer.echo(_NOTE, err=True)
    outcome = run_demo(task_id, settings, faults=FaultPlan(rate=faults, seed=seed), show_progress=None if not as_json else False)
    if as_json:
        typer.echo(json.dumps(outcome.to_json(), ensure_ascii=False))
    else:
        c = outcome.ask.record["completeness"]
        injected = ", ".join(f"{k} {v}" for k, v in sorted(outcome.faults.items())) or "none"
        typer.echo(outcome.ask.markdown)
        typer.echo(
            f"\nTask {outcome.task_id} ({outcome.ask.status}): {c['rows']} rows, {c['missing_cells']} missing cells; "
            f"{c['batches']} batches, {c['retries']} retries, {c['patch_rounds']} patch rounds; faults injected: {injected}."
        )
        s = outcome.score
        typer.echo(
            f"Score against the sandbox gold (exact judge): success {s['score']:g}, item F1 {s['f1_by_item']:.3f}, "
            f"row F1 {s['f1_by_row']:.3f}."
        )
        typer.echo(f"Model: simulated (not an LLM). Run directory: {outcome.ask.run_dir.path}")
    if outcome.ask.ending.status.ended_early:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the top-level `demo` command."""
    app.command("demo")(demo)
