"""A memory store: one namespace folder holding the SQLite database and the vector-index cache.

`MemoryStore` owns the connection, the encoder check and the transactions; the module-level
functions are the building blocks that higher layers (update, distillation, import, CLI)
compose *inside one transaction*, so a multi-step change (insert a record, credit hints, log
events) is all-or-nothing even with several writers.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amapreduce.errors import ConfigError, UserError
from amapreduce.llm.embed import Encoder, get_encoder
from amapreduce.memory.config import DEFAULT_ENCODER
from amapreduce.memory.records import Record, new_id, normalise_query
from amapreduce.memory.schema import connect, read_transaction, write_transaction

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "Hint",
    "MemoryStore",
    "add_pending_provenance",
    "add_provenance",
    "advice_dict",
    "advice_json",
    "MAX_SCORE",
    "bump_generation",
    "check_score",
    "delete_hint",
    "get_hint",
    "get_meta",
    "hint_provenance",
    "insert_hint",
    "insert_record",
    "list_hints",
    "log_event",
    "now",
    "pending_provenance",
    "prune_hints",
    "record_count",
    "set_meta",
    "update_hint",
]

MAX_SCORE = 1_000_000_000
"""The largest |w| a hint may have. Scores move by a few points per scored run, so a billion is
never reached by use; the bound refuses absurd values (an edited export, `--score`) up front,
before SQLite's 64-bit integers overflow or a later credit pushes them past that."""


def now() -> str:
    """UTC timestamp in ISO 8601 (second precision)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


class Hint(dict[str, Any]):
    """A hint row: `id`, `text`, `w`, `origin`, `seq`, `created_at`, `updated_at`, and `advice`
    (its typed payload as a dict, or None)."""

    @classmethod
    def of(cls, row: Any) -> Hint:
        """A hint from a `hints` row (its `advice` JSON read back into a dict)."""
        data = dict(row)
        raw = data.get("advice")
        data["advice"] = json.loads(raw) if isinstance(raw, str) and raw else None
        return cls(data)


_HINT_COLUMNS = "seq, id, text, w, origin, created_at, updated_at, advice"


def advice_dict(advice: Any) -> dict[str, Any] | None:
    """A typed payload (`HintAdvice`, a dict or None) as a plain dict (None stays None)."""
    if advice is None:
        return None
    return advice.to_json() if hasattr(advice, "to_json") else dict(advice)


def advice_json(advice: Any) -> str | None:
    """A typed payload (`HintAdvice`, a dict or None) as the JSON text the `advice` column holds."""
    payload = advice_dict(advice)
    return None if payload is None else json.dumps(payload, sort_keys=True, separators=(",", ":"))


def get_meta(conn: sqlite3.Connection, key: str) -> str | None:
    """One value of the `meta` table."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def set_meta(conn: sqlite3.Connection, key: str, value: str) -> None:
    """Set one `meta` value (inside a write transaction)."""
    conn.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                 (key, value))


def bump_generation(conn: sqlite3.Connection) -> None:
    """Mark that records were deleted or rewritten: every cached vector index rebuilds and the
    record counter is recomputed."""
    current = int(get_meta(conn, "records_generation") or 0)
    set_meta(conn, "records_generation", str(current + 1))
    set_meta(conn, "record_count", str(conn.execute("SELECT count(*) FROM records").fetchone()[0]))


def log_event(conn: sqlite3.Connection, kind: str, *, hint_id: str | None = None,
              record_id: str | None = None, **detail: Any) -> None:
    """Append one entry to the audit log of every change."""
    conn.execute("INSERT INTO events(at, kind, hint_id, record_id, detail) VALUES (?, ?, ?, ?, ?)",
                 (now(), kind, hint_id, record_id, json.dumps(detail, default=str, ensure_ascii=False)))


def insert_record(conn: sqlite3.Connection, record: Record, vector: np.ndarray) -> int:
    """Insert a record and its query vector; return its rowid (the vector-index id).

    Hints imported with question-level provenance (reference `insights.json`) that name this
    record's question gain it as provenance.
    """
    import numpy as np

    row = record.to_row()
    row["created_at"] = row["created_at"] or now()
    dim = get_meta(conn, "dim")
    if dim is None:
        set_meta(conn, "dim", str(int(vector.shape[-1])))
    elif int(dim) != int(vector.shape[-1]):
        raise ConfigError(f"record vector has {vector.shape[-1]} dimensions but the store holds {dim}-d vectors.")
    row["embedding"] = np.ascontiguousarray(vector, dtype=np.float32).tobytes()
    before = record_count(conn)
    try:
        cur = conn.execute(
            "INSERT INTO records(id, task_id, query, query_key, label, decision, trace, metrics, embedding, "
            "cluster, created_at) VALUES (:id, :task_id, :query, :query_key, :label, :decision, :trace, "
            ":metrics, :embedding, :cluster, :created_at)", row)
    except sqlite3.IntegrityError as exc:
        raise UserError(f"record id {record.id!r} already exists in the store. Use another id.") from exc
    linked = [r[0] for r in conn.execute("SELECT hint_id FROM pending_provenance WHERE query_key = ? ORDER BY hint_id",
                                         (row["query_key"],))]
    extra: dict[str, Any] = {"linked_hints": linked} if linked else {}
    log_event(conn, "record_added", record_id=record.id, label=record.label, task_id=record.task_id, **extra)
    _link(conn, [(hint_id, record.id) for hint_id in linked], query_key=row["query_key"])
    set_meta(conn, "record_count", str(before + 1))
    return int(cur.lastrowid or 0)


def record_count(conn: sqlite3.Connection) -> int:
    """Number of records, from a counter kept by `insert_record` (count(*) is O(n) in SQLite)."""
    raw = get_meta(conn, "record_count")
    if raw is None:
        return int(conn.execute("SELECT count(*) FROM records").fetchone()[0])
    return int(raw)


def check_score(w: int) -> int:
    """`w` when it is a valid hint score (|w| <= `MAX_SCORE`).

    Raises:
        UserError: it is not.
    """
    if not -MAX_SCORE <= w <= MAX_SCORE:
        shown = str(w) if len(str(w)) <= 20 else f"a {len(str(abs(w)))}-digit number"
        raise UserError(f"a hint score must be between {-MAX_SCORE:,} and {MAX_SCORE:,}, got {shown}.")
    return w


def insert_hint(conn: sqlite3.Connection, text: str, w: int, *, origin: str, provenance: Iterable[str] = (),
                hint_id: str | None = None, advice: Any = None, **detail: Any) -> str:
    """Create a hint with score `w`, provenance and an optional typed `advice` payload; return its id."""
    text = " ".join(text.split())
    if not text:
        raise UserError("a hint needs non-empty text.")
    w = check_score(int(w))
    hid = hint_id or new_id("h")
    stamp = now()
    try:
        conn.execute("INSERT INTO hints(id, text, w, origin, created_at, updated_at, advice) VALUES (?, ?, ?, ?, ?, ?, ?)",
                     (hid, text, int(w), origin, stamp, stamp, advice_json(advice)))
    except sqlite3.IntegrityError as exc:
        raise UserError(f"hint id {hid!r} already exists in the store. Use another id.") from exc
    added = add_provenance(conn, hid, provenance)
    if advice is not None:
        detail["advice"] = advice_dict(advice)
    log_event(conn, "hint_added", hint_id=hid, text=text, w=int(w), origin=origin, provenance=added, **detail)
    return hid


def add_provenance(conn: sqlite3.Connection, hint_id: str, record_ids: Iterable[str]) -> list[str]:
    """Add existing records to S(h); unknown record ids raise. Returns the ids given."""
    ids = list(dict.fromkeys(record_ids))
    for rid in ids:
        try:
            conn.execute("INSERT OR IGNORE INTO provenance(hint_id, record_id) VALUES (?, ?)", (hint_id, rid))
        except sqlite3.IntegrityError as exc:
            raise UserError(f"provenance of hint {hint_id!r} names record {rid!r}, which is not in the store.") from exc
    return ids


def _link(conn: sqlite3.Connection, pairs: Iterable[tuple[str, str]], *, query_key: str) -> int:
    """Add (hint, record) provenance rows found through a question, logging each new one as a
    `hint_linked` event: provenance decides retrieval, so every row of it must be traceable."""
    added = 0
    for hint_id, record_id in pairs:
        if conn.execute("INSERT OR IGNORE INTO provenance(hint_id, record_id) VALUES (?, ?)",
                        (hint_id, record_id)).rowcount:
            log_event(conn, "hint_linked", hint_id=hint_id, record_id=record_id, via="question", query_key=query_key)
            added += 1
    return added


def add_pending_provenance(conn: sqlite3.Connection, hint_id: str, queries: Iterable[str]) -> int:
    """Question-level provenance: link every present and future record asking `queries`.

    Returns the number of present records linked now (each logged as `hint_linked`).
    """
    linked = 0
    for query in queries:
        key = normalise_query(query)
        conn.execute("INSERT OR IGNORE INTO pending_provenance(hint_id, query_key) VALUES (?, ?)", (hint_id, key))
        records = [r[0] for r in conn.execute("SELECT id FROM records WHERE query_key = ? ORDER BY rowid", (key,))]
        linked += _link(conn, [(hint_id, rid) for rid in records], query_key=key)
    return linked


def pending_provenance(conn: sqlite3.Connection, hint_id: str) -> list[str]:
    """The normalised questions a hint is linked to (its question-level provenance)."""
    return [r[0] for r in conn.execute("SELECT query_key FROM pending_provenance WHERE hint_id = ? ORDER BY query_key",
                                       (hint_id,))]


def get_hint(conn: sqlite3.Connection, hint_id: str) -> Hint | None:
    """One hint, or None."""
    row = conn.execute(f"SELECT {_HINT_COLUMNS} FROM hints WHERE id = ?", (hint_id,)).fetchone()  # noqa: S608
    return None if row is None else Hint.of(row)


def hint_provenance(conn: sqlite3.Connection, hint_id: str) -> list[str]:
    """S(h) as record ids, oldest record first."""
    return [r[0] for r in conn.execute(
        "SELECT p.record_id FROM provenance p JOIN records r ON r.id = p.record_id WHERE p.hint_id = ? "
        "ORDER BY r.rowid", (hint_id,))]


def list_hints(conn: sqlite3.Connection) -> list[Hint]:
    """Every hint, oldest first, with its provenance size as `support`."""
    rows = conn.execute(
        "SELECT h.seq, h.id, h.text, h.w, h.origin, h.created_at, h.updated_at, h.advice, "
        "(SELECT count(*) FROM provenance p WHERE p.hint_id = h.id) AS support FROM hints h ORDER BY h.seq")
    return [Hint.of(r) for r in rows]


_KEEP: Any = object()


def update_hint(conn: sqlite3.Connection, hint_id: str, *, kind: str, text: str | None = None,
                delta: int = 0, score: int | None = None, advice: Any = _KEEP, **detail: Any) -> Hint:
    """Change a hint's text, score and/or typed advice (None removes it; left out: kept) and log
    why (`kind`: credit, agree, edit, downvote, ...)."""
    hint = get_hint(conn, hint_id)
    if hint is None:
        raise UserError(f"no hint with id {hint_id!r}. List hints with `amapreduce memory list --hints`.")
    new_text = " ".join(text.split()) if text is not None else hint["text"]
    if not new_text:
        raise UserError("a hint needs non-empty text.")
    new_w = check_score((int(score) if score is not None else int(hint["w"])) + int(delta))
    new_advice = hint["advice"] if advice is _KEEP else advice_dict(advice)
    conn.execute("UPDATE hints SET text = ?, w = ?, advice = ?, updated_at = ? WHERE id = ?",
                 (new_text, new_w, advice_json(new_advice), now(), hint_id))
    log_event(conn, f"hint_{kind}", hint_id=hint_id, w_before=hint["w"], w_after=new_w,
              **({"text_before": hint["text"], "text_after": new_text} if new_text != hint["text"] else {}),
              **({"advice_before": hint["advice"], "advice_after": new_advice} if new_advice != hint["advice"] else {}),
              **detail)
    return Hint({**hint, "text": new_text, "w": new_w, "advice": new_advice})


def delete_hint(conn: sqlite3.Connection, hint_id: str, *, kind: str = "removed", **detail: Any) -> None:
    """Delete a hint (and, by cascade, its provenance), logging its last state."""
    hint = get_hint(conn, hint_id)
    if hint is None:
        raise UserError(f"no hint with id {hint_id!r}. List hints with `amapreduce memory list --hints`.")
    provenance = hint_provenance(conn, hint_id)
    conn.execute("DELETE FROM hints WHERE id = ?", (hint_id,))
    log_event(conn, f"hint_{kind}", hint_id=hint_id, text=hint["text"], w=hint["w"], provenance=provenance,
              **detail)


def prune_hints(conn: sqlite3.Connection, threshold: int = 0, *, dry_run: bool = False) -> list[Hint]:
    """Delete hints with w <= threshold (App. D.8); return what was (or would be) pruned."""
    doomed = [Hint.of(r) for r in conn.execute(
        f"SELECT {_HINT_COLUMNS} FROM hints WHERE w <= ? ORDER BY seq", (threshold,))]  # noqa: S608
    if not dry_run:
        for hint in doomed:
            delete_hint(conn, hint["id"], kind="pruned", threshold=threshold)
    return doomed


class MemoryStore:
    """A namespace folder: SQLite (records, hints, provenance, events) plus the vector index cache.

    Thread-safe: one connection guarded by a re-entrant lock. Process-safe: writes take SQLite's
    write lock up front (`BEGIN IMMEDIATE`), reads run in consistent transactions under WAL.
    """

    def __init__(self, folder: str | Path, *, encoder: Encoder | str | None = None,
                 readonly: bool = False, create: bool = True,
                 connection: sqlite3.Connection | None = None) -> None:
        self.folder = Path(folder)
        self.readonly = readonly
        self._lock = threading.RLock()
        # The encoder is resolved first: an unknown one is refused before anything is created,
        # and a new store is born with it recorded.
        wanted = encoder.spec if isinstance(encoder, Encoder) else (get_encoder(encoder).spec if encoder else None)
        self.conn = connection or connect(self.folder, create=create, readonly=readonly,
                                          initial_meta={"encoder": wanted or DEFAULT_ENCODER, "created_at": now()})
        stored = get_meta(self.conn, "encoder")
        if stored is None:  # a store created before stores were born with their encoder
            spec = wanted or DEFAULT_ENCODER
            if not readonly:
                with self.write() as conn:
                    if get_meta(conn, "encoder") is None:
                        set_meta(conn, "encoder", spec)
                        set_meta(conn, "created_at", now())
                    spec = get_meta(conn, "encoder") or spec
            stored = spec
        if wanted is not None and wanted != stored:
            raise ConfigError(
                f"store {self.folder} was built with encoder {stored!r}, not {wanted!r}; vectors of two "
                f"encoders are not comparable. Use --encoder {stored} or another --store."
            )
        self.encoder_spec = stored
        self._encoder = encoder if isinstance(encoder, Encoder) else None
        self._question_cache: dict[str, np.ndarray] = {}

    @property
    def encoder(self) -> Encoder:
        """The store's encoder (loaded lazily, shared by the process)."""
        if self._encoder is None:
            self._encoder = get_encoder(self.encoder_spec)
        return self._encoder

    def question_vectors(self, questions: Sequence[str]) -> np.ndarray:
        """Vectors of provenance questions (normalised query keys), encoded once per store object:
        question-level provenance is a few questions per imported hint, so no index is kept."""
        with self._lock:
            todo = [q for q in dict.fromkeys(questions) if q not in self._question_cache]
            if todo:
                for q, vector in zip(todo, self.embed(todo), strict=True):
                    self._question_cache[q] = vector
            import numpy as np

            return np.stack([self._question_cache[q] for q in questions]).astype("float32")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Encode `texts` with the store's encoder, checking the dimension against stored vectors."""
        vectors = self.encoder.encode(list(texts))
        dim = get_meta(self.conn, "dim")
        if dim is not None and vectors.shape[1] != int(dim):
            raise ConfigError(f"encoder {self.encoder_spec!r} gives {vectors.shape[1]}-d vectors but the store "
                              f"holds {dim}-d ones. Use the encoder the store was built with.")
        return vectors

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """An all-or-nothing write transaction (raises for a read-only store)."""
        if self.readonly:
            raise UserError(f"memory store {self.folder} is opened read-only (a frozen snapshot); writes are refused.")
        with self._lock, write_transaction(self.conn, self.folder) as conn:
            yield conn

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A consistent read transaction."""
        with self._lock, read_transaction(self.conn, self.folder) as conn:
            yield conn

    def record(self, record_id: str) -> Record | None:
        """One record by id."""
        with self.read() as conn:
            row = conn.execute("SELECT * FROM records WHERE id = ?", (record_id,)).fetchone()
        return None if row is None else Record.from_row(dict(row))

    def counts(self) -> dict[str, int]:
        """Record and hint counts."""
        with self.read() as conn:
            pos, total = conn.execute("SELECT coalesce(sum(label), 0), count(*) FROM records").fetchone()
            hints = conn.execute("SELECT count(*) FROM hints").fetchone()[0]
        return {"records": int(total), "positive": int(pos), "negative": int(total - pos), "hints": int(hints)}

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self.conn.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
