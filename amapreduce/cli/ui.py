"""`amapreduce ui`: look at runs, tables, traces, memory and evaluations in a browser.

Only typer is imported at module level; Starlette, uvicorn and the pages load inside the
command (they are the optional `ui` extra).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register", "ui"]


def ui(
    runs_dir: Path | None = typer.Option(None, "--runs-dir", help="Folder of run directories (default: runs/)."),
    memory: Path | None = typer.Option(None, "--memory", metavar="STORE",
                                       help="Memory store folder (default: memory_store/default)."),
    evals: Annotated[list[Path] | None, typer.Option(
        "--eval", metavar="DIR", help="An `eval run --out` folder to show (repeatable).")] = None,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on. Anything but loopback needs --token."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="Port (0: any free port)."),
    token: str | None = typer.Option(None, "--token", envvar="AMAPREDUCE_UI_TOKEN", show_envvar=False,
                                     help="Token every request must carry (required off loopback; also read "
                                          "from AMAPREDUCE_UI_TOKEN). Open the UI once with ?token=TOKEN."),
) -> None:
    """Serve a browser view of runs, tables, batch timelines, the memory and evaluations.

    Pages: Runs (filter by status; running runs refresh), a Run (decision, batch plan, the table
    coloured by cell status with sources and conflicts, the batch timeline, usage and cost by
    role, downloads), Memory (hints, records, what the plan stage would retrieve; edit, remove
    and prune with a confirmation) and Evaluation (results.json, per-task scores, the report's
    plots, memory on vs off). Ctrl-C stops the server.
    """
    from amapreduce.errors import ConfigError
    from amapreduce.settings import load_settings

    try:
        import uvicorn  # noqa: F401  (checked here: the server loads it only when it starts)

        from amapreduce.ui import UIConfig, serve
    except ImportError as exc:
        raise ConfigError(f"`amapreduce ui` needs the ui extra ({exc.name} is missing): "
                          "pip install 'amapreduce[ui]'.") from None
    settings = load_settings()
    config = UIConfig(runs_dir=(runs_dir or settings.runs_dir).resolve(),
                      memory=(memory or settings.memory_store).resolve(),
                      evals=tuple(p.resolve() for p in evals or ()), host=host, port=port, token=token or None,
                      plot_dir=(settings.cache_dir / "ui-plots").resolve())
    serve(config, announce=lambda line: typer.echo(line, err=True))


def register(app: typer.Typer) -> None:
    """Add `ui` to the root command."""
    app.command("ui")(ui)
