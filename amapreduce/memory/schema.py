"""The SQLite side of a memory store: connection settings, schema and migrations.

Why SQLite with WAL: several processes (parallel benchmark runners, the CLI) read and write one
store at once. WAL lets readers proceed during a write; `BEGIN IMMEDIATE` plus a generous busy
timeout serialises writers without losing an update. The schema version lives in
`PRAGMA user_version`; migrations run forward inside one transaction, and a store written by a
newer amapreduce is refused rather than misread.

A new store is created whole (`_sqlite.create_database`: built aside, then linked into place),
so an existing file is always a finished store. A file that is empty, is not SQLite, or is SQLite
without amapreduce's schema is therefore refused (`NotAMemoryStore`), never initialised over:
a store truncated to zero bytes used to come back as a new, empty one, its hints gone without a
word. Read-only opens (`readonly=True`, SQLite's `mode=ro`) never write to the file, except to bring a
store of an older schema up to date once (a short read-write open first).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from amapreduce._sqlite import create_database, enable_wal
from amapreduce.errors import RunError, UserError, storage_error

__all__ = [
    "DB_NAME",
    "check_memory_store",
    "memory_store_for",
    "SCHEMA_VERSION",
    "NoMemoryStore",
    "NotAMemoryStore",
    "StoreCorrupted",
    "StoreError",
    "StoreUnusable",
    "StoreVersionError",
    "connect",
    "read_transaction",
    "write_transaction",
]

DB_NAME = "memory.sqlite3"
BUSY_TIMEOUT_MS = 60_000


class StoreError(RunError):
    """The memory store cannot be used."""


class StoreCorrupted(StoreError):
    """The store's files are not a readable amapreduce memory store."""


class NotAMemoryStore(StoreCorrupted, UserError):
    """The store's file exists but is empty, not SQLite, or SQLite without amapreduce's schema.

    A `UserError` (the CLI exits 2): the path given is not a store, and the fix is the user's —
    restore the file or point at another folder. Nothing is written to such a file.
    """


class NoMemoryStore(StoreError, UserError):
    """No store at the path given (a folder without `memory.sqlite3`), where one must exist.

    A `UserError` (the CLI exits 2) like every other "not found": the fix is the user's path.
    """


class StoreUnusable(StoreError, UserError):
    """The store's folder or file cannot be written or opened by this process (no permission, a
    read-only file system): a `UserError` (exit 2), since the fix is the path or its permissions."""


class StoreVersionError(StoreError):
    """The store was written by a newer amapreduce (or is otherwise of an unknown version)."""


_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE records (
    rowid INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    task_id TEXT,
    query TEXT NOT NULL,
    query_key TEXT NOT NULL,
    label INTEGER NOT NULL CHECK (label IN (0, 1)),
    decision TEXT NOT NULL,
    trace TEXT NOT NULL,
    metrics TEXT NOT NULL,
    embedding BLOB NOT NULL,
    cluster INTEGER,
    created_at TEXT NOT NULL
);
CREATE INDEX records_task ON records(task_id);
CREATE INDEX records_query_key ON records(query_key);
CREATE TABLE hints (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    text TEXT NOT NULL,
    w INTEGER NOT NULL,
    origin TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX hints_w ON hints(w);
CREATE TABLE provenance (
    hint_id TEXT NOT NULL REFERENCES hints(id) ON DELETE CASCADE ON UPDATE CASCADE,
    record_id TEXT NOT NULL REFERENCES records(id) ON DELETE CASCADE,
    PRIMARY KEY (hint_id, record_id)
) WITHOUT ROWID;
CREATE INDEX provenance_record ON provenance(record_id);
CREATE TABLE pending_provenance (
    hint_id TEXT NOT NULL REFERENCES hints(id) ON DELETE CASCADE,
    query_key TEXT NOT NULL,
    PRIMARY KEY (hint_id, query_key)
) WITHOUT ROWID;
CREATE INDEX pending_query ON pending_provenance(query_key);
CREATE TABLE events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    kind TEXT NOT NULL,
    hint_id TEXT,
    record_id TEXT,
    detail TEXT NOT NULL
);
CREATE INDEX events_hint ON events(hint_id);
"""


def _migrate_v1(conn: sqlite3.Connection) -> None:
    for statement in _V1.split(";"):
        if statement.strip():
            conn.execute(statement)


def _migrate_v2(conn: sqlite3.Connection) -> None:
    """Hints may carry a typed advice payload (`memory.advice.HintAdvice`, JSON), beside the text."""
    conn.execute("ALTER TABLE hints ADD COLUMN advice TEXT")


MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (_migrate_v1, _migrate_v2)
"""Migration i brings a store from version i to i+1. Append only; never edit a released one."""
SCHEMA_VERSION = len(MIGRATIONS)


_DISK_FAULT = ("database or disk is full", "disk i/o error", "database is full")
"""SQLite's words for a full or failing disk (SQLITE_FULL, SQLITE_IOERR)."""
_UNUSABLE = ("readonly database", "unable to open database file", "read-only file system", "permission denied")
"""SQLite's words for a file this process may not open or write (SQLITE_READONLY, SQLITE_CANTOPEN)."""

_CORRUPT = ("not a database", "malformed", "corrupt", "no such table", "no such column", "file is encrypted")


@contextlib.contextmanager
def _translate(path: Path) -> Iterator[None]:
    try:
        yield
    except sqlite3.DatabaseError as exc:
        text = str(exc).lower()
        if "locked" in text or "busy" in text:
            raise StoreError(
                f"memory store {path} stayed locked for {BUSY_TIMEOUT_MS // 1000} s: {exc}. "
                "Another process holds a long write; retry when it finishes."
            ) from exc
        if any(marker in text for marker in _CORRUPT):
            raise StoreCorrupted(
                f"memory store {path} is corrupted or not an amapreduce store ({exc}). "
                "Restore it from an `amapreduce memory export` file, or point --store (`ask --memory`) at another folder."
            ) from exc
        if any(marker in text for marker in _DISK_FAULT):
            raise StoreError(
                f"memory store {path}: {exc} (the disk is full or failing). Nothing was changed: the transaction "
                "was rolled back. Free space on that disk (or check the device), then run the command again."
            ) from exc
        if any(marker in text for marker in _UNUSABLE):
            raise StoreUnusable(
                f"memory store {path} cannot be used: {exc}. Check that this user can read and write the store's "
                "folder and that its file system is not read-only, or point --store (`ask --memory`) at another folder."
            ) from exc
        raise
    except OSError as exc:  # creating the store's file beside it (`create_database`), its folder
        raise storage_error(exc, then="run the command again (the memory store is unchanged)") from exc


def _not_a_store(folder: Path, why: str) -> NotAMemoryStore:
    return NotAMemoryStore(
        f"{folder} is empty or not an amapreduce memory store; restore it or pass a new path "
        f"({DB_NAME} {why}; an `amapreduce memory export` file restores a store with `memory import`)."
    )


def connect(folder: Path, *, create: bool = True, readonly: bool = False,
            initial_meta: Mapping[str, str] | None = None) -> sqlite3.Connection:
    """Open the store's database in `folder`, creating it (with `initial_meta` in its `meta`
    table) when it is missing and `create` is set, and migrating an older one.

    Raises:
        NotAMemoryStore: the file is empty, not a SQLite database, or has no amapreduce schema.
        StoreCorrupted: the file's tables are damaged.
        StoreVersionError: the store's schema is newer than this code understands.
        StoreError: the store does not exist and `create` is False (or `readonly`).
    """
    db = folder / DB_NAME
    if not db.exists():
        if readonly or not create:
            raise NoMemoryStore(
                f"no memory store at {folder} (missing {DB_NAME}). Create one by importing or recording runs, "
                "or check --store (`ask --memory`)."
            )
        with _translate(db):
            create_database(db, lambda new: _build(new, initial_meta or {}))
    if db.stat().st_size == 0:  # checked before SQLite opens it: a read-write open would start a schema in it
        raise _not_a_store(folder, "is 0 bytes")
    with _translate(db):
        uri = f"file:{db}?mode=ro" if readonly else f"file:{db}"
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                               check_same_thread=False)
        try:
            version = _open_version(conn, folder)
            if readonly and version < SCHEMA_VERSION:
                # A store of an older schema is upgraded once, by a short read-write open, so that
                # every reader sees one schema; a read-only open never writes otherwise.
                conn.close()
                connect(folder, create=False).close()
                return connect(folder, create=False, readonly=True)
            if not readonly:
                enable_wal(conn, timeout_s=BUSY_TIMEOUT_MS / 1000)
                conn.execute("PRAGMA synchronous = NORMAL")
                if version < SCHEMA_VERSION:
                    _migrate(conn)
            conn.execute("SELECT count(*) FROM meta").fetchone()
        except BaseException:
            conn.close()
            raise
    return conn


def _open_version(conn: sqlite3.Connection, folder: Path) -> int:
    """Set the connection up and return the store's schema version, refusing a file that is
    not a store (without writing to it) and a store newer than this code."""
    conn.row_factory = sqlite3.Row
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys = ON")
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc).lower() or "encrypted" in str(exc).lower():
            raise _not_a_store(folder, "is not a SQLite database") from exc
        raise
    if version == 0:  # every store is created at its schema version; 0 is SQLite's default
        raise _not_a_store(folder, "is a SQLite database without amapreduce's tables")
    if version > SCHEMA_VERSION:
        raise StoreVersionError(
            f"memory store {folder} has schema version {version}, newer than this amapreduce "
            f"supports ({SCHEMA_VERSION}). Upgrade amapreduce, or export the store with the newer version."
        )
    return version


def _build(conn: sqlite3.Connection, meta: Mapping[str, str]) -> None:
    """Write a new store's schema and first `meta` values (on the file being created)."""
    _migrate(conn)
    conn.executemany("INSERT INTO meta(key, value) VALUES (?, ?)", list(meta.items()))


def _migrate(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])  # re-read under the lock
        for step in MIGRATIONS[version:]:
            step(conn)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection, folder: Path) -> Iterator[sqlite3.Connection]:
    """A `BEGIN IMMEDIATE` transaction: the write lock is taken up front, so read-modify-write
    sequences (credit a hint, count records) cannot interleave with another writer's."""
    with _translate(folder / DB_NAME):
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except BaseException:  # a full disk can refuse the commit itself: leave no open transaction behind
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise


@contextlib.contextmanager
def read_transaction(conn: sqlite3.Connection, folder: Path) -> Iterator[sqlite3.Connection]:
    """A deferred transaction: every read inside sees one consistent state of the store."""
    if conn.in_transaction:  # nested inside another read or write: already consistent
        yield conn
        return
    with _translate(folder / DB_NAME):
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")


def memory_store_for(choice: Path | bool | None, default: Path, *, named: str = "--memory") -> Path | None:
    """The experiential-memory store a run uses, as `ask --memory/--no-memory` and the API's
    `memory=` pick it: None (not given): the `default` store (`Settings.memory_store`) when it holds
    one; False: none; True or a path: that store, which must hold one (`check_memory_store`)."""
    if choice is False:
        return None
    store = default if choice is None or choice is True else Path(choice)
    if choice is None and not (store / DB_NAME).is_file():
        return None
    check_memory_store(store, named=named)
    return store


def check_memory_store(store: Path, *, named: str = "--memory") -> None:
    """Refuse a memory folder that holds no store (or a file that is not one), before a run
    directory is made; `named` is how the caller's user gave it (`--memory`, `memory=`).

    Why a `UserError` naming the caller's flag: a mistyped path is a usage mistake (exit 2), not a
    run failure, and `connect`'s own message speaks of the memory commands' `--store` flag.
    """
    if not (store / DB_NAME).is_file():
        off = "memory=False" if named.endswith("=") else "--no-memory"
        raise UserError(
            f"{named}{'' if named.endswith('=') else ' '}{str(store)!r} holds no experiential-memory store (no {DB_NAME} "
            f"there). Point it at a store folder (one made by `amapreduce memory import` or `memory add`), or use {off}."
        )
    connect(store, create=False, readonly=True).close()  # an empty or foreign file: NotAMemoryStore, exit 2
