"""MkDocs hook: `docs/reference/cli.md` is the CLI's own `--help`, rendered at build time.

The page holds one marker line, `<!-- cli-help -->`; this hook replaces it with a section per
command and sub-command of `amapreduce` (every one the command tree has, hidden ones aside), each
holding exactly the text `amapreduce ... --help` prints with `TYPER_USE_RICH=0` (typer's plain
layout: no Rich panels), at a fixed width so the page does not depend on the terminal. The help
comes from the checkout being documented: the repository root goes first on `sys.path`.

Why a hook and not a plugin (checked against typer 0.29, which vendors its own click as
`typer._click`):

* mkdocs-typer2 0.4.1, native engine: fails on this typer (`TyperOption` has no `.type`).
  Its legacy engine runs a `typer` executable found on `PATH`, which `.venv/bin/mkdocs` does not
  put there, and renders an empty section, with no warning, when that command exits non-zero.
* mkdocs-click 0.9.0: needs a click command object in a module (`amapreduce.cli.app` has the
  typer app) and leaves out the epilogs, where the exit codes are.

This hook needs neither, shows the epilogs, and any error fails the build (`--strict` or not).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MARKER = "<!-- cli-help -->"
PAGE = "reference/cli.md"
WIDTH = 88  # characters per line of help text: fits a code block of the Material theme


def _commands(command: Any, ctx: Any) -> Iterator[tuple[str, Any]]:
    """(`amapreduce memory add`, its context) for the command and every sub-command, depth first,
    in the order `--help` lists them."""
    yield ctx.command_path, ctx
    for name in command.list_commands(ctx) if hasattr(command, "list_commands") else ():
        sub = command.get_command(ctx, name)
        if sub is None or sub.hidden:
            continue
        yield from _commands(sub, sub.make_context(name, [], parent=ctx, resilient_parsing=True))


def _plain_help(ctx: Any) -> str:
    """The command's `--help` as `TYPER_USE_RICH=0` prints it (typer reads that variable once, at
    import, so this sets the same switch on the command: no Rich markup mode)."""
    ctx.command.rich_markup_mode = None
    return str(ctx.get_help()).rstrip()


def render(root: Path | None = None) -> str:
    """The markdown of every command's help, one `##`/`###` section each."""
    if root is not None and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import typer.main

    from amapreduce.cli.app import app

    command = typer.main.get_command(app)
    top = command.make_context(
        "amapreduce", [], resilient_parsing=True, terminal_width=WIDTH, max_content_width=WIDTH
    )
    parts = []
    for path, ctx in _commands(command, top):
        depth = len(path.split())
        heading = "#" * min(depth + 1, 4)
        parts.append(f"{heading} `{path}`\n\n```text\n$ {path} --help\n{_plain_help(ctx)}\n```\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the marker of the CLI page with the rendered help; refuse a CLI page without one."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"{PAGE} has no {MARKER} line: the CLI reference would be empty")
    return markdown.replace(MARKER, render(Path(config.config_file_path).resolve().parent))
