"""How the command line's `--help` renders: every typer app of the CLI is an `App`.

Why: typer's Rich help reads every help text as Rich markup, so `pip install 'amapreduce[otel]'`
printed `pip install 'amapreduce'` (`[otel]` is a style tag to Rich), and it shows each option's
type in a column of its own, so a flag such as `--json` read `--json <bool>` as if it took a
value. The help texts are written as plain text (the docs' CLI reference prints them with no
markup), so in Rich's layout they are escaped while the help is drawn, and a flag's value column is
empty. Only typer is imported here: `amapreduce --help` must stay fast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer
import typer.core
from typer._click import Command, Context, HelpFormatter, Parameter
from typer.models import CommandFunctionType

__all__ = ["App", "HelpCommand", "HelpGroup"]


def _flags_take_no_value(params: list[Parameter]) -> list[Parameter]:
    """`params` with every flag's metavar set to "" (the Rich layout then shows no type for it)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


@contextmanager
def _markup_escaped(texts: list[tuple[Any, str]]) -> Iterator[None]:
    """Each `(object, attribute)` text escaped as Rich markup for the block, then restored."""
    from rich.markup import escape

    saved = [(obj, attr, getattr(obj, attr)) for obj, attr in texts]
    try:
        for obj, attr, value in saved:
            if isinstance(value, str):
                setattr(obj, attr, escape(value))
        yield
    finally:
        for obj, attr, value in saved:
            setattr(obj, attr, value)


def _texts(command: Command, ctx: Context) -> list[tuple[Any, str]]:
    """The help texts `command`'s help shows: its own, its parameters', its sub-commands' summaries."""
    texts: list[tuple[Any, str]] = [(command, "help"), (command, "short_help"), (command, "epilog")]
    texts += [(param, "help") for param in command.get_params(ctx) if hasattr(param, "help")]
    for sub in getattr(command, "commands", {}).values():
        texts += [(sub, "help"), (sub, "short_help")]
    return texts


def _format_help(command: typer.core.TyperCommand | typer.core.TyperGroup, ctx: Context,
                 formatter: HelpFormatter, draw: Any) -> None:
    if typer.core.HAS_RICH and command.rich_markup_mode == "rich":
        with _markup_escaped(_texts(command, ctx)):
            draw(ctx, formatter)
    else:
        draw(ctx, formatter)


class HelpCommand(typer.core.TyperCommand):
    """A command whose help shows its texts verbatim and its flags with no value."""

    def get_params(self, ctx: Context) -> list[Parameter]:
        return _flags_take_no_value(super().get_params(ctx))

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        _format_help(self, ctx, formatter, super().format_help)


class HelpGroup(typer.core.TyperGroup):
    """A group whose help shows its texts verbatim and its flags with no value."""

    def get_params(self, ctx: Context) -> list[Parameter]:
        return _flags_take_no_value(super().get_params(ctx))

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        _format_help(self, ctx, formatter, super().format_help)


class App(typer.Typer):
    """A typer app whose groups are `HelpGroup`s and whose commands are `HelpCommand`s."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cls", HelpGroup)
        kwargs.setdefault("add_completion", False)
        kwargs.setdefault("no_args_is_help", True)
        super().__init__(**kwargs)

    def command(self, name: str | None = None, **kwargs: Any) -> Callable[[CommandFunctionType], CommandFunctionType]:
        kwargs.setdefault("cls", HelpCommand)
        return super().command(name, **kwargs)
