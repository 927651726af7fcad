"""Import and export: versioned JSONL, plus the reference implementation's `insights.json`.

JSONL, one object per line. The first line is a header
`{"type": "header", "format": "amapreduce-memory", "version": 1, "encoder": ...}`; then records
`{"type": "record", "id", "query", "label", "decision", "metrics", "task_id", "trace"}` and hints
`{"type": "hint", "id", "text", "score", "provenance": [record ids]}`, plus
`"provenance_questions": [questions]` for a hint with question-level provenance (one imported
from `insights.json`), so it keeps gaining the records that ask them. Vectors are not exported:
they are recomputed with the importing store's encoder, so a store can move to another encoder.

The reference's `insights.json` (`[{"rule", "score", "correlation_tasks": [questions]}]`) has
question-level provenance; those questions are linked to every record asking them, now and later.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from amapreduce._atomic import atomic_open
from amapreduce.decision.model import Decision
from amapreduce.errors import UserError
from amapreduce.memory.records import DecisionSummary, Record, TraceSummary, new_id
from amapreduce.memory.store import (
    MemoryStore,
    add_pending_provenance,
    get_hint,
    insert_hint,
    insert_record,
    log_event,
    pending_provenance,
)

__all__ = ["FORMAT", "FORMAT_VERSION", "export_jsonl", "import_file"]

FORMAT = "amapreduce-memory"
FORMAT_VERSION = 1


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
    trace: dict[str, Any] = Field(default_factory=dict)
    created_at: str | None = None


class HintLine(_Strict):
    """One hint; `score` is w_h and `provenance` lists record ids that must be in the file or the store."""

    type: Literal["hint"]
    id: str = Field(min_length=1)
    text: str = Field(min_length=1)
    score: int
    provenance: list[str] = Field(default_factory=list)
    provenance_questions: list[str] = Field(default_factory=list)
    """Questions whose present and future records join the provenance (reference hints)."""


class ReferenceInsight(BaseModel):
    """One entry of the reference's insights.json (unknown keys ignored: several versions exist)."""

    model_config = ConfigDict(extra="ignore")
    rule: str = Field(min_length=1)
    score: int
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
        hints = conn.execute("SELECT id, text, w FROM hints ORDER BY seq").fetchall()
        for h in hints:
            prov = [r[0] for r in conn.execute(
                "SELECT p.record_id FROM provenance p JOIN records r ON r.id = p.record_id "
                "WHERE p.hint_id = ? ORDER BY r.rowid", (h["id"],))]
            line = {"type": "hint", "id": h["id"], "text": h["text"], "score": int(h["w"]), "provenance": prov}
            questions = pending_provenance(conn, h["id"])
            if questions:
                line["provenance_questions"] = questions
            fh.write(json.dumps(line, ensure_ascii=False) + "\n")
            counts["hints"] += 1
    return counts


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as fh:
        for number, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{number}: not valid JSON ({exc.msg}). Each line must be one JSON object.") from exc
            if not isinstance(obj, dict):
                raise UserError(f"{path}:{number}: expected a JSON object, got {type(obj).__name__}.")
            yield number, obj


def _validate(model: type[BaseModel], obj: dict[str, Any], where: str) -> Any:
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(line)"
        raise UserError(f"{where}: field `{field}`: {err['msg']}. Fix the line or re-export it.") from None


def _is_reference(path: Path) -> bool:
    with path.open(encoding="utf-8") as fh:
        head = fh.read(4096).lstrip()
    return head.startswith("[")


def import_file(store: MemoryStore, path: Path) -> dict[str, int]:
    """Import a JSONL export or a reference `insights.json`; existing ids are skipped. Returns counts.

    Raises:
        UserError: the file is missing, malformed, or of a newer format version.
    """
    if not path.is_file():
        raise UserError(f"no such file: {path}. Give a JSONL export or a reference insights.json.")
    if _is_reference(path):
        return _import_reference(store, path)
    counts = {"records": 0, "hints": 0, "skipped": 0}
    records: list[tuple[str, RecordLine]] = []
    hints: list[tuple[str, HintLine]] = []
    for number, obj in _lines(path):
        where = f"{path}:{number}"
        kind = obj.get("type")
        if kind == "header":
            header = _validate(HeaderLine, obj, where)
            if header.version > FORMAT_VERSION:
                raise UserError(f"{where}: format version {header.version} is newer than this amapreduce reads "
                                f"({FORMAT_VERSION}). Upgrade amapreduce.")
        elif kind == "record":
            records.append((where, _validate(RecordLine, obj, where)))
        elif kind == "hint":
            hints.append((where, _validate(HintLine, obj, where)))
        else:
            raise UserError(f"{where}: unknown line type {kind!r}; expected header, record or hint.")
    fresh: list[RecordLine] = []
    with store.read() as conn:
        for _, line in records:
            if conn.execute("SELECT 1 FROM records WHERE id = ?", (line.id,)).fetchone():
                counts["skipped"] += 1
            else:
                fresh.append(line)
    vectors = store.embed([r.query for r in fresh]) if fresh else None
    with store.write() as conn:
        for i, line in enumerate(fresh):
            rec = Record(id=line.id, query=line.query, label=line.label,
                         decision=line.decision if isinstance(line.decision, DecisionSummary)
                         else DecisionSummary.of(line.decision),
                         trace=TraceSummary.model_validate(line.trace), metrics=line.metrics, task_id=line.task_id,
                         created_at=line.created_at or "")
            insert_record(conn, rec, vectors[i])  # type: ignore[index]
            counts["records"] += 1
        for where, hint in hints:
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
            insert_hint(conn, hint.text, hint.score, origin="import", hint_id=hint.id, provenance=hint.provenance,
                        source=str(path), **({"provenance_questions": hint.provenance_questions}
                                             if hint.provenance_questions else {}))
            add_pending_provenance(conn, hint.id, hint.provenance_questions)
            counts["hints"] += 1
        log_event(conn, "imported", file=str(path), counts=counts)
    return counts


def _import_reference(store: MemoryStore, path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc.msg}); expected the reference's insights.json list.") from exc
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a JSON list of hints, got {type(data).__name__}.")
    counts = {"records": 0, "hints": 0, "skipped": 0, "linked": 0}
    with store.write() as conn:
        existing = {r[0] for r in conn.execute("SELECT text FROM hints")}
        for number, obj in enumerate(data, 1):
            insight = _validate(ReferenceInsight, obj if isinstance(obj, dict) else {}, f"{path}[{number}]")
            text = " ".join(insight.rule.split())
            if text in existing:
                counts["skipped"] += 1
                continue
            hid = insert_hint(conn, text, insight.score, origin="reference", hint_id=new_id("h"), source=str(path),
                              provenance_questions=insight.correlation_tasks)
            counts["linked"] += add_pending_provenance(conn, hid, insight.correlation_tasks)
            existing.add(text)
            counts["hints"] += 1
        log_event(conn, "imported", file=str(path), format="reference-insights", counts=counts)
    return counts
