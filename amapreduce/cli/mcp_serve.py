"""`amapreduce mcp serve`: amapreduce's tools for MCP clients (Claude Desktop, IDEs, other agents).

Only typer is imported at module level; the SDK loads inside the command (`mcp_server`).
"""

from __future__ import annotations

from pathlib import Path

import typer

from amapreduce.cli import options as opt
from amapreduce.cli.help import App

__all__ = ["app"]

app = App()


@app.command("serve")
def serve(
    http: bool = typer.Option(False, "--http", help="Serve streamable HTTP on 127.0.0.1 (loopback only) instead of stdio."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="With --http: the port (http://127.0.0.1:PORT/mcp)."),
    model: opt.ModelOpt = None,
    api_base: opt.ApiBaseOpt = None,
    search: opt.SearchOpt = None,
    allow_web_crawl: opt.AllowWebCrawlOpt = False,
    workers: opt.WorkersOpt = None,
    memory: opt.MemoryOpt = None,
    no_memory: opt.NoMemoryOpt = False,
    max_cost: float | None = typer.Option(None, "--max-cost", help="Stop each run after spending this many dollars."),
    max_tokens: opt.MaxTokensOpt = None,
    runs_dir: Path | None = typer.Option(None, "--runs-dir", help=(
        "Where runs are made and read by id (default: AMAPREDUCE_RUNS_DIR, else runs/).")),
) -> None:
    """Serve wide_search, enrich, plan, run_status and run_table to an MCP client (stdio by default).

    Every run gets these options, as `amapreduce ask` does; a run id is its folder's name under the runs folder.
    Stdio carries only JSON-RPC (logs go to stderr). A client's config (Claude Desktop):
    {"mcpServers": {"amapreduce": {"command": "amapreduce", "args": ["mcp", "serve", "--model", "openai/gpt-5-mini"]}}}
    """
    from amapreduce.mcp_server import ServerOptions
    from amapreduce.mcp_server import serve as run_server
    from amapreduce.session.parts import require_model

    if memory is not None and no_memory:
        raise typer.BadParameter("give either --memory STORE or --no-memory, not both")
    options = ServerOptions(model=model, api_base=api_base, search=search, workers=workers,
                            memory=False if no_memory else memory, max_cost=max_cost, max_tokens=max_tokens,
                            runs_dir=runs_dir, allow_web_crawl=allow_web_crawl or None)
    require_model(options.settings())  # no model: exit 2 now, not an error on every call
    run_server(options, http=http, port=port)
