"""Import and export: versioned JSONL, plus the reference implementation's `insights.json`.

JSONL, one object per line. The first line is a header
`{"type": "header", "format": "amapreduce-memory", "version": 1, "encoder": ...}`; then records
`{"type": "record", "id", "query", "label", "decision", "metrics", "task_id", "trace"}` and hints
`{"type": "hint", "id", "text", "score", "provenance": [record ids]}` (with `"advice": {...}`, its typed
payload, when it has one: `memory.advice.HintAdvice`), plus
`"provenance_questions": [questions]` for a hint with question-level provenance (one imported
from `insights.json`), so it keeps gaining the records that ask them. Vectors are not exported:
they are recomputed with the importing store's encoder, so a store can move to another encoder.

The reference's `insights.json` (`[{"rule", "score", "correlation_tasks": [questions]}]`) has
question-level provenance; those questions are linked to every record asking them, now and later.

An import file is outside input, read whole and checked before the store is touched
(`read_import`): whatever is wrong with it — bytes that are not UTF-8, a line that is not JSON,
nesting deeper than `MAX_NESTING`, a number beyond what Python parses or a score beyond
`store.MAX_SCORE`, a field of the wrong shape — is one `UserError` naming the line, and nothing
is written. Lone surrogate escapes (`"\\ud800"`) become U+FFFD (`_text.scrub_data`), since SQLite
cannot store them.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from amapreduce._atomic import atomic_open
from amapreduce._text import scrub_data
from amapreduce.decision.model import Decision
from amapreduce.errors import UserError
from amapreduce.memory.advice import HintAdvice
from amapreduce.memory.records import DecisionSummary, Record, TraceSummary, new_id
from amapreduce.memory.store import (
    MAX_SCORE,
    MemoryStore,
    add_pending_provenance,
    get_hint,
    insert_hint,
    insert_record,
    log_event,
    pending_provenance,
)

__all__ = [
    "FORMAT", "FORMAT_VERSION", "MAX_NESTING", "NUMERIC_METRICS", "ImportFile", "export_jsonl", "import_file", "read_import",
]

FORMAT = "amapreduce-memory"
FORMAT_VERSION = 1
NUMERIC_METRICS = ("score", "f1_by_row", "f1_by_item", "column_f1", "utility")
"""Metrics that `memory.labels` reads as numbers (pass rules, the quality of a record)."""
MAX_NESTING = 64
"""Deepest nesting of arrays and objects an import line may have. An export nests a few levels
(a record's metrics, a decision's schema); the bound is checked before parsing, because Python's
JSON parser and everything after it recurse once per level and fail at about a thousand."""


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in an edited export must not be dropped silently."""

    model_config = ConfigDict(extra="forbid")


class HeaderLine(_Strict):
    """First line of an export: format name and version, so a reader can refuse what it cannot read."""

    type: Literal["header"]
    format: Literal["amapreduce-memory"]
    version: int
    encoder: str | None = None
    exported_at: str | None = None


class RecordLine(_Strict):
    """One record; `decision` and `trace` are the stored summaries. A hand-written file may give a full
    decision instead of a summary: it is validated like a decision file and summarised on import."""

    type: Literal["record"]
    id: str = Field(min_length=1)
    query: str = Field(min_length=1)
    label: bool
    decision: DecisionSummary | Decision = Field(default_factory=DecisionSummary)
    metrics: dict[str, Any] = Field(default_factory=dict)
    task_id: str | None = None
    trace: TraceSummary = Field(default_factory=TraceSummary)
    created_at: str | None = None

    @field_validator("metrics")
    @classmethod
    def _scores_are_numbers(cls, metrics: dict[str, Any]) -> dict[str, Any]:
        """The metrics the memory computes with (labels, quality) must be finite numbers: a
        string there would pass the import and break `memory list` and distillation later."""
        for key in NUMERIC_METRICS:
            value = metrics.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not _finite(value)):
                raise ValueError(f"metric `{key}` must be a finite number or null, got {_short(repr(value), 40)}")
        return metrics


class HintLine(_Strict):
    """One hint; `score` is w_h and `provenance` lists record ids that must be in the file or the store."""

    type: Literal["hint"]
    id: str = Field(min_length=1)
    text: str = Field(min_length=1)
    score: int = Field(ge=-MAX_SCORE, le=MAX_SCORE)
    provenance: list[str] = Field(default_factory=list)
    provenance_questions: list[str] = Field(default_factory=list)
    """Questions whose present and future records join the provenance (reference hints)."""
    advice: HintAdvice | None = None
    """The hint's typed advice payload, if any."""


class ReferenceInsight(BaseModel):
    """One entry of the reference's insights.json (unknown keys ignored: several versions exist)."""

    model_config = ConfigDict(extra="ignore")
    rule: str = Field(min_length=1)
    score: int = Field(ge=-MAX_SCORE, le=MAX_SCORE)
    correlation_tasks: list[str] = Field(default_factory=list)


def export_jsonl(store: MemoryStore, path: Path) -> dict[str, int]:
    """Write the whole store to `path` atomically (temp file + rename); return counts."""
    counts = {"records": 0, "hints": 0}
    with atomic_open(path) as fh, store.read() as conn:
        from amapreduce.memory.store import now

        header = {"type": "header", "format": FORMAT, "version": FORMAT_VERSION, "encoder": store.encoder_spec,
                  "exported_at": now()}
        fh.write(json.dumps(header, ensure_ascii=False) + "\n")
        for row in conn.execute("SELECT * FROM records ORDER BY rowid"):
            rec = Record.from_row(dict(row))
            line = {"type": "record", "id": rec.id, "query": rec.query, "label": rec.label,
                    "decision": rec.decision.model_dump(mode="json"), "metrics": rec.metrics,
                    "task_id": rec.task_id, "trace": rec.trace.model_dump(mode="json", exclude_none=True),
                    "created_at": rec.created_at}
            fh.write(json.dumps(line, ensure_ascii=False) + "\n")
            counts["records"] += 1
        hints = conn.execute("SELECT id, text, w, advice FROM hints ORDER BY seq").fetchall()
        for h in hints:
            prov = [r[0] for r in conn.execute(
                "SELECT p.record_id FROM provenance p JOIN records r ON r.id = p.record_id "
                "WHERE p.hint_id = ? ORDER BY r.rowid", (h["id"],))]
            line = {"type": "hint", "id": h["id"], "text": h["text"], "score": int(h["w"]), "provenance": prov}
            if h["advice"]:
                line["advice"] = json.loads(h["advice"])
            questions = pending_provenance(conn, h["id"])
            if questions:
                line["provenance_questions"] = questions
            fh.write(json.dumps(line, ensure_ascii=False) + "\n")
            counts["hints"] += 1
    return counts


_STRING = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\\?\Z)', re.DOTALL)
"""A JSON string, or an unterminated one to the end of the text (so a failed match never
restarts inside it: the scan stays linear)."""
_BRACKET = re.compile(r"[\[\]{}]")
_LIST_START = re.compile(r"\s*\[")


def _too_deep(text: str) -> bool:
    """True when `text` nests arrays/objects deeper than `MAX_NESTING` (brackets inside strings
    do not count). Cheap for ordinary lines: they hold too few brackets to be deep."""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return False
    depth = 0
    for match in _BRACKET.finditer(_STRING.sub('""', text)):
        depth += 1 if match.group() in "[{" else -1
        if depth > MAX_NESTING:
            return True
    return False


def _parse_json(text: str, where: str, expected: str) -> Any:
    """`text` parsed as JSON (surrogates scrubbed), or a `UserError` saying what is wrong at `where`."""
    if _too_deep(text):
        raise UserError(f"{where}: JSON nested deeper than {MAX_NESTING} levels; a memory export nests a few at most.")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}). {expected}.") from None
    except RecursionError:  # not reached below MAX_NESTING; kept so no input can raise it
        raise UserError(f"{where}: JSON nested too deeply to read. {expected}.") from None
    except ValueError:  # the one other refusal: an integer longer than Python converts
        raise UserError(f"{where}: a number has more than {sys.get_int_max_str_digits():,} digits; no value in "
                        f"a memory export is that long. {expected}.") from None
    return scrub_data(value)


def _finite(number: float) -> bool:
    """True for a number that is finite as a float (an int too large for a float is not)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _text_of(path: Path) -> str:
    """The file as text: UTF-8 (a leading byte-order mark is allowed), else a `UserError`
    naming the line of the first byte that is not."""
    if not path.is_file():
        raise UserError(f"no such file: {path}. Give a JSONL export or a reference insights.json.")
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        utf16 = data[:2] in (b"\xff\xfe", b"\xfe\xff")
        hint = "it looks like UTF-16; save it as UTF-8" if utf16 else "export files are UTF-8 JSON text"
        raise UserError(f"{path}:{line}: byte 0x{data[exc.start]:02x} is not UTF-8 text ({hint}).") from None


def _lines(path: Path, text: str) -> Iterator[tuple[str, dict[str, Any]]]:
    # Lines end at "\n" only (as in an editor): `str.splitlines` would also split at U+2028 and
    # other characters that JSON strings may hold as they are.
    for number, raw in enumerate(text.split("\n"), 1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        obj = _parse_json(raw, where, "Each line must be one JSON object")
        if not isinstance(obj, dict):
            raise UserError(f"{where}: expected a JSON object, got {type(obj).__name__}.")
        yield where, obj


def _validate(model: type[BaseModel], obj: dict[str, Any], where: str) -> Any:
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(line)"
        raise UserError(f"{where}: field `{_short(field)}`: {_short(err['msg'])}. Fix the line or re-export it.") from None


@dataclass(frozen=True)
class ImportFile:
    """An import file read and checked whole (`read_import`), before any store is opened.

    `records` and `hints` hold a JSONL export's lines with where each came from (`path:line`);
    `insights` a reference `insights.json`'s entries (`path[n]`); one of the two kinds is empty.
    """

    path: Path
    records: tuple[tuple[str, RecordLine], ...] = ()
    hints: tuple[tuple[str, HintLine], ...] = ()
    insights: tuple[tuple[str, ReferenceInsight], ...] = ()
    reference: bool = False


def read_import(path: Path) -> ImportFile:
    """Read and validate a JSONL export or a reference `insights.json`; the store is not touched.

    Raises:
        UserError: the file is missing or malformed (the message names the line and the problem),
            or of a newer format version.
    """
    text = _text_of(path)
    if _LIST_START.match(text):
        return _read_reference(path, text)
    records: list[tuple[str, RecordLine]] = []
    hints: list[tuple[str, HintLine]] = []
    for where, obj in _lines(path, text):
        kind = obj.get("type")
        if kind == "header":
            header = _validate(HeaderLine, obj, where)
            if header.version > FORMAT_VERSION:
                raise UserError(f"{where}: format version {_short(str(header.version))} is newer than this "
                                f"amapreduce reads ({FORMAT_VERSION}). Upgrade amapreduce.")
        elif kind == "record":
            records.append((where, _validate(RecordLine, obj, where)))
        elif kind == "hint":
            hints.append((where, _validate(HintLine, obj, where)))
        else:
            raise UserError(f"{where}: unknown line type {_short(repr(kind))}; expected header, record or hint.")
    return ImportFile(path=path, records=tuple(records), hints=tuple(hints))


def _read_reference(path: Path, text: str) -> ImportFile:
    data = _parse_json(text, str(path), "Expected the reference's insights.json list")
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a JSON list of hints, got {type(data).__name__}.")
    insights = tuple((f"{path}[{n}]", _validate(ReferenceInsight, obj if isinstance(obj, dict) else {}, f"{path}[{n}]"))
                     for n, obj in enumerate(data, 1))
    return ImportFile(path=path, insights=insights, reference=True)


def import_file(store: MemoryStore, source: Path | ImportFile) -> dict[str, int]:
    """Import a JSONL export or a reference `insights.json` (a path, or the file `read_import`
    already read); existing ids are skipped. All or nothing. Returns counts.

    Raises:
        UserError: the file is missing, malformed, or of a newer format version; an id repeats;
            a hint's provenance names a record in neither the file nor the store.
    """
    parsed = source if isinstance(source, ImportFile) else read_import(source)
    if parsed.reference:
        return _import_reference(store, parsed)
    path = parsed.path
    counts = {"records": 0, "hints": 0, "skipped": 0}
    fresh: list[tuple[str, RecordLine]] = []
    with store.read() as conn:
        for where, line in parsed.records:
            if conn.execute("SELECT 1 FROM records WHERE id = ?", (line.id,)).fetchone():
                counts["skipped"] += 1
            else:
                fresh.append((where, line))
    vectors = store.embed([r.query for _, r in fresh]) if fresh else None
    with store.write() as conn:
        for i, (where, line) in enumerate(fresh):
            rec = Record(id=line.id, query=line.query, label=line.label,
                         decision=line.decision if isinstance(line.decision, DecisionSummary)
                         else DecisionSummary.of(line.decision),
                         trace=line.trace, metrics=line.metrics, task_id=line.task_id,
                         created_at=line.created_at or "")
            with _at(where):
                insert_record(conn, rec, vectors[i])  # type: ignore[index]
            counts["records"] += 1
        for where, hint in parsed.hints:
            if get_hint(conn, hint.id) is not None:
                counts["skipped"] += 1
                continue
            known = {r[0] for r in conn.execute(
                f"SELECT id FROM records WHERE id IN ({','.join('?' * len(hint.provenance))})",  # noqa: S608
                hint.provenance)} if hint.provenance else set()
            unknown = [p for p in hint.provenance if p not in known]
            if unknown:
                raise UserError(f"{where}: provenance names records not in the file or store: {unknown[:3]}. "
                                "Export records together with their hints.")
            with _at(where):
                insert_hint(conn, hint.text, hint.score, origin="import", hint_id=hint.id, provenance=hint.provenance,
                            source=str(path), advice=hint.advice, **({"provenance_questions": hint.provenance_questions}
                                                 if hint.provenance_questions else {}))
            add_pending_provenance(conn, hint.id, hint.provenance_questions)
            counts["hints"] += 1
        log_event(conn, "imported", file=str(path), counts=counts)
    return counts


@contextlib.contextmanager
def _at(where: str) -> Iterator[None]:
    """Prefix a `UserError` raised while storing one line (a repeated id, an empty hint) with
    the line it came from."""
    try:
        yield
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None


def _import_reference(store: MemoryStore, parsed: ImportFile) -> dict[str, int]:
    path = parsed.path
    counts = {"records": 0, "hints": 0, "skipped": 0, "linked": 0}
    with store.write() as conn:
        existing = {r[0] for r in conn.execute("SELECT text FROM hints")}
        for where, insight in parsed.insights:
            text = " ".join(insight.rule.split())
            if text in existing:
                counts["skipped"] += 1
                continue
            with _at(where):
                hid = insert_hint(conn, text, insight.score, origin="reference", hint_id=new_id("h"), source=str(path),
                                  provenance_questions=insight.correlation_tasks)
            counts["linked"] += add_pending_provenance(conn, hid, insight.correlation_tasks)
            existing.add(text)
            counts["hints"] += 1
        log_event(conn, "imported", file=str(path), format="reference-insights", counts=counts)
    return counts
