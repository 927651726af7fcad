"""Composed decisions: a child decision per task, checked whole at validation time.

A decision's `child` (a name in the root's `decisions`, or an inline decision) runs once per
task of its parent, with `__parent_k__` filled from the parent's task row. Each decision has at
most one child, so a composition is a chain from the root; named decisions may refer to each
other, so the chain may loop. As the composable-ensembles design asks, every such mistake is
caught before anything runs, with the path in the message:

* a cycle among named decisions (`decision cycle: top10 -> fill -> top10`);
* a chain deeper than `max_depth` (default 3, the root being depth 1; at most 8);
* a child name that `decisions` does not hold;
* `decisions` or `max_depth` below the root;
* `__parent_k__` beyond the parent's row width, or in the root (which has no parent);
* a parent column that neither its matrix nor its child fills (it could only stay missing).

Why the checks wait for the outermost decision: pydantic validates the children first and a
child cannot know whether it is the root, nor resolve a name. `level()` counts how deep the
validation is (a context variable: validation is synchronous in one thread), and only the
outermost decision runs `check_tree`.

`child_for` makes the decision a task runs: it stands alone (a root of its own run), so it
carries the named decisions its own chain still needs and the depth that remains.

The checks read a decision through `Node`, the few fields and views they need, so this module
does not import `decision.model` (whose `Decision` is a `Node` and calls these checks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal, Protocol, Self, TypeVar

from amapreduce.decision.discover_spec import DiscoverSpec
from amapreduce.decision.strategy import OpenStrategy, Strategy
from amapreduce.decision.template import parent_placeholders, render_parent
from amapreduce.table.keys import is_blank

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "MAX_DEPTH",
    "PARTS",
    "Node",
    "check_discovered",
    "check_tree",
    "child_for",
    "child_label",
    "level",
]

DEFAULT_MAX_DEPTH = 3
"""Nesting levels a root allows when it gives no `max_depth` (the root is level 1)."""
MAX_DEPTH = 8
"""Largest `max_depth`: each level multiplies the runs (a child per task), so deeper is a mistake."""
PARTS = frozenset({"discover", "child", "decisions", "max_depth"})
"""The composition fields; left out of a decision's dump when unused."""


class Node(Protocol):
    """What the checks read of a decision (`decision.model.Decision` is one): its fields, read only,
    and the views validation has resolved."""

    @property
    def template(self) -> str: ...
    @property
    def task_matrix(self) -> Sequence[Sequence[str]]: ...
    @property
    def discover(self) -> DiscoverSpec | None: ...
    @property
    def child(self) -> Self | str | None: ...
    @property
    def decisions(self) -> Mapping[str, Self] | None: ...
    @property
    def max_depth(self) -> int | None: ...
    @property
    def depth_limit(self) -> int: ...
    @property
    def matrix_width(self) -> int: ...
    @property
    def columns(self) -> tuple[str, ...]: ...
    @property
    def resolved_matrix_columns(self) -> tuple[str | None, ...]: ...
    def model_dump(self, *, mode: Literal["json"]) -> dict[str, Any]: ...


D = TypeVar("D", bound=Node)
"""A decision type; the checks hand back the decisions they are given."""

_LEVEL: ContextVar[int] = ContextVar("amapreduce_decision_level", default=0)


@contextmanager
def level() -> Iterator[bool]:
    """Validation of one decision; yields True for the outermost one (no decision around it)."""
    token = _LEVEL.set(_LEVEL.get() + 1)
    try:
        yield _LEVEL.get() == 1
    finally:
        _LEVEL.reset(token)


def check_discovered(matrix: Sequence[Sequence[str]], strategy: Strategy) -> None:
    """A decision with `discover` gets its matrix from discovery: none may be given, and no
    strategy may name rows that do not exist yet."""
    if matrix:
        raise ValueError(
            f"task_matrix has {len(matrix)} row(s) but `discover` is given; the discovered entities fill "
            "the task matrix (one row per entity, its discover.key_columns), so leave task_matrix empty or omit it"
        )
    if isinstance(strategy, OpenStrategy):
        raise ValueError(
            "an open batch_strategy names rows, which a discovered task_matrix does not have yet; "
            "use per_atom or by_attr with `discover`"
        )


def child_label(parent: str, name: str | None) -> str:
    """The path label of a child: `decisions[name]`, or `<parent>.child` for an inline one."""
    if name is not None:
        return f"decisions[{name}]"
    return "child" if parent == _ROOT else f"{parent}.child"


_ROOT = "the root decision"


def _texts(d: Node) -> Iterator[tuple[str, str]]:
    """(where, text) of every place `__parent_k__` may stand in `d`."""
    yield "template", d.template
    for i, row in enumerate(d.task_matrix):
        for j, cell in enumerate(row):
            yield f"task_matrix[{i}][{j}]", cell
    if d.discover is not None:
        yield "discover.template", d.discover.template
        for i, source in enumerate(d.discover.sources):
            yield f"discover.sources[{i}]", source


def _inline(d: D, label: str) -> Iterator[tuple[str, D]]:
    """`d` and its inline descendants, with their labels."""
    while True:
        yield label, d
        if d.child is None or isinstance(d.child, str):
            return
        d, label = d.child, child_label(label, None)


def _last(d: D) -> D:
    """The end of `d`'s inline chain: the decision whose child is a name, or none."""
    return [node for _, node in _inline(d, "")][-1]


def _resolve(d: D, label: str, named: Mapping[str, D]) -> tuple[str, D] | None:
    if d.child is None:
        return None
    if isinstance(d.child, str):
        return child_label(label, d.child), named[d.child]
    return child_label(label, None), d.child


def check_tree(root: Node) -> None:
    """Check the composition under `root` (see the module's list). Raises ValueError, one line."""
    named = root.decisions or {}
    for name in named:
        if is_blank(name):
            raise ValueError(f"decisions has the name {name!r}; name each decision with visible text")
    nodes = [*_inline(root, _ROOT), *(n for name, d in named.items() for n in _inline(d, child_label(_ROOT, name)))]
    for label, d in nodes:
        for field in ("decisions", "max_depth"):
            if d is not root and getattr(d, field) is not None:
                raise ValueError(f"{label}: `{field}` is allowed only in the root decision; move it there")
        if isinstance(d.child, str) and d.child not in named:
            known = f"named decisions are {sorted(named)}" if named else "the root decision has no `decisions`"
            raise ValueError(f"{label} names the child {d.child!r}, which is not in decisions; {known}")
    for where, text in _texts(root):
        if used := parent_placeholders(text):
            raise ValueError(
                f"the root decision uses __parent_{used[0]}__ in its {where}, but it has no parent task; "
                "__parent_k__ placeholders belong in a child decision"
            )
    _check_cycles(named)
    _check_chain(root, named)


def _check_cycles(named: Mapping[str, D]) -> None:
    # Each decision has one child at most: follow the chain of names from every named decision.
    for start in named:
        seen = [start]
        current = start
        while isinstance(child := _last(named[current]).child, str):
            current = child
            if current in seen:
                loop = [*seen[seen.index(current):], current]
                raise ValueError("decision cycle: " + " -> ".join(loop) + "; a decision cannot contain itself")
            seen.append(current)


def _check_chain(root: D, named: Mapping[str, D]) -> None:
    """Depth, parent placeholders and parent columns along the chain from the root."""
    limit = root.depth_limit
    chain: list[str] = []
    label, parent = _ROOT, root
    while (step := _resolve(parent, label, named)) is not None:
        label, child = step
        chain.append(label)
        if len(chain) + 1 > limit:
            raise ValueError(
                f"nesting depth {len(chain) + 1} exceeds max_depth {limit} at {' -> '.join(chain)}; "
                f"nest at most {limit} levels (the root is level 1) or raise max_depth (at most {MAX_DEPTH})"
            )
        _check_edge(parent, child, label)
        parent = child


def _check_edge(parent: Node, child: Node, label: str) -> None:
    width = parent.matrix_width
    for where, text in _texts(child):
        bad = [k for k in parent_placeholders(text) if k >= width]
        if bad:
            raise ValueError(
                f"{label} uses __parent_{bad[0]}__ in its {where}, but its parent's task rows have {width} cell(s) "
                f"(__parent_0__ … __parent_{width - 1}__)"
            )
    filled = {c for c in parent.resolved_matrix_columns if c is not None} | set(child.columns)
    lacking = [c for c in parent.columns if c not in filled]
    if lacking:
        raise ValueError(
            f"{label}: the parent's column(s) {lacking} are neither filled by its task_matrix nor columns of this "
            f"child (columns {list(child.columns)}); add them to the child's json_schema or drop them from the parent's"
        )


def child_for(parent: D, i: int, parse: Callable[[Any], D]) -> D:
    """The decision parent task `i` runs: its `child` (a name resolved), `__parent_k__` filled with
    row `i`'s cells in the template, the matrix cells and `discover`'s sources and template, as a
    root of its own: the named decisions its chain still needs and the depth that remains.

    Raises:
        ValueError: `parent` has no child.
        DecisionError: the filled child is invalid (from `parse`).
    """
    if parent.child is None:
        raise ValueError("child_for: the decision has no `child`")
    named = parent.decisions or {}
    child = named[parent.child] if isinstance(parent.child, str) else parent.child
    row = parent.task_matrix[i]
    data = child.model_dump(mode="json")
    data["template"] = render_parent(child.template, row)
    data["task_matrix"] = [[render_parent(cell, row) for cell in r] for r in child.task_matrix]
    if child.discover is not None:
        spec = child.discover
        data["discover"] = {**data["discover"], "template": render_parent(spec.template, row),
                            "sources": [render_parent(s, row) for s in spec.sources]}
    if child.child is not None:
        data["max_depth"] = parent.depth_limit - 1
        needed: dict[str, Any] = {}
        node = child
        while isinstance(name := _last(node).child, str):
            node = named[name]
            needed[name] = node.model_dump(mode="json")
        if needed:
            data["decisions"] = needed
    return parse(data)
