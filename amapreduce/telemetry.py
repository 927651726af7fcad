"""OpenTelemetry traces of runs: optional, off by default, one trace per run.

Why: smolagents users look at agent runs in OpenTelemetry tools (Phoenix, Langfuse, any OTLP
collector) through openinference's smolagents instrumentation. `enable` (what `--otel` and
`AMAPREDUCE_OTEL=1` call, through `session.lifecycle`) turns that instrumentation on (manager and
sub-agent runs, their steps, tool calls and API-model calls) and adds our own spans: the run, the
plan stage, the memory retrieval, the map phase and each delta-patch round, each batch and each
attempt. A sub-agent runs on an engine worker thread, yet its spans land under its attempt, its
batch and its run: the engine's executor runs every job in a copy of the submitting thread's
context (`mapreduce.executor`), and the engine makes a batch's span current while it submits that
batch's attempts. Without that copy every sub-agent run was a trace of its own.

Off, it costs nothing: no OpenTelemetry module is imported until `enable` runs, and every helper
first reads one module variable (`span` then hands back one shared no-op context). The JSONL trace
(`trace.TraceWriter`) is written either way and stays the record of a run.

Where spans go: to the `exporter` or `tracer_provider` given to `enable`; else to the global
provider an application already set (e.g. Phoenix's `register()`); else to an OTLP exporter
configured by the standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT`, `..._HEADERS`,
`OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, ...; `OTEL_TRACES_EXPORTER=console|none` also work).

Secrets: every string attribute, ours and openinference's, passes through `trace.redact_secrets`
(and `_text.scrub`) before it is set (openinference's through its `TraceConfig.mask`), and our
exception events carry redacted messages and no stack trace. openinference's own exception events
are set past `mask`: spans leaving through a provider this module built are therefore redacted once
more, whole, at export (`redacting_exporter`, which a caller's own exporter can be wrapped in).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any

from amapreduce._text import scrub
from amapreduce.errors import ConfigError
from amapreduce.trace import redact_secrets

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.trace import TracerProvider as AnyTracerProvider
    from opentelemetry.util.types import AttributeValue

__all__ = [
    "CHAIN",
    "INPUT_VALUE",
    "INSTALL_HINT",
    "NO_SPAN",
    "OUTPUT_VALUE",
    "RETRIEVER",
    "SESSION_ID",
    "SPAN_KIND",
    "SpanGroup",
    "SpanHandle",
    "active",
    "current_span",
    "disable",
    "enable",
    "open_span",
    "ours",
    "redacting_exporter",
    "retrieval_documents",
    "span",
    "traced_generate",
]

INSTALL_HINT = "pip install 'amapreduce[otel]'"

# OpenInference semantic conventions (the values of `openinference.semconv.trace`, written out so
# that nothing is imported while tracing is off; tests/test_otel.py checks they match).
SPAN_KIND = "openinference.span.kind"
INPUT_VALUE = "input.value"
OUTPUT_VALUE = "output.value"
SESSION_ID = "session.id"
CHAIN = "CHAIN"
RETRIEVER = "RETRIEVER"
_DOCUMENTS = "retrieval.documents"

_SERVICE_NAME = "amapreduce"
_TRACER_NAME = "amapreduce"


def ours(**values: Any) -> dict[str, Any]:
    """Our attributes, named `amapreduce.<name>` (batch id, attempt, task count, rows, status ...),
    beside OpenInference's names for what it has a convention for."""
    return {f"amapreduce.{name}": value for name, value in values.items()}


def _text(value: object) -> str:
    """`value` as text fit to leave the process: scrubbed, every registered secret masked."""
    return redact_secrets(scrub(str(value)))  # str(): a `str` subclass is written as plain text


def _clean(value: Any) -> AttributeValue | None:
    """An attribute value fit to leave the process: text scrubbed and with every registered secret
    masked; numbers and booleans as they are; sequences item by item; None dropped."""
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, bool | int | float):
        return value
    if value is None:
        return None
    if isinstance(value, Sequence):
        # OpenTelemetry takes sequences of one primitive type; anything else is written as text.
        items = [v for v in (_clean(v) for v in value) if v is not None]
        if len({type(v) for v in items}) <= 1 and all(isinstance(v, str | bool | int | float) for v in items):
            return items
        return [_text(v) for v in value]
    return _text(value)


def _attributes(attributes: Mapping[str, Any] | None) -> dict[str, AttributeValue]:
    out: dict[str, AttributeValue] = {}
    for key, value in (attributes or {}).items():
        cleaned = _clean(value)
        if cleaned is not None:
            out[key] = cleaned
    return out


def _shown(attributes: Mapping[str, Any] | None) -> dict[str, AttributeValue]:
    """Our spans' attributes, cleaned (`_attributes`) and masked as openinference masks its own:
    `OPENINFERENCE_HIDE_INPUTS` / `_OUTPUTS` (and the other `OPENINFERENCE_HIDE_*`) hide a run's
    question, table and retrieved hints as they hide a model's messages."""
    cleaned, state = _attributes(attributes), _state
    if state is None:
        return cleaned
    masked = {key: state.config.mask(key, value, externalize=False) for key, value in cleaned.items()}
    return {key: value for key, value in masked.items() if value is not None}


class SpanHandle:
    """One of our spans; `NO_SPAN` (every method does nothing) while tracing is off, so call
    sites never test whether tracing is on."""

    __slots__ = ("_failed", "_span")

    def __init__(self, span: Span | None) -> None:
        self._span = span
        self._failed = False

    def set(self, attributes: Mapping[str, Any]) -> None:
        """Add attributes (redacted; None values skipped)."""
        if self._span is not None:
            self._span.set_attributes(_shown(attributes))

    def event(self, name: str, attributes: Mapping[str, Any]) -> None:
        """Add a timestamped event (redacted attributes)."""
        if self._span is not None:
            self._span.add_event(name, _shown(attributes))

    def fail(self, exc: BaseException) -> None:
        """Mark the span failed by `exc`: status ERROR and an `exception` event, both with the
        message redacted and no stack trace (a stack trace can quote a provider's echo of a key)."""
        if self._span is None:
            return
        message = _text(exc)
        self._span.add_event("exception", {"exception.type": type(exc).__name__, "exception.message": message})
        self.error(f"{type(exc).__name__}: {message}")

    def error(self, description: str) -> None:
        """Set status ERROR with `description` (redacted): the work failed without raising (a run
        that recorded its failure)."""
        if self._span is not None:
            from opentelemetry.trace import Status, StatusCode

            self._failed = True
            self._span.set_status(Status(StatusCode.ERROR, _text(description)))

    def end(self, attributes: Mapping[str, Any] | None = None) -> None:
        """Set `attributes`, then end the span."""
        if self._span is not None:
            if attributes:
                self.set(attributes)
            self._span.end()

    def activate(self) -> contextlib.AbstractContextManager[object]:
        """Make the span current in this thread for a block: spans opened in it, and jobs an
        executor copies this context into, become its children. It is not ended on exit."""
        if self._span is None:
            return _NOTHING
        from opentelemetry.trace import use_span

        return use_span(self._span, end_on_exit=False, record_exception=False, set_status_on_exception=False)


NO_SPAN = SpanHandle(None)
"""The span handle while tracing is off."""

_NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()
_NO_SPAN_CONTEXT = contextlib.nullcontext(NO_SPAN)
"""What `span` returns while tracing is off: one shared context, entered any number of times."""


class _Tracing:
    """What `enable` set up: our tracer, its provider (shut down by `disable` when ours), and
    openinference's instrumentor."""

    def __init__(self, tracer: Tracer, provider: TracerProvider | None, instrumentor: Any, config: Any) -> None:
        self.tracer = tracer
        self.owned_provider = provider
        self.instrumentor = instrumentor
        self.config = config
        """openinference's `TraceConfig` (`_redacting_config`), which our spans are masked by too."""


_state: _Tracing | None = None
_lock = threading.Lock()


def active() -> bool:
    """True while tracing is on."""
    return _state is not None


def hides_inputs() -> bool:
    """True while tracing is on with `OPENINFERENCE_HIDE_INPUTS`: span attributes that would
    quote a run's question in other words (the run folder's name, made from it) are left out."""
    state = _state
    return state is not None and bool(state.config.hide_inputs)


def span(
    name: str, attributes: Mapping[str, Any] | None = None, *, kind: str = CHAIN
) -> contextlib.AbstractContextManager[SpanHandle]:
    """A span around a block, current inside it (a child of the current span; a new trace when
    there is none): status OK when the block ends, ERROR (redacted, `SpanHandle.fail`) when it
    raises. While tracing is off: a shared no-op context yielding `NO_SPAN`."""
    state = _state
    if state is None:
        return _NO_SPAN_CONTEXT
    return _current_span(state, name, attributes, kind)


@contextlib.contextmanager
def _current_span(state: _Tracing, name: str, attributes: Mapping[str, Any] | None, kind: str) -> Iterator[SpanHandle]:
    from opentelemetry.trace import Status, StatusCode, use_span

    started = state.tracer.start_span(name, attributes=_shown({SPAN_KIND: kind, **(attributes or {})}))
    handle = SpanHandle(started)
    with use_span(started, end_on_exit=True, record_exception=False, set_status_on_exception=False):
        try:
            yield handle
        except BaseException as exc:
            handle.fail(exc)
            raise
        if not handle._failed:  # the block did not call `error()`
            started.set_status(Status(StatusCode.OK))


def current_span() -> SpanHandle:
    """The span current in this thread (another library's, such as openinference's `TOOL` span
    around a tool call), to add our attributes to it rather than open a second span; `NO_SPAN`
    while tracing is off or when no span is recording."""
    if _state is None:
        return NO_SPAN
    from opentelemetry.trace import get_current_span

    found = get_current_span()
    return SpanHandle(found) if found.is_recording() else NO_SPAN


def open_span(name: str, attributes: Mapping[str, Any] | None = None, *, kind: str = CHAIN) -> SpanHandle:
    """A span started as a child of the current span but not made current; end it with
    `SpanHandle.end`. `NO_SPAN` while tracing is off."""
    state = _state
    if state is None:
        return NO_SPAN
    return SpanHandle(state.tracer.start_span(name, attributes=_shown({SPAN_KIND: kind, **(attributes or {})})))


class SpanGroup:
    """Spans of one name opened and ended by key, for work that outlives the threads running it:
    the engine's batches, whose attempts (and retries) run on worker threads. Used from one thread.

    Args:
        name: the spans' name.
        key_attribute: the attribute that holds each span's key.
    """

    def __init__(self, name: str, key_attribute: str) -> None:
        self._name = name
        self._key_attribute = key_attribute
        self._open: dict[str, SpanHandle] = {}

    def opened(self, key: str, attributes: Mapping[str, Any]) -> SpanHandle:
        """The span of `key`, opened with `attributes` (a child of the current span) the first time."""
        handle = self._open.get(key)
        if handle is None:
            handle = self._open[key] = open_span(self._name, {self._key_attribute: key, **attributes})
        return handle

    def event(self, key: str, name: str, attributes: Mapping[str, Any]) -> None:
        """An event on the open span of `key` (none: nothing)."""
        self._open.get(key, NO_SPAN).event(name, attributes)

    def end(self, key: str, attributes: Mapping[str, Any] | None = None) -> None:
        """End the span of `key`, if open."""
        self._open.pop(key, NO_SPAN).end(attributes)

    def end_all(self, attributes: Mapping[str, Any] | None = None) -> None:
        """End every span still open (the work stopped before it was done)."""
        while self._open:
            self._open.popitem()[1].end(attributes)


def retrieval_documents(documents: Sequence[tuple[str, str, float | None]]) -> dict[str, Any]:
    """OpenInference's `retrieval.documents.N.document.{id,content,score}` attributes of a
    retriever span, for `(id, content, score)` triples."""
    out: dict[str, Any] = {}
    for n, (doc_id, content, score) in enumerate(documents):
        prefix = f"{_DOCUMENTS}.{n}.document"
        out[f"{prefix}.id"] = doc_id
        out[f"{prefix}.content"] = content
        if score is not None:
            out[f"{prefix}.score"] = score
    return out


# -- turning it on and off ---------------------------------------------------------------------------


def enable(*, exporter: SpanExporter | None = None, tracer_provider: AnyTracerProvider | None = None) -> None:
    """Turn tracing on for this process: openinference's smolagents instrumentation plus our spans.

    Args:
        exporter: send spans to it, synchronously, through a provider made here (tests pass the
            SDK's `InMemorySpanExporter`).
        tracer_provider: use an application's own provider (its processors export them; wrap its
            exporter in `redacting_exporter` to mask the exception events openinference records).

    With neither: the global provider when the application set one, else a provider made here
    exporting as the standard `OTEL_*` variables say (OTLP over HTTP by default). While tracing is
    on, a call without arguments changes nothing (every run calls it); one with arguments starts
    over with them.

    Raises:
        ConfigError: the `otel` extra is not installed (the message names `INSTALL_HINT`), or an
            `OTEL_*` variable asks for an exporter or protocol it does not have.
    """
    global _state
    with _lock:
        if _state is not None:
            if exporter is None and tracer_provider is None:
                return
            _stop(_state)
            _state = None
        try:
            from openinference.instrumentation.smolagents import SmolagentsInstrumentor
            from opentelemetry import trace as trace_api
        except ImportError as exc:
            raise ConfigError(
                f"OpenTelemetry tracing (--otel, AMAPREDUCE_OTEL) needs the `otel` extra: {INSTALL_HINT} "
                f"({exc.name or exc} is not installed)."
            ) from None
        owned: TracerProvider | None = None
        provider: AnyTracerProvider
        if tracer_provider is not None:
            provider = tracer_provider
        elif exporter is None and not isinstance(trace_api.get_tracer_provider(), trace_api.ProxyTracerProvider):
            provider = trace_api.get_tracer_provider()
        else:
            provider = owned = _own_provider(exporter)
        instrumentor, config = SmolagentsInstrumentor(), _redacting_config()
        instrumentor.instrument(tracer_provider=provider, config=config)
        _state = _Tracing(provider.get_tracer(_TRACER_NAME), owned, instrumentor, config)


def disable() -> None:
    """Turn tracing off: undo the instrumentation; a provider `enable` made is flushed and shut down."""
    global _state
    with _lock:
        if _state is not None:
            _stop(_state)
            _state = None


def _stop(state: _Tracing) -> None:
    state.instrumentor.uninstrument()
    if state.owned_provider is not None:
        state.owned_provider.shutdown()


def _own_provider(exporter: SpanExporter | None) -> TracerProvider:
    """A provider whose spans are redacted at export: to `exporter` synchronously, or in batches
    to the exporter the `OTEL_*` variables name. The resource takes `OTEL_SERVICE_NAME` and
    `OTEL_RESOURCE_ATTRIBUTES`, the sampler `OTEL_TRACES_SAMPLER` (the SDK reads them)."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    resource = Resource.create({} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: _SERVICE_NAME})
    provider = TracerProvider(resource=resource)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(redacting_exporter(exporter)))
        return provider
    configured = _configured_exporter()
    if configured is not None:
        provider.add_span_processor(BatchSpanProcessor(redacting_exporter(configured)))
    return provider


def _configured_exporter() -> SpanExporter | None:
    """The exporter `OTEL_TRACES_EXPORTER` names (`otlp`, the default; `console`; `none`), OTLP over
    the protocol `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL` names
    (`http/protobuf`, the default; `grpc` when its exporter is installed)."""
    kind = (os.environ.get("OTEL_TRACES_EXPORTER") or "otlp").strip().lower()
    if kind == "none":
        return None
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if kind != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER={kind!r} is not supported here; use otlp (the default), console or none.")
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError:
            raise ConfigError(
                "OTLP over grpc (OTEL_EXPORTER_OTLP_PROTOCOL=grpc) needs `pip install opentelemetry-exporter-otlp-proto-grpc`; "
                "the `otel` extra exports over http/protobuf."
            ) from None
        grpc: SpanExporter = GrpcExporter()
        return grpc
    raise ConfigError(f"OTLP protocol {protocol!r} is not supported; use http/protobuf (the default) or grpc.")


def _redacting_config() -> Any:
    """openinference's `TraceConfig` (its `OPENINFERENCE_HIDE_*` variables still apply) whose
    `mask`, which sees every attribute openinference sets, also redacts the value."""
    from openinference.instrumentation import TraceConfig

    class _RedactingConfig(TraceConfig):  # type: ignore[misc,unused-ignore]  # untyped without the extra
        def mask(self, key: str, value: Any, *, externalize: bool = True) -> Any:
            return _clean(super().mask(key, value, externalize=externalize))

    return _RedactingConfig()


def redacting_exporter(inner: SpanExporter) -> SpanExporter:
    """`inner`, handed copies of the spans with every attribute, event attribute and status text
    redacted: the last line of defence, for text set past `mask` (the exception events, with stack
    traces, that openinference records quote a provider's echo of a key). Providers `enable` makes
    export through it; wrap your own exporter with it when you bring your own provider."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Status

    def copy(s: ReadableSpan) -> ReadableSpan:
        status = s.status
        if status.description:
            status = Status(status.status_code, _text(status.description))
        return ReadableSpan(
            name=s.name, context=s.context, parent=s.parent, resource=s.resource, attributes=_attributes(s.attributes),
            events=[Event(e.name, _attributes(e.attributes), e.timestamp) for e in s.events], links=s.links,
            kind=s.kind, status=status, start_time=s.start_time, end_time=s.end_time,
            instrumentation_scope=s.instrumentation_scope,
        )

    class _Redacting(SpanExporter):  # type: ignore[misc,unused-ignore]  # untyped without the extra
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return inner.export([copy(s) for s in spans])

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(inner.force_flush(timeout_millis))

    return _Redacting()


def traced_generate(model: Any, *args: Any, **kwargs: Any) -> Any:
    """`model.generate(*args, **kwargs)`, an LLM span as openinference makes for smolagents' own
    models when tracing is on and `model`'s class is not one it instruments (it wraps the classes
    smolagents exports: a simulated model's calls would otherwise leave no LLM span)."""
    state = _state
    generate = getattr(type(model), "generate", None)
    if state is None or type(generate).__module__.startswith("wrapt"):  # off, or traced by openinference
        return model.generate(*args, **kwargs)
    from openinference.instrumentation.smolagents._wrappers import _ModelWrapper

    return _ModelWrapper(tracer=state.instrumentor._tracer)(model.generate, model, args, kwargs)
