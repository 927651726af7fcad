"""`amapreduce enrich`: add columns to a list the user already has (CSV, TSV, Excel, Parquet, JSON Lines).

The list's rows become the task matrix (one sub-question per row), the asked columns the schema;
the run is one session of kind `enrich` (`amapreduce.enrichment`): plan stage with the memory's prior,
engine, evidence, budgets, progress, a run directory that `runs resume` finishes after a kill.
Every check of the input runs before a model is built or a run directory made (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from amapreduce.cli import options as opt
from amapreduce.cli.exit_codes import EXIT_CODES_HELP

if TYPE_CHECKING:
    from amapreduce.decision.model import Decision
    from amapreduce.enrichment import Enrichment, EnrichRequest
    from amapreduce.settings import Settings

__all__ = ["enrich", "register", "report_enrichment"]

_EVIDENCE_HELP = ("The enriched list also holds, after each new column C, `C status` (found/missing/conflict/marker), "
                  "`C source` (the URL), `C quote` and `C evidence` (verified/unverified/no_evidence).")


def enrich(
    input_file: Path = typer.Argument(..., metavar="INPUT", help=(
        "The list: .csv, .tsv, .xlsx/.xls, .parquet, .jsonl/.ndjson or .json (a header row and one row per entity).")),
    columns: str = typer.Option(..., "--columns", metavar='"A, B, C"', help="The columns to add, comma-separated."),
    key: list[str] | None = typer.Option(None, "--key", metavar="COL", help=(
        "A column that names each row (repeat for a key of several columns). Default: the first column whose "
        "values name every row once (shown before the run).")),
    instructions: str | None = typer.Option(None, "--instructions", metavar="TEXT", help=(
        "Extra guidance for every sub-agent (formats, where to look).")),
    out: Path | None = typer.Option(None, "--out", help=(
        "Write the enriched list here (format by suffix: .csv, .tsv, .xlsx, .parquet, .jsonl, .json); "
        "default: CSV on stdout. The run directory always keeps enriched.csv.")),
    evidence: bool = typer.Option(False, "--evidence", help=_EVIDENCE_HELP),
    batch_size: int | None = typer.Option(None, "--batch-size", min=1, help=(
        "Rows per sub-agent (default: 16 cells per sub-agent, divided by the key and new columns of a row).")),
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
    verify: opt.VerifyOpt = None,
    max_cost: opt.MaxCostOpt = None,
    max_tokens: opt.MaxTokensOpt = None,
    estimate: bool = typer.Option(False, "--estimate", help=(
        "Print what enriching the list would cost (sub-agent calls, tokens, cost, wall time; from your past runs, "
        "else documented defaults) and stop: no model is called, no run directory made.")),
    max_file_mb: float | None = typer.Option(None, "--max-file-mb", help=(
        "Refuse a larger input file, in MiB (default: AMAPREDUCE_ENRICH_MAX_FILE_MB, else 200).")),
    otel: opt.OtelOpt = False,
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object on stdout."),
) -> None:
    """Enrich a list you already have: add the asked columns to every row, with sources.

    The output keeps every input column and the row order, adds the new columns and
    `enrich_status` (complete, partial, failed: a row the run could not fill keeps its input and
    blank new cells). With --estimate, print what the run would cost and stop (no model call). With
    --max-cost, a run whose estimate's low end costs more is refused up front (exit 4, no run
    directory). Bad input (no such file or column, a repeated key, an empty or too large
    file) exits 2 before any model call, leaving no run directory. A killed run is finished by
    `amapreduce runs resume RUN`, without redoing its finished batches.
    """
    from amapreduce.enrichment import EnrichRequest, parse_columns, read_list, run_enrichment
    from amapreduce.memory.schema import memory_store_for
    from amapreduce.session.parts import require_model
    from amapreduce.settings import load_settings

    if memory is not None and no_memory:
        raise typer.BadParameter("give either --memory STORE or --no-memory, not both")
    settings = load_settings(
        model=model, api_base=api_base, search_backend=search, workers=workers, max_cost_usd=max_cost,
        max_tokens=max_tokens, otel=otel or None, verify=verify, enrich_max_file_mb=max_file_mb,
        allow_web_crawl=allow_web_crawl or None,
        **opt.endpoint_overrides(model_timeout=model_timeout, solver=solver, tool_choice=tool_choice,
                                 structured_output=structured_output, message_content=message_content),
    )
    frame = read_list(input_file, max_mb=settings.enrich_max_file_mb)
    request = EnrichRequest.of(frame, parse_columns(columns), key_columns=key, instructions=instructions,
                               batch_size=batch_size, label=f"enrich-{input_file.stem}")
    decision = request.decision()  # a cell the template cannot take is refused here, before anything runs
    if estimate:
        _print_estimate(request, decision, settings, as_json=as_json)
        return
    require_model(settings)
    store = memory_store_for(False if no_memory else memory, settings.memory_store)
    typer.echo(_plan_line(request, len(decision.task_matrix)), err=True)
    done = run_enrichment(request, settings, memory_store=store, show_progress=None if not as_json else False)
    report_enrichment(done, as_json=as_json, out=out, evidence=evidence)


def _print_estimate(request: EnrichRequest, decision: Decision, settings: Settings, *, as_json: bool) -> None:
    """`enrich --estimate`: the decision's batch plan (as the run would plan it) multiplied out by
    the per-batch figures of past runs (`session.estimate`); nothing is called or made."""
    from amapreduce.mapreduce.batching import plan_batches
    from amapreduce.session.estimate import estimate_for

    forecast = estimate_for(settings, plan_batches(decision, max_batches=settings.batch_cap("user")), decision.template)
    if as_json:
        typer.echo(json.dumps({"rows": len(request.frame), "key_columns": list(request.key_columns),
                               "columns": list(request.columns), "batch_size": request.batch_size,
                               "estimate": forecast.to_json()}, ensure_ascii=False))
        return
    typer.echo(_plan_line(request, len(decision.task_matrix)), err=True)
    for line in forecast.lines():
        typer.echo(line)


def _plan_line(request: EnrichRequest, rows: int) -> str:
    """What is about to run: rows, the key (and whether it was inferred), the new columns, the batching."""
    keys = ", ".join(request.key_columns)
    how = (" (inferred: the first column whose values name every row once; --key chooses another)"
           if request.key_inferred else "")
    batches = -(-rows // request.batch_size)
    return (f"enrich: {rows} rows; key: {keys}{how}; adding: {', '.join(request.columns)}; "
            f"{batches} batches of up to {request.batch_size} rows.")


def report_enrichment(done: Enrichment, *, as_json: bool, out: Path | None = None, evidence: bool = False) -> None:
    """Hand a finished (or stopped) enrichment to the user: the enriched list to `out` (else CSV on
    stdout, unless `as_json`), the summary on stderr (or one JSON object), and the exit code of how
    the run ended. One output contract for `enrich` and `runs resume` of an `enrich` run."""
    from amapreduce.cli.exit_codes import exit_for_run
    from amapreduce.cli.output import usage_json

    outcome = done.outcome
    if out is not None:
        done.write(out, evidence=evidence)
    error = outcome.ending.error
    if as_json:
        typer.echo(json.dumps({**done.to_json(), "out": None if out is None else str(out), "usage": usage_json(outcome.meter),
                               "run_dir": str(outcome.run_dir.path), "status": outcome.status,
                               **({"error": error} if error else {})}, ensure_ascii=False))
    else:
        if out is None:
            typer.echo(done.frame(evidence=evidence).to_csv(index=False), nl=False)
        rows = done.rows()
        typer.echo(f"{len(done.request.frame)} rows: {rows['complete']} complete, {rows['partial']} partial, "
                   f"{rows['failed']} failed ({outcome.status}{f': {error}' if error else ''}); "
                   f"{outcome.meter.cost_text()}.{f' Enriched list: {out}.' if out is not None else ''} "
                   f"Run directory: {outcome.run_dir.path}", err=True)
    exit_for_run(outcome.ending.status)


def register(app: typer.Typer) -> None:
    """Add `enrich` to the root app."""
    app.command("enrich", epilog=EXIT_CODES_HELP)(enrich)
