"""What a new user meets first: `python -m amapreduce`, shell completion, and help that shows
what the source says (issue 25, build point 4).

Typer draws `--help` with Rich, which reads help texts as markup: `pip install 'amapreduce[otel]'`
once printed as `pip install 'amapreduce'`, and every flag showed `<bool>` as if it took a value.
The help of every command in the tree is rendered here and compared with its source strings.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
import typer.rich_utils

from amapreduce._version import __version__
from amapreduce.cli.app import app, main

REPO = Path(__file__).resolve().parents[1]
BOX = re.compile(r"[\u2500-\u257f]")  # Rich's panel borders
BRACKETED = re.compile(r"\[[^\[\]]*\]")


def python_m(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m amapreduce ARGS` with this checkout first on the path."""
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               **(env or {})}
    return subprocess.run([sys.executable, "-m", "amapreduce", *args], capture_output=True, text=True,
                          env=environ, cwd=REPO, timeout=120, check=False)


def test_python_m_amapreduce_is_the_command_line() -> None:
    helped = python_m("--help")
    assert helped.returncode == 0, helped.stderr
    assert "Usage: amapreduce" in helped.stdout and "mapreduce" in helped.stdout
    versioned = python_m("--version")
    assert versioned.returncode == 0 and versioned.stdout.strip() == f"amapreduce {__version__}"
    wrong = python_m("no-such-command")
    assert wrong.returncode == 2 and "No such command" in wrong.stderr


def test_show_completion_prints_a_script_that_completes_commands_and_flags() -> None:
    shown = python_m("--show-completion", "bash", env={"SHELL": "/bin/bash"})
    assert shown.returncode == 0, shown.stderr
    assert "_AMAPREDUCE_COMPLETE=complete_bash" in shown.stdout and "complete -o default" in shown.stdout
    # What the script asks the program for, as bash would when the user types `amapreduce mem<TAB>`.
    command = python_m(env={"_AMAPREDUCE_COMPLETE": "complete_bash", "COMP_WORDS": "amapreduce mem", "COMP_CWORD": "1"})
    assert command.returncode == 0 and command.stdout.split() == ["memory"]
    flag = python_m(env={"_AMAPREDUCE_COMPLETE": "complete_bash", "COMP_WORDS": "amapreduce ask --js",
                         "COMP_CWORD": "2"})
    assert flag.returncode == 0 and flag.stdout.split() == ["--json"]


def test_the_root_help_offers_completion(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--install-completion" in out and "--show-completion" in out


def commands(command: Any, ctx: Any) -> Iterator[tuple[list[str], Any]]:
    """(`["memory", "add"]`, the click command) for the root and every sub-command, depth first."""
    yield ctx.command_path.split()[1:], ctx.command
    for name in getattr(command, "list_commands", lambda ctx: [])(ctx):
        sub = command.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            yield from commands(sub, sub.make_context(name, [], parent=ctx, resilient_parsing=True))


def every_command() -> list[tuple[list[str], Any]]:
    root = typer.main.get_command(app)
    return list(commands(root, root.make_context("amapreduce", [], resilient_parsing=True)))


def source_texts(command: Any) -> list[str]:
    """The help strings as the source declares them: the command's help, epilog and every option's."""
    ctx = command.make_context(command.name or "amapreduce", [], resilient_parsing=True)
    texts = [command.help, command.epilog, *(getattr(p, "help", None) for p in command.get_params(ctx))]
    return [text.split("\f")[0] for text in texts if text]


def flat(text: str) -> str:
    return " ".join(BOX.sub(" ", text).split())


def rendered_help(path: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main([*path, "--help"]) == 0
    return capsys.readouterr().out


@pytest.fixture
def wide_plain_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich's layout, wide enough that no help text wraps, without colour codes."""
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 2000)
    monkeypatch.setattr(typer.rich_utils, "FORCE_TERMINAL", False)


def test_the_tree_walk_sees_every_command() -> None:
    paths = {" ".join(path) for path, _command in every_command()}
    assert {"", "ask", "mapreduce run", "eval run", "memory add", "corpus index", "runs list"} <= paths
    assert len(paths) > 30


@pytest.mark.usefixtures("wide_plain_rich")
def test_every_help_shows_its_source_strings_without_markup_loss(capsys: pytest.CaptureFixture[str]) -> None:
    lost: list[str] = []
    bracketed = 0
    for path, command in every_command():
        shown = flat(rendered_help(path, capsys))
        for text in source_texts(command):
            bracketed += len(BRACKETED.findall(text))
            lost += [f"{' '.join(['amapreduce', *path])}: {part!r}"
                     for part in [*BRACKETED.findall(text), text] if flat(part) not in shown]
    assert lost == [], "help text lost in rendering:\n" + "\n".join(lost)
    assert bracketed >= 2  # the extras of --otel and --executor at least: the check has something to check


@pytest.mark.usefixtures("wide_plain_rich")
def test_the_extras_and_flags_read_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    shown = flat(rendered_help(["ask"], capsys))
    assert "pip install 'amapreduce[otel]'" in shown and "pip install 'amapreduce[ray]'" in shown
    assert re.search(r"--json Print exactly one JSON object", shown)  # a flag: no value between
    assert re.search(r"--workers <?N\|auto>?", shown)  # an option that takes a value still shows it
    assert "--max-tokens <int>" in shown  # ... and its type
    for path, _command in every_command():
        assert "<bool>" not in rendered_help(path, capsys), path


def test_the_plain_layout_keeps_the_extras_too() -> None:
    """The docs' CLI reference prints the help with typer's plain layout (no Rich markup)."""
    root = typer.main.get_command(app)
    ask = root.get_command(root.make_context("amapreduce", [], resilient_parsing=True), "ask")
    assert ask is not None
    ask.rich_markup_mode = None  # type: ignore[attr-defined]
    text = flat(ask.make_context("ask", [], resilient_parsing=True).get_help())
    assert "pip install 'amapreduce[otel]'" in text and "--json Print exactly one JSON object" in text
