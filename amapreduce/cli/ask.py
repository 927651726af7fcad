"""`amapreduce ask` and `amapreduce runs`: answer a question; inspect past runs."""

from __future__ import annotations

import json
from pathlib import Path

import typer

__all__ = ["register", "runs_app"]

runs_app = typer.Typer(no_args_is_help=True, add_completion=False)


def _memory_store(memory: Path | None, no_memory: bool, default: Path) -> Path | None:
    """`--memory` wins; `--no-memory` disables; otherwise the default store if it holds one."""
    if no_memory:
        return None
    if memory is not None:
        return memory
    from amapreduce.memory.schema import DB_NAME

    return default if (default / DB_NAME).is_file() else None


def ask(
    query: str = typer.Argument(..., help="The wide-search question."),
    model: str | None = typer.Option(None, "--model", help="LiteLLM id (openai/gpt-5-mini) or the server's model name."),
    api_base: str | None = typer.Option(None, "--api-base", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1."),
    search: str | None = typer.Option(None, "--search", help="ddgs | searxng:URL | serper | tavily | corpus:INDEX"),
    workers: int | None = typer.Option(None, "--workers", min=1, help="Sub-agents running at once."),
    memory: Path | None = typer.Option(None, "--memory", help="Experiential-memory store for the plan stage."),
    no_memory: bool = typer.Option(False, "--no-memory", help="Run without experiential memory."),
    out: Path | None = typer.Option(None, "--out", help="Also write the markdown table here."),
    csv_out: Path | None = typer.Option(None, "--csv", help="Also write the table as CSV here."),
    max_cost: float | None = typer.Option(None, "--max-cost", help=(
        "Stop after spending this many dollars. Models with no known price (a local vLLM or llama.cpp model) count "
        "as $0: price them in the JSON file named by AMAPREDUCE_PRICES_FILE, or use --max-tokens.")),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="Stop after this many tokens."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object on stdout."),
) -> None:
    """Answer a wide-search question with a table (manager + parallel search sub-agents)."""
    from amapreduce.cli.output import usage_json, write_table_copies
    from amapreduce.run.ask import run_ask
    from amapreduce.run.wiring import require_model
    from amapreduce.settings import load_settings

    if memory is not None and no_memory:
        raise typer.BadParameter("give either --memory STORE or --no-memory, not both")
    settings = load_settings(
        model=model, api_base=api_base, search_backend=search, workers=workers, max_cost_usd=max_cost, max_tokens=max_tokens
    )
    require_model(settings)
    outcome = run_ask(
        query, settings, memory_store=_memory_store(memory, no_memory, settings.memory_store),
        show_progress=None if not as_json else False,
    )
    write_table_copies(outcome.table, outcome.markdown, out=out, csv_out=csv_out)
    completeness = outcome.record["completeness"]
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "query": query,
                    "status": outcome.status,
                    "rows": completeness["rows"],
                    "missing_cells": completeness["missing_cells"],
                    "completeness": completeness,
                    "table_markdown": outcome.markdown,
                    "usage": usage_json(outcome.meter),
                    "run_dir": str(outcome.run_dir.path),
                },
                ensure_ascii=False,
            )
        )
    else:
        typer.echo(outcome.markdown)
        typer.echo(
            f"{completeness['rows']} rows, {completeness['missing_cells']} missing cells ({outcome.status}); "
            f"${outcome.meter.total().cost_usd:.4f}. Run directory: {outcome.run_dir.path}",
            err=True,
        )
    if outcome.ending.status.ended_early:
        raise typer.Exit(1)


@runs_app.command("list")
def runs_list(
    runs_dir: Path | None = typer.Option(None, "--runs-dir", help="Folder of run directories (default: runs/)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list."),
) -> None:
    """List past runs, newest first."""
    from amapreduce.run.rundir import list_runs
    from amapreduce.settings import load_settings

    rows = list_runs(runs_dir or load_settings().runs_dir)
    if as_json:
        typer.echo(json.dumps(rows, ensure_ascii=False))
        return
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
    for header in ("kind", "rows", "missing", "cost $", "status", "query"):
        table.add_column(header, overflow="fold")
    for r in rows:
        # Text, not str: a query such as "see [/x]" is user text, never rich markup.
        cells = [cell(r, k) for k in ("run", "kind", "rows", "missing_cells", "cost_usd", "status")]
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
            f"${cell(r, 'cost_usd')}" if cell(r, "cost_usd") else "",
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
    as_json: bool = typer.Option(False, "--json", help="Print the run's result.json."),
) -> None:
    """Show one run: status, completeness, usage and the table."""
    from amapreduce.run.rundir import load_run
    from amapreduce.settings import load_settings

    data = load_run(runs_dir or load_settings().runs_dir, run)
    if as_json:
        typer.echo(json.dumps(data, ensure_ascii=False))
        return
    folder = Path(data["run_dir"])
    typer.echo(f"{data.get('kind')}: {data.get('query')}\nstatus: {data.get('status')}")
    if data.get("error"):
        typer.echo(f"error: {data['error']}")
    typer.echo(f"completeness: {json.dumps(data.get('completeness'))}")
    typer.echo(f"usage: {json.dumps((data.get('usage') or {}).get('total'))}")
    table = folder / "table.md"
    if table.is_file():
        typer.echo(table.read_text(encoding="utf-8"))


def register(app: typer.Typer) -> None:
    """Add `ask` and the `runs` group to the root app."""
    app.command("ask")(ask)
    app.add_typer(runs_app, name="runs", help="List and inspect run directories.")
