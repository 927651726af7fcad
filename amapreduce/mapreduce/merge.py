"""Merging fuzzy duplicates among discovered candidates: one model call per reduce node.

Code dedups candidates by normalised key (`table.keys`), which never merges two different
entities but also never sees that "St. Petersburg" and "Saint Petersburg" are one city. A
`Merger` answers that question for one bin of candidates: which of them name the same entity,
and whose spelling to keep. Discovery (`mapreduce.discover`) calls it once per node of its tree
reduce, so no single call holds more candidates than the token budget allows.

A model's reply is outside text: it is read leniently (`_modeljson.read_json`), an id it
leaves out stays a group of its own (a candidate is never dropped because a model forgot it),
and an id it invents is ignored with a warning. `normalize_groups` enforces the same rules on
any `Merger`'s groups, so a custom merger cannot drop or invent candidates either.

With a `llm.reply_cache.ReplyCache` (a run keeps one in its directory), each reply is stored under its prompt,
so a resumed run, whose replayed map yields the very same candidates, ids and tree, gets its
merges from there instead of asking the model again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from amapreduce._modeljson import read_json
from amapreduce.llm.scope import usage_scope
from amapreduce.llm.usage import Usage
from amapreduce.prompts import render_prompt

if TYPE_CHECKING:
    from smolagents import Model

    from amapreduce.llm.reply_cache import ReplyCache
    from amapreduce.llm.tokens import TokenCounter
    from amapreduce.mapreduce.tree_reduce import Node

__all__ = [
    "MERGE_PROMPT",
    "Candidate",
    "MergeGroup",
    "MergeReply",
    "Merger",
    "ModelMerger",
    "candidate_lines",
    "merge_overhead_tokens",
    "merge_prompt",
    "normalize_groups",
    "parse_merge_reply",
]

logger = logging.getLogger(__name__)

MERGE_PROMPT = "discover_merge"
"""`prompts/discover_merge.yaml`: its `system` and `user` templates."""


@dataclass(frozen=True)
class Candidate:
    """One discovered candidate as a merge call sees it: an id and its key values, nothing more
    (attributes and evidence stay in code, so a merge prompt is as small as the entity list)."""

    id: str
    values: Mapping[str, str]
    """Key column → value, in key-column order."""

    def line(self) -> str:
        """The candidate as one JSON line of the merge prompt."""
        return json.dumps({"id": self.id, **self.values}, ensure_ascii=False)


@dataclass(frozen=True)
class MergeGroup:
    """Candidates that name one entity; `keep` is the one whose spelling the entity keeps."""

    ids: tuple[str, ...]
    keep: str


@dataclass(frozen=True)
class MergeReply:
    """What one merge call decided, and what it cost."""

    groups: tuple[MergeGroup, ...]
    usage: Usage = field(default_factory=Usage)
    """The metered usage of the call (zero for a model that is not metered)."""
    text: str = ""
    """The model's reply as it came (for the trace)."""
    prompt_tokens: int = 0
    """Input tokens of the call: the provider's count when it reported one, else the counter's."""
    warnings: tuple[str, ...] = ()
    cached: bool = False
    """The reply came from the cache (no model call, no usage)."""


class Merger(Protocol):
    """One call that groups the candidates which are the same entity."""

    def merge(self, candidates: list[Candidate], node: Node) -> MergeReply:
        """Group `candidates` (all ids distinct) into entities."""
        ...


def candidate_lines(candidates: Iterable[Candidate]) -> str:
    """The candidates as the merge prompt lists them: one JSON object per line."""
    return "\n".join(c.line() for c in candidates)


def merge_prompt(candidates: Sequence[Candidate], key_columns: Sequence[str]) -> tuple[str, str]:
    """The (system, user) messages of one merge call (`prompts/discover_merge.yaml`)."""
    system = render_prompt(MERGE_PROMPT, "system", key_columns=list(key_columns))
    user = render_prompt(MERGE_PROMPT, "user", candidates=candidate_lines(candidates))
    return system, user


def merge_overhead_tokens(counter: TokenCounter, key_columns: Sequence[str]) -> int:
    """Tokens of the merge prompt with no candidate in it: what each call costs on top of its
    candidates (discovery keeps it out of the budget the candidates may fill)."""
    system, user = merge_prompt((), key_columns)
    return counter.count(f"{system}\n{user}")


def parse_merge_reply(text: str) -> list[Any] | None:
    """The raw groups of a merge reply, read leniently; None when the reply holds none.

    Accepts `{"groups": [...]}` (as asked) or a bare list of groups, as the whole reply, in a
    fenced block, inside prose or as almost-JSON (single quotes, trailing commas): the first such
    value the one lenient reader finds (`_modeljson.read_json`).
    """
    data = read_json(text, accept=_holds_groups)
    return data.get("groups") if isinstance(data, Mapping) else data


def _holds_groups(value: Any) -> bool:
    return isinstance(value, list) or (isinstance(value, Mapping) and isinstance(value.get("groups"), list))


def _group_ids(raw: Any) -> tuple[list[str], Any]:
    """(ids, keep) of one raw group: an object with `ids`/`keep`, or a bare list of ids."""
    if isinstance(raw, Mapping):
        ids, keep = raw.get("ids"), raw.get("keep")
    else:
        ids, keep = raw, None
    if isinstance(ids, str):
        ids = [ids]
    if not isinstance(ids, list):
        return [], keep
    return [str(i).strip() for i in ids if isinstance(i, str | int) and not isinstance(i, bool)], keep


def normalize_groups(raw_groups: Sequence[Any] | None, ids: Sequence[str]) -> tuple[tuple[MergeGroup, ...], list[str]]:
    """Make `raw_groups` a partition of `ids`: unknown ids ignored (warned), an id in two groups
    kept in the first (warned), a `keep` outside its group replaced by the group's first id
    (warned), and every id the groups leave out a group of its own (never dropped).

    Groups come out in the order of their first member in `ids`, so the result does not depend
    on the order the model listed them in.
    """
    known = {i: n for n, i in enumerate(ids)}
    placed: set[str] = set()
    warnings: list[str] = []
    groups: list[MergeGroup] = []
    for raw in raw_groups or ():
        members, keep = _group_ids(raw)
        valid: list[str] = []
        for member in members:
            if member not in known:
                warnings.append(f"merge reply names unknown candidate id {member[:40]!r}; ignored")
            elif member in placed:
                if member not in valid:
                    warnings.append(f"merge reply puts candidate {member!r} in two groups; kept in the first")
            else:
                valid.append(member)
                placed.add(member)
        if not valid:
            continue
        kept = str(keep).strip() if isinstance(keep, str | int) and not isinstance(keep, bool) else None
        if kept not in valid:
            if kept is not None:
                warnings.append(f"merge reply keeps {kept[:40]!r}, which is not in its group {valid}; kept {valid[0]!r}")
            kept = valid[0]
        groups.append(MergeGroup(ids=tuple(sorted(valid, key=known.__getitem__)), keep=kept))
    groups.extend(MergeGroup(ids=(i,), keep=i) for i in ids if i not in placed)
    groups.sort(key=lambda g: known[g.ids[0]])
    for warning in warnings:
        logger.warning("%s", warning)
    return tuple(groups), warnings


class ModelMerger:
    """A `Merger` that asks a model (`prompts/discover_merge.yaml`), one call per merge node.

    The call goes through the one single-completion helper (`llm.complete`), so a model from
    the factory is retried, rate limited, budgeted and metered like every other call; its usage
    is read back from a `usage_scope` around the call.

    Args:
        model: any smolagents `Model` (the sub-agent role's managed model in a run; a scripted
            one in tests; the demo's simulated model).
        counter: counts prompt tokens when the provider reports none (default: chars/4 via
            `TokenCounter` for the model's id).
        cache: where replies are kept and looked up first (None: every merge asks the model).
    """

    def __init__(self, model: Model, *, counter: TokenCounter | None = None, cache: ReplyCache | None = None) -> None:
        self.model = model
        self.cache = cache
        self.model_id = str(getattr(model, "model_id", None) or type(model).__name__)
        if counter is None:
            from amapreduce.llm.tokens import TokenCounter

            counter = TokenCounter(getattr(model, "model_id", None))
        self.counter = counter
        self.calls = 0

    def overhead_tokens(self, key_columns: Sequence[str]) -> int:
        """`merge_overhead_tokens` with this merger's counter."""
        return merge_overhead_tokens(self.counter, key_columns)

    def merge(self, candidates: list[Candidate], node: Node) -> MergeReply:
        """One model call over `candidates`; their groups, read leniently (see the module doc)."""
        from amapreduce.llm.complete import complete

        keys = list(candidates[0].values) if candidates else []
        system, user = merge_prompt(candidates, keys)
        whole = f"{system}\n\n{user}"
        text = self.cache.get(self.model_id, whole) if self.cache is not None else None
        cached = text is not None
        usage = Usage()
        if text is None:
            self.calls += 1
            with usage_scope(node=node.label, level=node.level, index=node.index) as scope:
                text = complete(self.model, user, system=system)
            usage = scope.usage()
            if self.cache is not None:
                self.cache.put(self.model_id, whole, text)
        raw = parse_merge_reply(text)
        groups, warnings = normalize_groups(raw, [c.id for c in candidates])
        if raw is None:
            warning = f"merge reply at {node.label} #{node.index} held no groups; its {len(candidates)} candidates stay apart"
            logger.warning("%s", warning)
            warnings.insert(0, warning)
        prompt_tokens = usage.input_tokens if usage.input_tokens > 0 else self.counter.count(f"{system}\n{user}")
        return MergeReply(groups=groups, usage=usage, text=text, prompt_tokens=prompt_tokens, warnings=tuple(warnings),
                          cached=cached)
