"""`amapreduce ask` and `amapreduce runs`: answer a question; inspect, filter and resume runs."""

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

__all__ = ["register", "runs_app"]

runs_app = App()


def ask(
    query: str = typer.Argument(..., help="The wide-search question."),
    model: opt.ModelOpt = None,
    api_base: opt.ApiBaseOpt = None,
    search: opt.SearchOpt = None,
    allow_web_crawl: opt.AllowWebCrawlOpt = False,
    model_timeout: opt.ModelTimeoutOpt = None,
    solver: opt.SolverOpt = None,
    tool_choice: opt.ToolChoiceOpt = None,
    structured_output: opt.StructuredOutputOpt = None,
    message_content: opt.MessageContentOpt = None,
    workers: opt.WorkersAutoOpt = None,
    memory: opt.MemoryOpt = None,
    no_memory: opt.NoMemoryOpt = False,
    mcp: opt.McpOpt = None,
    mcp_manager: bool = typer.Option(False, "--mcp-manager", help="Give the MCP servers' tools to the manager too."),
    out: opt.OutOpt = None,
    csv_out: opt.CsvOpt = None,
    evidence: opt.EvidenceOpt = False,
    verify: opt.VerifyOpt = None,
    max_cost: opt.MaxCostOpt = None,
    max_tokens: opt.MaxTokensOpt = None,
    estimate: bool = typer.Option(False, "--estimate", help=(
        "Let the manager scout and write its decision, then print what the decision's fan-out would cost "
        "(sub-agent calls, tokens, cost, wall time; from your past runs, else documented defaults) instead of "
        "running it. No sub-agent is called; the manager's own calls are spent, and counted.")),
    otel: opt.OtelOpt = False,
    executor: opt.ExecutorOpt = None,
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object on stdout."),
) -> None:
    """Answer a wide-search question with a table (manager + parallel search sub-agents).

    With --max-cost, a fan-out whose estimate's low end (plus what the manager spent) costs more is
    refused before any sub-agent call: the run stops with exit 4 and the numbers.

    With --executor ray, the manager runs here and a decision of more batches than one chunk
    (4 per --workers) runs its chunks as Ray tasks, all under one cluster-wide rate limit and budget.
    """
    from amapreduce.memory.schema import memory_store_for
    from amapreduce.session import RunOptions, Session
    from amapreduce.session.parts import require_model
    from amapreduce.settings import load_settings

    if memory is not None and no_memory:
        raise typer.BadParameter("give either --memory STORE or --no-memory, not both")
    settings = load_settings(
        model=model, api_base=api_base, search_backend=search, workers=workers, max_cost_usd=max_cost, max_tokens=max_tokens,
        otel=otel or None, mcp=mcp, mcp_manager=mcp_manager or None, verify=verify, executor=executor,
        allow_web_crawl=allow_web_crawl or None,
        **opt.endpoint_overrides(model_timeout=model_timeout, solver=solver, tool_choice=tool_choice,
                                 structured_output=structured_output, message_content=message_content),
    )
    require_model(settings)
    store = memory_store_for(False if no_memory else memory, settings.memory_store)
    session = Session(settings, RunOptions(query=query, memory_store=store, executor=opt.executor_for(settings, executor),
                                           show_progress=None if not as_json else False, estimate_only=estimate))
    with session:
        outcome = session.ask()
    if estimate:
        report_estimate(outcome, as_json=as_json)
        return
    report_ask(outcome, as_json=as_json, out=out, csv_out=csv_out, evidence=evidence)


def report_ask(
    outcome: RunOutcome, *, as_json: bool, out: Path | None = None, csv_out: Path | None = None, evidence: bool = False
) -> None:
    """Hand a finished (or stopped) `ask` run to the user (`output.hand_over`): the `--json` object
    also holds the query and the completeness record, the summary line the effort and the cost.
    One output contract for `ask` and for `runs resume` of an `ask` run."""
    from amapreduce.cli.output import counted, effort_text, hand_over

    c, recorded = outcome.completeness, outcome.record.completeness
    hand_over(
        outcome, outcome.table, outcome.markdown, as_json=as_json,
        fields={"query": outcome.query, "rows": c.rows, "missing_cells": c.missing_cells,
                "completeness": recorded.model_dump(mode="json")},
        counts=f"{counted(c.rows, 'row')}, {counted(c.missing_cells, 'missing cell')}",
        tail=f"; {effort_text(recorded)}; {outcome.meter.cost_text()}. Run directory: {outcome.run_dir.path}",
        out=out, csv_out=csv_out, evidence=evidence,
    )


def report_estimate(outcome: RunOutcome, *, as_json: bool) -> None:
    """Hand an estimate-only `ask` to the user: the estimate of the manager's decision and what the
    manager spent writing it (exit 0); a manager that wrote no decision to run gets the run's exit code."""
    from amapreduce.cli.exit_codes import exit_for_run
    from amapreduce.cli.output import usage_json

    forecast, spent = outcome.estimate, outcome.meter.by_role().get("manager")
    manager = {"calls": spent.requests if spent else 0, "prompt_tokens": spent.input_tokens if spent else 0,
               "completion_tokens": spent.output_tokens if spent else 0}
    if as_json:
        typer.echo(json.dumps({"query": outcome.query, "estimate": None if forecast is None else forecast.to_json(),
                               "manager_spent": manager, "usage": usage_json(outcome.meter),
                               "run_dir": str(outcome.run_dir.path), "status": outcome.status}, ensure_ascii=False))
    else:
        for line in forecast.lines() if forecast is not None else []:
            typer.echo(line)
        typer.echo(f"spent by the manager to write the decision: {manager['calls']} model calls, "
                   f"{manager['prompt_tokens']:,} prompt and {manager['completion_tokens']:,} completion tokens "
                   f"({outcome.meter.cost_text()}); no sub-agent was called. Run directory: {outcome.run_dir.path}",
                   err=True)
    if forecast is None:
        typer.echo(f"the manager wrote no decision to run ({outcome.status}): nothing to estimate.", err=True)
        exit_for_run(outcome.ending.status)


@runs_app.command("list")
def runs_list(
    runs_dir: Path | None = typer.Option(None, "--runs-dir", help="Folder of run directories (default: runs/)."),
    status: str | None = typer.Option(None, "--status", help=(
        "Only runs in this state: running, complete, incomplete, failed, interrupted (a Ctrl-C, or a process "
        "that died), stopped or no_table.")),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list."),
) -> None:
    """List past runs, newest first, and say which runs folder was read.

    With --json: {"runs_dir": the folder read (absolute), "runs": [one object per run]}.
    """
    from amapreduce.cli.output import cost_cell
    from amapreduce.session.rundir import RUN_STATES, list_runs
    from amapreduce.settings import load_settings

    if status is not None and status not in RUN_STATES:
        raise typer.BadParameter(f"--status must be one of {', '.join(RUN_STATES)}, got {status!r}")
    folder = (runs_dir or load_settings().runs_dir).resolve()
    rows = list_runs(folder, state=status)
    if as_json:
        typer.echo(json.dumps({"runs_dir": str(folder), "runs": rows}, ensure_ascii=False))
        return
    # The folder first: an empty listing must not look like "no runs anywhere" when it read the
    # runs/ of another directory.
    if not rows:
        where = f"in {folder}" if folder.is_dir() else f"at {folder}: no such folder"
        which = f" with status {status}" if status is not None else ""
        typer.echo(f"No runs{which} {where} (another folder: --runs-dir DIR or AMAPREDUCE_RUNS_DIR).")
        return
    typer.echo(f"Runs in {folder}:")
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    def cell(r: dict[str, object], key: str) -> str:
        value = r.get(key)
        return "" if value is None else str(value)

    table = Table()
    # The run name is what `runs show RUN` takes: it is never cut or wrapped.
    table.add_column("run", no_wrap=True)
    for header in ("kind", "rows", "missing", "cost", "status", "query"):
        table.add_column(header, overflow="fold")
    for r in rows:
        # Text, not str: a query such as "see [/x]" is user text, never rich markup.
        cells = [*(cell(r, k) for k in ("run", "kind", "rows", "missing_cells")), cost_cell(r), cell(r, "status")]
        table.add_row(*(Text(c) for c in [*cells, cell(r, "query")[:60]]))
    console = Console()
    if Measurement.get(console, console.options.update_width(10**6), table).minimum <= console.width:
        console.print(table)
        return
    # Too narrow for a table whose run names stay whole (80 columns, a pipe): one block per run,
    # its name alone on the first line so it can be copied into `runs show`.
    for r in rows:
        facts = [
            cell(r, "kind"),
            f"{cell(r, 'rows')} rows" if cell(r, "rows") else "",
            f"{cell(r, 'missing_cells')} missing" if cell(r, "missing_cells") else "",
            cost_cell(r),
            cell(r, "status"),
        ]
        typer.echo(cell(r, "run"))
        typer.echo("    " + ", ".join(f for f in facts if f))
        if cell(r, "query"):
            typer.echo("    " + cell(r, "query")[:60])


@runs_app.command("show")
def runs_show(
    run: str = typer.Argument(..., help="Run folder name (from `runs list`) or path."),
    runs_dir: Path | None = typer.Option(None, "--runs-dir", help="Folder of run directories (default: runs/)."),
    as_json: bool = typer.Option(False, "--json", help=(
        "Print the run's record (result.json, docs/reference/result.schema.json); a run not finished: its "
        "journal's state and progress.")),
) -> None:
    """Show one run: status, completeness, usage and the table."""
    from amapreduce.session.rundir import read_run
    from amapreduce.settings import load_settings

    stored = read_run(runs_dir or load_settings().runs_dir, run)
    record = stored.record
    if as_json:  # a finished run: its record; one not finished: its journal's state and progress
        typer.echo(json.dumps(record.to_json() if record is not None else stored.to_json(), ensure_ascii=False))
        return
    typer.echo(f"{stored.kind}: {stored.query}\nstatus: {stored.status}")
    if record is not None and record.error:
        typer.echo(f"error: {record.error}")
    if stored.progress:
        p = stored.progress
        typer.echo(f"batches: {p['batches_done']}/{p['batches_total']} done, {p['patch_batches_done']} patch batches done")
    if record is not None:
        typer.echo(f"completeness: {json.dumps(record.completeness.model_dump(mode='json'))}")
        typer.echo(f"usage: {json.dumps(record.usage.total.model_dump(mode='json'))}")
    table = stored.path / "table.md"
    if table.is_file():
        typer.echo(table.read_text(encoding="utf-8"))


@runs_app.command("resume", epilog=EXIT_CODES_HELP)
def runs_resume(
    run: str = typer.Argument(..., help="Run folder name (from `runs list`) or path."),
    runs_dir: Path | None = typer.Option(None, "--runs-dir", help="Folder of run directories (default: runs/)."),
    workers: int | None = typer.Option(None, "--workers", min=1, help="Sub-agents running at once (default: the run's)."),
    otel: opt.OtelOpt = False,
    as_json: bool = typer.Option(False, "--json", help=(
        "Print exactly one JSON object on stdout (as `mapreduce run --json`, or `ask --json` for an `ask` run).")),
) -> None:
    """Finish a killed or interrupted `mapreduce run`, `enrich` or `ask` in its own run directory.

    Batches the run's journal marks done are not run again; the rest, the patch rounds and the
    final table follow, with the run's own settings (an `enrich` run writes its enriched list again:
    CSV on stdout and enriched.csv in the run directory). For `ask`, the decisions the manager had
    executed are reused: the manager is not asked again. A `mapreduce run` on Ray (--executor
    ray) resumes on Ray, on the cluster it ran on: the chunks it had finished are replayed from
    the journal, not run again. A run that already finished is left as
    it is (exit 0, a message on stderr, nothing on stdout); a folder without a journal exits 2;
    otherwise the exit code says how the resumed run ended, as for the command that started it.
    """
    from amapreduce.cli.mapreduce import report_run
    from amapreduce.session.journal import RunKind
    from amapreduce.session.resume import resume, resume_settings, saved_run
    from amapreduce.session.rundir import run_path
    from amapreduce.settings import load_settings

    path = run_path(runs_dir or load_settings().runs_dir, run)
    saved = saved_run(path)
    if saved.finished:
        status = saved.ended.label if saved.ended is not None else ""
        typer.echo(f"the run in {path} already finished ({status}); there is nothing to resume.", err=True)
        return
    settings = resume_settings(saved, workers=workers, otel=otel or None)
    executor = None
    if saved.wide is not None:  # a wide run resumes on the cluster it ran on
        from amapreduce.cluster import executor_for

        executor = executor_for(f"ray:{saved.wide.address}" if saved.wide.address else "ray")
    outcome = resume(path, saved, settings, show_progress=None if not as_json else False, executor=executor)
    if outcome.kind is RunKind.ENRICH:  # the enriched list again, from the run's `enrich.json`
        from amapreduce.cli.enrich import report_enrichment
        from amapreduce.enrichment import resumed_enrichment

        report_enrichment(resumed_enrichment(outcome), as_json=as_json)
        return
    (report_ask if outcome.kind.is_ask else report_run)(outcome, as_json=as_json)


def register(app: typer.Typer) -> None:
    """Add `ask` and the `runs` group to the root app."""
    app.command("ask", epilog=EXIT_CODES_HELP)(ask)
    app.add_typer(runs_app, name="runs", help="List and inspect run directories.")
