"""The README stays short and true, and the documentation site stays whole.

* The README is read in five minutes: at most 250 lines.
* Its Quick start has exactly two set-up commands: the main job and the tests. The test command is
  the one `.ci/run` runs (and a failure anywhere in it stops CI before the docs build), and every `amapreduce` command the Quick start shows is run here, offline,
  as a newcomer runs it (a fresh folder, no `AMAPREDUCE_*` variable). A command elsewhere in the
  README (the real-model example needs a key) is parsed by the CLI instead: its sub-command exists,
  its `--help` lists every flag it uses, and the parser accepts its arguments.
* Every relative link of the README names a file that exists.
* Every guide the docs promise exists and is in `mkdocs.yml`'s nav, as is every other page; the CLI
  reference (rendered by `docs/hooks/cli_help.py`) has a section for every command. The site itself
  is built by CI with `mkdocs build --strict` after the tests (a broken link or page fails CI there).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer.main
import yaml

from amapreduce.cli.app import app

MAX_README_LINES = 250
GUIDES = (
    "ask",
    "decisions",
    "discovery",
    "evaluation",
    "memory",
    "tracing",
    "mcp",
    "ray",
    "ui",
    "python-api",
    "search",
    "benchmarks",
)
OTHER_PAGES = (
    "index.md",
    "reference/python.md",
    "reference/cli.md",
    "architecture.md",
    "dependencies.md",
    "scaling.md",
    "scorer-rules.md",
    "reference-audit.md",
)
SETUP = "python3 -m venv .venv && "
CLI_PREFIX = ".venv/bin/amapreduce "
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _readme(repo_root: Path) -> str:
    return (repo_root / "README.md").read_text(encoding="utf-8")


def _section(markdown: str, heading: str) -> str:
    """The text under `## heading`, up to the next `## ` heading."""
    assert f"\n## {heading}\n" in markdown, f"no '## {heading}' section"
    return markdown.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def _bash_lines(markdown: str) -> list[str]:
    """The lines of every ```bash block, comments and blank lines left out."""
    blocks = re.findall(r"^```bash\n(.*?)^```$", markdown, re.MULTILINE | re.DOTALL)
    return [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def _amapreduce_commands(lines: list[str]) -> list[list[str]]:
    """The arguments of every `.venv/bin/amapreduce ...` command in these lines (`&&` chains split)."""
    found = []
    for line in lines:
        for part in line.split(" && "):
            part = part.strip()
            if part.startswith(CLI_PREFIX):
                found.append(shlex.split(part.removeprefix(CLI_PREFIX), comments=True))
    return found


def _resolve(args: list[str]) -> tuple[Any, list[str], list[str]]:
    """The command the arguments name, its path (`["memory", "add"]`) and the arguments left."""
    command = typer.main.get_command(app)
    path: list[str] = []
    rest = list(args)
    while rest and hasattr(command, "commands") and rest[0] in command.commands:
        path.append(rest[0])
        command = command.commands[rest.pop(0)]
    return command, path, rest


def _entry_point(repo_root: Path) -> list[str]:
    """`amapreduce` as its console script runs it (`[project.scripts]`), with this interpreter."""
    scripts = tomllib.loads((repo_root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    module, function = scripts["amapreduce"].split(":")
    return [
        sys.executable,
        "-c",
        f"import sys; sys.argv[0] = 'amapreduce'; from {module} import {function}; {function}()",
    ]


def _fresh_env(repo_root: Path) -> dict[str, str]:
    """The environment of a newcomer's shell: no AMAPREDUCE_* setting, this checkout's package."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(repo_root), *filter(None, [env.get("PYTHONPATH")])])
    return env


# --- (a) short ------------------------------------------------------------------------------------


def test_the_readme_is_read_in_five_minutes(repo_root: Path) -> None:
    lines = _readme(repo_root).splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


# --- (b) the Quick start: two set-up commands, the tests are CI's, the main job runs -------------


def test_the_quick_start_has_exactly_the_two_setup_commands(repo_root: Path) -> None:
    lines = _bash_lines(_section(_readme(repo_root), "Quick start"))
    assert len(lines) == 2, lines
    main_job, tests = lines
    assert main_job == "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/amapreduce demo"
    assert tests == 'python3 -m venv .venv && .venv/bin/pip install -e ".[dev]" && .venv/bin/python -m pytest'
    assert all(line.startswith(SETUP) for line in lines)


def test_the_test_command_is_what_ci_runs_and_ci_then_builds_the_docs(repo_root: Path) -> None:
    tests = _bash_lines(_section(_readme(repo_root), "Quick start"))[1]
    ci = (repo_root / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "set -euo pipefail" in ci
    assert [line for line in ci if "pytest" in line and not line.startswith("#")] == [tests]
    docs_build = ".venv/bin/mkdocs build --strict --site-dir site"
    assert docs_build in ci and ci.index(docs_build) > ci.index(tests)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash, as .ci/run does")
@pytest.mark.parametrize(
    ("test_command", "fails"),
    [("false && true && true", True), ("true && true && false", True), ("true && true && true", False)],
)
def test_ci_stops_before_the_docs_when_any_part_of_the_test_command_fails(
    repo_root: Path, test_command: str, fails: bool
) -> None:
    """`set -e` ignores a failure before the last command of an `&&` list (a failed pip install):
    the lines of `.ci/run` between the test command and the docs build must stop the script then."""
    tests = _bash_lines(_section(_readme(repo_root), "Quick start"))[1]
    ci = (repo_root / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    between = ci[ci.index(tests) + 1 : ci.index(".venv/bin/mkdocs build --strict --site-dir site")]
    script = "\n".join(["set -euo pipefail", test_command, *between, "echo docs-built"])
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, check=False)
    assert (done.returncode != 0, "docs-built" in done.stdout) == (fails, not fails)


@pytest.mark.slow
def test_every_amapreduce_command_of_the_quick_start_runs_offline(repo_root: Path, tmp_path: Path) -> None:
    """The main job as a newcomer runs it: a fresh folder, no settings, no key, no network."""
    commands = _amapreduce_commands(_bash_lines(_section(_readme(repo_root), "Quick start")))
    assert commands == [["demo"]]
    for args in commands:
        done = subprocess.run(
            [*_entry_point(repo_root), *args],
            cwd=tmp_path,
            env=_fresh_env(repo_root),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        table = [line for line in done.stdout.splitlines() if line.startswith("|") and line.endswith("|")]
        assert len(table) >= 3 and re.fullmatch(r"\|( --- \|)+", table[1]), done.stdout[-2000:]
        assert "(complete)" in done.stdout


def test_the_other_readme_commands_are_accepted_by_the_cli(repo_root: Path) -> None:
    """Commands that need a key or a network are not run: the CLI must know each sub-command and
    flag they use (its own `--help` lists them) and its parser must accept their arguments."""
    readme = _readme(repo_root)
    quick_start = _section(readme, "Quick start")
    commands = _amapreduce_commands(_bash_lines(readme.replace(quick_start, "")))
    assert any(args[:1] == ["ask"] and "--model" in args for args in commands)  # the real-model example
    for args in commands:
        command, path, rest = _resolve(args)
        assert path, f"not a sub-command: {args}"
        ctx = command.make_context("amapreduce " + " ".join(path), [], resilient_parsing=True)
        command.rich_markup_mode = None
        help_text = ctx.get_help()
        for flag in (a.split("=", 1)[0] for a in rest if a.startswith("--")):
            assert flag in help_text.split(), f"`amapreduce {' '.join(path)} --help` does not list {flag}"
        command.make_context("amapreduce " + " ".join(path), rest)  # raises on what the parser refuses


# --- (c) links ------------------------------------------------------------------------------------


def test_every_relative_link_of_the_readme_names_a_file(repo_root: Path) -> None:
    links = [
        link
        for link in LINK.findall(_readme(repo_root))
        if not re.match(r"[a-z]+:", link) and not link.startswith("#")
    ]
    assert len(links) >= len(GUIDES)
    missing = [link for link in links if not (repo_root / link.split("#", 1)[0]).is_file()]
    assert missing == []


def test_the_readme_links_every_guide(repo_root: Path) -> None:
    links = set(LINK.findall(_readme(repo_root)))
    assert [g for g in GUIDES if f"docs/guides/{g}.md" not in links] == []


# --- (d) the site: guides in the nav, the CLI reference whole, a strict build -------------------


def _nav_pages(repo_root: Path) -> list[str]:
    config = yaml.safe_load((repo_root / "mkdocs.yml").read_text(encoding="utf-8"))
    pages: list[str] = []

    def walk(entry: Any) -> None:
        if isinstance(entry, str):
            pages.append(entry)
        elif isinstance(entry, list):
            for item in entry:
                walk(item)
        elif isinstance(entry, dict):
            for value in entry.values():
                walk(value)

    walk(config["nav"])
    return pages


def test_every_guide_exists_and_is_in_the_nav(repo_root: Path) -> None:
    nav = _nav_pages(repo_root)
    for page in [f"guides/{g}.md" for g in GUIDES] + list(OTHER_PAGES):
        assert (repo_root / "docs" / page).is_file(), page
        assert page in nav, f"{page} is not in mkdocs.yml's nav"
    assert len(nav) == len(set(nav))


def test_every_page_under_docs_is_in_the_nav(repo_root: Path) -> None:
    docs = repo_root / "docs"
    pages = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md") if "hooks" not in p.parts}
    assert sorted(pages - set(_nav_pages(repo_root))) == []


def _hook(repo_root: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("cli_help", repo_root / "docs" / "hooks" / "cli_help.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_has_every_command_and_sub_command(repo_root: Path) -> None:
    def paths(command: Any, prefix: str) -> list[str]:
        subs = getattr(command, "commands", {})
        return [prefix] + [
            p for name, sub in subs.items() if not sub.hidden for p in paths(sub, f"{prefix} {name}")
        ]

    expected = paths(typer.main.get_command(app), "amapreduce")
    assert {
        "amapreduce ask",
        "amapreduce demo",
        "amapreduce memory add",
        "amapreduce runs resume",
        "amapreduce eval run",
        "amapreduce corpus index",
    } <= set(expected)
    rendered = _hook(repo_root).render()
    headings = re.findall(r"^#{2,4} `([^`]+)`$", rendered, re.MULTILINE)
    assert headings == expected
    assert "Exit codes: 0 complete; 3 incomplete" in " ".join(rendered.split())  # the epilogs are kept
    page = (repo_root / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert _hook(repo_root).MARKER in page
