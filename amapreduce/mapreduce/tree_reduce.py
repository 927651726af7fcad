"""A tree reduce of many outputs into one, under a chunk size or a token budget.

Why: one reduce call over every map output stops working when the outputs outgrow the model's
context window, and its quality drops well before that (design note
`mapreduce-ensemble-tree-reduce.txt` §1). The outputs are therefore reduced level by level, each
reduce call seeing only a slice of them, until what is left fits one `final` call. Discovery
(issue 12, point 2) uses this to merge candidate lists that no single prompt could hold; the
function is generic (`T` is whatever one output is) so that nothing here knows about entities.

Two strategies, chosen by `ReducePolicy` (§2):

* static (`chunk_size`, default 5): groups of `chunk_size` outputs in order, level by level,
  until at most `chunk_size` remain, then one `final` call (§6). The shape depends on N alone:
  deterministic and known before anything runs. As in §6, a last group of a single output is
  still a reduce call, so every level has the same shape.
* adaptive (`token_budget`): the outputs' token counts decide (§7). Everything within the
  budget: one `final` call at once (short-circuit, §3). Otherwise first-fit-decreasing bin
  packing (§9) makes bins of at most `token_budget` tokens, one reduce call per bin, and the
  loop repeats on the smaller outputs. A single output over the budget is warned about and goes
  on alone, never dropped (§9, §12, §14); a bin holding one output is carried to the next level
  as it is, with no call, so no reduce call ever goes over the budget because of one big output.

Both stop after `max_levels` intermediate levels (§7's `maxReduceLevels`; applied to static
trees too, as a guard against a policy no tree can satisfy), and the adaptive loop also stops
when a level did not lower the total (a reduce prompt whose output grows, §14). What remains then
goes to the `final` call anyway with a warning, as the design note does (§12), or, when the
caller gives `combine` (a code-only union), to `combine` instead of a call that would exceed the
budget.

Each node writes one `tree_node` trace event (§10, §11: the node's label and level), so a trace
shows the tree's shape: `map` (recorded by the caller with `record_map`), `reduce L{k}`,
`final`, or `direct` (§3's short-circuit before any map, `tree_reduce_direct`). Nothing here
reads the clock: the same inputs and counts give the same tree.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from amapreduce.errors import ConfigError
from amapreduce.trace import Trace

__all__ = [
    "DEFAULT_BUDGET_RATIO",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_MAX_LEVELS",
    "Node",
    "ReducePolicy",
    "TreeReduceResult",
    "pack_bins",
    "record_map",
    "tree_reduce",
    "tree_reduce_direct",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
ItemT = TypeVar("ItemT")
"""The item type of `tree_reduce_direct` (inputs before any map, the design note's `T`)."""

DEFAULT_CHUNK_SIZE = 5
"""Outputs per reduce call when a policy names neither strategy (the design note's default, §4)."""

DEFAULT_MAX_LEVELS = 10
"""Intermediate reduce levels at most (§4's `maxReduceLevels` default)."""

DEFAULT_BUDGET_RATIO = 0.5
"""Share of the context window a reduce call's input may fill (§4's `budgetRatio` default): the
rest is left for the prompt's instructions and the reply."""

NodeKind = Literal["map", "reduce", "final", "direct"]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ReducePolicy:
    """How outputs are grouped: static `chunk_size` or adaptive `token_budget` (§2, §13).

    The two are exclusive; with neither the policy is static with chunks of
    `DEFAULT_CHUNK_SIZE` (and `chunk_size` reads 5). Invalid values raise `ConfigError` (a
    `UserError`) at construction, with the value and what to do, because a policy comes from a
    user's decision file and a bad one must fail before any model call is spent.
    """

    chunk_size: int | None = None
    token_budget: int | None = None
    max_levels: int = DEFAULT_MAX_LEVELS

    def __post_init__(self) -> None:
        if self.chunk_size is not None and self.token_budget is not None:
            raise ConfigError(
                f"a reduce policy takes chunk_size or token_budget, not both (got chunk_size={self.chunk_size}, "
                f"token_budget={self.token_budget}). Keep chunk_size for a fixed tree or token_budget for one "
                "sized by token counts."
            )
        if self.chunk_size is not None and (not _is_int(self.chunk_size) or self.chunk_size < 2):
            raise ConfigError(
                f"chunk_size must be an integer >= 2, got {self.chunk_size!r}. A reduce call must merge at "
                "least two outputs, or the tree never shrinks."
            )
        if self.token_budget is not None and (not _is_int(self.token_budget) or self.token_budget < 1):
            raise ConfigError(f"token_budget must be an integer >= 1, got {self.token_budget!r}.")
        if not _is_int(self.max_levels) or self.max_levels < 1:
            raise ConfigError(
                f"max_levels must be an integer >= 1, got {self.max_levels!r}. It bounds the intermediate "
                "reduce levels; use 1 for at most one level before the final call."
            )
        if self.chunk_size is None and self.token_budget is None:
            object.__setattr__(self, "chunk_size", DEFAULT_CHUNK_SIZE)

    @classmethod
    def from_context_window(
        cls, context_window: int, ratio: float = DEFAULT_BUDGET_RATIO, *, max_levels: int = DEFAULT_MAX_LEVELS
    ) -> ReducePolicy:
        """An adaptive policy whose budget is `int(context_window * ratio)` (§4's
        `contextWindowSize` x `budgetRatio`); `ratio` must be in (0, 1]."""
        if not _is_int(context_window) or context_window < 1:
            raise ConfigError(f"context_window must be an integer >= 1 (tokens), got {context_window!r}.")
        if (
            isinstance(ratio, bool)
            or not isinstance(ratio, int | float)
            or not math.isfinite(ratio)
            or not 0 < ratio <= 1
        ):
            raise ConfigError(
                f"budget ratio must be in (0, 1], got {ratio!r}: it is the share of the context window a "
                "reduce call's input may fill (0.5 leaves half for instructions and the reply)."
            )
        budget = int(context_window * ratio)
        if budget < 1:
            raise ConfigError(
                f"a context window of {context_window} tokens x ratio {ratio} leaves a token budget of "
                f"{budget}; raise the ratio or the context window."
            )
        return cls(token_budget=budget, max_levels=max_levels)

    @property
    def adaptive(self) -> bool:
        """True for a token-budget policy, False for a static chunk-size one."""
        return self.token_budget is not None


@dataclass(frozen=True)
class Node:
    """One node of the tree: a map task, a reduce call, the final call or the direct call."""

    kind: NodeKind
    level: int
    """0 = map (and direct), 1.. = reduce levels; final = the last reduce level + 1."""
    index: int
    """Position within its level (reduce calls of a level are numbered 0.. in run order)."""
    inputs: int
    """How many outputs (or items, for map and direct) the node works on."""
    input_tokens: int
    """Their token count (the sum of `tokens` over them; for map and direct, the caller's estimate)."""

    @property
    def label(self) -> str:
        """`map`, `reduce L{level}`, `final` or `direct`: the names traces and summaries use."""
        return f"reduce L{self.level}" if self.kind == "reduce" else self.kind


@dataclass(frozen=True)
class TreeReduceResult(Generic[T]):
    """What a tree reduce produced, and the shape it took to get there."""

    output: T
    nodes: tuple[Node, ...]
    """Every reduce / final / direct node that ran, in run order (map nodes are the caller's)."""
    levels: int
    """Intermediate reduce levels that made at least one call."""
    warnings: tuple[str, ...]
    combined_in_code: bool
    """True when `combine` produced the output instead of a final call (see the module doc)."""

    @property
    def calls(self) -> int:
        """Model calls made: one per node."""
        return len(self.nodes)

    @property
    def peak_input_tokens(self) -> int:
        """The largest input of any call (0 when none ran): what must fit the context window."""
        return max((node.input_tokens for node in self.nodes), default=0)


@dataclass
class _Item(Generic[T]):
    """One output still to reduce, with its token count and whether its size was warned about."""

    value: T
    tokens: int
    warned: bool = False


@dataclass
class _Run(Generic[T]):
    """The state of one tree reduce: the nodes run and the warnings given so far."""

    reduce: Callable[[list[T], Node], T]
    tokens: Callable[[T], int]
    trace: Trace | None
    nodes: list[Node] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        logger.warning("%s", message)
        self.warnings.append(message)

    def item(self, value: T) -> _Item[T]:
        return _Item(value, _token_count(self.tokens, value))

    def call(self, kind: NodeKind, level: int, index: int, items: list[_Item[T]]) -> _Item[T]:
        node = Node(kind, level, index, len(items), sum(item.tokens for item in items))
        self.nodes.append(node)
        _record(self.trace, node)
        return self.item(self.reduce([item.value for item in items], node))


def _token_count(tokens: Callable[[T], int], value: T) -> int:
    count = tokens(value)
    if not _is_int(count) or count < 0:
        raise ValueError(f"a token count must be an integer >= 0, got {count!r}")
    return count


def _record(trace: Trace | None, node: Node) -> None:
    """Write `node` as one `tree_node` event: its label, level, index, inputs and input tokens."""
    if trace is not None:
        trace.write(
            "tree_node", node=node.label, level=node.level, index=node.index, inputs=node.inputs,
            input_tokens=node.input_tokens,
        )


def record_map(trace: Trace | None, index: int, *, input_tokens: int = 0, inputs: int = 1) -> Node:
    """The map node number `index` (level 0), written to `trace` like every other node.

    Map tasks run in the caller's engine, not here; the caller records each so that the trace
    shows the whole tree (§10), then passes the map outputs to `tree_reduce`.
    """
    node = Node("map", 0, index, inputs, input_tokens)
    _record(trace, node)
    return node


def pack_bins(sizes: Sequence[int], budget: int) -> list[list[int]]:
    """First-fit-decreasing bins of the indices of `sizes`, each bin's sizes summing to <= `budget`
    except a size over `budget`, which gets a bin of its own (§9).

    FFD decides which outputs share a bin (sizes taken largest first, ties by position; each goes
    to the first bin with room, else to a new bin). The result is then put back in input order,
    within each bin and across bins (by each bin's first index), so that a reduce call sees its
    outputs, and the next level the reduced outputs, in the order they came: what came first
    stays first (discovery keeps entities in first-seen order).
    """
    if not _is_int(budget) or budget < 1:
        raise ValueError(f"a bin budget must be an integer >= 1, got {budget!r}")
    bins: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        size = sizes[index]
        target = next((b for b, free in enumerate(room) if size <= free), None) if size <= budget else None
        if target is None:
            bins.append([index])
            room.append(budget - size)
        else:
            bins[target].append(index)
            room[target] -= size
    return sorted((sorted(members) for members in bins), key=lambda members: members[0])


def tree_reduce(
    outputs: Sequence[T],
    reduce: Callable[[list[T], Node], T],
    *,
    tokens: Callable[[T], int],
    policy: ReducePolicy,
    combine: Callable[[list[T]], T] | None = None,
    trace: Trace | None = None,
) -> TreeReduceResult[T]:
    """Reduce `outputs` (the map outputs, in order) to one by calls of `reduce` (see the module doc).

    `reduce(outputs, node)` is one model call over one group; `tokens(output)` counts one output
    (provider usage or a tokenizer, `llm.tokens.TokenCounter`); `combine(outputs)` is an optional
    code-only union used instead of a final call that would exceed the budget or the static tree's
    levels. Errors raised by `reduce` or `combine` propagate (the caller's retry policy applies to
    its own calls, §12). Raises `ValueError` for no outputs: there is nothing to reduce.
    """
    if not outputs:
        raise ValueError("tree_reduce needs at least one output; the map phase produced none")
    run = _Run(reduce, tokens, trace)
    current = [run.item(value) for value in outputs]
    if policy.token_budget is not None:
        current, levels = _adaptive_levels(run, current, policy.token_budget, policy.max_levels)
        over = sum(item.tokens for item in current) > policy.token_budget
        limit = f"the token budget of {policy.token_budget}"
    else:
        chunk = policy.chunk_size or DEFAULT_CHUNK_SIZE
        current, levels = _static_levels(run, current, chunk, policy.max_levels)
        over = len(current) > chunk
        limit = f"the chunk size of {chunk}"
    total = sum(item.tokens for item in current)
    if over and combine is not None:
        run.warn(
            f"tree reduce: {len(current)} outputs ({total} tokens) are still over {limit} after {levels} "
            "level(s); they are combined in code instead of one final call over the limit"
        )
        output = combine([item.value for item in current])
        return TreeReduceResult(output, tuple(run.nodes), levels, tuple(run.warnings), combined_in_code=True)
    if over:
        run.warn(
            f"tree reduce: {len(current)} outputs ({total} tokens) are still over {limit} after {levels} "
            "level(s); the final call gets them all anyway. Raise the limit or make the outputs more compact."
        )
    final = run.call("final", levels + 1, 0, current)
    return TreeReduceResult(final.value, tuple(run.nodes), levels, tuple(run.warnings), combined_in_code=False)


def _static_levels(run: _Run[T], current: list[_Item[T]], chunk: int, max_levels: int) -> tuple[list[_Item[T]], int]:
    """§6: groups of `chunk` in order, level by level, until at most `chunk` remain."""
    levels = 0
    while len(current) > chunk and levels < max_levels:
        levels += 1
        groups = [current[start : start + chunk] for start in range(0, len(current), chunk)]
        current = [run.call("reduce", levels, index, group) for index, group in enumerate(groups)]
    return current, levels


def _adaptive_levels(
    run: _Run[T], current: list[_Item[T]], budget: int, max_levels: int
) -> tuple[list[_Item[T]], int]:
    """§7 step 4: FFD bins and one call per bin of two or more, until the total fits `budget`,
    `max_levels` levels have run, or a level cannot or did not lower the total."""
    levels = 0
    total = sum(item.tokens for item in current)
    while total > budget:
        for position, item in enumerate(current):
            if item.tokens > budget and not item.warned:
                item.warned = True
                run.warn(
                    f"tree reduce: output {position} of level {levels} has {item.tokens} tokens, over the token "
                    f"budget of {budget}; it goes on alone (never dropped). Raise the budget or make the "
                    "outputs more compact."
                )
        if levels >= max_levels:
            run.warn(f"tree reduce: max_levels ({max_levels}) reached with {total} tokens over the budget of {budget}")
            break
        bins = pack_bins([item.tokens for item in current], budget)
        if all(len(members) == 1 for members in bins):
            run.warn(
                f"tree reduce: no two of the {len(current)} remaining outputs fit the budget of {budget} "
                f"together ({total} tokens in all); stopping after {levels} level(s)"
            )
            break
        levels += 1
        reduced: list[_Item[T]] = []
        calls = 0
        for members in bins:
            if len(members) == 1:
                reduced.append(current[members[0]])
                continue
            reduced.append(run.call("reduce", levels, calls, [current[m] for m in members]))
            calls += 1
        current = reduced
        previous, total = total, sum(item.tokens for item in current)
        if total >= previous:
            run.warn(
                f"tree reduce: level {levels} did not lower the total ({previous} -> {total} tokens); "
                "stopping the reduce levels"
            )
            break
    return current, levels


def tree_reduce_direct(
    items: Sequence[ItemT],
    direct: Callable[[list[ItemT], Node], T],
    *,
    estimate: Callable[[ItemT], int],
    policy: ReducePolicy,
    trace: Trace | None = None,
) -> TreeReduceResult[T] | None:
    """§3's short-circuit: one `direct` call over every item, when the policy is adaptive and the
    estimated input fits its budget; None otherwise (then the caller runs the map phase and
    `tree_reduce`).

    Why: when everything fits one prompt, a map phase and a reduce cost more calls for nothing.
    The items are inputs (before any map), so `estimate` is a pre-call estimate, not a count of
    outputs. Static policies never short-circuit (§4: direct is adaptive only). Discovery does
    not use it: its map phase is what finds the candidates.
    """
    if not items:
        raise ValueError("tree_reduce_direct needs at least one item")
    if policy.token_budget is None:
        return None
    estimated = sum(_token_count(estimate, item) for item in items)
    if estimated > policy.token_budget:
        return None
    node = Node("direct", 0, 0, len(items), estimated)
    _record(trace, node)
    output = direct(list(items), node)
    return TreeReduceResult(output, (node,), 0, (), combined_in_code=False)
