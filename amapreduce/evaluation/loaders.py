"""Read the official benchmark files: task jsonl, gold CSV tables and predicted answers.

Why our own loaders: the official WideSearch local loader crashes on the released jsonl (its
`evaluation` field is a JSON *string*, bug B9) and the HF loader downloads the dataset. These
read the same files offline and turn every malformed input into a `UserError` naming the file
and line, never a traceback: bytes that are not UTF-8, nesting deeper than the JSON parser's
recursion limit and integers beyond `int`'s 4,300-digit limit included. Strings read from a jsonl
(an answer a model wrote, a task's text) are scrubbed of lone surrogates (`amapreduce._text`), so
a `"\\ud83d"` escape in a response is scored as the text around it, not refused or crashed on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from amapreduce._text import scrub_data
from amapreduce.errors import UserError
from amapreduce.evaluation.answer import norm_column

__all__ = [
    "ColumnRule",
    "EvalSpec",
    "GoldTable",
    "PredictionLine",
    "TaskSpec",
    "gold_as_markdown",
    "load_gold",
    "load_predictions_dir",
    "load_predictions_jsonl",
    "load_tasks",
]


class ColumnRule(BaseModel):
    """One `eval_pipeline` entry: preprocess names, metric names and the metric's criterion."""

    model_config = ConfigDict(extra="allow")

    preprocess: list[str] = Field(default_factory=list)
    metric: list[str] = Field(default_factory=list)
    criterion: Any = None


class EvalSpec(BaseModel):
    """The decoded `evaluation` field of a task."""

    model_config = ConfigDict(extra="allow")

    unique_columns: list[str] = Field(min_length=1)
    required: list[str] = Field(min_length=1)
    eval_pipeline: dict[str, ColumnRule]


class EnrichSpec(BaseModel):
    """The `enrich` field of an enrichment task: the list to enrich, the columns to add, its key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str
    """The list file, relative to the tasks file's folder (made absolute by `load_tasks`)."""
    columns: list[str]
    key_columns: list[str]


class TaskSpec(BaseModel):
    """One benchmark task (WideSearch or DeepWideSearch), with `evaluation` decoded.

    Unknown keys are ignored on purpose: the official files carry fields the scorer never
    reads (`raw_deep_question`, `raw_wide_question`, ...), and `evaluation` may grow new ones.
    """

    model_config = ConfigDict(extra="ignore")

    instance_id: str
    query: str = ""
    evaluation: EvalSpec
    language: str = ""
    entity: str = ""
    topic: str = ""
    enrich: EnrichSpec | None = None
    """An enrichment task's given list (the sandbox's `enrich_tasks.jsonl`): its trials enrich it as
    `amapreduce enrich` does instead of asking `query`."""


class PredictionLine(BaseModel):
    """One line of a `--pred-jsonl` file.

    Other keys are ignored on purpose: the official WideSearch / DeepWideSearch output records
    carry `messages`, `trial_idx`, `prediction`, ... next to the three fields scored here, and
    must load as they are. A misspelt required key still fails (the key is then missing).
    """

    model_config = ConfigDict(extra="ignore")

    instance_id: str
    trial: int | str
    response: str | None


def _json_value(text: str, where: str, what: str) -> Any:
    """`text` parsed as JSON, its strings scrubbed; any way it fails is a `UserError` at `where`."""
    try:
        return scrub_data(json.loads(text))
    except json.JSONDecodeError as exc:
        reason = f"{exc.msg} at column {exc.colno}"
    except RecursionError:
        reason = "nested too deeply to read"
    except ValueError as exc:  # an integer longer than 4,300 digits
        reason = str(exc).split(";")[0]
    raise UserError(f"malformed {what} {where}: {reason}. Each line must be one JSON object.")


def _json_lines(path: Path, what: str) -> Iterator[tuple[str, Any]]:
    """(`path:line`, scrubbed JSON value) for each non-blank line of a jsonl file.

    Lines are decoded one by one, so a byte that is not UTF-8 is reported with its line number.
    """
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(
                    f"malformed {what} {where}: byte {exc.start + 1} is not UTF-8 ({exc.reason}). Save the file as UTF-8."
                ) from None
            if line.strip():
                yield where, _json_value(line, where, what)


def load_tasks(path: Path, benchmark: Literal["widesearch", "deepwidesearch"]) -> dict[str, TaskSpec]:
    """Load a task jsonl into `{instance_id: TaskSpec}`, in file order.

    DeepWideSearch names the prompt `question`; it is stored as `query` like WideSearch.

    Raises:
        UserError: the file is missing, a line is not JSON, or a line lacks a field.
    """
    if not path.is_file():
        raise UserError(f"tasks file not found: {path}. Pass the benchmark's jsonl with --tasks.")
    tasks: dict[str, TaskSpec] = {}
    for where, item in _json_lines(path, "task line"):
        if not isinstance(item, dict):
            raise UserError(
                f"malformed task line {where}: expected a JSON object, got {type(item).__name__}. "
                "Each line must be one JSON task."
            )
        evaluation = item.get("evaluation")
        if isinstance(evaluation, str):
            item["evaluation"] = _json_value(evaluation, f"{where} (`evaluation`)", "task line")
        if "query" not in item and "question" in item:
            item["query"] = item["question"]
        if not isinstance(item.get("entity", ""), str):
            item["entity"] = json.dumps(item["entity"], ensure_ascii=False)
        if isinstance(item.get("enrich"), dict) and isinstance(item["enrich"].get("input"), str):
            item["enrich"] = {**item["enrich"], "input": str(path.parent / item["enrich"]["input"])}
        try:
            task = TaskSpec.model_validate(item)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise UserError(
                f"malformed task line {where}: field `{field}`: {err['msg']}. "
                f"Is this a {benchmark} tasks file?"
            ) from None
        tasks[task.instance_id] = task
    if not tasks:
        raise UserError(f"tasks file {path} holds no task. Pass the benchmark's jsonl with --tasks.")
    return tasks


class GoldTable:
    """A gold table as the official loader leaves it: stringified cells, normalised headers.

    Attributes:
        columns: normalised header names, in `required` order.
        cells: one list of `str` cells per column (column-major), before deduplication.
        raw_headers: the CSV's own header names (for rendering the gold as an answer).
        kinds, as_text: how pandas read each column and, for number columns, the cells as
            written (`CellTable`); only when loaded `corrected` (the B13 fix needs them).
    """

    __slots__ = ("as_text", "cells", "columns", "kinds", "raw_headers")

    def __init__(
        self,
        columns: list[str],
        rows: list[tuple[str, ...]] | None,
        raw_headers: list[str],
        *,
        cells: list[list[str]] | None = None,
        kinds: list[str] | None = None,
        as_text: list[list[str] | None] | None = None,
    ) -> None:
        self.columns = columns
        self.kinds = kinds
        self.as_text = as_text
        self.cells = cells if cells is not None else [list(col) for col in zip(*(rows or []), strict=True)]
        if not self.cells:
            self.cells = [[] for _ in columns]
        self.raw_headers = raw_headers

    @property
    def rows(self) -> list[tuple[str, ...]]:
        """The rows as tuples (row-major view)."""
        return list(zip(*self.cells, strict=True))


def load_gold(gold_dir: Path, task: TaskSpec, *, corrected: bool = False) -> GoldTable:
    """Read `<gold_dir>/<instance_id>.csv` like the official loader (plain `pd.read_csv`).

    Args:
        corrected: B1 fix: render integral floats as integers ("2019" not "2019.0"); keep what
            the B13 fix needs (how each column was read, number columns as written).

    Raises:
        UserError: the file is missing or unreadable, or lacks a required column.
    """
    from amapreduce.evaluation.answer import read_table_cells

    path = gold_dir / f"{task.instance_id}.csv"
    if not path.is_file():
        raise UserError(
            f"gold table not found for {task.instance_id}: {path}. "
            f"Point --gold-dir at the folder holding <instance_id>.csv files."
        )
    try:
        table = read_table_cells(path, corrected=corrected)
    except Exception as exc:
        raise UserError(f"gold table {path} cannot be read: {exc}") from None
    raw_headers = [c.strip() for c in table.columns]
    normalised = [norm_column(h) for h in raw_headers]
    missing = [c for c in task.evaluation.required if c not in normalised]
    if missing:
        raise UserError(
            f"gold table {path} lacks required column(s) {missing}; it has {normalised}. "
            f"The gold folder does not match the tasks file."
        )
    index = [normalised.index(c) for c in task.evaluation.required]
    return GoldTable(
        list(task.evaluation.required),
        None,
        [raw_headers[i] for i in index],
        cells=[table.cells[i] for i in index],
        kinds=None if table.kinds is None else [table.kinds[i] for i in index],
        as_text=None if table.as_text is None else [table.as_text[i] for i in index],
    )


def gold_as_markdown(gold: GoldTable) -> str:
    """Render a gold table as a fenced markdown answer (the "gold pass" of docs/scorer-rules.md §11).

    Cells are the stringified gold values; a newline inside a cell becomes a space, since a
    markdown row cannot hold one.
    """

    def cell(value: str) -> str:
        return " ".join(value.replace("|", "/").splitlines()) if value else value

    lines = ["| " + " | ".join(gold.raw_headers) + " |", "|" + "---|" * len(gold.raw_headers)]
    lines.extend("| " + " | ".join(cell(v) for v in row) + " |" for row in gold.rows)
    return "```markdown\n" + "\n".join(lines) + "\n```"


def load_predictions_dir(pred_dir: Path, instance_ids: list[str]) -> dict[str, str | None]:
    """Read `<pred_dir>/<instance_id>.md` for each id; a missing file maps to None (scores 0).

    Raises:
        UserError: the folder is missing, or a file exists but cannot be read as UTF-8.
    """
    if not pred_dir.is_dir():
        raise UserError(
            f"--pred-dir {pred_dir} is not a folder. Pass one folder of <instance_id>.md per trial."
        )
    out: dict[str, str | None] = {}
    for iid in instance_ids:
        path = pred_dir / f"{iid}.md"
        if not path.is_file():
            out[iid] = None
            continue
        try:
            out[iid] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(
                f"answer file {path} cannot be read: {exc}. Save answers as UTF-8 text."
            ) from None
    return out


def load_predictions_jsonl(path: Path) -> dict[str, dict[str, str | None]]:
    """Read `--pred-jsonl` lines `{"instance_id", "trial", "response"}` into `{trial: {id: text}}`.

    Trials are ordered by id — numerically when every id is an integer, else as text — so the
    file's line order (say, a first task that lacks trial 1) never decides a trial's position in
    the per-task lists of the results.

    Raises:
        UserError: missing file, malformed line, or the same (trial, id) twice.
    """
    if not path.is_file():
        raise UserError(f"--pred-jsonl {path} not found.")
    trials: dict[str, dict[str, str | None]] = {}
    for where, value in _json_lines(path, "prediction line"):
        try:
            item = PredictionLine.model_validate(value)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "line"
            raise UserError(
                f"malformed prediction line {where}: `{field}`: {err['msg']}. "
                f'Each line must be {{"instance_id": ..., "trial": ..., "response": ...}}.'
            ) from None
        bucket = trials.setdefault(str(item.trial), {})
        if item.instance_id in bucket:
            raise UserError(
                f"duplicate prediction {where}: trial {item.trial!r} already has "
                f"{item.instance_id}. Keep one answer per task and trial."
            )
        bucket[item.instance_id] = item.response
    if not trials:
        raise UserError(f"--pred-jsonl {path} holds no prediction.")
    try:
        order = sorted(trials, key=int)
    except ValueError:
        order = sorted(trials)
    return {label: trials[label] for label in order}
