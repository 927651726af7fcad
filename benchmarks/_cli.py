"""The `amapreduce` that benchmarks run as a subprocess: this checkout's CLI, under this interpreter.

Why not `<repo>/.venv/bin/amapreduce`: that file exists only where a virtual environment was made
inside the repository (not in a worktree, not in CI's); `python -m amapreduce` with the checkout
first on `PYTHONPATH` runs the code being measured wherever the script is run from.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def amapreduce_command() -> list[str]:
    """The command line that starts `amapreduce` (arguments follow)."""
    return [sys.executable, "-m", "amapreduce"]


def checkout_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the checkout first on `PYTHONPATH`."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env
