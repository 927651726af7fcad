"""Static checks are part of the suite, so CI enforces them: ruff on the repo, mypy --strict on the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(repo_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=repo_root, capture_output=True, text=True, check=False)


def test_ruff_is_clean(repo_root: Path) -> None:
    out = run(repo_root, "ruff", "check", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict_is_clean(repo_root: Path) -> None:
    out = run(repo_root, "mypy", "amapreduce")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
