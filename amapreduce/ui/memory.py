"""The Memory page: hints, records, what the plan stage would retrieve, and hand edits.

Every read and write goes through the functions the `memory` CLI calls (`memory.inspection`
for listings, one item and statistics; `ExperientialMemory.search` for retrieval;
`memory.store.update_hint`, `delete_hint` and `prune_hints` inside one write transaction for
edits), so the page and `amapreduce memory ...` cannot disagree about what a store holds or
what an edit does. Edits log the same event kinds as the CLI's, with `via: "ui"` added.

Search never calls a model: the prior shown is the raw ranked hints (as `memory search
--no-project`), because a page view must not spend money; the plan stage projects them with the
memory model when one is configured.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amapreduce.errors import UserError
from amapreduce.memory import ExperientialMemory, MemoryStore
from amapreduce.memory.inspection import list_items, show_item, stats
from amapreduce.memory.store import delete_hint, get_hint, prune_hints, update_hint

__all__ = ["EditPlan", "apply_edit", "apply_prune", "apply_remove", "item_view", "memory_view", "plan_edit",
           "plan_prune", "search_view"]

RECORDS_SHOWN = 200
"""Records listed on the page (newest last); the store may hold thousands."""


@contextmanager
def _store(folder: Path, *, write: bool = False) -> Iterator[MemoryStore]:
    """The store in `folder`, never creating one (a missing store raises `StoreError`); opened
    read-only (SQLite `mode=ro`) unless the page `write`s, as the `memory` commands that only look."""
    store = MemoryStore(folder, create=False, readonly=not write)
    try:
        yield store
    finally:
        store.close()


def memory_view(folder: Path, *, contains: str | None, sort: str) -> dict[str, Any]:
    """Statistics, every hint (filtered and sorted as `memory list --hints`) and the latest records."""
    with _store(folder) as store:
        hints = list_items(store, records=False, hints=True, contains=contains or None, sort=sort)
        records = list_items(store, records=True, hints=False, contains=contains or None)
        facts = stats(store)
    return {"stats": facts, "hints": hints, "records": records[-RECORDS_SHOWN:], "records_total": len(records)}


def search_view(folder: Path, query: str, *, task_id: str | None) -> dict[str, Any]:
    """What the plan stage would retrieve for `query`: positive and negative neighbours, the
    ranked hints (s = w + v) and the prior text, without projection."""
    with _store(folder) as store, ExperientialMemory(store, model=None) as memory:
        retrieval, prior = memory.search(query, task_id=task_id or None)
    return {"positives": [n.to_json() for n in retrieval.positives],
            "negatives": [n.to_json() for n in retrieval.negatives],
            "hints": [h.to_json() for h in retrieval.hints], "prior": prior.text,
            "candidates": prior.details.get("candidates"), "excluded": prior.details.get("excluded_same_task")}


def item_view(folder: Path, item_id: str) -> dict[str, Any]:
    """One record or hint in full, with provenance and change log (`memory show`)."""
    with _store(folder) as store:
        return show_item(store, item_id)


@dataclass(frozen=True)
class EditPlan:
    """A hand edit of a hint, checked but not applied: what the confirmation page shows."""

    hint_id: str
    text_before: str
    text_after: str
    w_before: int
    w_after: int

    @property
    def changes(self) -> bool:
        return self.text_before != self.text_after or self.w_before != self.w_after


def _score(raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise UserError(f"the score w must be a whole number, got {raw!r}.") from None


def plan_edit(folder: Path, hint_id: str, *, text: str, score: str) -> EditPlan:
    """Check an edit of `hint_id` (new text and score) against the stored hint.

    Raises:
        UserError: no such hint, an empty text, a score that is not an integer, or no change.
    """
    new_text = " ".join(text.split())
    if not new_text:
        raise UserError("a hint needs non-empty text.")
    w = _score(score)
    with _store(folder) as store, store.read() as conn:
        hint = get_hint(conn, hint_id)
    if hint is None:
        raise UserError(f"no hint with id {hint_id!r}.")
    plan = EditPlan(hint_id=hint_id, text_before=hint["text"], text_after=new_text, w_before=int(hint["w"]), w_after=w)
    if not plan.changes:
        raise UserError("nothing to edit: the text and the score are unchanged.")
    return plan


def apply_edit(folder: Path, plan: EditPlan) -> None:
    """Apply a confirmed edit (as `memory edit --text --score`)."""
    with _store(folder, write=True) as store, store.write() as conn:
        update_hint(conn, plan.hint_id, kind="edited_by_hand",
                    text=plan.text_after if plan.text_after != plan.text_before else None,
                    score=plan.w_after if plan.w_after != plan.w_before else None, via="ui")


def apply_remove(folder: Path, hint_id: str) -> None:
    """Remove a hint (as `memory remove`)."""
    with _store(folder, write=True) as store, store.write() as conn:
        delete_hint(conn, hint_id, kind="removed_by_hand", via="ui")


def plan_prune(folder: Path, threshold: str) -> tuple[int, list[dict[str, Any]]]:
    """The hints `memory prune --threshold T --dry-run` would remove, and T."""
    limit = _score(threshold)
    with _store(folder) as store, store.read() as conn:
        doomed = prune_hints(conn, limit, dry_run=True)
    return limit, [{"id": h["id"], "text": h["text"], "w": int(h["w"])} for h in doomed]


def apply_prune(folder: Path, threshold: int) -> list[str]:
    """Remove every hint with w <= `threshold` (as `memory prune`); the ids removed."""
    with _store(folder, write=True) as store, store.write() as conn:
        return [h["id"] for h in prune_hints(conn, threshold)]
