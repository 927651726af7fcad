"""The trace's events have a documented schema (issue 36, part 3): `amapreduce.trace_schema` lists
every event and field, `docs/reference/trace.md` is made from it, and the conftest checks every
`trace.jsonl` line the suite writes against it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from amapreduce.agents import tool_calls
from amapreduce.events import Event
from amapreduce.llm import events as llm_events
from amapreduce.llm import retry as llm_retry
from amapreduce.mapreduce import events
from amapreduce.mapreduce.result import AttemptRecord, RunEnding, RunStatus
from amapreduce.session import lifecycle
from amapreduce.trace_schema import TRACE_EVENTS, markdown, problems


def test_the_published_page_is_the_schema(repo_root: Path) -> None:
    page = repo_root / "docs" / "reference" / "trace.md"
    assert page.read_text(encoding="utf-8") == markdown(), (
        "docs/reference/trace.md is stale: python -c 'from amapreduce.trace_schema import markdown; "
        "print(markdown(), end=\"\")' > docs/reference/trace.md")


def test_every_event_is_listed_once() -> None:
    names = [spec.name for spec in TRACE_EVENTS]
    assert len(names) == len(set(names))


def _sample(kind: type[Event]) -> Event:
    """An instance of an engine event with every field given."""
    values = {"record": AttemptRecord(batch_id="b", phase="map", attempt=1, outcome="ok", elapsed_s=0.1),
              "ending": RunEnding(RunStatus.FAILED, "boom"), "usage": {}}
    filler = {int: 1, float: 0.5, str: "x", bool: True}
    kwargs = {}
    for f in dataclasses.fields(kind):
        if f.name in values:
            kwargs[f.name] = values[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = next((v for t, v in filler.items() if t.__name__ in str(f.type)), ())
    return kind(**kwargs)


def test_each_typed_event_writes_exactly_its_documented_fields() -> None:
    by_name = {spec.name: spec for spec in TRACE_EVENTS}
    traced = {k for module in (events, llm_events, llm_retry, tool_calls, lifecycle) for k in vars(module).values()
              if isinstance(k, type) and issubclass(k, Event) and k.trace_event}
    assert {k.trace_event for k in traced} == {"run_start", "patch_round", "attempt", "backup_start", "run_end", "workers",
                                               "model_call", "model_retry", "model_hedge", "tool", "run_finished"}
    for kind in traced:
        assert kind.trace_event is not None
        event = _sample(kind)
        written, documented = set(event.trace_fields()), set(by_name[kind.trace_event].fields)
        # each documented field is written (a tool call's `reason` and `error` only when it has one)
        assert written <= documented and documented - written <= {"reason", "error", "shared"}, kind.__name__  # (when set)
        assert problems({"ts": 0, "event": kind.trace_event, **event.trace_fields()}) == []


def test_a_line_outside_the_schema_is_named() -> None:
    assert problems({"ts": 1, "event": "attempt", "batch_id": "b", "chunk": 2}) == []
    assert problems({"ts": 1, "event": "model_call", "role": "subagent", "batch_id": "b", "node": "final"}) == []
    assert problems({"ts": 1, "event": "atempt"}) == ["unknown trace event 'atempt'"]
    assert problems({"ts": 1, "event": "run_end", "batch_id": "b"}) == [
        "run_end: field 'batch_id' is not in the trace schema"]  # only scoped events carry scope labels


def test_the_suite_checks_every_run_folder_trace_line(tmp_path: Path) -> None:
    """The conftest's check is on: a run folder's trace refuses an undocumented event."""
    import pytest

    from amapreduce.session.rundir import RunDir

    run_dir = RunDir(tmp_path)
    run_dir.trace.write("run_finished", status="complete", usage={})
    with pytest.raises(AssertionError, match="unknown trace event 'made_up'"):
        run_dir.trace.write("made_up", n=1)
    run_dir.trace.close()
