"""An append-only JSONL trace of every call, batch and attempt.

It sits in the foundation layer because every layer above writes to it (model calls and
retries from `llm`, batches and attempts from `mapreduce`, the run directory from `run`);
it imports nothing from the package. One line per event, written under a lock so threads
never interleave lines. Secrets are removed before anything is written: keys that look like
credentials are replaced by `[REDACTED]` at any depth.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any, TextIO

__all__ = ["NullTrace", "Trace", "TraceWriter", "redact"]

_SECRET_KEY = re.compile(r"(api[_-]?key|authorization|auth[_-]?token|secret|password|bearer)", re.IGNORECASE)


def redact(value: Any) -> Any:
    """A copy of `value` with every credential-like key's value replaced by `[REDACTED]`."""
    if isinstance(value, dict):
        return {k: "[REDACTED]" if _SECRET_KEY.search(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
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
    """Appends events as JSON lines to a file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file: TextIO | None = self.path.open("a", encoding="utf-8")

    def write(self, event: str, **data: Any) -> None:
        """Append one event line: `{"ts", "event", ...data}`."""
        line = json.dumps({"ts": round(time.time(), 6), "event": event, **redact(data)}, ensure_ascii=False, default=str)
        with self._lock:
            if self._file is None:
                raise ValueError(f"trace {str(self.path)!r} is closed; open a new TraceWriter")
            self._file.write(line + "\n")

    def close(self) -> None:
        """Flush and close the file (idempotent)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
