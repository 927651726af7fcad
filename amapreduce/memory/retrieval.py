"""Retrieval for a query q (paper Eq. 7–10, 17–19): neighbours, hint ranking and the prior text.

I⁺ / I⁻ are the exact top-k⁺ / top-k⁻ records by cosine among positive / negative records (no
similarity floor unless configured; records of the same task excluded). With `negative_floor:
positives` (the default) a negative joins I⁻ only when it is at least as similar as the least
similar positive of a full I⁺, so a few failures are not in every query's neighbourhood. Candidate hints are those
whose provenance meets N(q) = I⁺ ∪ I⁻; each gets v(h; q) = |S(h) ∩ N(q)| and
s(h) = w_h + v(h; q); the top k_H by s are kept (ties: higher v, then older hint). The exemplars
ε_pos / ε_neg are the most similar record of each set.

Question-level provenance (a hint imported from the reference's `insights.json` names the
questions it came from, and no record may ask them yet) votes the same way: the k⁺ + k⁻
provenance questions most similar to q (at least `min_question_similarity`) form a question neighbourhood N_Q(q), and
v(h; q) also counts |Q(h) ∩ N_Q(q)|. So an imported memory serves at once, for its own questions
and their paraphrases. In an evaluation (a task id given) a provenance question equal to q is
left out, as records of the same task are.

`retrieval: random` (an ablation, never a default) draws k⁺ / k⁻ records and k_H hints at random
(seeded by the query and `seed`), ignoring similarity, provenance and scores.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from amapreduce.memory.advice import HintAdvice, Outcome
from amapreduce.memory.config import MemoryConfig
from amapreduce.memory.index import VectorIndex
from amapreduce.memory.records import DecisionSummary, TraceSummary, normalise_query
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
    outcome: Outcome | None = None
    """What the record measured (its decision, trace, metrics), for the structured advice."""

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
    advice: HintAdvice | None = None
    """The hint's typed payload (None: prose only)."""
    questions: int = 0
    """Of v, the votes of its provenance questions (question-level provenance)."""

    def to_json(self) -> dict[str, Any]:
        """The `search --json` shape."""
        return {"id": self.id, "text": self.text, "w": self.w, "v": self.v, "s": self.s,
                "advice": None if self.advice is None else self.advice.to_json(),
                **({"question_votes": self.questions} if self.questions else {})}


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
                exclude: set[int], min_similarity: float | None, rng: random.Random | None = None) -> tuple[Neighbour, ...]:
    if rng is not None:  # the random-retrieval ablation
        rowids = [r[0] for r in store.conn.execute("SELECT rowid FROM records WHERE label = ? ORDER BY rowid",
                                                   (int(positive),)) if r[0] not in exclude]
        hits = [(rowid, 0.0) for rowid in rng.sample(rowids, min(k, len(rowids)))]
    else:
        hits = index.search(vector, positive=positive, k=k, exclude=exclude)
    if min_similarity is not None and rng is None:
        hits = [h for h in hits if h[1] >= min_similarity]
    if not hits:
        return ()
    marks = ",".join("?" * len(hits))
    rows = {r["rowid"]: r for r in store.conn.execute(
        f"SELECT rowid, id, query, label, task_id, decision, trace, metrics FROM records WHERE rowid IN ({marks})",  # noqa: S608
        [h[0] for h in hits])}
    out = []
    for rowid, sim in hits:
        row = rows.get(rowid)
        if row is None:  # the index was synced inside this same read transaction, so this is a bug
            raise StoreError(f"vector index of {store.folder} names record rowid {rowid}, which SQLite does not "
                             "hold. Rebuild the index with `amapreduce memory reindex`.")
        decision = DecisionSummary.model_validate_json(row["decision"])
        outcome = Outcome(record_id=row["id"], decision=decision, trace=TraceSummary.model_validate_json(row["trace"]),
                          metrics=json.loads(row["metrics"]), label=bool(row["label"]))
        out.append(Neighbour(id=row["id"], query=row["query"], similarity=sim, label=bool(row["label"]),
                             task_id=row["task_id"], pattern=decision.pattern, outcome=outcome))
    return tuple(out)


def _question_votes(store: MemoryStore, conn: Any, vector: Any, query: str, config: MemoryConfig,
                    *, task_id: str | None) -> dict[str, int]:
    """v over question-level provenance: hint id → how many of its provenance questions are among
    the k⁺ + k⁻ questions most similar to `query` (see the module docstring)."""
    pairs = [(r[0], r[1]) for r in conn.execute("SELECT hint_id, query_key FROM pending_provenance")]
    own = normalise_query(query)
    questions = sorted({q for _, q in pairs if not (task_id is not None and q == own)})
    k = config.k_pos + config.k_neg
    if not questions or k == 0:
        return {}
    vectors = store.question_vectors(questions)
    sims = vectors @ np.asarray(vector, dtype=np.float32)
    order = sorted(range(len(questions)), key=lambda i: (-float(sims[i]), questions[i]))[:k]
    floor = max(config.min_question_similarity, config.min_similarity if config.min_similarity is not None else -1.0)
    near = {questions[i] for i in order if float(sims[i]) >= floor}
    votes: dict[str, int] = {}
    for hint_id, q in pairs:
        if q in near:
            votes[hint_id] = votes.get(hint_id, 0) + 1
    return votes


def _advice_of(raw: Any) -> HintAdvice | None:
    """A stored payload, validated again (a store edited by hand holds anything)."""
    if not raw:
        return None
    try:
        return HintAdvice.model_validate_json(raw)
    except ValueError:
        return None


def retrieve(store: MemoryStore, index: VectorIndex, vector: Any, query: str, config: MemoryConfig,
             *, task_id: str | None = None) -> Retrieval:
    """Run Eq. 7–10 for one query vector against one consistent state of the store."""
    with store.read() as conn:
        index.sync(conn)
        exclude: set[int] = set()
        if task_id is not None:
            exclude = {r[0] for r in conn.execute("SELECT rowid FROM records WHERE task_id = ?", (task_id,))}
        rng = None
        if config.retrieval == "random":
            rng = random.Random(int.from_bytes(hashlib.sha256(f"{config.seed}|{query}".encode()).digest()[:8], "big"))
        positives = _neighbours(store, index, vector, positive=True, k=config.k_pos, exclude=exclude,
                                min_similarity=config.min_similarity, rng=rng)
        negatives = _neighbours(store, index, vector, positive=False, k=config.k_neg, exclude=exclude,
                                min_similarity=config.min_similarity, rng=rng)
        if config.negative_floor == "positives" and rng is None and config.k_pos and len(positives) == config.k_pos:
            negatives = tuple(n for n in negatives if n.similarity >= min(p.similarity for p in positives))
        ids = [n.id for n in positives + negatives]
        votes: dict[str, int] = {}
        if ids:
            marks = ",".join("?" * len(ids))
            votes = {r[0]: int(r[1]) for r in conn.execute(
                f"SELECT hint_id, count(*) FROM provenance WHERE record_id IN ({marks}) GROUP BY hint_id", ids)}  # noqa: S608
        by_question = _question_votes(store, conn, vector, query, config, task_id=task_id) if rng is None else {}
        scored: list[tuple[int, int, int, ScoredHint]] = []
        wanted = set(votes) | set(by_question)
        rows = conn.execute("SELECT id, text, w, seq, advice FROM hints ORDER BY seq").fetchall()
        if rng is not None:
            rows = rng.sample(rows, min(config.k_hints, len(rows)))
        for row in rows:
            if rng is None and row["id"] not in wanted:
                continue
            w = int(row["w"])
            v = votes.get(row["id"], 0) + by_question.get(row["id"], 0)
            hint = ScoredHint(id=row["id"], text=row["text"], w=w, v=v, s=w + v, advice=_advice_of(row["advice"]),
                              questions=by_question.get(row["id"], 0))
            scored.append((0, 0, 0, hint) if rng is not None else (-hint.s, -hint.v, int(row["seq"]), hint))
    if rng is None:
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
