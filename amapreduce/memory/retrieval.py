"""Retrieval for a query q (paper Eq. 7–10, 17–19): neighbours, hint ranking and the prior text.

I⁺ / I⁻ are the exact top-k⁺ / top-k⁻ records by cosine among positive / negative records (no
similarity floor unless configured; records of the same task excluded). Candidate hints are those
whose provenance meets N(q) = I⁺ ∪ I⁻; each gets v(h; q) = |S(h) ∩ N(q)| and
s(h) = w_h + v(h; q); the top k_H by s are kept (ties: higher v, then older hint). The exemplars
ε_pos / ε_neg are the most similar record of each set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from amapreduce.memory.config import MemoryConfig
from amapreduce.memory.index import VectorIndex
from amapreduce.memory.schema import StoreError
from amapreduce.memory.store import MemoryStore

__all__ = ["EMPTY_PRIOR", "Neighbour", "Retrieval", "ScoredHint", "render_prior", "retrieve"]

EMPTY_PRIOR = "No relevant experience in memory yet; review the decision against the task yourself."


@dataclass(frozen=True, kw_only=True)
class Neighbour:
    """One retrieved record."""

    id: str
    query: str
    similarity: float
    label: bool
    task_id: str | None
    pattern: str
    """The record's decision summary, shown as the exemplar's pattern."""

    def to_json(self) -> dict[str, Any]:
        """The `search --json` shape."""
        return {"id": self.id, "query": self.query, "similarity": round(self.similarity, 6)}


@dataclass(frozen=True, kw_only=True)
class ScoredHint:
    """A candidate hint with its ranking terms."""

    id: str
    text: str
    w: int
    v: int
    s: int

    def to_json(self) -> dict[str, Any]:
        """The `search --json` shape."""
        return {"id": self.id, "text": self.text, "w": self.w, "v": self.v, "s": self.s}


@dataclass(frozen=True, kw_only=True)
class Retrieval:
    """Everything the plan stage retrieves for one query."""

    query: str
    positives: tuple[Neighbour, ...] = ()
    negatives: tuple[Neighbour, ...] = ()
    hints: tuple[ScoredHint, ...] = ()
    candidates: int = 0
    """|H_cand(q)| before the top-k_H cut."""
    excluded: int = 0
    """Records skipped because they belong to the same task."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def neighbourhood(self) -> tuple[str, ...]:
        """N(q) = I⁺ ∪ I⁻ as record ids, positives first."""
        return tuple(n.id for n in self.positives + self.negatives)

    @property
    def exemplar_pos(self) -> Neighbour | None:
        """ε_pos: the most similar positive record."""
        return self.positives[0] if self.positives else None

    @property
    def exemplar_neg(self) -> Neighbour | None:
        """ε_neg: the most similar negative record."""
        return self.negatives[0] if self.negatives else None


def _neighbours(store: MemoryStore, index: VectorIndex, vector: Any, *, positive: bool, k: int,
                exclude: set[int], min_similarity: float | None) -> tuple[Neighbour, ...]:
    hits = index.search(vector, positive=positive, k=k, exclude=exclude)
    if min_similarity is not None:
        hits = [h for h in hits if h[1] >= min_similarity]
    if not hits:
        return ()
    marks = ",".join("?" * len(hits))
    rows = {r["rowid"]: r for r in store.conn.execute(
        f"SELECT rowid, id, query, label, task_id, decision FROM records WHERE rowid IN ({marks})",  # noqa: S608
        [h[0] for h in hits])}
    out = []
    for rowid, sim in hits:
        row = rows.get(rowid)
        if row is None:  # the index was synced inside this same read transaction, so this is a bug
            raise StoreError(f"vector index of {store.folder} names record rowid {rowid}, which SQLite does not "
                             "hold. Rebuild the index with `amapreduce memory reindex`.")
        pattern = json.loads(row["decision"]).get("pattern", "")
        out.append(Neighbour(id=row["id"], query=row["query"], similarity=sim, label=bool(row["label"]),
                             task_id=row["task_id"], pattern=pattern))
    return tuple(out)


def retrieve(store: MemoryStore, index: VectorIndex, vector: Any, query: str, config: MemoryConfig,
             *, task_id: str | None = None) -> Retrieval:
    """Run Eq. 7–10 for one query vector against one consistent state of the store."""
    with store.read() as conn:
        index.sync(conn)
        exclude: set[int] = set()
        if task_id is not None:
            exclude = {r[0] for r in conn.execute("SELECT rowid FROM records WHERE task_id = ?", (task_id,))}
        positives = _neighbours(store, index, vector, positive=True, k=config.k_pos, exclude=exclude,
                                min_similarity=config.min_similarity)
        negatives = _neighbours(store, index, vector, positive=False, k=config.k_neg, exclude=exclude,
                                min_similarity=config.min_similarity)
        ids = [n.id for n in positives + negatives]
        scored: list[tuple[int, int, int, ScoredHint]] = []
        if ids:
            marks = ",".join("?" * len(ids))
            for row in conn.execute(
                "SELECT h.id, h.text, h.w, h.seq, count(*) AS v FROM provenance p JOIN hints h ON h.id = p.hint_id "
                f"WHERE p.record_id IN ({marks}) GROUP BY h.id", ids):  # noqa: S608
                w, v = int(row["w"]), int(row["v"])
                hint = ScoredHint(id=row["id"], text=row["text"], w=w, v=v, s=w + v)
                scored.append((-hint.s, -hint.v, int(row["seq"]), hint))
    scored.sort(key=lambda t: t[:3])
    return Retrieval(query=query, positives=positives, negatives=negatives,
                     hints=tuple(t[3] for t in scored[: config.k_hints]), candidates=len(scored),
                     excluded=len(exclude))


def render_prior(retrieval: Retrieval, guidance: list[str] | tuple[str, ...]) -> str:
    """Δ_q = h_s ⊕ ε_pos ⊕ ε_neg as text for the manager."""
    lines: list[str] = []
    if guidance:
        lines.append("Batching guidance from experience:")
        lines += [f"- {g}" for g in guidance]
    pos, neg = retrieval.exemplar_pos, retrieval.exemplar_neg
    if pos is not None:
        lines += [f"Similar task that succeeded (similarity {pos.similarity:.2f}): {pos.query}",
                  f"  Its decision: {pos.pattern or 'not recorded'}"]
    if neg is not None:
        lines += [f"Similar task that did worse (similarity {neg.similarity:.2f}): {neg.query}",
                  f"  Its decision: {neg.pattern or 'not recorded'}"]
    return "\n".join(lines) if lines else EMPTY_PRIOR
