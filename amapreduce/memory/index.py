"""The faiss side of a memory store: exact cosine top-k over positive and negative records.

SQLite is the source of truth (every record row carries its unit-norm query vector); the index
is a cache of it. Two flat inner-product indexes (one per label) keyed by record rowid give I⁺
and I⁻ exactly, with no approximation. The cache catches up incrementally (rows with a higher
rowid than it has seen), rebuilds when records were deleted (`records_generation` changed), and
is persisted to `vectors.npz` so a new process need not decode 100k blobs. No pickle: the file
holds faiss's own serialisation as raw bytes plus integers.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amapreduce._atomic import atomic_open
from amapreduce.memory.store import get_meta

__all__ = ["INDEX_FILE", "VectorIndex"]

INDEX_FILE = "vectors.npz"
PERSIST_AFTER = 1000
"""Rows caught up from SQLite before the cache file is rewritten."""
COARSE_MIN = 20_000
"""From this many vectors per label, search first scans a float16 copy (half the memory traffic)."""
COARSE_MARGIN = 16
"""Extra candidates fetched from the float16 scan before exact re-ranking."""
FP16_BOUND = 2.0**-10
"""Bound on |cos(q, x) - cos(q, fp16(x))| for unit vectors: float16 keeps 11 significant bits, so
each component's relative error is <= 2^-11 and, by Cauchy-Schwarz, the inner product's error is
<= 2^-11; doubled for float32 accumulation slack."""


@dataclass
class _State:
    dim: int
    generation: int
    last_rowid: int
    pos: Any
    neg: Any
    coarse: dict[bool, Any] = field(default_factory=dict)
    """Float16 copies of `pos`/`neg` (built lazily once an index reaches COARSE_MIN vectors)."""


_threads_set = False


def _faiss() -> Any:
    """Import faiss, pinned to one OpenMP thread.

    A single-query flat search is memory-bound: on a small shared machine OpenMP threads only add
    synchronisation, and measured 2-5x slower (p95 at 100k: ~80 ms with 2 threads under load
    versus ~16 ms with one). The setting is process-wide; the memory is this project's only faiss user.
    """
    global _threads_set
    import faiss

    if not _threads_set:
        faiss.omp_set_num_threads(1)
        _threads_set = True
    return faiss


def _new_index(dim: int) -> Any:
    faiss = _faiss()
    return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))


class VectorIndex:
    """Exact top-k cosine search over one store's records, split by label."""

    def __init__(self, folder: Path, *, load_cache: bool = True, write_cache: bool = True) -> None:
        """`load_cache`: start from `vectors.npz` when it matches the database (read-only stores
        too: that is what saves a new `ask` process from decoding every blob). `write_cache`:
        rewrite the file as the index grows (off for read-only stores, which must not write)."""
        self.folder = folder
        self.load_cache = load_cache
        self.write_cache = write_cache
        self._state: _State | None = None
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        """The cache file."""
        return self.folder / INDEX_FILE

    def _load_file(self, dim: int, generation: int) -> _State | None:
        import numpy as np

        faiss = _faiss()
        if not self.path.exists():
            return None
        try:
            with np.load(self.path, allow_pickle=False) as data:
                header = [int(x) for x in data["header"]]
                pos, neg = data["pos"], data["neg"]
                if header[0] != dim or header[1] != generation:
                    return None
                return _State(dim=dim, generation=generation, last_rowid=header[2],
                              pos=faiss.deserialize_index(pos), neg=faiss.deserialize_index(neg))
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            # The cache is disposable: a damaged file is rebuilt from SQLite, but say so.
            import logging

            logging.getLogger(__name__).warning("vector cache %s unreadable (%s); rebuilding from SQLite",
                                                self.path, exc)
            return None

    def _save(self, state: _State) -> None:
        import numpy as np

        faiss = _faiss()
        header = np.array([state.dim, state.generation, state.last_rowid], dtype=np.int64)
        with atomic_open(self.path, "wb") as fh:
            np.savez(fh, header=header, pos=faiss.serialize_index(state.pos), neg=faiss.serialize_index(state.neg))

    def sync(self, conn: sqlite3.Connection) -> int:
        """Bring the index up to date with SQLite (call inside a read transaction); return rows added."""
        return self._sync(conn, use_file=self.load_cache)

    def _sync(self, conn: sqlite3.Connection, *, use_file: bool) -> int:
        import numpy as np

        dim_raw = get_meta(conn, "dim")
        if dim_raw is None:
            self._state = None
            return 0
        dim, generation = int(dim_raw), int(get_meta(conn, "records_generation") or 0)
        with self._lock:
            state = self._state
            if state is None or state.dim != dim or state.generation != generation:
                state = self._load_file(dim, generation) if use_file else None
                if state is not None:
                    newest = conn.execute("SELECT coalesce(max(rowid), 0) FROM records").fetchone()[0]
                    if state.last_rowid > int(newest):  # cache from a newer copy of the database
                        state = None
                state = state or _State(dim=dim, generation=generation, last_rowid=0, pos=_new_index(dim),
                                        neg=_new_index(dim))
            rows = conn.execute("SELECT rowid, label, embedding FROM records WHERE rowid > ? ORDER BY rowid",
                                (state.last_rowid,)).fetchall()
            if rows:
                ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
                labels = np.fromiter((r[1] for r in rows), dtype=np.int8, count=len(rows))
                vectors = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.float32).reshape(len(rows), dim)
                for flag, index in ((1, state.pos), (0, state.neg)):
                    mask = labels == flag
                    if mask.any():
                        index.add_with_ids(np.ascontiguousarray(vectors[mask]), ids[mask])
                        coarse = state.coarse.get(bool(flag))
                        if coarse is not None:
                            coarse.add_with_ids(np.ascontiguousarray(vectors[mask]), ids[mask])
                state.last_rowid = int(ids[-1])
            self._state = state
            if self.write_cache and len(rows) >= PERSIST_AFTER:
                try:
                    self._save(state)
                except OSError as exc:  # the cache only saves time; retrieval stays correct without it
                    import logging

                    logging.getLogger(__name__).warning("could not write vector cache %s: %s", self.path, exc)
            return len(rows)

    def rebuild(self, conn: sqlite3.Connection) -> int:
        """Drop the cache and rebuild it from SQLite; return the number of vectors indexed.

        Without `write_cache` only the in-memory index is rebuilt (the file is left alone), and
        the rebuild does not start from the file either."""
        with self._lock:
            self._state = None
            if self.write_cache:
                self.path.unlink(missing_ok=True)
        self._sync(conn, use_file=False)
        with self._lock:
            state = self._state
            if state is None:
                return 0
            if self.write_cache:
                self._save(state)
            return int(state.pos.ntotal + state.neg.ntotal)

    def _coarse(self, state: _State, positive: bool) -> Any | None:
        """The float16 copy of one label's index, built on first need; None below COARSE_MIN."""
        index = state.pos if positive else state.neg
        if index.ntotal < COARSE_MIN:
            return None
        coarse = state.coarse.get(positive)
        if coarse is None:
            faiss = _faiss()
            flat = faiss.downcast_index(index.index)
            vectors = faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * state.dim).reshape(flat.ntotal, state.dim)
            coarse = faiss.IndexIDMap2(faiss.IndexScalarQuantizer(
                state.dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT))
            coarse.add_with_ids(vectors.copy(), faiss.vector_to_array(index.id_map))
            state.coarse[positive] = coarse
        return coarse

    def search(self, vector: Any, *, positive: bool, k: int, exclude: set[int] | frozenset[int] = frozenset()
               ) -> list[tuple[int, float]]:
        """Exact top-`k` (rowid, cosine) among records of one label, skipping `exclude` rowids.

        Fetching `k + len(exclude)` neighbours keeps the result exact: at most `len(exclude)` of
        them can be filtered out. Large indexes are scanned in float16 first, the candidates
        re-scored in float32, and the result is certified exact: every record not fetched scores
        at most the last candidate's float16 score plus FP16_BOUND, so when the k-th exact score is
        above that, nothing was missed; otherwise the full float32 scan runs.
        """
        import numpy as np

        with self._lock:
            state = self._state
            if state is None or k <= 0:
                return []
            index = state.pos if positive else state.neg
            fetch = min(k + len(exclude), int(index.ntotal))
            if fetch <= 0:
                return []
            query = np.ascontiguousarray(np.asarray(vector, dtype=np.float32).reshape(1, -1))
            coarse = self._coarse(state, positive)
            if coarse is not None and fetch + COARSE_MARGIN < index.ntotal:
                approx, cand = coarse.search(query, fetch + COARSE_MARGIN)
                rows = [int(i) for i in cand[0] if i >= 0]
                exact = np.stack([index.reconstruct(i) for i in rows]) @ query[0]
                hits = sorted(((i, float(s)) for i, s in zip(rows, exact, strict=True) if i not in exclude),
                              key=lambda h: (-h[1], h[0]))[:k]
                if len(hits) == k and hits[-1][1] > float(approx[0][-1]) + FP16_BOUND:
                    return hits
            sims, ids = index.search(query, fetch)
        hits = [(int(i), float(s)) for s, i in zip(sims[0], ids[0], strict=True) if i >= 0 and int(i) not in exclude]
        hits.sort(key=lambda h: (-h[1], h[0]))
        return hits[:k]

    def frozen_copy(self, folder: Path) -> VectorIndex:
        """An independent, non-persisting copy of the current state (for a frozen snapshot).

        Call it inside the same read transaction that copies the database, right after `sync`,
        so the copy covers exactly the snapshot's records without re-decoding every vector.
        """
        copy = VectorIndex(folder, load_cache=False, write_cache=False)
        with self._lock:
            state = self._state
            if state is not None:
                faiss = _faiss()
                copy._state = _State(dim=state.dim, generation=state.generation, last_rowid=state.last_rowid,
                                     pos=faiss.clone_index(state.pos), neg=faiss.clone_index(state.neg),
                                     coarse={k: faiss.clone_index(v) for k, v in state.coarse.items()})
        return copy

    def size(self) -> tuple[int, int]:
        """(positives, negatives) currently indexed."""
        with self._lock:
            if self._state is None:
                return (0, 0)
            return int(self._state.pos.ntotal), int(self._state.neg.ntotal)
