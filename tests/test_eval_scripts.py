"""The evaluation scripts in `eval/` are what a user runs: each is valid bash, every `amapreduce`
flag it passes is one the command accepts, and the offline one runs end to end."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from amapreduce.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "eval").glob("*.sh"))


def _commands(script: Path) -> list[list[str]]:
    """Each `"$AMAPREDUCE" sub sub --flag ...` line of `script` (continuations joined), as words."""
    text = re.sub(r"\\\n\s*", " ", script.read_text(encoding="utf-8"))
    found = []
    for line in text.splitlines():
        if '"$AMAPREDUCE"' in line:
            words = shlex.split(line.split('"$AMAPREDUCE"', 1)[1].replace('"${flags[@]}"', "").replace(
                '"${extra[@]}"', ""), comments=True)
            found.append(words)
    return found


def _flags_of(script: Path) -> set[str]:
    """Every `--flag` the script gives, in its command lines or its `flags=(...)` arrays."""
    text = script.read_text(encoding="utf-8")
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))))


def _help(words: list[str]) -> str:
    from typer.testing import CliRunner

    path = [w for w in words if not w.startswith("-") and not w.startswith("$")][:2]
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    return result.output


def test_there_are_scripts_and_each_is_valid_bash() -> None:
    assert {s.name for s in SCRIPTS} >= {"sandbox.sh", "benchmark.sh", "gold_ceiling.sh"}
    for script in SCRIPTS:
        subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_flag_a_script_passes_is_accepted(script: Path) -> None:
    commands = _commands(script)
    assert commands, f"{script.name} runs no amapreduce command"
    accepted = set()
    for words in commands:
        accepted |= set(re.findall(r"(--[a-z][a-z-]+)", _help(words)))
    assert _flags_of(script) <= accepted, f"{script.name}: flags no command accepts: {_flags_of(script) - accepted}"


@pytest.mark.slow
def test_the_sandbox_evaluation_runs_and_reports(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")}
    env |= {"LIMIT": "1", "AMAPREDUCE": str(Path(sys.executable).with_name("amapreduce")),
            "AMAPREDUCE_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(["bash", str(ROOT / "eval" / "sandbox.sh"), str(tmp_path / "out")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = (tmp_path / "out" / "memory" / "report.md").read_text(encoding="utf-8")
    assert str(tmp_path / "out" / "no-memory") in report  # the memory-off half is what it is compared with
    for half in ("memory", "no-memory"):
        results = json.loads((tmp_path / "out" / half / "results.json").read_text(encoding="utf-8"))
        assert results["benchmark"] == "sandbox" and len(results["per_task"]) == 1  # LIMIT=1: one task scored
