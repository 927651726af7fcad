"""Read-only views of a store for people: listings, one item in full, and statistics.

The CLI prints these; keeping them here (plain dicts, JSON-ready) makes them testable and usable
from notebooks without going through the command line.
"""

from __future__ import annotations

import json
from typing import Any

from amapreduce.errors import UserError
from amapreduce.memory.labels import confidence
from amapreduce.memory.records import Record
from amapreduce.memory.schema import SCHEMA_VERSION
from amapreduce.memory.store import MemoryStore, get_meta, hint_provenance, list_hints, pending_provenance

__all__ = ["list_items", "show_item", "stats"]

_RECORD_SORT = {"created": "rowid", "id": "id", "query": "query", "label": "label"}


def list_items(store: MemoryStore, *, records: bool = True, hints: bool = True, label: bool | None = None,
               contains: str | None = None, sort: str = "default", descending: bool = False,
               limit: int | None = None) -> list[dict[str, Any]]:
    """Records and/or hints as summary dicts (`type`, `id`, ...), filtered and sorted.

    `sort`: `default` (hints by score, best first; records oldest first), `created`, `id`, `score`
    (hint w / record quality), `support` (hints: provenance size), `query`, `label` (records).
    """
    needle = contains.casefold() if contains else None
    out: list[dict[str, Any]] = []
    with store.read() as conn:
        if hints:
            items = [{"type": "hint", "id": h["id"], "text": h["text"], "w": int(h["w"]), "support": int(h["support"]),
                      "origin": h["origin"], "created_at": h["created_at"], "_seq": h["seq"]}
                     for h in list_hints(conn)]
            items = [i for i in items if needle is None or needle in i["text"].casefold()]
            key = {"default": lambda i: (-i["w"], i["_seq"]), "created": lambda i: i["_seq"], "id": lambda i: i["id"],
                   "score": lambda i: (i["w"], i["_seq"]), "support": lambda i: (i["support"], i["_seq"])}.get(sort)
            if key is None:
                raise UserError(f"cannot sort hints by {sort!r}. Use default, created, id, score or support.")
            items.sort(key=key, reverse=descending)
            out += items
        if records:
            where: list[str] = []
            params: list[Any] = []
            if label is not None:
                where.append("label = ?")
                params.append(int(label))
            if needle is not None:
                where.append("instr(lower(query), ?) > 0")
                params.append(needle)
            sql = "SELECT rowid AS _seq, id, task_id, query, label, metrics, cluster, created_at FROM records"
            sql += (" WHERE " + " AND ".join(where)) if where else ""
            rows = [dict(r) for r in conn.execute(sql + " ORDER BY rowid", params)]
            items = [{"type": "record", "id": r["id"], "query": r["query"], "label": bool(r["label"]),
                      "task_id": r["task_id"], "quality": round(confidence(json.loads(r["metrics"])), 4),
                      "cluster": r["cluster"], "created_at": r["created_at"], "_seq": r["_seq"]} for r in rows]
            if sort not in ("default", "score", *_RECORD_SORT):
                raise UserError(f"cannot sort records by {sort!r}. Use default, created, id, query, label or score.")
            field = "quality" if sort == "score" else ("_seq" if sort in ("default", "created") else sort)
            items.sort(key=lambda i: (i[field], i["_seq"]), reverse=descending)
            out += items
    for item in out:
        item.pop("_seq", None)
    return out[:limit] if limit is not None else out


def show_item(store: MemoryStore, item_id: str) -> dict[str, Any]:
    """One record or hint in full, with its links (hints citing a record; a hint's provenance) and events."""
    with store.read() as conn:
        row = conn.execute("SELECT * FROM records WHERE id = ?", (item_id,)).fetchone()
        if row is not None:
            rec = Record.from_row(dict(row))
            cited = [r[0] for r in conn.execute("SELECT hint_id FROM provenance WHERE record_id = ? ORDER BY hint_id",
                                                (item_id,))]
            events = conn.execute("SELECT at, kind, hint_id, detail FROM events WHERE record_id = ? ORDER BY seq",
                                  (item_id,)).fetchall()
            return {"type": "record", **rec.model_dump(mode="json"), "hints": cited,
                    "events": [{"at": e[0], "kind": e[1], **({"hint_id": e[2]} if e[2] else {}), **json.loads(e[3])}
                               for e in events]}
        hint = conn.execute("SELECT * FROM hints WHERE id = ?", (item_id,)).fetchone()
        if hint is None:
            raise UserError(f"no record or hint with id {item_id!r}. Find ids with `amapreduce memory list`.")
        events = conn.execute("SELECT at, kind, record_id, detail FROM events WHERE hint_id = ? ORDER BY seq",
                              (item_id,)).fetchall()
        pending = pending_provenance(conn, item_id)
        return {"type": "hint", "id": hint["id"], "text": hint["text"], "w": int(hint["w"]), "origin": hint["origin"],
                "created_at": hint["created_at"], "updated_at": hint["updated_at"],
                "provenance": hint_provenance(conn, item_id), "provenance_questions": pending,
                "events": [{"at": e[0], "kind": e[1], **({"record_id": e[2]} if e[2] else {}), **json.loads(e[3])}
                           for e in events]}


def stats(store: MemoryStore) -> dict[str, Any]:
    """Counts, label balance, hint-score histogram, clusters and schedule state."""
    with store.read() as conn:
        total, pos = conn.execute("SELECT count(*), coalesce(sum(label), 0) FROM records").fetchone()
        histogram = {str(w): n for w, n in conn.execute("SELECT w, count(*) FROM hints GROUP BY w ORDER BY w")}
        clusters = {("none" if c is None else str(c)): n for c, n in conn.execute(
            "SELECT cluster, count(*) FROM records GROUP BY cluster ORDER BY cluster")}
        hints = sum(histogram.values())
        no_prov = conn.execute("SELECT count(*) FROM hints h WHERE NOT EXISTS "
                               "(SELECT 1 FROM provenance p WHERE p.hint_id = h.id) AND NOT EXISTS "
                               "(SELECT 1 FROM pending_provenance q WHERE q.hint_id = h.id)").fetchone()[0]
        events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        tasks = conn.execute("SELECT count(DISTINCT task_id) FROM records WHERE task_id IS NOT NULL").fetchone()[0]
        meta = {k: get_meta(conn, k) for k in ("encoder", "dim", "created_at", "last_refine_at", "last_merge_at")}
    total, pos = int(total), int(pos)
    return {
        "store": str(store.folder), "schema_version": SCHEMA_VERSION, **meta,
        "records": total, "positive": pos, "negative": total - pos,
        "positive_share": round(pos / total, 4) if total else None, "tasks": int(tasks),
        "hints": hints, "hints_without_provenance": int(no_prov), "score_histogram": histogram,
        "clusters": clusters, "events": int(events),
    }
