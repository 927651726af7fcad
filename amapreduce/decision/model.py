"""The decision Θ = (task matrix M, template P, batching strategy B), validated.

A decision is what the manager agent writes and the engine executes. Validation happens here,
at the edge, so every later stage can trust it: errors name the exact field and problem
(ragged rows, a placeholder out of range, duplicate rows, an unknown strategy, a group index
out of range, a cell that contains a placeholder ...).

How matrix cells relate to output columns: matrix column j fills output column
`matrix_columns[j]` (default: the first K₀ output columns, in order — put the entity columns
first in the schema, or give `matrix_columns`, using null for a context-only column). Those
values identify the task's entity, so the engine takes them from the matrix, never from a
sub-agent. `key_columns` (default: the mapped matrix columns) identify a row of the table.
When the key includes a column the matrix does not fill (e.g. `rank` under a `year` task), one
task may yield several rows; `rows_per_task` then says how many are expected.

A decision is outside text (a user's file, a model's tool call): every string in it is scrubbed
of unencodable code points (`amapreduce._text.scrub_data`) before validation, so a lone
surrogate can neither crash a writer nor the console later. Numbers are bounded where a larger
one can only be a mistake (`MAX_BATCH_SIZE`, `MAX_ROWS_PER_TASK`), and a key cell must show
something (`table.keys.is_blank`): a zero-width space names no entity.

A decision may be composed (issue 12): `discover` finds the task matrix instead of listing it
(`task_matrix` stays empty), and `child` runs a whole decision per task, named in the root's
`decisions` or given inline, with `__parent_k__` filled from the parent's row. The checks of
the composition (cycles, `max_depth`, unknown names, root-only fields, parent placeholders) live
in `decision.nesting` and run once, on the outermost decision validated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

import amapreduce.decision.nesting as nesting  # not `from amapreduce.decision`: its __init__ imports this module
from amapreduce._text import scrub_data
from amapreduce.decision.columns import ColumnSpec, ColumnType, columns_from_schema
from amapreduce.decision.describe import CHILD_TAG, cell_to_str, describe, shown
from amapreduce.decision.discover_spec import DiscoverSpec
from amapreduce.decision.reading import DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS, read_decision_file
from amapreduce.decision.strategy import (
    MAX_BATCH_SIZE,
    ByAttr,
    Int,
    OpenStrategy,
    PerAtom,
    Strategy,
)
from amapreduce.decision.template import PLACEHOLDER, misspelt_placeholders, placeholders, render
from amapreduce.errors import DecisionError
from amapreduce.table.keys import is_blank, normalize_value

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MAX_ROWS_PER_TASK", "Decision", "load_decision"]

MAX_ROWS_PER_TASK = 10_000
"""Most rows one task may be asked for (`rows_per_task`). A sub-agent answers a task in one
reply; "top 10 000" is already far beyond one reply, so a larger number (`1e18`) is a mistake."""

def _child_kind(value: Any) -> str:
    """The union member of a `child`: a name of `decisions`, or an inline decision."""
    return "name" if isinstance(value, str) else CHILD_TAG


class Decision(BaseModel):
    """A validated decision Θ, ready to be batched and executed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_matrix: list[list[str]] = Field(default_factory=list)
    """N rows × K₀ cells; row i fills the template's `__0__ … __{K₀-1}__` (empty with `discover`)."""
    template: str
    """The atomic sub-query with placeholders."""
    json_schema: dict[str, Any] | list[Any]
    """Output columns: a JSON schema (`properties` in order) or a list of column names."""
    batch_strategy: Strategy = Field(default_factory=PerAtom)
    batch_size: Int | None = Field(default=None, ge=1, le=MAX_BATCH_SIZE)
    """Tasks per batch for `per_atom` (and the leftover chunk size for `open`)."""
    key_columns: list[str] | None = None
    """Columns that identify a table row (default: the matrix-mapped columns)."""
    matrix_columns: list[str | None] | None = None
    """Output column filled by each matrix column (null: context only). Default: the first K₀ columns."""
    rows_per_task: Int | None = Field(default=None, ge=1, le=MAX_ROWS_PER_TASK)
    """Rows each task must yield when the key is finer than the matrix (e.g. top-10 per year)."""
    discover: DiscoverSpec | None = None
    """Find the task matrix (one row per discovered entity: its `discover.key_columns`)."""
    child: Annotated[Annotated[Decision, Tag(CHILD_TAG)] | Annotated[str, Tag("name")], Discriminator(_child_kind)] | None = None
    """Run per task instead of a sub-agent: a name in the root's `decisions`, or an inline decision."""
    decisions: dict[str, Decision] | None = None
    """Root only: named decisions a `child` may name."""
    max_depth: Int | None = Field(default=None, ge=1, le=nesting.MAX_DEPTH)
    """Root only: nesting depth limit, the root being depth 1 (default `nesting.DEFAULT_MAX_DEPTH`)."""

    _column_specs: tuple[ColumnSpec, ...] = PrivateAttr(default=())
    _mapped: tuple[str | None, ...] = PrivateAttr(default=())
    _keys: tuple[str, ...] = PrivateAttr(default=())
    _normalizers: dict[str, Callable[[str], str]] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _scrub(cls, data: Any) -> Any:
        # Outside text: a lone surrogate (`"\ud800"` in a JSON file) becomes U+FFFD here, once,
        # so nothing downstream (plan output, prompts, trace, tables) meets an unencodable string.
        return scrub_data(data) if isinstance(data, Mapping) else data

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Unused composition fields are left out: a plain decision dumps (journal, result.json) as before.
        data = handler(self)
        return {k: v for k, v in data.items() if v is not None or k not in nesting.PARTS}

    @field_validator("task_matrix", mode="before")
    @classmethod
    def _coerce_cells(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        rows = []
        for i, row in enumerate(value):
            if not isinstance(row, list | tuple):
                raise ValueError(f"row {i} must be a list of cells, got {row!r}")
            rows.append([cell_to_str(c, f"task_matrix[{i}][{j}]") for j, c in enumerate(row)])
        return rows

    @field_validator("batch_strategy", mode="before")
    @classmethod
    def _normalize_strategy(cls, value: Any) -> Any:
        if value is None:
            return PerAtom()
        if isinstance(value, str):
            return {"type": value.strip().lower()}
        if isinstance(value, Mapping) and isinstance(value.get("type"), str):
            return {**value, "type": value["type"].strip().lower()}
        return value

    @model_validator(mode="after")
    def _check(self) -> Decision:
        self._check_matrix()
        self._check_template()
        self._column_specs = columns_from_schema(self.json_schema)
        self._normalizers = {c.name: c.kind.normalize for c in self._column_specs if c.kind is not ColumnType.TEXT}
        self._mapped = self._resolve_matrix_columns()
        self._keys = self._resolve_keys()
        self._check_key_cells()
        self._check_strategy()
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _tree(cls, data: Any, handler: ModelWrapValidatorHandler[Decision]) -> Decision:
        # The checks of the whole composition run once, on the outermost decision (see `nesting`),
        # after `_check` has resolved the columns: a wrap validator defined after it encloses it.
        with nesting.level() as outermost:
            decision = handler(data)
        if outermost:
            nesting.check_tree(decision)
        return decision

    # -- validation steps -------------------------------------------------------------------

    @property
    def matrix_width(self) -> int:
        """Cells per matrix row (with `discover`: the discovered key columns)."""
        if self.task_matrix:
            return len(self.task_matrix[0])
        return len(self.discover.resolved_key_columns) if self.discover is not None else 0

    def _check_matrix(self) -> None:
        m = self.task_matrix
        if self.discover is not None:
            nesting.check_discovered(m, self.batch_strategy)
            return
        if not m:
            raise ValueError("task_matrix is empty; give at least one row (one atomic task per row)")
        width = len(m[0])
        if width == 0:
            raise ValueError("task_matrix row 0 has no cells; each row needs at least one cell")
        seen: dict[tuple[str, ...], int] = {}
        for i, row in enumerate(m):
            if len(row) != width:
                raise ValueError(
                    f"task_matrix is ragged: row {i} has {len(row)} cells but row 0 has {width}; "
                    "every row needs the same number of cells"
                )
            for j, cell in enumerate(row):
                found = PLACEHOLDER.search(cell)
                if found:
                    raise ValueError(
                        f"task_matrix[{i}][{j}] = {cell!r} contains the placeholder {found.group(0)!r}; "
                        "cell values must be plain text"
                    )
            norm = tuple(normalize_value(c) for c in row)
            if norm in seen:
                raise ValueError(
                    f"task_matrix rows {seen[norm]} and {i} are duplicates ({row!r}); "
                    "each row must be a distinct atomic task"
                )
            seen[norm] = i

    def _check_template(self) -> None:
        width = self.matrix_width
        used = placeholders(self.template)
        if not self.template.strip():
            raise ValueError("template is empty; write the atomic sub-query with __0__ … placeholders")
        misspelt = misspelt_placeholders(self.template)
        if misspelt:
            raise ValueError(
                f"template has {misspelt[0]!r}, a placeholder whose digits are not ASCII 0-9 "
                "(fullwidth or another script's digits); write placeholders as __0__, __1__ and so on"
            )
        bad = [m.group(0) for m in PLACEHOLDER.finditer(self.template) if placeholders(m.group(0))[0] >= width]
        if bad:
            raise ValueError(
                f"template uses {shown(bad[0], 40)} but task_matrix rows have {width} cells "
                f"(placeholders __0__ … __{width - 1}__)"
            )
        if not used and (len(self.task_matrix) > 1 or self.discover is not None):
            raise ValueError(
                "template has no __0__ … placeholder, so every row would render the same sub-query; "
                "put the row's cells into it with __0__, __1__, ..."
            )

    def _resolve_matrix_columns(self) -> tuple[str | None, ...]:
        width = self.matrix_width
        names = [c.name for c in self._column_specs]
        found = self.discover.resolved_key_columns if self.discover is not None else ()
        if self.matrix_columns is None and found and set(found) <= set(names):
            return found  # discovered keys fill the output columns of the same names
        if self.matrix_columns is None:
            if width > len(names):
                raise ValueError(
                    f"task_matrix rows have {width} cells but json_schema has only {len(names)} columns; "
                    "give `matrix_columns` (null for a context-only cell)"
                )
            return tuple(names[:width])
        if len(self.matrix_columns) != width:
            raise ValueError(
                f"matrix_columns has {len(self.matrix_columns)} entries but task_matrix rows have {width} cells"
            )
        for name in self.matrix_columns:
            if name is not None and name not in names:
                raise ValueError(f"matrix_columns names {name!r}, which is not an output column; columns are {names}")
        mapped = [n for n in self.matrix_columns if n is not None]
        if len(set(mapped)) != len(mapped):
            raise ValueError(f"matrix_columns maps two matrix columns to the same output column: {self.matrix_columns}")
        return tuple(self.matrix_columns)

    def _resolve_keys(self) -> tuple[str, ...]:
        names = [c.name for c in self._column_specs]
        if self.key_columns is None:
            mapped = tuple(n for n in self._mapped if n is not None)
            return mapped or (names[0],)
        if not self.key_columns:
            raise ValueError("key_columns is empty; name at least one column that identifies a row")
        for k in self.key_columns:
            if k not in names:
                raise ValueError(f"key_columns names {k!r}, which is not an output column; columns are {names}")
        if len(set(self.key_columns)) != len(self.key_columns):
            raise ValueError(f"key_columns repeats a column: {self.key_columns}")
        return tuple(self.key_columns)

    def _check_key_cells(self) -> None:
        # The engine copies matrix-filled key cells into the table and never asks a sub-agent
        # for them, so an empty one would make a row nobody can identify or fill. Other matrix
        # cells (context, non-key columns) may legitimately be empty.
        keyed = [(j, col) for j, col in enumerate(self._mapped) if col is not None and col in self._keys]
        for i, row in enumerate(self.task_matrix):
            for j, col in keyed:
                if is_blank(row[j]):
                    what = "an empty cell" if not row[j].strip() else (
                        f"a cell with no visible character ({row[j]!r}: only zero-width, format or space characters)"
                    )
                    raise ValueError(
                        f"task_matrix row {i} ({shown(row, 80)}) has {what} for key column {col!r} "
                        f"(task_matrix[{i}][{j}]); every row must name its entity, so fill the cell or drop the row"
                    )

    def _attribute(self, index: int | None, name: str | None, where: str) -> int:
        width = self.matrix_width
        if name is not None:
            if name not in self._mapped:
                mapped = [n for n in self._mapped if n is not None]
                raise ValueError(f"{where}.attribute_name {name!r} is not a matrix column; matrix columns are {mapped}")
            return self._mapped.index(name)
        if index is None:
            raise ValueError(f"{where} needs `attribute_index` or `attribute_name`")
        if index >= width:
            raise ValueError(
                f"{where}.attribute_index {shown(index)} is out of range: rows have {width} cells (0 … {width - 1})"
            )
        return index

    def _check_strategy(self) -> None:
        s = self.batch_strategy
        n = len(self.task_matrix)
        if isinstance(s, ByAttr):
            self._attribute(s.attribute_index, s.attribute_name, "batch_strategy")
        elif isinstance(s, OpenStrategy):
            owner: dict[int, int] = {}
            for g, group in enumerate(s.groups):
                where = f"batch_strategy.groups[{g}]"
                if group.indices is not None:
                    for i in group.indices:
                        if not 0 <= i < n:
                            raise ValueError(
                                f"{where}.indices has {shown(i)}, out of range for {n} rows (0 … {n - 1})"
                            )
                        if i in owner:
                            raise ValueError(f"row {i} is in batch_strategy.groups[{owner[i]}] and groups[{g}]")
                        owner[i] = g
                else:
                    col = self._attribute(
                        group.attribute_index if group.attribute_index is not None else s.attribute_index,
                        group.attribute_name or (s.attribute_name if group.attribute_index is None else None),
                        where,
                    )
                    rows = [i for i, r in enumerate(self.task_matrix) if r[col] == group.attribute_value and i not in owner]
                    if not rows:
                        raise ValueError(
                            f"{where} (attribute_value {group.attribute_value!r}) matches no row that is not "
                            "already in an earlier group"
                        )
                    for i in rows:
                        owner[i] = g

    # -- derived views ------------------------------------------------------------------------

    @property
    def column_specs(self) -> tuple[ColumnSpec, ...]:
        """The ordered output columns with their types and descriptions (what sub-agents are shown)."""
        return self._column_specs

    @property
    def columns(self) -> tuple[str, ...]:
        """Names of the output columns, in order (as `Table.columns`)."""
        return tuple(c.name for c in self._column_specs)

    @property
    def resolved_key_columns(self) -> tuple[str, ...]:
        """`key_columns` as given, or its default (the matrix-filled columns); never None."""
        return self._keys

    @property
    def resolved_matrix_columns(self) -> tuple[str | None, ...]:
        """`matrix_columns` as given, or its default (the first K₀ output columns); None: context only."""
        return self._mapped

    @property
    def one_row_per_task(self) -> bool:
        """True when the matrix fills every key column, so each task is exactly one row."""
        return set(self._keys) <= {n for n in self._mapped if n is not None}

    def attribute_column(self, index: int | None, name: str | None) -> int:
        """Resolve an attribute given by index or name to a matrix column index."""
        return self._attribute(index, name, "batch_strategy")

    def task_text(self, i: int) -> str:
        """The atomic sub-query of row `i` (template filled with the row's cells)."""
        return render(self.template, self.task_matrix[i])

    @property
    def normalizers(self) -> Mapping[str, Callable[[str], str]]:
        """Column → its type's canonical form (`ColumnType.normalize`), for the columns typed other than
        text: what the table this decision reduces into stores values as (`Table(normalizers=...)`)."""
        return self._normalizers

    def forced_values(self, i: int) -> dict[str, str]:
        """Output cells that row `i` fixes (its matrix-mapped columns), in their column type's canonical
        form, as the table stores them (so a forced `1,000` finds the row holding `1000`)."""
        cells = {col: self.task_matrix[i][j] for j, col in enumerate(self._mapped) if col is not None}
        return {col: self._normalizers[col](v) if col in self._normalizers else v for col, v in cells.items()}

    @property
    def composed(self) -> bool:
        """True with `discover` or `child`: the decision runs as several engine runs, each planned
        as it runs (`mapreduce.compose`), so it has no single batch plan up front."""
        return self.discover is not None or self.child is not None

    @property
    def depth_limit(self) -> int:
        """`max_depth`, or its default: the most levels of nesting, this decision being level 1."""
        return self.max_depth or nesting.DEFAULT_MAX_DEPTH

    def with_matrix(self, rows: Sequence[Sequence[str]]) -> Decision:
        """This decision with `rows` as its task matrix and no `discover` (the fill after discovery).

        The matrix columns stay those this decision maps (with `discover`, the discovered keys').

        Raises:
            DecisionError: the rows are not a valid matrix for it (empty, ragged, duplicates ...).
        """
        data = self.model_dump(mode="json")
        if self.discover is not None:
            data.pop("discover")
            data["matrix_columns"] = list(self._mapped)
        return Decision.parse({**data, "task_matrix": [list(row) for row in rows]})

    def child_for(self, i: int) -> Decision:
        """The decision task `i` runs: `child`, resolved and with `__parent_k__` → row `i`'s cells
        (see `nesting.child_for`). Raises ValueError without a `child`, DecisionError when the
        filled child is invalid (its rows became duplicates ...)."""
        return nesting.child_for(self, i, Decision.parse)

    @classmethod
    def from_dataframe(
        cls, df: pd.DataFrame, *, template: str, columns: Sequence[str] | Mapping[str, Any],
        key_columns: Sequence[str] | None = None, context_columns: Sequence[str] = (), **fields: Any,
    ) -> Decision:
        """A decision whose task matrix is `df`'s rows: for a DataFrame of entities, find `columns`.

        Each of `df`'s columns, in order, is a matrix column (`__0__` in `template` is the first)
        and an output column of the same name, except `context_columns`, which only fill the
        template. `columns` are the output columns to find, after `df`'s: names, or a map of name
        to `{"type": ..., "description": ...}`. `key_columns` defaults to `df`'s output columns;
        `fields` are other decision fields (`batch_strategy`, `batch_size`, `rows_per_task`).
        A cell is written as text (a missing one, None or NaN, as empty).

        Raises:
            DecisionError: the decision is invalid (an empty frame, a column name that is not
                text, a context column not in `df`, an empty key cell, ...).
        """
        import pandas as pd

        names = list(df.columns)
        if not all(isinstance(n, str) for n in names):
            raise DecisionError(f"DataFrame column names must be text, got {names!r}; rename them (df.columns = [...]).")
        unknown = [c for c in context_columns if c not in names]
        if unknown:
            raise DecisionError(f"context_columns {unknown} are not columns of the DataFrame {names}.")
        mapped = [None if n in context_columns else n for n in names]
        found = dict(columns) if isinstance(columns, Mapping) else dict.fromkeys(
            [columns] if isinstance(columns, str) else columns)
        if made := sorted({"task_matrix", "json_schema", "matrix_columns"} & fields.keys()):
            raise DecisionError(f"from_dataframe makes {made} from the DataFrame; give `columns`/`context_columns`.")
        if repeated := [c for c in found if c in mapped]:
            raise DecisionError(f"columns {repeated} are already DataFrame columns; list only the columns to find.")
        matrix = [["" if pd.api.types.is_scalar(v) and pd.isna(v) else v.item() if hasattr(v, "item") else v
                   for v in row] for row in df.itertuples(index=False, name=None)]
        return cls.parse({
            **fields, "task_matrix": matrix, "template": template, "matrix_columns": mapped,
            "json_schema": {"properties": {**{n: {} for n in mapped if n is not None}, **found}},
            "key_columns": None if key_columns is None else list(key_columns),
        })

    @classmethod
    def parse(cls, data: Any) -> Decision:
        """Validate raw JSON data into a `Decision`, translating errors into one `DecisionError`."""
        if not isinstance(data, Mapping):
            raise DecisionError(f"a decision must be a JSON object, got {type(data).__name__}.")
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise DecisionError(describe(exc, cls)) from None
        except RecursionError:
            raise DecisionError(
                "invalid decision: it is nested too deeply to read; a decision needs only a few levels "
                "(a matrix of rows, a schema of columns)."
            ) from None


def load_decision(path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES,
                  max_rows: int = DEFAULT_MAX_ROWS) -> Decision:
    """Read and validate a decision JSON file (`decision.reading.read_decision_file`: refused over
    `max_bytes` before it is read, over `max_rows` rows before they are validated).

    Raises:
        DecisionError: the file is missing, too large, not JSON, or not a valid decision.
    """
    return Decision.parse(read_decision_file(Path(path), max_bytes=max_bytes, max_rows=max_rows))
