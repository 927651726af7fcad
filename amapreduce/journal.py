"""Append-only, fsynced JSONL journals: what a long run or evaluation has finished, kept across a crash.

Why a journal beside the trace: the trace is for reading afterwards (every call, whole prompts,
buffered writes), and losing its tail costs nothing. A journal is the minimal record a resume
needs, and each line reaches the disk (`fsync`) before the work it records counts as done. So a
run killed with `kill -9`, or a machine that loses power, loses at most the entry being written,
never a finished batch or a scored task.

Format (one format for runs and evaluations): UTF-8 JSON Lines. The first line is the header
`{"type": "journal", "format": "amapreduce-journal", "version": 1, "kind": ...}`; every later line
is one entry, a JSON object whose `type` names its pydantic model. The caller defines the entry
models (a run's decisions and batch attempts, an evaluation's tasks) and reads them back with the
same models, validated at the edge like every other file the package reads.

Crash rule: an entry is appended with a single `write` of the whole line, then flushed and
fsynced. A crash can therefore leave at most one torn line, the last, without its newline.
Readers ignore a torn last line; a writer reopening the journal cuts it off before appending. A
bad line anywhere else is corruption, reported with its line number, never skipped.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from amapreduce._text import scrub_data
from amapreduce.errors import UserError, storage_error
from amapreduce.trace import redact_secrets

__all__ = ["FORMAT", "VERSION", "JournalEntry", "JournalHeader", "JournalWriter", "read_journal"]

FORMAT = "amapreduce-journal"
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK}
VERSION = 1


class JournalEntry(BaseModel):
    """Base of every journal entry: strict, immutable, and named by its `type` field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str


class JournalHeader(JournalEntry):
    """The first line: which format, which version, what kind of journal (`run`, `eval`, ...)."""

    type: Literal["journal"] = "journal"
    format: Literal["amapreduce-journal"] = "amapreduce-journal"
    version: int = VERSION
    kind: str


class JournalWriter:
    """Appends entries to one journal file, each line forced to disk before `append` returns.

    Opening an existing journal checks its header (same `kind`, a version this code reads) and
    cuts off a torn last line, so appending continues a crashed run's journal. Thread-safe.

    Raises:
        UserError: the file exists but is not a journal of `kind` (or of a newer version).
    """

    def __init__(self, path: str | Path, *, kind: str) -> None:
        self.path = Path(path)
        self.kind = kind
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            _cut_torn_tail(self.path)
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        if fresh:
            try:
                _create_whole(self.path, self._line(JournalHeader(kind=kind)))
            except OSError as exc:
                raise storage_error(exc, path=self.path) from exc
        else:
            with self.path.open("rb") as handle:
                _read_header(self.path, handle.readline(), kind=kind)
        self._file = os.fdopen(os.open(self.path, os.O_WRONLY | os.O_APPEND), "ab")

    def append(self, entry: JournalEntry) -> None:
        """Write `entry` as one line and fsync it."""
        with self._lock:
            self._write_line(entry)

    @staticmethod
    def _line(entry: JournalEntry) -> bytes:
        # Outside text (rows, errors) is made encodable and stripped of configured secrets here,
        # the one writer of every journal: a lone surrogate must not end a run, nor a key be kept.
        line = redact_secrets(json.dumps(scrub_data(entry.model_dump(mode="json")), ensure_ascii=False,
                                         separators=(",", ":")))
        return line.encode("utf-8") + b"\n"

    def _write_line(self, entry: JournalEntry) -> None:
        if self._file.closed:
            raise ValueError(f"journal {str(self.path)!r} is closed")
        data = self._line(entry)
        try:
            self._file.write(data)
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            # A full disk can take part of the line: drop what the buffer still holds and cut the
            # file back to its last whole line, so the journal stays readable and resumable.
            self._discard_unwritten()
            raise storage_error(exc, path=self.path) from exc

    def _discard_unwritten(self) -> None:
        """After a failed append: forget the buffered bytes and cut a torn tail off the file."""
        fd = os.dup(self._file.fileno())
        with contextlib.suppress(OSError):  # closing flushes the buffer again; it may fail the same way
            self._file.close()
        try:
            _cut_torn_tail(self.path)
        finally:
            self._file = os.fdopen(fd, "ab")

    def close(self) -> None:
        """Close the file (entries are already on disk)."""
        with self._lock:
            self._file.close()

    def __enter__(self) -> JournalWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_journal(
    path: str | Path, entry_types: Sequence[type[JournalEntry]], *, kind: str
) -> tuple[JournalHeader, list[JournalEntry]]:
    """The header and the entries of the journal at `path`, in order (a torn last line ignored).

    Args:
        path: the journal file.
        entry_types: the entry models the journal may hold, told apart by their `type` field.
        kind: the kind of journal expected (`run`, `eval`, ...).

    Raises:
        UserError: the file is missing or unreadable, is not a journal of `kind`, or holds a line
            (other than a torn last one) that is not valid JSON or not a known entry; the message
            names the line.
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read journal {str(p)!r}: {exc.strerror or exc}.") from None
    # Every complete line ends with a newline; what follows the last one is empty, or a torn line
    # a crash cut short: either way it is not an entry.
    lines = data.split(b"\n")[:-1]
    if not lines:
        raise UserError(f"journal {str(p)!r} is empty; it has no header line.")
    header = _read_header(p, lines[0], kind=kind)
    by_type = {_type_name(t): t for t in entry_types}
    entries: list[JournalEntry] = []
    for number, raw in enumerate(lines[1:], start=2):
        entries.append(_parse_entry(p, number, raw, by_type))
    return header, entries


def _type_name(model: type[JournalEntry]) -> str:
    default = model.model_fields["type"].default
    if not isinstance(default, str):
        raise TypeError(f"{model.__name__}.type needs a default naming the entry type (a Literal string)")
    return default


def _parse_entry(path: Path, number: int, raw: bytes, by_type: dict[str, type[JournalEntry]]) -> JournalEntry:
    where = f"journal {str(path)!r} line {number}"
    try:
        obj: Any = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{where} is not valid JSON ({exc}); the journal is damaged.") from None
    kind = obj.get("type") if isinstance(obj, dict) else None
    model = by_type.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise UserError(f"{where} has unknown entry type {kind!r}; expected one of {sorted(by_type)}.")
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = ".".join(str(part) for part in first["loc"])
        raise UserError(f"{where}: invalid {kind!r} entry: {loc + ': ' if loc else ''}{first['msg']}.") from None


_HEADER = TypeAdapter(JournalHeader)


def _read_header(path: Path, raw: bytes, *, kind: str) -> JournalHeader:
    try:
        header = _HEADER.validate_json(raw)
    except ValidationError:
        raise UserError(f"{str(path)!r} is not an amapreduce journal (its first line is not a journal header).") from None
    if header.version > VERSION:
        raise UserError(
            f"journal {str(path)!r} has format version {header.version}; this amapreduce reads up to {VERSION}. "
            "Upgrade amapreduce to read it."
        )
    if header.kind != kind:
        raise UserError(f"journal {str(path)!r} is a {header.kind!r} journal, not a {kind!r} one.")
    return header


def _create_whole(path: Path, header: bytes) -> None:
    """Create the journal `path` holding `header`, all or nothing: written and fsynced under a
    temporary name beside it, then linked into place (replacing an empty file a crash left).

    Why: created empty and then written, a journal on a full disk stayed 0 bytes, and every later
    reader refused the run ("it has no header line"). A journal that exists has its header.
    Created 0600 like the rest of a run directory (it holds prompts' results and rows).
    """
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".new")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(header)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            if path.stat().st_size:  # another writer created it whole first
                return
            os.replace(tmp, path)
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS or path.exists():
                raise
            os.replace(tmp, path)  # a file system without hard links: the journal is still absent
    finally:
        tmp.unlink(missing_ok=True)


def _cut_torn_tail(path: Path) -> None:
    """Truncate a last line that has no newline (a crash mid-write), so appends start on a fresh line."""
    with path.open("rb+") as handle:
        data = handle.read()
        if data.endswith(b"\n"):
            return
        handle.truncate(data.rfind(b"\n") + 1)
        handle.flush()
        os.fsync(handle.fileno())
