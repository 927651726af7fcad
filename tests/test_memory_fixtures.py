"""Shared helpers for the memory tests: a hand-made encoder and a store with exactly known ranks.

Holds no tests itself; the other memory test modules import it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from amapreduce.llm.embed import register_encoder
from amapreduce.memory import ExperientialMemory, MemoryConfig
from amapreduce.memory.records import Record
from amapreduce.memory.store import insert_hint, insert_record

PASS = {"score": 1, "f1_by_row": 1.0, "f1_by_item": 1.0}
FAIL = {"score": 0, "f1_by_row": 0.1, "f1_by_item": 0.2}
QUERY = "the query"


class VectorEncoder:
    """Maps known texts to hand-made unit vectors: cosine with QUERY is exactly the chosen number."""

    spec = "test:vectors"

    def __init__(self) -> None:
        self.vectors: dict[str, np.ndarray] = {QUERY: self.at(1.0)}

    @staticmethod
    def at(cosine: float, axis: int = 1) -> np.ndarray:
        """A unit vector whose cosine with QUERY ([1, 0, 0, 0]) is `cosine`."""
        v = np.zeros(4, dtype=np.float32)
        v[0] = cosine
        v[axis] = math.sqrt(max(0.0, 1.0 - cosine * cosine))
        return v

    @property
    def dim(self) -> int:
        return 4

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        for t in texts:
            if t not in self.vectors:
                raise KeyError(f"test encoder has no vector for {t!r}")
        return np.stack([self.vectors[t] for t in texts]).astype(np.float32)


def ranked_store(folder: Path, config: MemoryConfig | None = None) -> tuple[ExperientialMemory, VectorEncoder]:
    """A store where ranking hints by s = w + v differs from ranking by v alone.

    Positives P1..P5 have cosine .9 .8 .7 .6 .5 with QUERY; negatives N1..N3 .85 .75 .4. With
    k⁺ = 4, k⁻ = 2: N(q) = {P1, P2, P3, P4, N1, N2}. Hints (w; provenance → v; s):
    hA (1; P1 P2 P3 → 3; 4), hB (6; P4 → 1; 7), hC (2; N1 P5 → 1; 3), hD (10; P5 N3 → 0; -),
    hE (3; P1 N1 → 2; 5). By s: hB, hE, hA, hC. By v: hA, hE, then hB/hC.
    """
    enc = VectorEncoder()
    register_encoder(enc)
    sims = {"P1": 0.9, "P2": 0.8, "P3": 0.7, "P4": 0.6, "P5": 0.5, "N1": 0.85, "N2": 0.75, "N3": 0.4}
    mem = ExperientialMemory(folder, encoder=enc, config=config or MemoryConfig())
    with mem.store.write() as conn:
        for rid, sim in sims.items():
            text = f"question {rid}"
            enc.vectors[text] = enc.at(sim, axis=1 + (sorted(sims).index(rid) % 3))
            task = "T-P1" if rid == "P1" else None
            rec = Record(id=rid, query=text, label=rid.startswith("P"), metrics=PASS if rid[0] == "P" else FAIL,
                         task_id=task)
            insert_record(conn, rec, enc.vectors[text])
        for hid, w, prov in [("hA", 1, ["P1", "P2", "P3"]), ("hB", 6, ["P4"]), ("hC", 2, ["N1", "P5"]),
                             ("hD", 10, ["P5", "N3"]), ("hE", 3, ["P1", "N1"])]:
            insert_hint(conn, f"hint {hid}.", w, origin="test", provenance=prov, hint_id=hid)
    return mem, enc
