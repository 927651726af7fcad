"""The `amapreduce` command line: one typer app, sub-commands registered from small modules.

Why this shape: `main(argv) -> int` is testable without a subprocess, and every sub-command
module imports only typer at module level (heavy libraries load inside the command body), so
`amapreduce --help` answers fast.
"""

from __future__ import annotations

import importlib
import logging
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import typer
import typer.main

from amapreduce._version import __version__
from amapreduce.cli.exit_codes import (
    EXIT_BUDGET,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    ROOT_EXIT_CODES_HELP,
)
from amapreduce.cli.help import App
from amapreduce.errors import (
    AmapreduceError,
    EstimateOverBudget,
    RunError,
    StorageError,
    UserError,
    storage_error,
)

__all__ = ["app", "main", "run"]

# (module, attribute, command name, help). Each module exposes a typer app (a group) or, when
# the name is None, a `register(app)` function that adds top-level commands.
_SUBCOMMANDS: tuple[tuple[str, str, str | None, str], ...] = (
    ("amapreduce.cli.ask", "register", None, "Answer questions and inspect runs."),
    ("amapreduce.cli.mapreduce", "app", "mapreduce", "Validate, plan and run MapReduce decisions."),
    ("amapreduce.cli.enrich", "register", None, "Enrich a list you already have."),
    ("amapreduce.cli.eval", "app", "eval", "Run benchmarks end to end (the memory learns), score answers like the official scorers, report."),
    ("amapreduce.cli.memory", "app", "memory", "Inspect, search, prune, distil and teach the experiential memory."),
    ("amapreduce.cli.web", "register", None, "Search, crawl, cache and corpus commands."),
    ("amapreduce.cli.demo", "register", None, "Run the whole pipeline offline with a simulated model."),
    ("amapreduce.cli.ui", "register", None, "Look at runs, tables, traces, memory and evaluations in a browser."),
    ("amapreduce.cli.mcp_serve", "app", "mcp", "Serve wide search to MCP clients (Claude Desktop, IDEs, agents)."),
)

app = App(
    name="amapreduce",
    help="Agentic MapReduce for wide search: questions whose answer is a table over many entities.",
    epilog=ROOT_EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (typer's; shellingham loads only then)
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"amapreduce {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Agentic MapReduce for wide search."""


def _register() -> None:
    for module_name, attr, name, help_text in _SUBCOMMANDS:
        module = importlib.import_module(module_name)
        target = getattr(module, attr)
        if name is None:
            target(app)
        else:
            app.add_typer(target, name=name, help=help_text)


_register()


def _one_line(exc: BaseException) -> str:
    """The error message on one line.

    Why: messages quote user and model text (field names, paths, cell values) that may hold
    newlines, and the contract is one line on stderr, which scripts read with `head -1`.
    """
    return " ".join(str(exc).split())


class _StderrHandler(logging.Handler):
    """Our warnings on the current `sys.stderr`, the message alone (as Python's last resort shows them)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging's own contract: a handler never raises
            self.handleError(record)


@contextmanager
def _warnings_on_stderr() -> Iterator[None]:
    """The package's warnings reach stderr while a command runs (the package itself has a
    NullHandler: the Python API prints nothing)."""
    logger = logging.getLogger("amapreduce")
    handler = _StderrHandler()
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI with `argv` (default: `sys.argv[1:]`) and return the exit code.

    Errors are translated here, at the boundary: a `UserError` or a usage mistake prints one
    line to stderr and returns 2; a fan-out refused for its estimate's cost (`EstimateOverBudget`)
    returns 4; a `RunError` returns 1; Ctrl-C returns 130. An `OSError` or a
    `sqlite3.Error` that reaches here (a full disk, an I/O error, a path without permission) is one
    line too, naming the path and what to do (`errors.storage_error`): 2 when the path itself
    cannot be used, else 1. A run command that
    finished ends with the code of how its run ended (`cli.exit_codes`). No traceback is shown
    for errors we raise on purpose.
    """
    command = typer.main.get_command(app)
    args = sys.argv[1:] if argv is None else argv
    try:
        with _warnings_on_stderr():
            result = command.main(args=args, prog_name="amapreduce", standalone_mode=False)
    except typer.Exit as exc:
        return int(getattr(exc, "exit_code", getattr(exc, "code", 0)) or 0)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("Interrupted.", err=True)
        return EXIT_INTERRUPTED
    except typer.TyperException as exc:  # usage errors from typer's bundled click
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        else:
            typer.echo(f"error: {exc}", err=True)
        return int(getattr(exc, "exit_code", EXIT_USAGE))
    except UserError as exc:
        typer.echo(f"error: {_one_line(exc)}", err=True)
        return EXIT_USAGE
    except StorageError as exc:
        typer.echo(f"error: {_one_line(exc)}", err=True)
        return EXIT_USAGE if exc.usage else EXIT_FAILED
    except EstimateOverBudget as exc:  # refused in pre-flight: the estimate is over --max-cost, nothing was made
        typer.echo(f"error: {_one_line(exc)}", err=True)
        return EXIT_BUDGET
    except (RunError, AmapreduceError) as exc:
        typer.echo(f"error: {_one_line(exc)}", err=True)
        return EXIT_FAILED
    except OSError as exc:  # a write or read the machine refused (disk full, I/O error, permissions)
        translated = storage_error(exc)
        typer.echo(f"error: {_one_line(translated)}", err=True)
        return EXIT_USAGE if translated.usage else EXIT_FAILED
    except sqlite3.Error as exc:  # a SQLite file outside the memory store's own translation
        typer.echo(f"error: SQLite failed: {_one_line(exc)}. If the disk is full or failing, free space or check "
                   "the device, then run the command again.", err=True)
        return EXIT_FAILED
    return int(result) if isinstance(result, int) else EXIT_OK


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
