"""`amapreduce mapreduce ...`: validate a decision file, print its batch plan, or run it.

Both commands read the user's own decision, so neither caps its batch plan unless asked to
(`--max-batches` or `AMAPREDUCE_MAX_BATCHES`; see `Settings.batch_cap`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from amapreduce.cli import options as opt
from amapreduce.cli.exit_codes import EXIT_CODES_HELP
from amapreduce.cli.help import App

if TYPE_CHECKING:
    from amapreduce.session.outcome import RunOutcome

__all__ = ["app", "report_run"]

app = App()

MAX_BATCHES_HELP = (
    "Refuse a batch plan with more batches than this (default: AMAPREDUCE_MAX_BATCHES, else no cap: "
    "a decision you wrote runs as written)."
)


PLAN_BATCHES_SHOWN = 60
"""`mapreduce plan` lists every batch of a plan up to this many; a larger plan is summarised."""
PLAN_HEAD, PLAN_TAIL = 20, 5
"""The batches a summarised plan lists: its first `PLAN_HEAD` and its last `PLAN_TAIL`."""


@app.command("plan")
def plan(
    decision_file: str = typer.Argument(..., metavar="DECISION.json", help="Decision file to validate."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object on stdout."),
    max_batches: int | None = typer.Option(None, "--max-batches", min=1, help=MAX_BATCHES_HELP),
    estimate: bool = typer.Option(False, "--estimate", help=(
        "Also estimate the run's sub-agent calls, tokens, cost and wall time, from your past runs "
        "(AMAPREDUCE_RUNS_DIR) of sub-questions worded alike, else documented defaults.")),
    model: str | None = typer.Option(None, "--model", help="With --estimate: the sub-agent model to price."),
    workers: opt.WorkersOpt = None,
) -> None:
    """Validate a decision file and print its batch plan (and, with --estimate, what running it would cost).

    Invalid input (missing file, bad JSON, failed validation, a file over AMAPREDUCE_MAX_DECISION_BYTES
    or AMAPREDUCE_MAX_DECISION_ROWS) exits 2 with a one-line reason. A plan of more than 60 batches is
    summarised: its first 20 and last 5 batches (--json always lists every batch).
    """
    from amapreduce.decision.model import load_decision
    from amapreduce.session.estimate import plan_decision
    from amapreduce.settings import load_settings

    settings = load_settings(max_batches=max_batches, model=model, workers=workers)
    decision = load_decision(decision_file, max_bytes=settings.max_decision_bytes, max_rows=settings.max_decision_rows)
    planned = plan_decision(decision, settings, estimate=estimate)
    stage, batch_plan, first, columns, keys = planned.stage, planned.plan, planned.first, planned.columns, planned.keys
    note, forecast = planned.note, planned.estimate
    if as_json:
        typer.echo(json.dumps(planned.to_json(), ensure_ascii=False))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # Everything below except our own styling is user or model text (rationales, templates, column
    # names), so it is escaped: `[/x]` in a rationale must print as written, not crash rich's
    # markup parser, and `:smile:` must not turn into an emoji.
    console = Console(emoji=False)
    console.print(
        f"{'discovery: ' if stage == 'discover' else ''}"
        f"[bold]{batch_plan.num_rows}[/] atomic tasks → [bold]{len(batch_plan.batches)}[/] batches "
        f"([cyan]{escape(batch_plan.strategy)}[/]); columns: {escape(', '.join(columns))}; "
        f"key: {escape(', '.join(keys))}"
    )
    table = Table("batch", "rows", "size", "rationale")
    batches = batch_plan.batches
    # A plan of thousands of batches is summarised: its first and last batches, and how many lie between.
    shown_batches = batches if len(batches) <= PLAN_BATCHES_SHOWN else [*batches[:PLAN_HEAD], *batches[-PLAN_TAIL:]]
    for n, b in enumerate(shown_batches):
        if len(shown_batches) < len(batches) and n == PLAN_HEAD:
            table.add_row("…", f"{len(batches) - PLAN_HEAD - PLAN_TAIL:,} more batches", "", "")
        shown = ", ".join(str(i) for i in b.indices[:12]) + (" …" if b.size > 12 else "")
        table.add_row(escape(b.batch_id), shown, str(b.size), escape(b.rationale))
    console.print(table)
    console.print(f"First sub-query: [italic]{escape(first)}[/]")
    if note:
        console.print(escape(note))
    for line in forecast.lines() if forecast is not None else []:
        console.print(escape(line))


@app.command("run", epilog=EXIT_CODES_HELP)
def run(
    decision_file: str = typer.Argument(..., metavar="DECISION.json", help="Decision file to execute."),
    model: str | None = typer.Option(None, "--model", help="Sub-agent model: LiteLLM id or the server's model name."),
    api_base: opt.ApiBaseOpt = None,
    search: opt.SearchOpt = None,
    allow_web_crawl: opt.AllowWebCrawlOpt = False,
    model_timeout: opt.ModelTimeoutOpt = None,
    solver: opt.SolverOpt = None,
    tool_choice: opt.ToolChoiceOpt = None,
    structured_output: opt.StructuredOutputOpt = None,
    message_content: opt.MessageContentOpt = None,
    workers: opt.WorkersAutoOpt = None,
    max_batches: int | None = typer.Option(None, "--max-batches", min=1, help=MAX_BATCHES_HELP),
    mcp: opt.McpOpt = None,
    out: opt.OutOpt = None,
    csv_out: opt.CsvOpt = None,
    evidence: opt.EvidenceOpt = False,
    verify: opt.VerifyOpt = None,
    otel: opt.OtelOpt = False,
    executor: opt.ExecutorOpt = None,
    max_cost: opt.MaxCostOpt = None,
    max_tokens: opt.MaxTokensOpt = None,
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object on stdout."),
) -> None:
    """Run a decision through the engine and search sub-agents, with no manager.

    For users who already know their entity list. Every run leaves runs/<timestamp>-<slug>/; a
    command refused for bad input (exit 2) leaves nothing, and so does a plan whose estimate's low
    end costs more than --max-cost (exit 4, with the numbers; see `mapreduce plan --estimate`).

    With --executor ray, a plain decision of more batches than one chunk (the --max-batches cap,
    else 4 per worker) runs in chunks as Ray tasks, merged here in matrix order.
    """
    from amapreduce.decision.model import load_decision
    from amapreduce.settings import load_settings

    settings = load_settings(
        model=model, api_base=api_base, search_backend=search, workers=workers, max_batches=max_batches,
        otel=otel or None, mcp=mcp, verify=verify, executor=executor, max_cost_usd=max_cost, max_tokens=max_tokens,
        allow_web_crawl=allow_web_crawl or None,
        **opt.endpoint_overrides(model_timeout=model_timeout, solver=solver, tool_choice=tool_choice,
                                 structured_output=structured_output, message_content=message_content),
    )
    # The decision's caps are checked before the session's modules load: a refusal costs a second, not more.
    decision = load_decision(decision_file, max_bytes=settings.max_decision_bytes, max_rows=settings.max_decision_rows)
    from amapreduce.session import RunOptions, Session
    from amapreduce.session.journal import RunKind
    from amapreduce.session.parts import require_model

    require_model(settings)
    session = Session(settings, RunOptions(kind=RunKind.MAPREDUCE_RUN, query=Path(decision_file).stem, decision=decision,
                                           executor=opt.executor_for(settings, executor),
                                           show_progress=None if not as_json else False))
    with session:
        outcome = session.run()
    report_run(outcome, as_json=as_json, out=out, csv_out=csv_out, evidence=evidence)


def report_run(
    outcome: RunOutcome, *, as_json: bool, out: Path | None = None, csv_out: Path | None = None,
    evidence: bool = False,
) -> None:
    """Hand a finished (or stopped) `mapreduce run` to the user (`output.hand_over`): the `--json`
    object also holds the completeness record and the wall time, the summary line the patch rounds
    and retries. One output contract for `mapreduce run` and `runs resume`.
    """
    from amapreduce.cli.output import counted, hand_over

    result, s = outcome.result, outcome.result.summary
    hand_over(
        outcome, result.table, result.markdown(), as_json=as_json,
        fields={"rows": s.rows, "missing_cells": s.missing_cells, "completeness": outcome.record.completeness.model_dump(mode="json"),
                "timings": {"wall_s": s.timings.get("wall_s", 0.0)}},
        counts=(f"{counted(s.rows, 'row')}, {counted(s.missing_cells, 'missing cell')}, "
                f"{counted(s.patch_rounds, 'patch round')}, {counted(s.retries, 'retry')}"),
        tail=f". Run directory: {outcome.run_dir.path}",
        out=out, csv_out=csv_out, evidence=evidence,
    )
