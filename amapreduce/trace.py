"""An append-only JSONL trace of every call, batch and attempt, and the redaction of secrets.

It sits in the foundation layer because every layer above writes to it (model calls and
retries from `llm`, batches and attempts from `mapreduce`, the run directory from `run`);
its only import from the package is `_text`. One line per event, written under a lock so
threads never interleave lines, and flushed as it is written, so a killed run keeps every event
up to the kill. The file is created readable by its owner only (0600), like
the rest of a run directory (`_atomic` writes through `mkstemp`).

Secrets are removed before anything is written, two ways:

* by name: the value of a credential-like key (`api_key`, `authorization`, ...) becomes
  `[REDACTED]` at any depth (`redact`);
* by value: every configured key (model and search-backend keys, credential variables of the
  environment) is registered once (`register_secrets`: by `llm.factory.ModelFactory`, once per run
  or command, before anything is written; by the search backends; by `llm.models.ManagedModel` for
  a client a caller brings with its own key) and masked wherever
  it appears inside any text (`redact_secrets`). Why by value: a provider that refuses a key echoes
  it in its error ("Incorrect API key provided: sk-..."), and that text used to travel into the
  trace, `result.json`, the journal and the retry prompts sent back to the model. Every place that
  turns outside text into our text (model errors in `llm.retry`, search errors, the engine's retry
  prompts) calls `redact_secrets`; `redact`, which the trace and `result.json` pass everything
  through, is the last line of defence.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from amapreduce._text import cap_text, scrub
from amapreduce.errors import storage_error

__all__ = [
    "MAX_TRACE_TEXT",
    "MIN_SECRET_CHARS",
    "REDACTED",
    "NullTrace",
    "Trace",
    "TraceWriter",
    "forget_secrets",
    "read_trace",
    "redact",
    "redact_secrets",
    "redacted_json",
    "register_secrets",
]

REDACTED = "[REDACTED]"
"""What a secret becomes."""

MIN_SECRET_CHARS = 8
"""Shorter values are never registered: masking every "test" or "none" would garble the text
while hiding nothing (no real key is that short)."""

_SECRET_KEY = re.compile(r"(api[_-]?key|authorization|auth[_-]?token|secret|password|bearer)", re.IGNORECASE)

_secrets_lock = threading.Lock()
_secrets: tuple[str, ...] = ()
"""Every registered value, longest first (a key that contains another is masked whole); replaced,
never mutated, so readers need no lock."""


def register_secrets(values: Iterable[str | None]) -> None:
    """Mask each of `values` from now on wherever `redact_secrets` (or `redact`) sees it.

    Process-wide and idempotent: a key registered by two runs is registered once. `None`, empty
    and short values (under `MIN_SECRET_CHARS`) are ignored; surrounding whitespace is dropped.
    """
    global _secrets
    fresh = {v.strip() for v in values if isinstance(v, str) and len(v.strip()) >= MIN_SECRET_CHARS}
    with _secrets_lock:
        if fresh <= set(_secrets):
            return
        _secrets = tuple(sorted(fresh.union(_secrets), key=lambda v: (-len(v), v)))


def forget_secrets() -> None:
    """Unregister every secret (tests: one test's keys must not mask another's text)."""
    global _secrets
    with _secrets_lock:
        _secrets = ()


def redact_secrets(text: str) -> str:
    """`text` with every registered secret replaced by `[REDACTED]`; `text` itself (the same
    object) when none occurs, so callers can tell, and the common case costs one substring
    search per registered secret."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact(value: Any, *, by_name: bool = True) -> Any:
    """A copy of `value` with every registered secret masked inside every string (dict keys
    included), at any depth; with `by_name`, every credential-like key's value is replaced by
    `[REDACTED]` too (off where a document's keys are data, such as a decision's column names)."""
    if isinstance(value, str):
        return redact_secrets(value)
    if isinstance(value, dict):
        return {
            (redact_secrets(k) if isinstance(k, str) else k): REDACTED
            if by_name and _SECRET_KEY.search(str(k))
            else redact(v, by_name=by_name)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v, by_name=by_name) for v in value]
    return value


def _as_text(value: object) -> str:
    """How `json.dumps` writes an object it cannot encode: its text, secrets masked."""
    return redact_secrets(str(value))


def redacted_json(value: Any, *, indent: int | None = None, by_name: bool = True) -> str:
    """`value` as JSON with credentials redacted (`redact`, `by_name` as there), objects JSON cannot
    encode written as their text with secrets masked too: the one way a trace line or a run file
    is serialised."""
    return json.dumps(redact(value, by_name=by_name), ensure_ascii=False, indent=indent, default=_as_text)


def read_trace(path: str | Path, *, event: str | None = None) -> Iterator[dict[str, Any]]:
    """The events of a `trace.jsonl`, in the order written, read lazily: the one reader of traces.

    A line that is not a JSON object (the last line of a killed run, cut mid-way) is skipped, and
    a missing file has no events.

    Args:
        path: the trace file.
        event: only the events of this name (lines that cannot hold it are skipped unparsed).
    """
    target = Path(path)
    if not target.is_file():
        return
    with target.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if event is not None and f'"{event}"' not in line:
                continue
            try:
                found = json.loads(line)
            except ValueError:
                continue
            if isinstance(found, dict) and (event is None or found.get("event") == event):
                yield found


MAX_TRACE_TEXT = 100_000
"""Longest text one trace field keeps (a prompt, a reply, a tool's output): a longer one is cut with
a note saying how much was left out. A 50 MB matrix cell once made a 750 MB `trace.jsonl`."""


def _capped(value: Any) -> Any:
    """`value` with every text longer than `MAX_TRACE_TEXT` cut, noted, at any depth."""
    if isinstance(value, str):
        return cap_text(value, MAX_TRACE_TEXT, what="characters, not kept in the trace")
    if isinstance(value, dict):
        return {k: _capped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_capped(v) for v in value]
    return value


class Trace:
    """Interface: anything that accepts trace events."""

    enabled: bool = True
    """False when events are discarded, so callers can skip building them."""

    def write(self, event: str, **data: Any) -> None:
        """Record one event."""

    def close(self) -> None:
        """Flush and release the sink."""


class NullTrace(Trace):
    """Discards every event (the default when no trace file is wanted)."""

    enabled = False


class TraceWriter(Trace):
    """Appends events as JSON lines to a file, created 0600, each line flushed as it is written."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # The mode applies when the file is created; an existing trace (a resumed run) keeps its own.
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def write(self, event: str, **data: Any) -> None:
        """Append one event line: `{"ts", "event", ...data}`, secrets redacted.

        Never fails on the text it is given: lone surrogates (a model's split emoji) become
        U+FFFD (`_text.scrub`) on the serialised line, which also covers objects only `str()`
        can write. A text over `MAX_TRACE_TEXT` characters is cut with a note.
        """
        line = redacted_json({"ts": round(time.time(), 6), "event": event, **_capped(data)})
        data_bytes = (scrub(line) + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"trace {str(self.path)!r} is closed; open a new TraceWriter")
            self._append(self._fd, data_bytes)

    def _append(self, fd: int, data: bytes) -> None:
        """Write `data` whole at the end of the file (unbuffered: nothing is left to flush later).

        A disk that fills mid-line is cut back to the last whole line, so the trace a resumed run
        appends to stays one event per line; the failure is a `StorageError` naming the trace.
        """
        before = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            failed = storage_error(exc, path=self.path)
            try:
                os.ftruncate(fd, before)
            except OSError as cut:
                failed.add_note(f"(the torn last line of {self.path} could not be cut off: {cut})")
            raise failed from exc

    def close(self) -> None:
        """Close the file (idempotent; every line is already written)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
