"""Batch planning: every strategy, manifests, the cap, and the every-row-once property."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amapreduce.decision import Decision
from amapreduce.errors import DecisionError
from amapreduce.mapreduce.batching import plan_batches


def decision(rows: list[list[str]], strategy: Any = None, batch_size: int | None = None) -> Decision:
    return Decision.parse(
        {
            "task_matrix": rows,
            "template": "Find __0__ in __1__",
            "json_schema": ["name", "group", "value"],
            "batch_strategy": strategy,
            "batch_size": batch_size,
        }
    )


ROWS = [["a", "x"], ["b", "y"], ["c", "x"], ["d", "z"], ["e", "x"]]


def test_per_atom_one_row_per_batch() -> None:
    plan = plan_batches(decision(ROWS))
    assert [b.indices for b in plan.batches] == [(0,), (1,), (2,), (3,), (4,)]
    assert [b.batch_id for b in plan.batches] == ["batch-001", "batch-002", "batch-003", "batch-004", "batch-005"]


def test_per_atom_chunks_by_batch_size() -> None:
    plan = plan_batches(decision(ROWS, batch_size=2))
    assert [b.indices for b in plan.batches] == [(0, 1), (2, 3), (4,)]
    assert plan.batches[0].rationale == "chunks of 2 atomic tasks"


def test_by_attr_groups_in_first_seen_order_with_cap() -> None:
    plan = plan_batches(decision(ROWS, {"type": "by_attr", "attribute_index": 1, "max_group_size": 2}))
    assert [b.indices for b in plan.batches] == [(0, 2), (4,), (1,), (3,)]
    first = plan.batches[0]
    assert first.shared_context == {"attribute_index": 1, "attribute_name": "group", "attribute_value": "x", "part": "1/2"}
    assert "group = 'x'" in first.rationale


def test_by_attr_by_name_and_group_rationales() -> None:
    s = {"type": "by_attr", "attribute_name": "group", "group_rationales": {"y": "y pages"}, "rationale": "same list"}
    plan = plan_batches(decision(ROWS, s))
    assert [b.indices for b in plan.batches] == [(0, 2, 4), (1,), (3,)]
    assert [b.rationale for b in plan.batches] == ["same list", "y pages", "same list"]


def test_open_groups_then_leftover_chunks() -> None:
    s = {
        "type": "open",
        "groups": [
            {"indices": [3, 1], "rationale": "hard ones", "shared_context": {"source": "https://list.example"}},
            {"attribute_index": 1, "attribute_value": "x"},
        ],
        "chunk_size": 5,
    }
    plan = plan_batches(decision([*ROWS, ["f", "w"], ["g", "v"]], s))
    assert [b.indices for b in plan.batches] == [(1, 3), (0, 2, 4), (5, 6)]
    assert plan.batches[0].shared_context == {"group": 0, "source": "https://list.example"}
    assert plan.batches[0].rationale == "hard ones"
    assert plan.batches[1].shared_context["attribute_value"] == "x"
    assert plan.batches[2].shared_context == {"note": "leftover chunk"}


def test_open_leftovers_fall_back_to_batch_size() -> None:
    plan = plan_batches(decision(ROWS, {"type": "open", "groups": [{"indices": [0]}]}, batch_size=3))
    assert [b.indices for b in plan.batches] == [(0,), (1, 2, 3), (4,)]


def test_plan_json_shape() -> None:
    out = plan_batches(decision(ROWS[:2])).to_json()
    assert out == {
        "num_rows": 2,
        "strategy": "per_atom",
        "batches": [
            {"batch_id": "batch-001", "indices": [0], "size": 1, "rationale": "one atomic task per batch"},
            {"batch_id": "batch-002", "indices": [1], "size": 1, "rationale": "one atomic task per batch"},
        ],
    }


def test_batch_cap() -> None:
    rows = [[f"e{i}", "g"] for i in range(51)]
    with pytest.raises(DecisionError, match=r"51 batches, more than `max_batches`=50"):
        plan_batches(decision(rows))
    assert len(plan_batches(decision(rows), max_batches=60).batches) == 51


@st.composite
def decisions(draw: st.DrawFn) -> Decision:
    n = draw(st.integers(1, 60))
    groups = draw(st.lists(st.sampled_from("pqrs"), min_size=n, max_size=n))
    rows = [[f"row{i}", g] for i, g in enumerate(groups)]
    kind = draw(st.sampled_from(["per_atom", "by_attr", "open"]))
    size = draw(st.none() | st.integers(1, 7))
    if kind == "per_atom":
        return decision(rows, {"type": "per_atom"}, size)
    if kind == "by_attr":
        return decision(rows, {"type": "by_attr", "attribute_index": 1, "max_group_size": draw(st.none() | st.integers(1, 5))})
    perm = draw(st.permutations(range(n)))
    cut = draw(st.integers(0, n))
    chosen, spec = perm[:cut], []
    while chosen:
        take = draw(st.integers(1, len(chosen)))
        spec.append({"indices": list(chosen[:take])})
        chosen = chosen[take:]
    values = draw(st.lists(st.sampled_from("pqrs"), unique=True, max_size=2))
    used = set(perm[:cut])
    for v in values:
        if any(g == v and i not in used for i, g in enumerate(groups)):
            spec.append({"attribute_index": 1, "attribute_value": v})
            used |= {i for i, g in enumerate(groups) if g == v}
    return decision(rows, {"type": "open", "groups": spec, "chunk_size": draw(st.none() | st.integers(1, 6))}, size)


@settings(max_examples=200, deadline=None)
@given(decisions())
def test_every_row_lands_in_exactly_one_batch(d: Decision) -> None:
    plan = plan_batches(d, max_batches=10_000)
    seen = [i for b in plan.batches for i in b.indices]
    assert sorted(seen) == list(range(len(d.task_matrix)))
    assert all(b.size >= 1 for b in plan.batches)
    assert len({b.batch_id for b in plan.batches}) == len(plan.batches)
