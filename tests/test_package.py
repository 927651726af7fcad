"""Package hygiene: the public API, module size, lazy imports, CI = README, prompts in the wheel,
and documents cited by the code."""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import amapreduce

MAX_MODULE_LINES = 650
"""A module past this is a sign of a concept too many: split it by a domain noun (as `mapreduce.backup`
holds the straggler policy the engine's loop applies), never just to fit under the number. Raised from
500 when the engine's loop took the backup attempts (issue 28): splitting the loop itself would have
spread one control flow over two files."""


def test_all_is_sorted_and_importable() -> None:
    public = sorted(amapreduce.__all__, key=str.lower)
    assert amapreduce.__all__ == sorted(amapreduce.__all__)
    assert public
    for name in amapreduce.__all__:
        assert getattr(amapreduce, name) is not None
    assert dir(amapreduce) == sorted(amapreduce.__all__)
    assert not {"json", "os", "importlib", "Any"} & set(dir(amapreduce))


def _documented_api(readme: str) -> tuple[set[str], set[tuple[str, str]]]:
    """What the README and the guides document: names they take from `amapreduce` itself (imported, or
    called as `amapreduce.ask(...)`), and (module, name) pairs they name
    by a dotted path (`amapreduce.testing.scripted.FunctionModel`) or import
    (`from amapreduce.trace import TraceWriter`)."""
    top: set[str] = set()
    for names in re.findall(r"^from amapreduce import (.+)$", readme, re.MULTILINE):
        top |= {n.strip() for n in names.split(",")}
    top |= set(re.findall(r"(?<![\w.])amapreduce\.(\w+)\(", readme))  # the calls shown: `amapreduce.ask(...)`
    qualified = set(re.findall(r"^from (amapreduce(?:\.\w+)+) import (\w+)$", readme, re.MULTILINE))
    for path in re.findall(r"(?<![\"'])\bamapreduce(?:\.\w+)+", readme):  # a quoted one is an entry-point group
        module, _, name = path.rpartition(".")
        try:
            importlib.import_module(path)
        except ModuleNotFoundError:  # the last part is a name in `module`, not a module
            qualified.add((module, name))
    return {n for n in top if n}, qualified


def _documented(repo_root: Path) -> str:
    """The README and every guide of the documentation site."""
    pages = [repo_root / "README.md", *sorted((repo_root / "docs" / "guides").glob("*.md"))]
    return "\n".join(page.read_text(encoding="utf-8") for page in pages)


def test_all_names_everything_the_readme_and_guides_document(repo_root: Path) -> None:
    top, qualified = _documented_api(_documented(repo_root))
    assert {"Decision", "ask", "load_decision"} <= top
    assert ("amapreduce", "load_decision") in qualified
    assert sorted(top - set(amapreduce.__all__)) == []
    not_exported = sorted(
        f"{module}.{name}"
        for module, name in qualified
        if name not in getattr(importlib.import_module(module), "__all__", ())
    )
    assert not_exported == []


def test_all_is_the_users_api_the_reference_lists(repo_root: Path) -> None:
    """`amapreduce.__all__` is the user's API: exactly the names docs/reference/python.md lists, and
    no engine, tool or solver class (those stay importable from their modules)."""
    page = (repo_root / "docs" / "reference" / "python.md").read_text(encoding="utf-8")
    block = page.split("<!-- exports -->")[1].split("<!-- /exports -->")[0]
    assert sorted(re.findall(r"`(\w+)`", block)) == sorted(amapreduce.__all__)
    internals = {"MapReduceEngine", "EngineConfig", "MapReduceTool", "SmolagentsSolver", "BatchSolver", "Session",
                 "RunOptions", "RunOutcome", "Prior", "PriorProvider"}
    assert not internals & set(amapreduce.__all__)
    from amapreduce.agents.mapreduce_tool import MapReduceTool
    from amapreduce.mapreduce.engine import MapReduceEngine
    from amapreduce.session import Session

    assert MapReduceTool and MapReduceEngine and Session


def _public_modules() -> list[ModuleType]:
    names = [m.name for m in pkgutil.walk_packages(amapreduce.__path__, "amapreduce.")]
    return [amapreduce] + [
        importlib.import_module(n) for n in names if not any(p.startswith("_") for p in n.split("."))
    ]


def test_every_module_with_public_names_declares_an_all_that_exists() -> None:
    """`__all__` is the contract of a module: present wherever the module binds public names
    (a package whose `__init__` only documents its submodules needs none), and every name in it
    is really there, once."""
    modules = _public_modules()
    assert len(modules) > 50
    without_all, unknown, repeated = [], [], []
    for module in modules:
        declared = getattr(module, "__all__", None)
        if declared is None:
            # `annotations` is bound by `from __future__ import annotations`; submodules are not names
            binds = [
                k for k, v in vars(module).items()
                if not k.startswith("_") and k != "annotations" and not isinstance(v, ModuleType)
            ]
            if binds:
                without_all.append(f"{module.__name__}: {binds[:3]}")
            continue
        unknown += [f"{module.__name__}.{n}" for n in declared if not hasattr(module, n)]
        if len(set(declared)) != len(declared):
            repeated.append(module.__name__)
    assert without_all == []
    assert unknown == []
    assert repeated == []


CITATION = re.compile(r"docs/([\w-]+\.md)([^()\n]*?)(?=docs/|[)\n]|$)")
SECTION = re.compile(r"§(\d+(?:\.\d+)*)(?:\s*[–-]\s*§?(\d+(?:\.\d+)*))?")
HEADING = re.compile(r"^#{2,4} (\d+(?:\.\d+)*)\.? ", re.MULTILINE)


def test_documents_cited_in_the_code_exist(repo_root: Path) -> None:
    """Every `docs/<name>.md §N` in code, tests, README and the docs names a file in the repository
    and a section heading in it (users get the repository, not the team's notes)."""
    sources = [repo_root / "README.md", repo_root / "pyproject.toml", repo_root / "eval" / "README.md"]
    for folder in ("amapreduce", "tests", "benchmarks", "eval", "docs"):
        sources += sorted((repo_root / folder).rglob("*.py")) + sorted((repo_root / folder).rglob("*.md"))
    cited: dict[tuple[str, str], str] = {}
    for path in sources:
        text = path.read_text(encoding="utf-8")
        for doc, tail in CITATION.findall(text):
            sections = [s for pair in SECTION.findall(tail) for s in pair if s] or [""]
            for section in sections:
                cited.setdefault((doc, section), str(path.relative_to(repo_root)))
    assert ("scorer-rules.md", "10") in cited
    broken = []
    for (doc, section), where in sorted(cited.items()):
        target = repo_root / "docs" / doc
        if not target.is_file():
            broken.append(f"{where}: docs/{doc} does not exist")
        elif section and section not in HEADING.findall(target.read_text(encoding="utf-8")):
            broken.append(f"{where}: docs/{doc} has no section {section}")
    assert broken == []


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
        "heavy = ['torch', 'sentence_transformers', 'faiss', 'finch', 'smolagents', 'pandas', 'trafilatura', 'litellm', "
        "'opentelemetry', 'openinference', 'mcp', 'starlette', 'uvicorn', 'selenium', 'pydantic']\n"
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
