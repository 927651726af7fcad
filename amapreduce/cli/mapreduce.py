"""`amapreduce mapreduce ...`: validate a decision file, print its batch plan, or run it.

Both commands read the user's own decision, so neither caps its batch plan unless asked to
(`--max-batches` or `AMAPREDUCE_MAX_BATCHES`; see `Settings.batch_cap`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from amapreduce.cli.ask import OTEL_HELP
from amapreduce.cli.exit_codes import EXIT_CODES_HELP
from amapreduce.cli.output import EVIDENCE_HELP, VERIFY_HELP

if TYPE_CHECKING:
    from amapreduce.run.mapreduce_run import MapReduceRunOutcome

__all__ = ["app", "report_run"]

app = typer.Typer(no_args_is_help=True, add_completion=False)

MAX_BATCHES_HELP = (
    "Refuse a batch plan with more batches than this (default: AMAPREDUCE_MAX_BATCHES, else no cap: "
    "a decision you wrote runs as written)."
)


@app.command("plan")
def plan(
    decision_file: str = typer.Argument(..., metavar="DECISION.json", help="Decision file to validate."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object on stdout."),
    max_batches: int | None = typer.Option(None, "--max-batches", min=1, help=MAX_BATCHES_HELP),
) -> None:
    """Validate a decision file and print its batch plan.

    Invalid input (missing file, bad JSON, failed validation) exits 2 with a one-line reason.
    """
    from amapreduce.decision.model import load_decision
    from amapreduce.mapreduce.batching import plan_batches
    from amapreduce.settings import load_settings

    settings = load_settings(max_batches=max_batches)
    decision = load_decision(decision_file)
    batch_plan = plan_batches(decision, max_batches=settings.batch_cap("user"))
    if as_json:
        typer.echo(json.dumps(batch_plan.to_json(), ensure_ascii=False))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # Everything below except our own styling is user or model text (rationales, templates, column
    # names), so it is escaped: `[/x]` in a rationale must print as written, not crash rich's
    # markup parser, and `:smile:` must not turn into an emoji.
    console = Console(emoji=False)
    console.print(
        f"[bold]{batch_plan.num_rows}[/] atomic tasks → [bold]{len(batch_plan.batches)}[/] batches "
        f"([cyan]{escape(batch_plan.strategy)}[/]); columns: {escape(', '.join(decision.columns))}; "
        f"key: {escape(', '.join(decision.resolved_key_columns))}"
    )
    table = Table("batch", "rows", "size", "rationale")
    for b in batch_plan.batches:
        shown = ", ".join(str(i) for i in b.indices[:12]) + (" …" if b.size > 12 else "")
        table.add_row(escape(b.batch_id), shown, str(b.size), escape(b.rationale))
    console.print(table)
    console.print(f"First sub-query: [italic]{escape(decision.task_text(0))}[/]")


@app.command("run", epilog=EXIT_CODES_HELP)
def run(
    decision_file: str = typer.Argument(..., metavar="DECISION.json", help="Decision file to execute."),
    model: str | None = typer.Option(None, "--model", help="Sub-agent model: LiteLLM id or the server's model name."),
    api_base: str | None = typer.Option(None, "--api-base", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1."),
    search: str | None = typer.Option(None, "--search", help=(
        "ddgs | searxng:URL | serper | tavily | corpus:INDEX, or an installed plug-in's NAME[:ARG] "
        "(`amapreduce search --list-backends`).")),
    workers: int | None = typer.Option(None, "--workers", min=1, help="Sub-agents running at once."),
    max_batches: int | None = typer.Option(None, "--max-batches", min=1, help=MAX_BATCHES_HELP),
    mcp: Path | None = typer.Option(None, "--mcp", metavar="CONFIG", help=(
        "JSON file of MCP servers (Claude Desktop's {\"mcpServers\": ...} format) whose tools every search "
        "sub-agent gets; needs the `mcp` extra.")),
    out: Path | None = typer.Option(None, "--out", help="Also write the markdown table here."),
    csv_out: Path | None = typer.Option(None, "--csv", help="Also write the table as CSV here."),
    evidence: bool = typer.Option(False, "--evidence", help=EVIDENCE_HELP),
    verify: str | None = typer.Option(None, "--verify", metavar="off|record|strict", help=VERIFY_HELP),
    otel: bool = typer.Option(False, "--otel", help=OTEL_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object on stdout."),
) -> None:
    """Run a decision through the engine and search sub-agents, with no manager.

    For users who already know their entity list. Every run leaves runs/<timestamp>-<slug>/; a
    command refused for bad input (exit 2) leaves nothing.
    """
    from amapreduce.decision.model import load_decision
    from amapreduce.run.mapreduce_run import run_decision
    from amapreduce.run.wiring import check_run_setup, require_model
    from amapreduce.settings import load_settings

    decision = load_decision(decision_file)
    settings = load_settings(
        model=model, api_base=api_base, search_backend=search, workers=workers, max_batches=max_batches,
        otel=otel or None, mcp=mcp, verify=verify,
    )
    require_model(settings)
    check_run_setup(settings, ("subagent", "extraction"))
    outcome = run_decision(decision, settings, label=Path(decision_file).stem, show_progress=None if not as_json else False)
    report_run(outcome, as_json=as_json, out=out, csv_out=csv_out, evidence=evidence)


def report_run(
    outcome: MapReduceRunOutcome, *, as_json: bool, out: Path | None = None, csv_out: Path | None = None,
    evidence: bool = False,
) -> None:
    """Hand a finished (or stopped) `mapreduce run` to the user: the table copies asked for, the
    `--json` object or the table and a summary line, and the exit code of how it ended
    (`exit_for_run`). One output contract for `mapreduce run` and `runs resume`.
    """
    from amapreduce.cli.exit_codes import exit_for_run
    from amapreduce.cli.output import counted, usage_json, write_table_copies

    result = outcome.result
    write_table_copies(result.table, result.markdown(), out=out, csv_out=csv_out, evidence=evidence)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "rows": result.summary.rows,
                    "missing_cells": result.summary.missing_cells,
                    "completeness": outcome.record["completeness"],
                    "table_markdown": result.markdown(),
                    "usage": usage_json(outcome.meter),
                    "timings": {"wall_s": result.summary.timings.get("wall_s", 0.0)},
                    "run_dir": str(outcome.run_dir.path),
                    "status": outcome.status,
                    **({"error": outcome.ending.error} if outcome.ending.error else {}),
                },
                ensure_ascii=False,
            )
        )
    else:
        typer.echo(result.markdown())
        s = result.summary
        typer.echo(
            f"{counted(s.rows, 'row')}, {counted(s.missing_cells, 'missing cell')}, "
            f"{counted(s.patch_rounds, 'patch round')}, {counted(s.retries, 'retry')} "
            f"({outcome.status}{f': {outcome.ending.error}' if outcome.ending.error else ''}). "
            f"Run directory: {outcome.run_dir.path}",
            err=True,
        )
    exit_for_run(outcome.ending.status)
