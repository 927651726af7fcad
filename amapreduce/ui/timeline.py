"""The batch timeline of a run (a Gantt chart) from its `trace.jsonl`.

Why from the trace: it is the one file that records every sub-agent attempt with its end time
and duration (`attempt` events), each provider retry inside an attempt (`model_retry`) and each
delta-patch round (`patch_round`), in the order they happened. The chart is laid out here, in
plain numbers, so the template only draws rectangles and the layout is testable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amapreduce.trace import read_trace

__all__ = ["LABEL_WIDTH", "LANE_HEIGHT", "PLOT_WIDTH", "Bar", "Lane", "Mark", "Tick", "Timeline", "read_timeline"]

LABEL_WIDTH = 170
"""Pixels for the batch names left of the chart."""
PLOT_WIDTH = 760
"""Pixels for the time axis."""
LANE_HEIGHT = 18
AXIS_HEIGHT = 26


@dataclass(frozen=True)
class Bar:
    """One attempt of one batch: where it sits and what it says on hover."""

    x: float
    y: float
    width: float
    outcome: str
    """`ok`, `parse_error`, `error` or `timeout`: the bar's colour."""
    title: str


@dataclass(frozen=True)
class Mark:
    """A provider retry (a tick on its batch's lane) or a patch round (a line across the chart)."""

    x: float
    y: float
    height: float
    kind: str
    title: str


@dataclass(frozen=True)
class Lane:
    """One batch's row."""

    y: float
    label: str
    phase: str


@dataclass(frozen=True)
class Tick:
    """One label of the time axis."""

    x: float
    label: str


@dataclass(frozen=True)
class Timeline:
    """The laid-out chart: lanes, bars, marks, axis ticks and the SVG's size."""

    lanes: tuple[Lane, ...]
    bars: tuple[Bar, ...]
    marks: tuple[Mark, ...]
    ticks: tuple[Tick, ...]
    width: int
    height: int
    span_s: float
    counts: dict[str, int]
    """Attempts by outcome, and `retries` (provider retries) and `patch_rounds`."""


def _events(path: Path) -> list[dict[str, Any]]:
    """The trace's events that carry a time (`trace.read_trace`)."""
    return [event for event in read_trace(path) if isinstance(event.get("ts"), int | float)]


def _number(value: object, default: float = 0.0) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return default


def _step(span: float) -> float:
    """A round tick spacing giving about five ticks over `span` seconds."""
    raw = span / 5
    power = 10.0 ** math.floor(math.log10(raw))
    return next(float(m * power) for m in (1, 2, 5, 10) if m * power >= raw)


def read_timeline(trace: Path) -> Timeline | None:
    """The Gantt chart of the attempts in `trace` (a run's `trace.jsonl`); None when it has none.

    Lanes are batches in the order they were planned (then patch batches as they appear); a
    second execution in the same run gets its own lanes, named `2:batch-001`.
    """
    if not trace.is_file():
        return None
    events = _events(trace)
    execution = 0
    lanes: dict[tuple[int, str], str] = {}
    attempts: list[tuple[tuple[int, str], dict[str, Any]]] = []
    retries: list[tuple[tuple[int, str], dict[str, Any]]] = []
    rounds: list[dict[str, Any]] = []
    for event in events:
        kind = event.get("event")
        if kind == "run_start":
            execution += 1
            for batch in event.get("batches") or []:
                if isinstance(batch, dict) and isinstance(batch.get("batch_id"), str):
                    lanes.setdefault((execution, batch["batch_id"]), "map")
        elif kind == "attempt" and isinstance(event.get("batch_id"), str):
            key = (max(execution, 1), event["batch_id"])
            lanes.setdefault(key, str(event.get("phase") or "map"))
            attempts.append((key, event))
        elif kind in ("model_retry", "model_hedge") and isinstance(event.get("batch_id"), str):
            retries.append(((max(execution, 1), event["batch_id"]), event))
        elif kind == "patch_round":
            rounds.append(event)
    if not attempts:
        return None
    starts = [_number(e["ts"]) - _number(e.get("elapsed_s")) for _, e in attempts]
    t0 = min(starts)
    t1 = max(_number(e["ts"]) for _, e in attempts)
    span = max(t1 - t0, 1e-3)
    scale = PLOT_WIDTH / span
    row = {key: i for i, key in enumerate(lanes)}

    def x_of(ts: float) -> float:
        return round(LABEL_WIDTH + min(max(ts - t0, 0.0), span) * scale, 2)

    def y_of(key: tuple[int, str]) -> float:
        return AXIS_HEIGHT + row[key] * LANE_HEIGHT

    bars = []
    counts: dict[str, int] = {}
    for (key, event), start in zip(attempts, starts, strict=True):
        outcome = str(event.get("outcome") or "error")
        counts[outcome] = counts.get(outcome, 0) + 1
        end = _number(event["ts"])
        if event.get("backup") is True:
            counts["backups"] = counts.get("backups", 0) + 1
        copy = " backup" if event.get("backup") is True else ""
        title = (f"{key[1]} attempt {event.get('attempt')}{copy} ({event.get('phase')}): {outcome}, "
                 f"{end - start:.2f} s, starts at {start - t0:.2f} s")
        if event.get("error"):
            title += f"\n{str(event['error'])[:300]}"
        bars.append(Bar(x=x_of(start), y=y_of(key) + 3, width=round(max((end - start) * scale, 2.0), 2),
                        outcome=outcome, title=title))
    height = AXIS_HEIGHT + len(lanes) * LANE_HEIGHT + 6
    marks = [Mark(x=x_of(_number(e["ts"])), y=y_of(key) + 1, height=LANE_HEIGHT - 2, kind="retry",
                  title=f"{key[1]}: provider retry {e.get('retry')} ({e.get('kind')}), waited {_number(e.get('delay_s')):.2f} s")
             for key, e in retries if key in row and e.get("event") == "model_retry"]
    hedges = [(key, e) for key, e in retries if e.get("event") == "model_hedge"]
    marks += [Mark(x=x_of(_number(e["ts"])), y=y_of(key) + 1, height=LANE_HEIGHT - 2, kind="hedge",
                   title=f"{key[1]}: a late model call hedged after {_number(e.get('after_s')):.2f} s; "
                         f"{'the hedge' if e.get('winner') == 'hedge' else 'the first request'} answered first")
              for key, e in hedges if key in row]
    marks += [Mark(x=x_of(_number(e["ts"])), y=AXIS_HEIGHT - 4, height=height - AXIS_HEIGHT, kind="patch",
                   title=f"patch round {e.get('round')}: {len(e.get('batches') or [])} batches")
              for e in rounds]
    counts["retries"] = len(retries) - len(hedges)
    if hedges:
        counts["hedges"] = len(hedges)
    counts["patch_rounds"] = len(rounds)
    step = _step(span)
    ticks = [Tick(x=x_of(t0 + k * step), label=f"{k * step:g} s") for k in range(int(span / step) + 1)]
    named = [Lane(y=y_of(key), label=(key[1] if execution <= 1 else f"{key[0]}:{key[1]}"), phase=phase)
             for key, phase in lanes.items()]
    return Timeline(lanes=tuple(named), bars=tuple(bars), marks=tuple(marks), ticks=tuple(ticks),
                    width=LABEL_WIDTH + PLOT_WIDTH + 10, height=height, span_s=round(span, 3), counts=counts)
