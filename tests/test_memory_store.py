"""The store: concurrent writers lose nothing, bad stores fail clearly, the vector cache is disposable."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest
from test_memory_fixtures import PASS, QUERY, ranked_store

from amapreduce.errors import ConfigError, UserError
from amapreduce.mapreduce.prior import Prior
from amapreduce.memory import ExperientialMemory, MemoryStore, StoreCorrupted, StoreVersionError
from amapreduce.memory.index import INDEX_FILE, PERSIST_AFTER
from amapreduce.memory.records import DecisionSummary, Record
from amapreduce.memory.schema import DB_NAME, SCHEMA_VERSION, NotAMemoryStore
from amapreduce.memory.store import get_hint, hint_provenance, insert_hint, insert_record, record_count
from tests.test_store_integrity import start_together

WRITERS, WRITES = 8, 100


def _writer(folder: str, worker: int, start: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    """One process: 100 scored runs, each crediting the shared hint (a read-modify-write)."""
    start.wait(30)
    mem = ExperientialMemory(folder, encoder="hashing:64")
    prior = Prior(text="", hint_ids=("shared",), kept_hint_ids=("shared",))
    for i in range(WRITES):
        mem.update(prior, query=f"worker {worker} question {i}", decision=DecisionSummary(template="t"), metrics=PASS,
                   task_id=f"w{worker}", record_id=f"w{worker}-{i}")
    mem.close()


def test_eight_processes_times_one_hundred_writes_lose_nothing(tmp_path: Path) -> None:
    with MemoryStore(tmp_path, encoder="hashing:64") as store, store.write() as conn:
        insert_hint(conn, "Shared hint.", 2, origin="test", hint_id="shared")
    start_together(_writer, [(str(tmp_path), w) for w in range(WRITERS)])
    with MemoryStore(tmp_path) as store, store.read() as conn:
        assert store.counts()["records"] == WRITERS * WRITES == record_count(conn)
        ids = {r[0] for r in conn.execute("SELECT id FROM records")}
        assert ids == {f"w{w}-{i}" for w in range(WRITERS) for i in range(WRITES)}
        hint = get_hint(conn, "shared")
        assert hint is not None and hint["w"] == 2 + 2 * WRITERS * WRITES  # no lost credit
        assert len(hint_provenance(conn, "shared")) == WRITERS * WRITES
        credited = conn.execute("SELECT count(*) FROM events WHERE kind = 'hint_credited'").fetchone()[0]
        assert credited == WRITERS * WRITES
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_file_that_is_not_a_store_gives_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / DB_NAME).write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(NotAMemoryStore, match="is empty or not an amapreduce memory store; restore it or pass a new path"):
        MemoryStore(tmp_path)
    assert (tmp_path / DB_NAME).read_bytes() == b"this is not a database at all" * 100


def test_a_store_with_damaged_tables_gives_a_clear_error(tmp_path: Path) -> None:
    with MemoryStore(tmp_path, encoder="hashing:64") as store, store.write() as conn:
        for i in range(200):
            insert_hint(conn, f"hint number {i} " * 20, 2, origin="test")
    with (tmp_path / DB_NAME).open("r+b") as fh:  # the header stays, pages after it are overwritten
        fh.seek(4096 * 2)
        fh.write(b"\xff" * 4096 * 8)
    with pytest.raises(StoreCorrupted, match="corrupted or not an amapreduce store"):
        with MemoryStore(tmp_path) as store:
            store.counts()


def test_a_store_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    MemoryStore(tmp_path, encoder="hashing").close()
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreVersionError, match=f"schema version {SCHEMA_VERSION + 1}, newer"):
        MemoryStore(tmp_path)


def test_a_missing_store_is_not_created_when_creation_is_off(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="no memory store"):
        MemoryStore(tmp_path / "absent", create=False)
    assert not (tmp_path / "absent").exists()


def test_the_encoder_is_fixed_at_creation(tmp_path: Path) -> None:
    MemoryStore(tmp_path, encoder="hashing:64").close()
    assert MemoryStore(tmp_path).encoder_spec == "hashing:64"
    with pytest.raises(ConfigError, match="built with encoder 'hashing:64'"):
        MemoryStore(tmp_path, encoder="minilm")
    with pytest.raises(ConfigError, match="unknown encoder"):
        MemoryStore(tmp_path / "other", encoder="word2vec")


def test_duplicate_ids_are_user_errors(tmp_path: Path) -> None:
    mem, enc = ranked_store(tmp_path)
    with pytest.raises(UserError, match="already exists"), mem.store.write() as conn:
        insert_record(conn, Record(id="P1", query="question P1", label=True), enc.encode(["question P1"])[0])
    # Through the update, an existing record id is an idempotent commit: nothing is written again.
    result = mem.update(None, query="question P1", decision=DecisionSummary(), metrics=PASS, record_id="P1")
    assert result.skipped == "already committed" and result.record_id == "P1" and result.credited == {}
    with mem.store.read() as conn:
        assert conn.execute("SELECT count(*) FROM records WHERE id = 'P1'").fetchone()[0] == 1
    with pytest.raises(UserError, match="already exists"), mem.store.write() as conn:
        insert_hint(conn, "dup", 2, origin="t", hint_id="hA")


def test_vector_cache_is_persisted_and_rebuilt_from_sqlite(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path)
    assert mem.rebuild_index() == 8
    assert (tmp_path / INDEX_FILE).exists()
    fresh = ExperientialMemory(tmp_path)  # loads the cache file, then catches up from SQLite
    assert [n.id for n in fresh.retrieve(QUERY).positives] == ["P1", "P2", "P3", "P4"]
    (tmp_path / INDEX_FILE).write_bytes(b"garbage")
    again = ExperientialMemory(tmp_path)
    assert [n.id for n in again.retrieve(QUERY).negatives] == ["N1", "N2"]
    assert PERSIST_AFTER >= 100


def test_read_only_memory_loads_the_vector_cache_but_never_writes_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The `ask` path opens the store read-only: it must start from vectors.npz (not decode every
    blob again), catch up on newer rows from SQLite, and leave the file untouched."""
    import amapreduce.memory.index as index_module

    mem, enc = ranked_store(tmp_path)
    assert mem.rebuild_index() == 8
    cached = (tmp_path / INDEX_FILE).read_bytes()
    enc.vectors["newer"] = enc.at(0.95)
    mem.update(None, query="newer", decision=DecisionSummary(), metrics=PASS, record_id="NEW")
    mem.close()
    monkeypatch.setattr(index_module, "PERSIST_AFTER", 1)  # a writer would rewrite the file now
    reader = ExperientialMemory(tmp_path, readonly=True)
    with reader.store.read() as conn:
        assert reader.index.sync(conn) == 1  # only the row newer than the cache was decoded
    assert [n.id for n in reader.retrieve(QUERY).positives] == ["NEW", "P1", "P2", "P3"]
    assert reader.rebuild_index() == 9
    assert (tmp_path / INDEX_FILE).read_bytes() == cached


def test_deleting_records_bumps_the_generation_and_rebuilds(tmp_path: Path) -> None:
    from amapreduce.memory.store import bump_generation

    mem, _ = ranked_store(tmp_path)
    assert mem.retrieve(QUERY).positives[0].id == "P1"
    with mem.store.write() as conn:
        conn.execute("DELETE FROM records WHERE id = 'P1'")
        bump_generation(conn)
    assert [n.id for n in mem.retrieve(QUERY).positives] == ["P2", "P3", "P4", "P5"]


def test_snapshot_is_read_only(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path)
    snap = mem.snapshot()
    with pytest.raises(UserError, match="read-only"):
        snap.update(None, query=QUERY, decision=DecisionSummary(), metrics=PASS)
    with pytest.raises(sqlite3.OperationalError):
        snap.store.conn.execute("DELETE FROM hints")


def test_float16_prefilter_stays_exact_against_brute_force(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large indexes scan float16 first; results must equal an exact float32 brute force."""
    import faiss
    import numpy as np

    import amapreduce.memory.index as index_module
    from amapreduce.memory.index import VectorIndex
    from amapreduce.memory.records import Record
    from amapreduce.memory.store import insert_record

    monkeypatch.setattr(index_module, "COARSE_MIN", 100)
    float16_indexes_built: list[tuple[object, ...]] = []
    real_quantizer = faiss.IndexScalarQuantizer

    def quantizer(*args: object) -> object:
        float16_indexes_built.append(args)
        return real_quantizer(*args)

    monkeypatch.setattr(faiss, "IndexScalarQuantizer", quantizer)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3000, 32)).astype(np.float32)
    x[500:540] = x[3]  # a block of identical vectors forces the float32 fallback near them
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    with MemoryStore(tmp_path, encoder="hashing:32") as store:
        with store.write() as conn:
            rowids = [insert_record(conn, Record(id=f"r{i}", query=f"question {i}", label=True), v)
                      for i, v in enumerate(x)]
        assert rowids == list(range(1, 3001))
        index = VectorIndex(tmp_path, load_cache=False, write_cache=False)
        with store.read() as conn:
            assert index.sync(conn) == 3000
    queries = np.vstack([rng.standard_normal((60, 32)).astype(np.float32), x[3:4], x[:20]])
    for q in queries / np.linalg.norm(queries, axis=1, keepdims=True):
        exclude = {int(i) for i in rng.integers(1, 3001, 3)}
        got = index.search(q, positive=True, k=4, exclude=exclude)
        sims = x @ q
        expected = sorted(((i + 1, float(sims[i])) for i in range(3000) if i + 1 not in exclude),
                          key=lambda h: (-h[1], h[0]))[:4]
        assert [round(s, 5) for _, s in got] == [round(s, 5) for _, s in expected]
    assert float16_indexes_built  # the float16 path was really used


def test_a_cache_newer_than_the_database_is_ignored(tmp_path: Path) -> None:
    """Restoring an older memory.sqlite3 next to a newer vectors.npz must not retrieve ghosts."""
    import shutil

    mem, enc = ranked_store(tmp_path / "live")
    mem.close()
    shutil.copy(tmp_path / "live" / DB_NAME, tmp_path / "old.sqlite3")
    mem = ExperientialMemory(tmp_path / "live")
    enc.vectors["ghost"] = enc.at(0.99)
    mem.update(None, query="ghost", decision=DecisionSummary(), metrics=PASS, record_id="ghost")
    mem.rebuild_index()
    mem.close()
    shutil.copy(tmp_path / "old.sqlite3", tmp_path / "live" / DB_NAME)
    for suffix in ("-wal", "-shm"):
        (tmp_path / "live" / (DB_NAME + suffix)).unlink(missing_ok=True)
    restored = ExperientialMemory(tmp_path / "live")
    assert [n.id for n in restored.retrieve(QUERY).positives] == ["P1", "P2", "P3", "P4"]


def test_one_memory_object_serves_threads_reading_and_writing(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from amapreduce.mapreduce.prior import PriorRequest

    mem = ExperientialMemory(tmp_path, encoder="hashing:64")
    with mem.store.write() as conn:
        insert_hint(conn, "Shared.", 2, origin="t", hint_id="shared")
    mem.update(Prior(text="", hint_ids=("shared",), kept_hint_ids=("shared",)), query="seed question", decision=DecisionSummary(), metrics=PASS)

    def work(i: int) -> int:
        prior = mem.prior(PriorRequest(query=f"question {i}"))
        mem.update(prior, query=f"question {i}", decision=DecisionSummary(), metrics=PASS, record_id=f"t{i}")
        return len(prior.hint_ids)

    with ThreadPoolExecutor(4) as pool:
        used = list(pool.map(work, range(40)))
    assert used == [1] * 40  # every prior found the shared hint through an earlier record
    with mem.store.read() as conn:
        hint = get_hint(conn, "shared")
    assert hint is not None and hint["w"] == 2 + 2 * 41 and mem.store.counts()["records"] == 41
