"""The distillation operator F_ψ (paper Eq. 14–15, App. D.8): cluster, refine contrastively, merge.

1. **Cluster** every record's stored query vector with FINCH (finch-clust), taking one explicit,
   configured partition level, seeded, so the same store gives the same clusters.
2. **Refine** inside each cluster: a negative record is paired with its most similar positive of
   the same cluster and the memory model proposes ADD/EDIT/REMOVE/AGREE operations on the hints
   attached to that cluster (a cluster with positives only gets the success-only prompt).
3. **Merge** redundant hints per cluster: each hint belongs to the cluster holding most of its
   provenance (so it is merged once, not duplicated); batches shrink to max(1, n/3) hints whose
   provenance is the cluster plus the provenance of the hints they replace, and whose score is
   the best score they replace (the reference resets both: score to 2, provenance to the cluster).

Every change goes through the store's helpers, so each is an event in the audit log.
"""

from __future__ import annotations

import json
import os
import random
import socket
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from amapreduce.errors import ConfigError, RunError
from amapreduce.memory.advice import render_hint, split_advice
from amapreduce.memory.config import MemoryConfig
from amapreduce.memory.llm import ask
from amapreduce.memory.parsing import Operation, map_operations, parse_list, parse_operations
from amapreduce.memory.records import normalise_query
from amapreduce.memory.store import (
    MemoryStore,
    add_provenance,
    delete_hint,
    get_hint,
    get_meta,
    hint_provenance,
    insert_hint,
    log_event,
    prune_hints,
    set_meta,
    update_hint,
)
from amapreduce.prompts import render_prompt

__all__ = ["DistillReport", "cluster_records", "distill"]


@dataclass(kw_only=True)
class DistillReport:
    """What one distillation did (or, with `dry_run`, would ask the model)."""

    dry_run: bool
    records: int = 0
    clusters: dict[int, int] = field(default_factory=dict)
    """Cluster id → number of records."""
    calls: list[dict[str, Any]] = field(default_factory=list)
    """One entry per model call: step, cluster, records shown, hints shown."""
    applied: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)
    merged: list[dict[str, Any]] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """What the distillation changed, counted: hints created, edited, agreed with, removed,
        merge batches, hints pruned, model calls made and operations rejected."""
        ops = [a["op"] for a in self.applied]
        return {"created": ops.count("ADD"), "edited": ops.count("EDIT"), "agreed": ops.count("AGREE"),
                "removed": ops.count("REMOVE"), "merged": len(self.merged), "pruned": len(self.pruned),
                "calls": len(self.calls), "rejected": len(self.rejected)}

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {"dry_run": self.dry_run, "records": self.records,
                "clusters": {str(k): v for k, v in sorted(self.clusters.items())}, "calls": self.calls,
                "applied": self.applied, "rejected": self.rejected, "merged": self.merged, "pruned": self.pruned}


@dataclass(frozen=True, kw_only=True)
class _Rec:
    id: str
    label: bool
    query: str
    pattern: str
    cluster: int


def cluster_records(vectors: Any, config: MemoryConfig) -> Any:
    """FINCH cluster labels (one per row) at `config.finch_level`, clamped to the coarsest level."""
    import numpy as np

    n = len(vectors)
    if n < 3:
        return np.zeros(n, dtype=np.int64)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="pynndescent is not installed", category=UserWarning)
        from finch import FINCH
    try:
        partitions, _, _ = FINCH(np.asarray(vectors, dtype=np.float32), distance="cosine", verbose=False,
                                 random_state=config.seed)
    except MemoryError as exc:
        raise RunError(f"FINCH could not cluster {n} records without approximate neighbours ({exc}). "
                       "Install finch-clust[ann] (pynndescent) for stores above 20,000 records.") from exc
    level = min(config.finch_level, partitions.shape[1] - 1)
    return np.asarray(partitions[:, level], dtype=np.int64)


def _load(store: MemoryStore, config: MemoryConfig, *, dry_run: bool) -> tuple[list[_Rec], Any]:
    import numpy as np

    with store.read() as conn:
        rows = conn.execute("SELECT id, label, query, decision, embedding FROM records ORDER BY rowid").fetchall()
    if not rows:
        return [], np.zeros((0, 0), dtype=np.float32)
    vectors = np.stack([np.frombuffer(r["embedding"], dtype=np.float32) for r in rows])
    labels = cluster_records(vectors, config)
    recs = [_Rec(id=r["id"], label=bool(r["label"]), query=r["query"],
                 pattern=json.loads(r["decision"]).get("pattern", ""), cluster=int(c))
            for r, c in zip(rows, labels, strict=True)]
    if not dry_run:
        with store.write() as conn:
            conn.executemany("UPDATE records SET cluster = ? WHERE id = ?", [(r.cluster, r.id) for r in recs])
            sizes: dict[int, int] = {}
            for r in recs:
                sizes[r.cluster] = sizes.get(r.cluster, 0) + 1
            log_event(conn, "clustered", records=len(recs), clusters=len(sizes), level=config.finch_level)
    return recs, vectors


def _cluster_hints(store: MemoryStore, record_ids: list[str], limit: int | None = None) -> list[tuple[str, str, int]]:
    """Hints whose provenance meets the cluster, best score first: (id, text, w)."""
    if not record_ids:
        return []
    with store.read() as conn:
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS _cluster(id TEXT PRIMARY KEY)")
        conn.execute("DELETE FROM _cluster")
        conn.executemany("INSERT OR IGNORE INTO _cluster(id) VALUES (?)", [(i,) for i in record_ids])
        rows = conn.execute(
            "SELECT h.id, h.text, h.w, h.advice FROM hints h WHERE EXISTS (SELECT 1 FROM provenance p JOIN _cluster c "
            "ON c.id = p.record_id WHERE p.hint_id = h.id) ORDER BY h.w DESC, h.seq").fetchall()
    hints = [(r[0], _shown(r[1], r[3]), int(r[2])) for r in rows]
    return hints[:limit] if limit is not None else hints


def _shown(text: str, advice: Mapping[str, Any] | str | None) -> str:
    """A hint as the distillation prompts list it: its text and its typed payload (`render_hint`;
    the payload as stored, JSON text, or as `get_hint` reads it back, a dict)."""
    return render_hint(text, json.loads(advice) if isinstance(advice, str) else advice or None)


def _line(op: Operation) -> str:
    return f"{op.op} {op.number}: {op.text}" if op.number is not None else f"{op.op}: {op.text}"


def _apply(store: MemoryStore, config: MemoryConfig, ops: list[Operation], relevant: list[str],
           listed: dict[str, str], report: DistillReport, cluster: int, members: list[str]) -> None:
    """Apply one reply's operations in one write transaction.

    AGREE and EDIT add the records shown to the model (`relevant`) to the hint's provenance; a new
    hint inherits the whole cluster's records (`members`), as the paper's S(h_k) = I_k: it is the
    cluster's anchor, retrievable for any task whose neighbours lie in the cluster.

    The hints were listed (and shown to the model) in an earlier transaction, and other writers
    may have pruned, merged, removed or edited them while the model was answering; an operation
    on such a hint is rejected on its own, so the rest of the reply (and the run) still applies.
    """
    order = {"REMOVE": 0, "AGREE": 1, "EDIT": 2, "ADD": 3}
    pool = len(listed)
    with store.write() as conn:
        existing = {normalise_query(r[0]): r[1] for r in conn.execute("SELECT text, id FROM hints")}
        for op in sorted(ops, key=lambda o: order[o.op]):
            if op.hint_id:
                current = get_hint(conn, op.hint_id)
                if current is None:
                    report.rejected.append({"line": _line(op), "reason": "hint no longer exists"})
                    continue
                shown = _shown(current["text"], current["advice"])
                if op.op == "EDIT" and shown != listed.get(op.hint_id, shown):
                    report.rejected.append({"line": _line(op), "reason": "hint was changed by another writer "
                                            "after it was shown to the model"})
                    continue
            if op.op == "REMOVE" and op.hint_id:
                update_hint(conn, op.hint_id, kind="downvoted", delta=-3 if pool >= config.max_listed_hints else -1,
                            cluster=cluster, records=relevant)
            elif op.op in ("AGREE", "EDIT") and op.hint_id:
                text, advice, problem = split_advice(op.text)
                if problem:
                    report.rejected.append({"line": _line(op), "reason": problem})
                edit: dict[str, Any] = {"text": text, **({"advice": advice} if advice is not None else {})}
                update_hint(conn, op.hint_id, kind="agreed" if op.op == "AGREE" else "edited", delta=1,
                            **(edit if op.op == "EDIT" else {}), cluster=cluster, records=relevant)
                add_provenance(conn, op.hint_id, relevant)
            elif op.op == "ADD":
                text, advice, problem = split_advice(op.text)
                if problem:
                    report.rejected.append({"line": _line(op), "reason": problem})
                key = normalise_query(text)
                same = existing.get(key)
                if same is not None and same not in listed:
                    # The model restated a hint this cluster was not shown (its support lies in other
                    # clusters): the cluster's records now support it too, so it can be retrieved here.
                    add_provenance(conn, same, members)
                    report.applied.append({"op": "SUPPORT", "hint_id": same, "text": text, "cluster": cluster})
                    continue
                if any(key == e or e in key for e in existing if e):
                    report.rejected.append({"line": f"ADD: {op.text}", "reason": "duplicates an existing hint"})
                    continue
                hid = insert_hint(conn, text, config.hint_init_score, origin="distill", provenance=members,
                                  cluster=cluster, advice=advice)
                existing[key] = hid
                report.applied.append({"op": "ADD", "hint_id": hid, "text": text, "cluster": cluster,
                                       **({"advice": advice.to_json()} if advice is not None else {})})
                continue
            report.applied.append({"op": op.op, "hint_id": op.hint_id, "text": op.text, "cluster": cluster})
        report.pruned += [h["id"] for h in prune_hints(conn, config.prune_threshold)]


def _refine(store: MemoryStore, config: MemoryConfig, model: Any, recs: list[_Rec], vectors: Any,
            report: DistillReport, rng: random.Random) -> None:
    by_cluster: dict[int, list[int]] = {}
    for i, r in enumerate(recs):
        by_cluster.setdefault(r.cluster, []).append(i)
    for cluster, members in sorted(by_cluster.items()):
        pos = [i for i in members if recs[i].label]
        neg = [i for i in members if not recs[i].label]
        if not pos:
            continue
        jobs: list[tuple[str, list[int]]] = []
        if neg:
            for negative in sorted(rng.sample(neg, min(config.pairs_per_cluster, len(neg)))):
                sims = {p: float(vectors[p] @ vectors[negative]) for p in pos}
                best = max(pos, key=lambda p: (sims[p], -p))  # its most similar positive; ties: oldest
                jobs.append(("compare", [best, negative]))
        else:
            jobs.append(("success", sorted(rng.sample(pos, min(config.success_chunk, len(pos))))))
        for kind, idx in jobs:
            listed = _cluster_hints(store, [recs[i].id for i in members], config.max_listed_hints)
            rules = "\n".join(f"{k}. {t}" for k, (_, t, _) in enumerate(listed, 1)) or "(no rules yet)"
            fmt = render_prompt("memory", "operation_format", max_ops=config.max_ops)
            if kind == "compare":
                good, weak = recs[idx[0]], recs[idx[1]]
                system = render_prompt("memory", "compare_system")
                user = render_prompt("memory", "compare_user", pos_query=good.query, pos_pattern=good.pattern,
                                     neg_query=weak.query, neg_pattern=weak.pattern, rules=rules, format=fmt)
            else:
                cases = "\n".join(f"Case {k}: {recs[i].query}\n{recs[i].pattern}" for k, i in enumerate(idx, 1))
                system = render_prompt("memory", "success_system")
                user = render_prompt("memory", "success_user", cases=cases, rules=rules, format=fmt)
            if len(listed) >= config.max_listed_hints:
                system += render_prompt("memory", "full_pool_suffix")
            relevant = [recs[i].id for i in idx]
            report.calls.append({"step": kind, "cluster": cluster, "records": relevant,
                                 "hints": [h[0] for h in listed]})
            if report.dry_run:
                continue
            ops, rejected = parse_operations(ask(model, system, user))
            ops, more = map_operations(ops, [(h[0], h[1]) for h in listed], max_ops=config.max_ops)
            report.rejected += [{"line": r.line, "reason": r.reason} for r in (*rejected, *more)]
            _apply(store, config, ops, relevant, {h[0]: h[1] for h in listed}, report, cluster,
                   [recs[i].id for i in members])


def _merge(store: MemoryStore, config: MemoryConfig, model: Any, recs: list[_Rec], report: DistillReport) -> None:
    members: dict[int, list[str]] = {}
    for r in recs:
        members.setdefault(r.cluster, []).append(r.id)
    cluster_of = {r.id: r.cluster for r in recs}
    with store.read() as conn:
        hints = conn.execute("SELECT id, text, w, seq, advice FROM hints ORDER BY w DESC, seq").fetchall()
        prov = conn.execute("SELECT hint_id, record_id FROM provenance").fetchall()
    overlap: dict[str, dict[int, int]] = {}
    for hint_id, record_id in prov:
        if record_id in cluster_of:
            counts = overlap.setdefault(hint_id, {})
            counts[cluster_of[record_id]] = counts.get(cluster_of[record_id], 0) + 1
    assigned: dict[int, list[Any]] = {}
    for h in hints:
        votes = overlap.get(h["id"])
        if votes:
            home = min(votes.items(), key=lambda item: (-item[1], item[0]))[0]  # most provenance; ties: lowest id
            assigned.setdefault(home, []).append(h)
    for cluster, group in sorted(assigned.items()):
        for start in range(0, len(group), config.merge_batch):
            batch = group[start:start + config.merge_batch]
            if len(batch) < 2:
                continue
            limit = max(1, len(batch) // 3)
            report.calls.append({"step": "merge", "cluster": cluster, "records": members[cluster],
                                 "hints": [h["id"] for h in batch]})
            if report.dry_run:
                continue
            rules = "\n".join(f"{k}. {_shown(h['text'], h['advice'])}" for k, h in enumerate(batch, 1))
            merged = parse_list(ask(model, render_prompt("memory", "merge_system"),
                                      render_prompt("memory", "merge_user", rules=rules, limit=limit)),
                                limit=limit)
            if not merged:
                report.rejected.append({"line": f"merge of cluster {cluster}", "reason": "reply had no numbered list"})
                continue
            with store.write() as conn:
                # Re-read the batch: other writers may have credited, edited or removed its hints
                # while the model was answering. A merge of text that has since gone or changed
                # would bring it back, so such a batch is left alone (a later merge retries it);
                # otherwise the score is the best *current* w, so no credit given meanwhile is lost.
                current = [get_hint(conn, h["id"]) for h in batch]
                stale = [h["id"] for h, now_ in zip(batch, current, strict=True)
                         if now_ is None or now_["text"] != h["text"]]
                if stale:
                    report.rejected.append({"line": f"merge of cluster {cluster}",
                                            "reason": f"hints {', '.join(stale)} were removed or changed by another "
                                                      "writer during the merge; batch left unmerged"})
                    continue
                score = max(int(h["w"]) for h in current if h is not None)
                # Support is kept like the score: the merged hints stand for the cluster and for every
                # record that supported a hint they replace (a hint credited by tasks of another cluster
                # must stay retrievable for them).
                support = list(dict.fromkeys([*members[cluster],
                                              *(r for h in batch for r in hint_provenance(conn, h["id"]))]))
                shared = {json.dumps(h["advice"], sort_keys=True) for h in current if h is not None and h["advice"]}
                kept = json.loads(shared.pop()) if len(shared) == 1 else None  # one payload among them: kept
                new_ids = []
                for item in merged:
                    text, advice, _problem = split_advice(item)
                    new_ids.append(insert_hint(conn, text, score, origin="merge", provenance=support, cluster=cluster,
                                               sources=[h["id"] for h in batch],
                                               advice=advice if advice is not None else kept))
                for h in batch:
                    delete_hint(conn, h["id"], kind="merged", into=new_ids, cluster=cluster)
            report.merged.append({"cluster": cluster, "from": [h["id"] for h in batch], "into": new_ids, "w": score})


def distill(store: MemoryStore, config: MemoryConfig, model: Any | None, *, refine: bool = True,
            merge: bool = True, dry_run: bool = False, record_id: str | None = None) -> DistillReport:
    """Run F_ψ once over the whole store (see the module docstring).

    `record_id` names the commit that made this distillation due: the transaction that ends a
    distillation that ran to its end also records it done for that commit (a `distill_done` event,
    `memory.update.distillation_done`), so a process killed afterwards never runs it twice.

    Raises:
        ConfigError: no memory model was given and this is not a dry run.
    """
    if model is None and not dry_run:
        raise ConfigError("distillation needs a memory model (any smolagents Model). Pass one, or use --dry-run "
                          "to see the clusters and the calls it would make.")
    report = DistillReport(dry_run=dry_run)
    if not dry_run:
        _claim(store)
    finished = False
    try:
        recs, vectors = _load(store, config, dry_run=dry_run)
        report.records = len(recs)
        for r in recs:
            report.clusters[r.cluster] = report.clusters.get(r.cluster, 0) + 1
        if recs:
            rng = random.Random(config.seed * 1_000_003 + len(recs))
            if refine:
                _refine(store, config, model, recs, vectors, report, rng)
            if merge:
                _merge(store, config, model, recs, report)
        finished = True
    finally:
        if not dry_run:
            with store.write() as conn:
                conn.execute("DELETE FROM meta WHERE key IN ('distilling_since', 'distilling_by')")
                _drop_undo(conn)
                log_event(conn, "distilled", refine=refine, merge=merge, calls=len(report.calls),
                          applied=len(report.applied), merged=len(report.merged), rejected=len(report.rejected))
                if finished and record_id is not None:
                    what = "refine+merge" if refine and merge else ("refine" if refine else "merge")
                    log_event(conn, "distill_done", record_id=record_id, outcome={"what": what, **report.counts()})
    return report


STALE_CLAIM_S = 3600
"""A distillation claim older than this is treated as left behind by a crashed process."""


def _claim(store: MemoryStore) -> None:
    """Take the store's distillation slot, so two processes never refine the same hints at once."""
    import time

    with store.write() as conn:
        since = get_meta(conn, "distilling_since")
        if since is not None and time.time() - float(since) < STALE_CLAIM_S and _owner_alive(get_meta(conn, "distilling_by")):
            raise RunError(f"another distillation of {store.folder} is running (since "
                           f"{time.strftime('%H:%M:%S', time.gmtime(float(since)))} UTC). Wait for it to finish.")
        if since is not None:  # a claim its process left behind: it died mid-distillation
            _undo_partial(conn)
        set_meta(conn, "distilling_since", str(time.time()))
        set_meta(conn, "distilling_by", f"{socket.gethostname()}:{os.getpid()}")
        _keep_undo(conn)


_UNDO = {"hints": "distill_undo_hints", "provenance": "distill_undo_provenance",
         "pending_provenance": "distill_undo_pending"}
"""The tables a distillation changes → the copy kept while it runs, so that one killed half-way is
undone before the next starts (a distillation writes in several transactions: one per cluster and
merge batch, the model answering in between)."""


def _keep_undo(conn: Any) -> None:
    """Copy the hint tables as they are before this distillation (inside the claim's transaction)."""
    for table, copy in _UNDO.items():
        conn.execute(f"DROP TABLE IF EXISTS {copy}")
        conn.execute(f"CREATE TABLE {copy} AS SELECT * FROM {table}")


def _undo_partial(conn: Any) -> None:
    """Put the hint tables back as they were before a distillation that never finished (its copies
    exist only while one runs), so the distillation a resumed commit completes starts from the same
    hints as it would have: a resumed evaluation ends with the memory an uninterrupted one has."""
    present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not set(_UNDO.values()) <= present:
        return
    conn.execute("DELETE FROM hints")  # provenance and pending links go with their hints (ON DELETE CASCADE)
    for table, copy in _UNDO.items():
        conn.execute(f"INSERT INTO {table} SELECT * FROM {copy}")
    log_event(conn, "distill_undone", hints=conn.execute("SELECT count(*) FROM hints").fetchone()[0])


def _drop_undo(conn: Any) -> None:
    """Drop the copies once the distillation ended (finished, or failed and reported)."""
    for copy in _UNDO.values():
        conn.execute(f"DROP TABLE IF EXISTS {copy}")


def _owner_alive(owner: str | None) -> bool:
    """Whether the process that claimed the distillation slot (`host:pid`) still runs: a claim left
    by a process killed mid-distillation on this host is free at once (a resumed evaluation
    completes its pending distillation), one from another host (or an older claim without an
    owner) is honoured until it is stale."""
    if owner is None:
        return True
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True

