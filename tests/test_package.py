"""Package hygiene: the public API, module size, lazy imports, CI = README, prompts in the wheel."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import amapreduce

MAX_MODULE_LINES = 500


def test_all_is_sorted_complete_and_importable() -> None:
    public = sorted(amapreduce.__all__, key=str.lower)
    assert amapreduce.__all__ == sorted(amapreduce.__all__)
    assert public
    for name in amapreduce.__all__:
        assert getattr(amapreduce, name) is not None
    assert dir(amapreduce) == sorted(amapreduce.__all__)
    assert not {"json", "os", "importlib", "Any"} & set(dir(amapreduce))


def test_modules_stay_small(repo_root: Path) -> None:
    too_long = {
        str(p.relative_to(repo_root)): n
        for p in (repo_root / "amapreduce").rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert too_long == {}


def test_cli_start_imports_no_heavy_library() -> None:
    code = (
        "import sys, amapreduce.cli.app\n"
        "heavy = ['torch', 'sentence_transformers', 'faiss', 'finch', 'smolagents', 'pandas', 'trafilatura', 'litellm']\n"
        "print(','.join(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_ci_runs_the_readme_test_command(repo_root: Path) -> None:
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)\n```", readme.split("## Quick start", 1)[1], re.DOTALL)
    test_command = blocks[1].strip()
    assert "pytest" in test_command
    ci = (repo_root / ".ci" / "run").read_text(encoding="utf-8")
    assert test_command in ci.splitlines()


def test_wheel_ships_prompts(repo_root: Path, tmp_path: Path) -> None:
    from hatchling.builders.wheel import WheelBuilder

    wheel = Path(next(iter(WheelBuilder(str(repo_root)).build(directory=str(tmp_path), versions=["standard"]))))
    names = zipfile.ZipFile(wheel).namelist()
    assert "amapreduce/prompts/mapreduce.yaml" in names
    assert "amapreduce/prompts/search_agent.yaml" in names
    assert not any(n.startswith(("tests/", "memory_store/")) for n in names)
