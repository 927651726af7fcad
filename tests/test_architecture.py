"""Imports run one way: no module imports a layer above its own, nor a peer the architecture forbids.

The layers are read from `docs/architecture.md` itself (its "Layers" and "Peer imports" tables),
so the page and this check are one table and cannot drift apart. Every import counts: module
level, inside functions and under `if TYPE_CHECKING:`, because each of them is a dependency a
reader has to follow and a refactor has to keep. A module in no layer, or a layer naming a
module that does not exist, fails too.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "amapreduce"
ROOT_UNIT = PACKAGE
"""The package root (`amapreduce/__init__.py`) is a unit of its own, named like the package."""


@dataclass(frozen=True)
class Layers:
    """The import rule: each unit's layer, and the peers each unit may import in its own layer.

    A unit is a top-level module or subpackage of the package (`errors`, `llm`) or the root.
    """

    layer_of: Mapping[str, int]
    allowed_peers: Mapping[str, frozenset[str]]


def _section(text: str, heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"docs/architecture.md has no '## {heading}' section"
    return match.group(1)


def _rows(section: str) -> Iterator[list[str]]:
    """The body rows of the first markdown table in `section`, as lists of cells."""
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0][:1].isdigit():
            yield cells


def _names(cell: str) -> list[str]:
    return re.findall(r"`([A-Za-z_][\w.]*)`", cell)


def parse_layers(doc: str) -> Layers:
    """Read the "Layers" table (`| N name | `unit`, ... | ... |`) and the "Peer imports" table
    (`| N | `importer`, ... | `allowed peer`, ... | ... |`) of the architecture page."""
    layer_of: dict[str, int] = {}
    for cells in _rows(_section(doc, "Layers")):
        layer = int(cells[0].split()[0])
        for unit in _names(cells[1]):
            assert unit not in layer_of, f"docs/architecture.md puts `{unit}` in two layers"
            layer_of[unit] = layer
    allowed: dict[str, frozenset[str]] = {}
    for cells in _rows(_section(doc, "Peer imports")):
        peers = frozenset(_names(cells[2]))
        for unit in _names(cells[1]):
            allowed[unit] = allowed.get(unit, frozenset()) | peers
    return Layers(layer_of=layer_of, allowed_peers=allowed)


def module_name(path: str) -> str:
    """`amapreduce/llm/models.py` -> `amapreduce.llm.models`; a package's `__init__.py` -> the package."""
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    """The layer unit a module belongs to: `amapreduce.llm.models` -> `llm`; the root -> `amapreduce`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT_UNIT


def imported_modules(path: str, source: str, units: frozenset[str]) -> Iterator[tuple[str, int]]:
    """Every package module `source` imports, with its line: module level, in functions, under
    `TYPE_CHECKING`; relative imports resolved. `from amapreduce import errors` names the
    `errors` unit; `from amapreduce import Table` names the root."""
    module = module_name(path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    nodes = [n for n in ast.walk(ast.parse(source, filename=path)) if isinstance(n, ast.Import | ast.ImportFrom)]
    for node in sorted(nodes, key=lambda n: n.lineno):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            if base == PACKAGE:
                for alias in node.names:
                    yield (f"{PACKAGE}.{alias.name}" if alias.name in units else PACKAGE), node.lineno
            else:
                yield base, node.lineno


def violations(files: Mapping[str, str], layers: Layers) -> list[str]:
    """One message per import that breaks the rule, for `files` (`{"amapreduce/x.py": source}`)."""
    units = frozenset(layers.layer_of)
    found: list[str] = []
    for path, source in sorted(files.items()):
        module = module_name(path)
        unit = unit_of(module)
        if unit not in layers.layer_of:
            found.append(f"{module} is in no layer: add `{unit}` to the Layers table of docs/architecture.md")
            continue
        layer = layers.layer_of[unit]
        for target, line in imported_modules(path, source, units):
            if target != PACKAGE and not target.startswith(PACKAGE + "."):
                continue
            target_unit = unit_of(target)
            if target_unit == unit or target_unit not in layers.layer_of:
                continue  # inside one unit, or an unknown unit (reported where that unit's modules are)
            target_layer = layers.layer_of[target_unit]
            where = f" ({path}:{line})"
            if target_layer > layer:
                found.append(f"{module} (layer {layer}) imports {target} (layer {target_layer} > {layer}){where}")
            elif target_layer == layer and target_unit not in layers.allowed_peers.get(unit, frozenset()):
                found.append(
                    f"{module} (layer {layer}) imports {target} (layer {target_layer}), a peer that the "
                    f"Peer imports table of docs/architecture.md does not allow{where}"
                )
    return found


def package_files(repo_root: Path) -> dict[str, str]:
    return {
        p.relative_to(repo_root).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted((repo_root / PACKAGE).rglob("*.py"))
    }


def doc_layers(repo_root: Path) -> Layers:
    return parse_layers((repo_root / "docs" / "architecture.md").read_text(encoding="utf-8"))


def test_no_module_imports_a_higher_layer_or_a_forbidden_peer(repo_root: Path) -> None:
    problems = violations(package_files(repo_root), doc_layers(repo_root))
    assert problems == [], "imports against docs/architecture.md:\n" + "\n".join(problems)


def test_every_unit_the_doc_names_exists(repo_root: Path) -> None:
    layers = doc_layers(repo_root)
    package = repo_root / PACKAGE
    named = set(layers.layer_of) | set(layers.allowed_peers) | {p for ps in layers.allowed_peers.values() for p in ps}
    missing = sorted(
        u for u in named - {ROOT_UNIT} if not (package / f"{u}.py").is_file() and not (package / u).is_dir()
    )
    assert missing == [], f"docs/architecture.md names modules that do not exist: {missing}"


def test_only_the_demo_reaches_the_simulated_models(repo_root: Path) -> None:
    # Layer 6 (`run`) could import `testing` by the layer rule alone; docs/architecture.md keeps
    # simulated models out of product code, so only `demo` (and `testing` itself) may.
    units = frozenset(doc_layers(repo_root).layer_of)
    reaching = sorted(
        f"{path}:{line} imports {target}"
        for path, source in package_files(repo_root).items()
        if unit_of(module_name(path)) not in {"demo", "testing"}
        for target, line in imported_modules(path, source, units)
        if unit_of(target) == "testing" and target.startswith(PACKAGE + ".")
    )
    assert reaching == [], "product code imports the simulated models:\n" + "\n".join(reaching)


SYNTHETIC = Layers(
    layer_of={"errors": 0, "settings": 0, "table": 1, "session": 6, ROOT_UNIT: 8},
    allowed_peers={"settings": frozenset({"errors"})},
)


def module_imports(files: Mapping[str, str]) -> dict[str, set[str]]:
    """The import graph between the package's modules: every import counts (module level, in
    functions, under `TYPE_CHECKING`, relative ones); `from pkg import sub` names the module `sub`
    when it is one, any other name its longest module prefix."""
    modules = {module_name(path) for path in files}

    def resolved(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for path, source in files.items():
        module = module_name(path)
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(source, filename=path)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            graph[module] |= {t for name in targets if (t := resolved(name)) is not None and t != module}
    return graph


def import_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`: its strongly connected components of more than one module
    (Tarjan's algorithm, iterative), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return sorted(cycles)


def test_no_import_cycle_between_modules_even_inside_a_package(repo_root: Path) -> None:
    cycles = import_cycles(module_imports(package_files(repo_root)))
    assert cycles == [], "modules that import each other (directly or round a loop):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_the_cycle_check_counts_type_checking_and_function_imports() -> None:
    files = {
        "amapreduce/mapreduce/__init__.py": "",
        "amapreduce/mapreduce/result.py": "if TYPE_CHECKING:\n    from amapreduce.mapreduce.discover import Summary\n",
        "amapreduce/mapreduce/discover.py": "def f():\n    from amapreduce.mapreduce import engine\n",
        "amapreduce/mapreduce/engine.py": "from .result import Result\n",
        "amapreduce/mapreduce/batching.py": "from amapreduce.mapreduce.result import Result\n",
    }
    assert import_cycles(module_imports(files)) == [
        ["amapreduce.mapreduce.discover", "amapreduce.mapreduce.engine", "amapreduce.mapreduce.result"]]
    files["amapreduce/mapreduce/result.py"] = "import json\n"
    assert import_cycles(module_imports(files)) == []


def test_the_check_fails_on_an_upward_import() -> None:
    files = {"amapreduce/table/render.py": "from amapreduce.session.parts import build_parts\n"}
    assert violations(files, SYNTHETIC) == [
        "amapreduce.table.render (layer 1) imports amapreduce.session.parts (layer 6 > 1) (amapreduce/table/render.py:1)"
    ]


def test_the_check_counts_imports_in_functions_type_checking_and_relative_ones() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from amapreduce.session import parts\n"
        "def late():\n"
        "    import amapreduce.session.session\n"
        "from .. import session\n"
        "from amapreduce import Table\n"
    )
    found = violations({"amapreduce/table/keys.py": source}, SYNTHETIC)
    assert [f.split(" (amapreduce/")[0] for f in found] == [
        "amapreduce.table.keys (layer 1) imports amapreduce.session (layer 6 > 1)",
        "amapreduce.table.keys (layer 1) imports amapreduce.session.session (layer 6 > 1)",
        "amapreduce.table.keys (layer 1) imports amapreduce.session (layer 6 > 1)",
        "amapreduce.table.keys (layer 1) imports amapreduce (layer 8 > 1)",
    ]


def test_the_check_fails_on_a_forbidden_peer_and_a_module_in_no_layer() -> None:
    files = {
        "amapreduce/errors.py": "from amapreduce.settings import Settings\n",
        "amapreduce/settings.py": "from amapreduce.errors import ConfigError\n",  # allowed peer
        "amapreduce/extra/thing.py": "import json\n",
        "amapreduce/table/table.py": "from amapreduce.table.keys import normalize_key\n",  # own unit
    }
    assert violations(files, SYNTHETIC) == [
        "amapreduce.errors (layer 0) imports amapreduce.settings (layer 0), a peer that the Peer imports "
        "table of docs/architecture.md does not allow (amapreduce/errors.py:1)",
        "amapreduce.extra.thing is in no layer: add `extra` to the Layers table of docs/architecture.md",
    ]


def test_the_tables_are_read_from_the_doc() -> None:
    doc = (
        "# A\n\n## Layers\n\n| layer | modules | what |\n|---|---|---|\n"
        "| 0 foundation | `errors`, `settings` | x |\n| 8 interface | `cli`, `amapreduce` (root) | y |\n\n"
        "## Peer imports\n\n| layer | importer | may import | why |\n|---|---|---|---|\n"
        "| 0 | `settings` | `errors` | z |\n\n## Other\n"
    )
    layers = parse_layers(doc)
    assert layers.layer_of == {"errors": 0, "settings": 0, "cli": 8, ROOT_UNIT: 8}
    assert layers.allowed_peers == {"settings": frozenset({"errors"})}
