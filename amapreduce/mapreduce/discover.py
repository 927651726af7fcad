"""Discovery as MapReduce: find the task matrix, then fill it (issue 12, point 2).

Why: a manager that scouts the entity set in its own context overflows long before 300 entities
spread over 20 list pages are listed. Here the scouting is a MapReduce of its own, so the
entity list never enters the manager's context:

1. map: one `Decision` over the sources (list pages or search queries fill `__0__` of the
   discover template; the sources are context only) runs through the engine like any other:
   sub-agents return candidate rows with evidence, several per task, a checkpoint makes a resumed
   run skip finished batches, and the engine's code reduce dedups them by normalised key and
   records conflicts.
2. merge (`merge: "model"`): the candidates (id and key values only), grouped per map task, are
   the map outputs of a `tree_reduce` under the spec's chunk size or token budget. Each reduce
   node is one `Merger.merge` call that groups the fuzzy duplicates of its bin; its output is
   the kept candidates, and code remembers which candidates each one stands for (union-find).
   `combine`, the code-only union, is plain concatenation. The merge prompt's fixed part is
   kept out of the token budget, so no merge call's whole prompt exceeds it.
3. result: the entities' key values in first-seen order and kept spelling (the fill stage's
   task matrix), the merged table (each entity's kept candidate with its evidence, gaps filled
   from the candidates merged into it) and a `DiscoverySummary` (`mapreduce.result`) for `result.json`.

Merge calls are not in the journal (its entries are the engine's). A resumed run replays the map
from the journal, which gives the same candidates, ids and tree again, so a merger with a reply
cache (`ModelMerger(cache=...)`, which a run keeps in its directory) answers them from there; without
one they are asked again (they are few, and each holds key values only). `merge_calls` counts
the merges decided either way (a cached prompt's tokens are counted, not the provider's).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from amapreduce.decision.discover_spec import DiscoverSpec
from amapreduce.decision.model import Decision
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.batching import BatchPlan, plan_batches
from amapreduce.mapreduce.merge import (
    Candidate,
    Merger,
    candidate_lines,
    merge_overhead_tokens,
    normalize_groups,
)
from amapreduce.mapreduce.result import (
    INTERRUPTED,
    RUN_STOPPING_ERRORS,
    DiscoverySummary,
    MapReduceResult,
    stop_ending,
)
from amapreduce.mapreduce.tree_reduce import Node, ReducePolicy, record_map, tree_reduce
from amapreduce.table.table import CellStatus, Table
from amapreduce.trace import Trace

if TYPE_CHECKING:
    from amapreduce.llm.tokens import TokenCounter
    from amapreduce.mapreduce.checkpoint import Checkpoint
    from amapreduce.mapreduce.engine import MapReduceEngine

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "DISCOVERY_RATIONALE",
    "MAX_SUMMARY_WARNINGS",
    "DiscoveryResult",
    "discover",
    "discovery_decision",
    "discovery_plan",
]

logger = logging.getLogger(__name__)

DEFAULT_CONTEXT_WINDOW = 128_000
"""Context window assumed when neither the settings nor the model's info name one (tokens)."""

DISCOVERY_RATIONALE = (
    "entity discovery: each sub-question names a list page or a search query; return EVERY entity it lists, "
    "one row each, not only the first few"
)
"""Why the map's batches are what they are, as sub-agents read it: a list, complete, not a sample."""

_STOPS: tuple[type[BaseException], ...] = (*RUN_STOPPING_ERRORS, KeyboardInterrupt)
"""What stops a merge the way it stops the map (the rest propagates as raised)."""

MAX_SUMMARY_WARNINGS = 50
"""Warnings kept in a summary; the rest are counted (a sloppy merge model must not bloat result.json)."""


@dataclass(frozen=True)
class DiscoveryResult:
    """The discovered entities, their table and how they were found."""

    rows: list[list[str]]
    """The entities' key values in `key_columns` order, first-seen order: the fill matrix."""
    table: Table
    """The merged candidates with their cells' source, quote and evidence."""
    summary: DiscoverySummary
    map_result: MapReduceResult
    """The map's result; its `ending` is the discovery's (a map or merge that stopped early ended it)."""
    merge_usage: Usage = field(default_factory=Usage)
    """What the merge calls used (replies from the run's cache cost nothing again)."""

    @property
    def stopped(self) -> bool:
        """The map or the merge stopped early (a spent budget, `cancel()`, Ctrl-C, a provider down):
        `rows` is empty and `table` holds the candidates found so far, unmerged."""
        return self.map_result.ending.status.ended_early


def _stopped(spec: DiscoverSpec, map_result: MapReduceResult, candidates: int, merge_usage: Usage) -> DiscoveryResult:
    """A discovery whose map or merge stopped early: no entities, the candidates found so far."""
    summary = DiscoverySummary(sources=len(spec.sources), candidates=candidates, entities=0, merge_calls=0, levels=0,
                               nodes=(), peak_prompt_tokens=0, token_budget=None, warnings=())
    return DiscoveryResult(rows=[], table=map_result.table, summary=summary, map_result=map_result,
                           merge_usage=merge_usage)


def discovery_decision(spec: DiscoverSpec) -> Decision:
    """The map stage's decision: one task per source, the source as context only, the spec's
    key columns, several rows per task.

    Raises:
        DecisionError: the spec does not make a valid decision (cannot happen for a validated spec
            unless the decision rules are stricter than the spec's).
    """
    return Decision.parse({
        "task_matrix": [[source] for source in spec.sources],
        "template": spec.template,
        "json_schema": spec.json_schema,
        "matrix_columns": [None],
        "key_columns": list(spec.resolved_key_columns),
        "batch_size": spec.batch_size,
        "batch_strategy": {"type": "per_atom", "rationale": DISCOVERY_RATIONALE},
    })


def discovery_plan(spec: DiscoverSpec, *, max_batches: int | None) -> BatchPlan:
    """The map stage's batch plan (what the `mapreduce` tool shows before discovery runs)."""
    return plan_batches(discovery_decision(spec), max_batches=max_batches)


@dataclass(frozen=True)
class _Output:
    """One output of the merge tree: candidates, and whether a merge call has already grouped
    them (a merged list alone in the final node needs no second call)."""

    candidates: tuple[Candidate, ...]
    merged: bool


class _Merging:
    """One discovery's merge state: the union-find over candidate ids and the call figures."""

    def __init__(self, merger: Merger, trace: Trace) -> None:
        self.merger = merger
        self.trace = trace
        self.parent: dict[str, str] = {}
        self.calls = 0
        self.peak = 0
        self.usage = Usage()
        self.warnings: list[str] = []

    def find(self, cid: str) -> str:
        root = cid
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while cid != root:  # path compression
            self.parent[cid], cid = root, self.parent.get(cid, root)
        return root

    def reduce(self, outputs: list[_Output], node: Node) -> _Output:
        """One reduce node: one merge call over the bin's candidates (none for fewer than two, or
        for a single list a merge call already grouped)."""
        flat = [c for out in outputs for c in out.candidates]
        if len(flat) < 2 or (len(outputs) == 1 and outputs[0].merged):
            return _Output(tuple(flat), merged=True)
        reply = self.merger.merge(flat, node)
        self.calls += 1
        self.peak = max(self.peak, reply.prompt_tokens)
        if not reply.cached:
            self.usage = self.usage + reply.usage
        raw = [{"ids": list(g.ids), "keep": g.keep} for g in reply.groups]
        groups, problems = normalize_groups(raw, [c.id for c in flat])
        self.warnings.extend([*reply.warnings, *problems])
        by_id = {c.id: c for c in flat}
        for group in groups:
            for member in group.ids:
                if member != group.keep:
                    self.parent[member] = group.keep
        kept = tuple(by_id[g.keep] for g in groups)
        self.trace.write(
            "merge_call", node=node.label, level=node.level, index=node.index, candidates=len(flat),
            entities=len(kept), prompt_tokens=reply.prompt_tokens, usage=reply.usage.to_json(), cached=reply.cached,
            warnings=list(reply.warnings) + problems, reply=reply.text,
        )
        return _Output(kept, merged=True)


def _counter(merger: Merger | None, counter: TokenCounter | None) -> TokenCounter:
    if counter is not None:
        return counter
    found = getattr(merger, "counter", None)
    from amapreduce.llm.tokens import TokenCounter

    return found if isinstance(found, TokenCounter) else TokenCounter()


def _overhead(merger: Merger, keys: Sequence[str], counter: TokenCounter) -> int:
    """Prompt tokens a merge call spends besides its candidates (the fixed instructions)."""
    own = getattr(merger, "overhead_tokens", None)
    if callable(own):
        return int(own(keys))
    return merge_overhead_tokens(counter, keys)


def _merged_table(table: Table, order: list[tuple[int, list[int]]]) -> Table:
    """Each entity's kept row (cells, evidence, conflicts), its missing non-key cells filled from
    the rows merged into it, in first-seen order."""
    merged = table.empty_like()
    for kept, members in order:
        row = merged.merge_row(table.rows[kept])
        if row is None:
            continue
        for member in members:
            for column, cell in table.rows[member].cells.items():
                if column in table.key_columns or cell.status is CellStatus.MISSING:
                    continue
                if row.cells[column].status is CellStatus.MISSING:
                    row.cells[column] = dataclasses.replace(cell, alternatives=list(cell.alternatives))
    return merged


def discover(
    engine: MapReduceEngine,
    spec: DiscoverSpec,
    *,
    merger: Merger | None,
    checkpoint: Checkpoint | None = None,
    trace: Trace | None = None,
    context_window: int = DEFAULT_CONTEXT_WINDOW,
    counter: TokenCounter | None = None,
) -> DiscoveryResult:
    """Run discovery for `spec` (see the module doc).

    Args:
        engine: runs the map stage (its limiter, budget, checkpointing and evidence checks).
        spec: the decision's `discover` part.
        merger: merges fuzzy duplicates when `spec.merge == "model"`; None: code dedup only
            (with a warning when the spec asked for a model merge).
        checkpoint: the run's journal: finished map batches are not run again on resume.
        trace: where `tree_node`, `merge_call` and `discovery` events go (default: the engine's).
        context_window: the merge model's context window, for the token budget when the spec
            gives neither `chunk_size` nor `token_budget`.
        counter: counts candidate tokens (default: the merger's counter, else chars/4 or a tokenizer).

    A map or a merge that stopped early (a spent budget, `cancel()`, Ctrl-C, a provider down) is
    returned `stopped` (see `DiscoveryResult.stopped`), its map result's `ending` saying why.

    Raises:
        Exception: any other error a merge call raises.
    """
    trace = trace if trace is not None else engine.trace
    decision = discovery_decision(spec)
    plan = plan_batches(decision, max_batches=engine.config.max_batches)
    map_result = engine.run(decision, plan=plan, checkpoint=checkpoint)
    table = map_result.table
    keys = table.key_columns
    candidates = [Candidate(id=f"c{i}", values={k: row.cells[k].value for k in keys}) for i, row in enumerate(table.rows)]
    if map_result.ending.status.ended_early:
        return _stopped(spec, map_result, len(candidates), Usage())
    labels = ["map"] * len(plan.batches)
    for index, batch in enumerate(plan.batches):
        record_map(trace, index, inputs=batch.size)
    warnings: list[str] = []
    budget: int | None = None
    merging: _Merging | None = None
    levels = 0
    if spec.merge == "model" and merger is None:
        warnings.append("discover.merge is \"model\" but no merge model is configured; only exact duplicates were merged")
        logger.warning("%s", warnings[-1])
    elif spec.merge == "model" and len(candidates) > 1 and merger is not None:
        merging = _Merging(merger, trace)
        tokens = _counter(merger, counter)
        budget = spec.token_budget_for(context_window)
        candidate_budget = None
        if budget is not None:
            overhead = _overhead(merger, keys, tokens)
            candidate_budget = max(1, budget - overhead)
            if budget <= overhead:
                warnings.append(f"the token budget of {budget} is not above the merge prompt's own {overhead} tokens; "
                                "each merge call goes over it")
        policy = ReducePolicy(chunk_size=spec.chunk_size, token_budget=candidate_budget, max_levels=spec.max_levels)
        by_task: dict[int, list[Candidate]] = {}
        for cand, row in zip(candidates, table.rows, strict=True):
            by_task.setdefault(row.task_index, []).append(cand)
        outputs = [_Output(tuple(by_task[t]), merged=False) for t in sorted(by_task)]
        try:
            result = tree_reduce(
                outputs, merging.reduce,
                # +1 per list: the newline that joins it to the next one in a prompt
                tokens=lambda out: tokens.count(candidate_lines(out.candidates)) + 1,
                policy=policy,
                combine=lambda outs: _Output(tuple(c for out in outs for c in out.candidates), merged=True),
                trace=trace,
            )
        except _STOPS as exc:
            # A spent budget, a provider down or Ctrl-C during the merge stops the run like one in
            # the map: the candidates found so far are the partial result.
            ending = INTERRUPTED if isinstance(exc, KeyboardInterrupt) else stop_ending(exc)
            ending = dataclasses.replace(ending, reason=f"{ending.reason or 'cancelled'} (while merging candidates)")
            return _stopped(spec, dataclasses.replace(map_result, ending=ending), len(candidates), merging.usage)
        levels = result.levels
        labels.extend(node.label for node in result.nodes)
        warnings.extend([*result.warnings, *merging.warnings])
    index_of = {c.id: i for i, c in enumerate(candidates)}
    groups: dict[int, list[int]] = {}
    for cand in candidates:
        root = merging.find(cand.id) if merging is not None else cand.id
        groups.setdefault(index_of[root], []).append(index_of[cand.id])
    order = sorted(((kept, sorted(m for m in members if m != kept)) for kept, members in groups.items()),
                   key=lambda entry: min([entry[0], *entry[1]]))
    merged = _merged_table(table, order)
    rows = [[row.cells[k].value for k in keys] for row in merged.rows]
    shown = warnings[:MAX_SUMMARY_WARNINGS]
    if len(warnings) > MAX_SUMMARY_WARNINGS:
        shown.append(f"... and {len(warnings) - MAX_SUMMARY_WARNINGS} more warnings (see the trace)")
    summary = DiscoverySummary(
        sources=len(spec.sources), candidates=len(candidates), entities=len(rows),
        merge_calls=merging.calls if merging is not None else 0, levels=levels, nodes=tuple(labels),
        peak_prompt_tokens=merging.peak if merging is not None else 0, token_budget=budget, warnings=tuple(shown),
    )
    trace.write("discovery", summary=summary.to_json())
    return DiscoveryResult(rows=rows, table=merged, summary=summary, map_result=map_result,
                           merge_usage=merging.usage if merging is not None else Usage())
