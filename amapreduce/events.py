"""Typed events and the stream they are emitted on: one event per thing that happened.

Why: one settled attempt used to be reported on four channels (the trace, the progress line, the
journal, OpenTelemetry) by four separate calls in the engine, each with its own free-form names
and fields. Now the engine emits one typed event (`mapreduce.events.AttemptSettled`) and each
channel is a subscriber of the stream: adding a channel adds a subscriber, not a call in the
engine, and a test can count what the engine emitted.

* `Event`: a frozen dataclass; `trace_event` names the `trace.jsonl` line it is written as (None:
  not traced) and `trace_fields` gives that line's fields. Its documented schema is
  `docs/reference/trace.md` (`amapreduce.trace_schema`).
* `EventStream`: `subscribe(kind, handler)` calls `handler` for every emitted event that is a
  `kind` (a base class subscribes to all its subclasses); `scoped()` makes a child stream whose
  events also reach the parent's subscribers (one engine run's journal subscribes to its own
  scope, so runs sharing an engine never see each other's attempts).

Handlers run synchronously, on the emitting thread, in subscription order; an exception a handler
raises is not swallowed: it reaches the emitter (a journal that cannot write stops the run, as
before). Subscribing is thread-safe (copy on write); emitting takes no lock.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from amapreduce.trace import Trace

__all__ = ["Event", "EventStream", "trace_channel"]


@dataclass(frozen=True, kw_only=True)
class Event:
    """Something that happened; subclasses are the event types."""

    trace_event: ClassVar[str | None] = None
    """The `trace.jsonl` event this is written as (None: not written to the trace)."""

    def trace_fields(self) -> dict[str, Any]:
        """The fields of its trace line (default: the dataclass fields, by name)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


E = TypeVar("E", bound=Event)


class EventStream:
    """Where events are emitted; subscribers by type (see the module doc)."""

    def __init__(self, parent: EventStream | None = None) -> None:
        self._parent = parent
        self._lock = threading.Lock()
        self._handlers: tuple[tuple[type[Event], Callable[[Any], object]], ...] = ()

    def subscribe(self, kind: type[E], handler: Callable[[E], object]) -> Callable[[], None]:
        """Call `handler` with every `kind` emitted from now on; returns the unsubscribe function."""
        entry: tuple[type[Event], Callable[[Any], object]] = (kind, handler)
        with self._lock:
            self._handlers = (*self._handlers, entry)

        def unsubscribe() -> None:
            with self._lock:
                self._handlers = tuple(h for h in self._handlers if h is not entry)

        return unsubscribe

    def scoped(self) -> EventStream:
        """A child stream: its subscribers see only its events; the parent's see them too."""
        return EventStream(parent=self)

    def emit(self, event: Event) -> None:
        """Hand `event` to every subscriber of its type (this stream's, then the parent's)."""
        for kind, handler in self._handlers:
            if isinstance(event, kind):
                handler(event)
        if self._parent is not None:
            self._parent.emit(event)


def trace_channel(stream: EventStream, trace: Trace) -> Callable[[], None]:
    """Write every traced event (one with a `trace_event`) emitted on `stream` to `trace`, as its
    line; returns the unsubscribe function."""

    def write(event: Event) -> None:
        if event.trace_event is not None and trace.enabled:
            trace.write(event.trace_event, **event.trace_fields())

    return stream.subscribe(Event, write)
