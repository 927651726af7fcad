"""Validation of composed decisions: `child`, `decisions`, `max_depth`, `discover` (issue 12, point 3).

Every mistake of a composition is refused before anything runs, as one line with its path.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from amapreduce.decision import Decision
from amapreduce.decision.template import render_parent
from amapreduce.errors import DecisionError

SCHEMA = ["name", "value"]


def leaf(**extra: Any) -> dict[str, Any]:
    """A plain decision whose row comes from its parent's first cell."""
    return {"task_matrix": [["__parent_0__"]], "template": "Find [[__0__]]", "json_schema": SCHEMA, **extra}


def root(**extra: Any) -> dict[str, Any]:
    return {"task_matrix": [["a"], ["b"]], "template": "About __0__", "json_schema": SCHEMA, **extra}


def chain(depth: int, **extra: Any) -> dict[str, Any]:
    """A root with a chain of named children d1 -> d2 -> ... (`depth` levels, the root included)."""
    names = [f"d{k}" for k in range(1, depth)]
    decisions = {n: leaf(**({"child": names[k + 1]} if k + 1 < len(names) else {})) for k, n in enumerate(names)}
    return root(**({"child": names[0], "decisions": decisions} if names else {}), **extra)


def refused(data: dict[str, Any]) -> str:
    with pytest.raises(DecisionError) as info:
        Decision.parse(data)
    text = str(info.value)
    assert "\n" not in text
    return text


def discover(**extra: Any) -> dict[str, Any]:
    return {"sources": ["https://atlas.sandbox/lists/a", "cities of b"], "template": "List every city on __0__.",
            "json_schema": ["City", "Country"], **extra}


# -- depth ----------------------------------------------------------------------------------------


def test_a_chain_exactly_at_the_default_max_depth_validates() -> None:
    decision = Decision.parse(chain(3))
    assert decision.depth_limit == 3 and decision.child == "d1"
    assert decision.child_for(0).child == "d2"


def test_one_level_beyond_max_depth_fails_with_the_path() -> None:
    text = refused(chain(4))
    assert "nesting depth 4 exceeds max_depth 3 at decisions[d1] -> decisions[d2] -> decisions[d3]" in text
    assert text.startswith("invalid decision: ")


@pytest.mark.parametrize("limit", [1, 2, 5, 8])
def test_max_depth_moves_the_limit(limit: int) -> None:
    assert Decision.parse(chain(limit, max_depth=limit)).depth_limit == limit
    text = refused(chain(limit + 1, max_depth=limit))
    assert f"nesting depth {limit + 1} exceeds max_depth {limit} at decisions[d1]" in text


def test_inline_children_are_named_by_their_place_in_the_path() -> None:
    deep = root(child=leaf(child=leaf(child=leaf())))
    assert "nesting depth 4 exceeds max_depth 3 at child -> child.child -> child.child.child" in refused(deep)
    mixed = root(child=leaf(child="d"), decisions={"d": leaf(child=leaf())})
    assert "at child -> decisions[d] -> decisions[d].child" in refused(mixed)


@pytest.mark.parametrize(("value", "says"), [(0, "at least 1"), (9, "at most 8"), (True, "boolean"), ("deep", "integer")])
def test_max_depth_must_be_1_to_8(value: Any, says: str) -> None:
    assert says in refused(chain(2, max_depth=value))


# -- cycles and names -----------------------------------------------------------------------------


def test_a_cycle_among_named_decisions_is_refused() -> None:
    data = root(child="top10", decisions={"top10": leaf(child="fill"), "fill": leaf(child="top10")})
    assert "decision cycle: top10 -> fill -> top10" in refused(data)


def test_a_decision_naming_itself_through_an_inline_child_is_a_cycle() -> None:
    data = root(child="a", decisions={"a": leaf(child=leaf(child="a"))})
    assert "decision cycle: a -> a" in refused(data)


def test_a_cycle_is_refused_even_where_no_run_reaches_it() -> None:
    data = root(decisions={"x": leaf(child="y"), "y": leaf(child="x")})
    assert "decision cycle: x -> y -> x" in refused(data)


def test_an_unknown_child_name_is_refused() -> None:
    text = refused(root(child="top1O", decisions={"top10": leaf()}))
    assert "the root decision names the child 'top1O', which is not in decisions; named decisions are ['top10']" in text
    assert "has no `decisions`" in refused(root(child="top10"))
    assert "decisions[top10] names the child 'nope'" in refused(root(child="top10", decisions={"top10": leaf(child="nope")}))


def test_a_child_that_is_neither_a_name_nor_a_decision_is_refused() -> None:
    assert "child: 5 is not a child" in refused(root(child=5))


def test_a_blank_decision_name_is_refused() -> None:
    assert "name each decision with visible text" in refused(root(child="\u200b", decisions={"\u200b": leaf()}))


# -- root-only fields -----------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["decisions", "max_depth"])
def test_root_only_fields_are_refused_below_the_root(field: str) -> None:
    value: Any = {"z": leaf()} if field == "decisions" else 2
    text = refused(root(child=leaf(**{field: value})))
    assert f"child: `{field}` is allowed only in the root decision" in text
    text = refused(root(child="a", decisions={"a": leaf(**{field: value})}))
    assert f"decisions[a]: `{field}` is allowed only in the root decision" in text


# -- parent placeholders and columns --------------------------------------------------------------


def test_parent_placeholders_beyond_the_parent_row_are_refused() -> None:
    text = refused(root(child=leaf(template="Find [[__0__]] in __parent_1__")))
    assert "child uses __parent_1__ in its template, but its parent's task rows have 1 cell(s)" in text
    text = refused(root(child=leaf(task_matrix=[["x", "__parent_2__"]], matrix_columns=["name", None])))
    assert "in its task_matrix[0][1]" in text
    wide = root(task_matrix=[["a", "ctx"]], matrix_columns=["name", None],
                child=leaf(template="Find [[__0__]] in __parent_1__"))
    assert Decision.parse(wide).child_for(0).template == "Find [[__0__]] in ctx"


def test_the_root_cannot_use_parent_placeholders() -> None:
    text = refused(root(template="About __0__ in __parent_0__"))
    assert "the root decision uses __parent_0__ in its template, but it has no parent task" in text


def test_a_parent_column_nobody_fills_is_refused() -> None:
    data = root(json_schema=["name", "value", "extra"], child=leaf())
    assert "child: the parent's column(s) ['extra'] are neither filled by its task_matrix nor columns" in refused(data)


def test_errors_inside_a_nested_decision_carry_its_path() -> None:
    assert refused(root(child=leaf(template=""))).startswith("invalid decision: child: template is empty")
    assert refused(root(child="a", decisions={"a": leaf(bogus=1)})).startswith("invalid decision: decisions.a.bogus: unknown field")


# -- discover -------------------------------------------------------------------------------------


def fill(**extra: Any) -> dict[str, Any]:
    return {"discover": discover(), "template": "Population of [[__0__]]", "json_schema": ["City", "Country", "Population"],
            **extra}


def test_discover_with_no_matrix_validates_with_the_key_columns_as_its_width() -> None:
    decision = Decision.parse(fill())
    assert decision.task_matrix == [] and decision.resolved_matrix_columns == ("City",)
    two = Decision.parse(fill(discover=discover(key_columns=["City", "Country"]), template="[[__0__]] in __1__"))
    assert two.resolved_matrix_columns == ("City", "Country")


@pytest.mark.parametrize("matrix", [[["Paris"]], [["Paris"], ["Rome"]]])
def test_discover_with_a_task_matrix_is_refused(matrix: list[list[str]]) -> None:
    text = refused(fill(task_matrix=matrix))
    assert f"task_matrix has {len(matrix)} row(s) but `discover` is given" in text


def test_discover_templates_are_checked_against_the_key_columns_count() -> None:
    assert "template uses __1__ but task_matrix rows have 1 cells" in refused(fill(template="[[__0__]] in __1__"))
    assert "template has no __0__" in refused(fill(template="Population of every city"))


def test_discover_maps_the_discovered_keys_by_name() -> None:
    decision = Decision.parse(fill(discover=discover(key_columns=["Country", "City"]), template="[[__1__]], __0__"))
    assert decision.resolved_matrix_columns == ("Country", "City")
    filled = decision.with_matrix([["France", "Paris"]])
    assert filled.forced_values(0) == {"Country": "France", "City": "Paris"}
    assert filled.task_text(0) == "[[Paris]], France"


def test_discover_refuses_an_open_strategy() -> None:
    text = refused(fill(batch_strategy={"type": "open", "groups": [{"indices": [0]}]}))
    assert "an open batch_strategy names rows, which a discovered task_matrix does not have yet" in text


def test_discover_errors_name_the_discover_fields() -> None:
    assert "allowed discover fields are" in refused(fill(discover=discover(bogus=1)))


def test_with_matrix_makes_the_fill_decision() -> None:
    decision = Decision.parse(fill(batch_size=2))
    filled = decision.with_matrix([["Paris"], ["Rome"]])
    assert filled.discover is None and filled.task_matrix == [["Paris"], ["Rome"]] and filled.batch_size == 2
    assert filled.resolved_key_columns == ("City",) and filled.task_text(1) == "Population of [[Rome]]"
    with pytest.raises(DecisionError, match="task_matrix is empty"):
        decision.with_matrix([])
    with pytest.raises(DecisionError, match="duplicates"):
        decision.with_matrix([["Paris"], ["paris"]])


# -- child_for ------------------------------------------------------------------------------------


def test_child_for_fills_parent_cells_everywhere_in_one_pass() -> None:
    child = {"discover": discover(sources=["list of __parent_0__"], template="In __parent_1__: __0__"),
             "template": "[[__0__]] of __parent_0__", "json_schema": ["City", "Country", "year"]}
    data = {"task_matrix": [["2019", "ctx"]], "matrix_columns": ["year", None], "template": "Top __0__",
            "json_schema": ["year", "City", "Country"], "key_columns": ["year", "City"], "child": child}
    made = Decision.parse(data).child_for(0)
    assert made.template == "[[__0__]] of 2019"
    assert made.discover is not None and made.discover.sources == ["list of 2019"]
    assert made.discover.template == "In ctx: __0__"
    # a parent's cell is text: a placeholder-shaped value is never filled in again
    assert render_parent("__parent_0__ and __parent_1__", ["__parent_1__", "b"]) == "__parent_1__ and b"


def test_child_for_resolves_names_and_carries_what_the_child_still_needs() -> None:
    data = chain(4, max_depth=4)
    data["decisions"]["unused"] = leaf()
    decision = Decision.parse(data)
    first = decision.child_for(1)
    assert first.task_matrix == [["b"]] and first.child == "d2"
    assert first.decisions is not None and sorted(first.decisions) == ["d2", "d3"] and first.max_depth == 3
    last = first.child_for(0).child_for(0)
    assert last.child is None and last.decisions is None and last.max_depth is None
    with pytest.raises(ValueError, match="no `child`"):
        last.child_for(0)


def test_child_for_reports_a_child_made_invalid_by_its_parent_cells() -> None:
    data = root(child=leaf(task_matrix=[["__parent_0__"], ["a"]]))
    with pytest.raises(DecisionError, match=re.escape("task_matrix rows 0 and 1 are duplicates")):
        Decision.parse(data).child_for(0)


def test_a_plain_decision_dumps_without_composition_fields() -> None:
    dumped = Decision.parse(root()).model_dump(mode="json")
    assert not {"discover", "child", "decisions", "max_depth"} & dumped.keys()
    nested = Decision.parse(chain(2)).model_dump(mode="json")
    assert nested["child"] == "d1" and Decision.parse(nested).model_dump(mode="json") == nested
