"""The generic tree reduce (`mapreduce.tree_reduce`): every rule of issue 12, point 2, and the
design note `mapreduce-ensemble-tree-reduce.txt` §6, §7, §9, §12, §13, §14.

Outputs here are `Out` records: the map ids they cover and a declared token count, so each test
sets the sizes the tree reacts to and can check that no map output is ever dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amapreduce.errors import ConfigError, UserError
from amapreduce.mapreduce.tree_reduce import (
    DEFAULT_CHUNK_SIZE,
    Node,
    ReducePolicy,
    TreeReduceResult,
    pack_bins,
    record_map,
    tree_reduce,
    tree_reduce_direct,
)
from amapreduce.trace import Trace


@dataclass(frozen=True)
class Out:
    """One output: the map ids it covers, in order, and its token count."""

    ids: tuple[int, ...]
    tokens: int


def size(out: Out) -> int:
    return out.tokens


def maps(sizes: list[int]) -> list[Out]:
    return [Out((i,), s) for i, s in enumerate(sizes)]


@dataclass
class Reducer:
    """A reduce call that records what it was given; its output's size is `shrink(input tokens)`."""

    shrink: Callable[[int], int] = lambda total: max(1, total // 2)
    calls: list[tuple[Node, list[Out]]] = field(default_factory=list)

    def __call__(self, group: list[Out], node: Node) -> Out:
        self.calls.append((node, list(group)))
        ids = tuple(i for out in group for i in out.ids)
        return Out(ids, self.shrink(sum(out.tokens for out in group)))

    def labels(self) -> list[str]:
        return [node.label for node, _ in self.calls]


def union(outputs: list[Out]) -> Out:
    """The code-only `combine`: every id, no call."""
    return Out(tuple(i for out in outputs for i in out.ids), sum(out.tokens for out in outputs))


class ListTrace(Trace):
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def write(self, event: str, **data: Any) -> None:
        self.events.append((event, data))


def shape(result: TreeReduceResult[Out]) -> list[tuple[str, int]]:
    return [(node.label, node.inputs) for node in result.nodes]


# --- static (§6) --------------------------------------------------------------------------------


def test_static_one_output_is_one_final_call() -> None:
    reducer = Reducer()
    result = tree_reduce(maps([7]), reducer, tokens=size, policy=ReducePolicy(chunk_size=3))
    assert shape(result) == [("final", 1)]
    assert result.levels == 0 and result.nodes[0].level == 1
    assert result.output.ids == (0,) and not result.combined_in_code and result.warnings == ()


def test_static_chunk_outputs_are_one_final_call() -> None:
    result = tree_reduce(maps([1] * 5), Reducer(), tokens=size, policy=ReducePolicy(chunk_size=5))
    assert shape(result) == [("final", 5)]
    assert result.levels == 0


def test_static_chunk_plus_one_is_one_level_of_two_then_final() -> None:
    reducer = Reducer()
    result = tree_reduce(maps([1] * 6), reducer, tokens=size, policy=ReducePolicy(chunk_size=5))
    assert shape(result) == [("reduce L1", 5), ("reduce L1", 1), ("final", 2)]
    assert [(n.level, n.index) for n in result.nodes] == [(1, 0), (1, 1), (2, 0)]
    assert result.levels == 1
    assert result.output.ids == tuple(range(6))


def test_static_hundred_outputs_by_five_is_depth_three() -> None:
    result = tree_reduce(maps([1] * 100), Reducer(), tokens=size, policy=ReducePolicy(chunk_size=5))
    labels = [node.label for node in result.nodes]
    assert labels == ["reduce L1"] * 20 + ["reduce L2"] * 4 + ["final"]
    assert result.levels == 2  # two reduce levels + the final: depth 3 (§6)
    assert result.nodes[-1].inputs == 4 and result.nodes[-1].level == 3
    assert result.output.ids == tuple(range(100))  # order kept, nothing dropped


def test_static_seven_by_three_keeps_the_single_item_group() -> None:
    """§6's example: the last group of one is still a reduce call (same shape at every level)."""
    result = tree_reduce(maps([1] * 7), Reducer(), tokens=size, policy=ReducePolicy(chunk_size=3))
    assert shape(result) == [("reduce L1", 3), ("reduce L1", 3), ("reduce L1", 1), ("final", 3)]


def test_static_groups_keep_input_order() -> None:
    reducer = Reducer()
    tree_reduce(maps([1] * 7), reducer, tokens=size, policy=ReducePolicy(chunk_size=3))
    assert [[o.ids for o in group] for _, group in reducer.calls[:3]] == [
        [(0,), (1,), (2,)], [(3,), (4,), (5,)], [(6,)],
    ]


def test_default_policy_is_static_chunks_of_five() -> None:
    policy = ReducePolicy()
    assert policy.chunk_size == DEFAULT_CHUNK_SIZE == 5 and policy.token_budget is None
    assert not policy.adaptive
    result = tree_reduce(maps([1] * 6), Reducer(), tokens=size, policy=policy)
    assert shape(result) == [("reduce L1", 5), ("reduce L1", 1), ("final", 2)]


def test_static_max_levels_reached_runs_the_final_call_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="amapreduce.mapreduce.tree_reduce"):
        result = tree_reduce(maps([1] * 100), Reducer(), tokens=size, policy=ReducePolicy(chunk_size=2, max_levels=2))
    assert result.levels == 2
    assert result.nodes[-1].label == "final" and result.nodes[-1].inputs == 25
    assert len(result.warnings) == 1 and "chunk size of 2" in result.warnings[0]
    assert [r.getMessage() for r in caplog.records] == list(result.warnings)


def test_static_max_levels_reached_with_combine_combines_in_code() -> None:
    result = tree_reduce(
        maps([1] * 100), Reducer(), tokens=size, policy=ReducePolicy(chunk_size=2, max_levels=2), combine=union
    )
    assert result.combined_in_code and result.levels == 2
    assert "final" not in [node.label for node in result.nodes]
    assert result.output.ids == tuple(range(100))


# --- adaptive (§3, §7, §9) ----------------------------------------------------------------------


def test_adaptive_short_circuit_when_everything_fits() -> None:
    reducer = Reducer()
    result = tree_reduce(maps([10, 20, 30]), reducer, tokens=size, policy=ReducePolicy(token_budget=60))
    assert shape(result) == [("final", 3)]
    assert result.levels == 0 and result.nodes[0].input_tokens == 60 and result.warnings == ()


def test_adaptive_one_output_within_budget_is_one_final_call() -> None:
    result = tree_reduce(maps([5]), Reducer(), tokens=size, policy=ReducePolicy(token_budget=10))
    assert shape(result) == [("final", 1)]


def test_ffd_packs_largest_first_into_the_first_bin_with_room() -> None:
    # sorted: 6(#4) 5(#1) 4(#2) 3(#3) 2(#0) -> bin A: 6+4; bin B: 5+3+2; then back in input order.
    assert pack_bins([2, 5, 4, 3, 6], 10) == [[0, 1, 3], [2, 4]]


def test_ffd_equal_sizes_and_a_single_large_item() -> None:
    assert pack_bins([3, 3, 3, 3, 3], 9) == [[0, 1, 2], [3, 4]]
    assert pack_bins([4, 50, 4], 10) == [[0, 2], [1]]  # over the budget: a bin of its own
    assert pack_bins([10, 10], 10) == [[0], [1]]  # exactly full bins
    with pytest.raises(ValueError, match="budget"):
        pack_bins([1], 0)


def test_adaptive_reduce_calls_get_the_ffd_bins_and_never_exceed_the_budget() -> None:
    reducer = Reducer()
    result = tree_reduce(maps([2, 5, 4, 3, 6]), reducer, tokens=size, policy=ReducePolicy(token_budget=10))
    first_level = [[o.ids[0] for o in group] for node, group in reducer.calls if node.level == 1]
    assert first_level == [[0, 1, 3], [2, 4]]
    # level 1 outputs: 10//2=5 and 10//2=5 -> total 10 fits: final
    assert shape(result) == [("reduce L1", 3), ("reduce L1", 2), ("final", 2)]
    assert all(node.input_tokens <= 10 for node in result.nodes)
    assert sorted(result.output.ids) == [0, 1, 2, 3, 4]


def test_adaptive_several_levels() -> None:
    reducer = Reducer(shrink=lambda total: max(1, total // 3))
    result = tree_reduce(maps([30] * 20), reducer, tokens=size, policy=ReducePolicy(token_budget=100))
    # L1: 6 bins of 3x30 and one of 2x30 -> six 30s and a 20; L2: two bins of 3x30, the 20 carried
    # alone (no call); 30+30+20 fits: final.
    assert shape(result) == [("reduce L1", 3)] * 6 + [("reduce L1", 2)] + [("reduce L2", 3)] * 2 + [("final", 3)]
    assert result.levels == 2
    assert all(node.input_tokens <= 100 for node in result.nodes)
    assert sorted(result.output.ids) == list(range(20))
    assert result.nodes[-1].label == "final" and result.peak_input_tokens <= 100


def test_single_output_over_budget_is_warned_and_never_dropped(caplog: pytest.LogCaptureFixture) -> None:
    reducer = Reducer()
    with caplog.at_level(logging.WARNING, logger="amapreduce.mapreduce.tree_reduce"):
        result = tree_reduce(
            maps([500, 30, 30, 30, 30]), reducer, tokens=size, policy=ReducePolicy(token_budget=100), combine=union
        )
    assert any("output 0 of level 0 has 500 tokens, over the token budget of 100" in w for w in result.warnings)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == list(result.warnings)
    # the big output was never sent to a call: each call stayed within the budget
    assert reducer.calls and all(node.input_tokens <= 100 for node, _ in reducer.calls)
    assert all(0 not in [i for o in group for i in o.ids] for _, group in reducer.calls)
    assert result.combined_in_code and sorted(result.output.ids) == [0, 1, 2, 3, 4]
    assert sum(1 for w in result.warnings if "500 tokens" in w) == 1  # warned once, not once per level


def test_single_output_over_budget_without_combine_goes_to_the_final_call() -> None:
    reducer = Reducer()
    result = tree_reduce(maps([500, 30, 30]), reducer, tokens=size, policy=ReducePolicy(token_budget=100))
    assert not result.combined_in_code
    assert result.nodes[-1].label == "final" and result.nodes[-1].input_tokens > 100
    assert any("final call gets them all anyway" in w for w in result.warnings)
    assert sorted(result.output.ids) == [0, 1, 2]


def test_one_output_over_budget_alone() -> None:
    result = tree_reduce(maps([500]), Reducer(), tokens=size, policy=ReducePolicy(token_budget=100), combine=union)
    assert result.nodes == () and result.combined_in_code and result.output.ids == (0,)
    assert any("over the token budget" in w for w in result.warnings)


def test_adaptive_max_levels_reached_without_combine_runs_final(caplog: pytest.LogCaptureFixture) -> None:
    reducer = Reducer(shrink=lambda total: total - 1)  # progress, but slow
    with caplog.at_level(logging.WARNING, logger="amapreduce.mapreduce.tree_reduce"):
        result = tree_reduce(
            maps([40] * 8), reducer, tokens=size, policy=ReducePolicy(token_budget=100, max_levels=1)
        )
    assert result.levels == 1
    assert {node.label for node in result.nodes} == {"reduce L1", "final"}
    assert any("max_levels (1) reached" in w for w in result.warnings)
    assert any("max_levels (1) reached" in r.getMessage() for r in caplog.records)
    assert result.nodes[-1].input_tokens > 100 and not result.combined_in_code


def test_adaptive_max_levels_reached_with_combine_combines() -> None:
    reducer = Reducer(shrink=lambda total: total - 1)
    result = tree_reduce(
        maps([40] * 8), reducer, tokens=size, policy=ReducePolicy(token_budget=100, max_levels=1), combine=union
    )
    assert result.levels == 1 and result.combined_in_code
    assert all(node.label == "reduce L1" and node.input_tokens <= 100 for node in result.nodes)
    assert sorted(result.output.ids) == list(range(8))


def test_no_progress_stops_the_levels() -> None:
    reducer = Reducer(shrink=lambda total: total + 10)  # a reduce whose output grows (§14)
    result = tree_reduce(maps([40] * 8), reducer, tokens=size, policy=ReducePolicy(token_budget=100), combine=union)
    assert result.levels == 1  # max_levels (10) not reached: stopped after the level that did not help
    assert any("level 1 did not lower the total (320 -> 360 tokens)" in w for w in result.warnings)
    assert result.combined_in_code and sorted(result.output.ids) == list(range(8))


def test_no_two_outputs_fit_together_stops_without_calls() -> None:
    reducer = Reducer()
    result = tree_reduce(maps([60, 60, 60]), reducer, tokens=size, policy=ReducePolicy(token_budget=100), combine=union)
    assert reducer.calls == [] and result.levels == 0 and result.combined_in_code
    assert any("no two of the 3 remaining outputs fit" in w for w in result.warnings)


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=40),
    budget=st.integers(min_value=1, max_value=250),
    max_levels=st.integers(min_value=1, max_value=6),
)
def test_with_combine_no_call_exceeds_the_budget_and_nothing_is_dropped(
    sizes: list[int], budget: int, max_levels: int
) -> None:
    reducer = Reducer()
    result = tree_reduce(
        maps(sizes), reducer, tokens=size, policy=ReducePolicy(token_budget=budget, max_levels=max_levels),
        combine=union,
    )
    assert all(node.input_tokens <= budget for node in result.nodes)
    assert all(node.inputs >= 2 for node in result.nodes if node.kind == "reduce")
    assert sorted(result.output.ids) == list(range(len(sizes)))
    assert result.levels <= max_levels
    assert len(result.nodes) == len(reducer.calls)


# --- validation (§13) ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk_size": 3, "token_budget": 100}, "not both"),
        ({"chunk_size": 1}, "chunk_size must be an integer >= 2, got 1"),
        ({"chunk_size": True}, "chunk_size must be an integer >= 2"),
        ({"token_budget": 0}, "token_budget must be an integer >= 1, got 0"),
        ({"max_levels": 0}, "max_levels must be an integer >= 1, got 0"),
    ],
)
def test_policy_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        ReducePolicy(**kwargs)
    assert isinstance(raised.value, UserError)


@pytest.mark.parametrize("ratio", [0, -0.5, 1.01, float("nan"), float("inf")])
def test_budget_ratio_outside_zero_one_is_refused(ratio: float) -> None:
    with pytest.raises(ConfigError, match=r"budget ratio must be in \(0, 1\]"):
        ReducePolicy.from_context_window(128_000, ratio)


def test_policy_from_context_window() -> None:
    policy = ReducePolicy.from_context_window(128_000)
    assert policy.token_budget == 64_000 and policy.chunk_size is None and policy.adaptive
    assert ReducePolicy.from_context_window(1000, 1, max_levels=3) == ReducePolicy(token_budget=1000, max_levels=3)
    with pytest.raises(ConfigError, match="max_levels"):
        ReducePolicy.from_context_window(1000, max_levels=0)
    with pytest.raises(ConfigError, match="leaves a token budget of 0"):
        ReducePolicy.from_context_window(1, 0.5)
    with pytest.raises(ConfigError, match="context_window"):
        ReducePolicy.from_context_window(0)


def test_no_outputs_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one output"):
        tree_reduce([], Reducer(), tokens=size, policy=ReducePolicy())


def test_a_negative_token_count_is_an_error() -> None:
    with pytest.raises(ValueError, match="token count"):
        tree_reduce(maps([-1]), Reducer(), tokens=size, policy=ReducePolicy(token_budget=5))


# --- trace and labels (§10, §11) -----------------------------------------------------------------


def test_every_node_is_a_trace_event_with_its_label_and_level() -> None:
    trace = ListTrace()
    outputs = maps([2, 5, 4, 3, 6])
    for index, out in enumerate(outputs):
        record_map(trace, index, input_tokens=out.tokens)
    result = tree_reduce(outputs, Reducer(), tokens=size, policy=ReducePolicy(token_budget=10), trace=trace)
    assert {name for name, _ in trace.events} == {"tree_node"}
    events = [data for _, data in trace.events]
    assert [e["node"] for e in events] == ["map"] * 5 + ["reduce L1", "reduce L1", "final"]
    assert events[5] == {"node": "reduce L1", "level": 1, "index": 0, "inputs": 3, "input_tokens": 10}
    assert events[6] == {"node": "reduce L1", "level": 1, "index": 1, "inputs": 2, "input_tokens": 10}
    assert events[7] == {"node": "final", "level": 2, "index": 0, "inputs": 2, "input_tokens": 10}
    assert events[0] == {"node": "map", "level": 0, "index": 0, "inputs": 1, "input_tokens": 2}
    assert [e["node"] for e in events[5:]] == [node.label for node in result.nodes]


def test_node_labels() -> None:
    assert Node("map", 0, 0, 1, 0).label == "map"
    assert Node("reduce", 3, 0, 2, 0).label == "reduce L3"
    assert Node("final", 4, 0, 2, 0).label == "final"
    assert Node("direct", 0, 0, 9, 0).label == "direct"


# --- direct short-circuit (§3) -------------------------------------------------------------------


def test_direct_handles_everything_when_the_estimate_fits() -> None:
    trace = ListTrace()
    seen: list[tuple[list[str], Node]] = []

    def direct(items: list[str], node: Node) -> str:
        seen.append((items, node))
        return "+".join(items)

    result = tree_reduce_direct(["ab", "cd", "ef"], direct, estimate=len, policy=ReducePolicy(token_budget=6),
                                trace=trace)
    assert result is not None and result.output == "ab+cd+ef"
    assert seen == [(["ab", "cd", "ef"], Node("direct", 0, 0, 3, 6))]
    assert [data["node"] for _, data in trace.events] == ["direct"]
    assert result.levels == 0 and not result.combined_in_code


def test_direct_is_skipped_over_budget_and_in_static_mode() -> None:
    def direct(items: list[str], node: Node) -> str:
        raise AssertionError("direct must not run")

    assert tree_reduce_direct(["abcd", "ef"], direct, estimate=len, policy=ReducePolicy(token_budget=5)) is None
    assert tree_reduce_direct(["a"], direct, estimate=len, policy=ReducePolicy(chunk_size=2)) is None
    with pytest.raises(ValueError, match="at least one item"):
        tree_reduce_direct([], direct, estimate=len, policy=ReducePolicy(token_budget=5))
