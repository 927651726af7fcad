"""What an enrichment asks: the user's rows, the key that names each row, the columns to add.

`EnrichRequest.of` checks a list against the columns asked, before anything runs: every key
column exists, no key cell is blank (or reads like `N/A`), no two rows share a key (as the table
compares keys: case, spaces and accents folded, `table.keys`), no new column is already an input
column or clashes with a column the output adds. Without `--key`, the key is inferred: the
first input column whose cells name every row once, which the command shows.

`EnrichRequest.decision()` turns it into a plain `Decision`: one task per input row, in order;
the key columns fill the table's key cells from the matrix (never from a sub-agent), every other
input column is context only (shown to the sub-agent, not an output column); the asked columns
are the schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from amapreduce.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

    from amapreduce.decision.model import Decision

__all__ = ["CELLS_PER_BATCH", "EVIDENCE_SUFFIXES", "ROW_STATUS_COLUMN", "EnrichRequest", "cell_text", "parse_columns"]

CELLS_PER_BATCH = 16
"""Output cells (key and new columns of a row together) one sub-agent is asked for by default: the
rows per batch are this divided by the row's width (at least one). `--batch-size` overrides it."""
ROW_STATUS_COLUMN = "enrich_status"
"""The column the enriched list adds after the new ones: `complete` (every new cell found),
`partial` (some found) or `failed` (none found; the row keeps its input and blank new cells)."""
EVIDENCE_SUFFIXES = ("status", "source", "quote", "evidence")
"""With evidence, each new column `c` is followed by `c status`, `c source`, `c quote` and
`c evidence`, named as `to_dataframe(evidence=True)` names them."""


def cell_text(value: Any) -> str:
    """An input cell as the task matrix writes it: text as is, a missing cell (None, NaN) empty,
    a number without a trailing `.0` when whole."""
    import pandas as pd

    if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
        return ""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def parse_columns(text: str) -> list[str]:
    """`"CEO, Headquarters, Founded"` → the column names (comma-separated, spaces trimmed).

    Raises:
        UserError: no name at all.
    """
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise UserError(f"--columns {text!r} names no column; give them comma-separated, e.g. \"CEO, Founded\".")
    return names


@dataclass(frozen=True, kw_only=True)
class EnrichRequest:
    """A checked enrichment: the input `frame`, its `key_columns`, the `columns` to add."""

    frame: pd.DataFrame
    """The user's rows, every column in its order (kept as given in the enriched copy)."""
    columns: dict[str, dict[str, Any]]
    """The columns to add, in order, each with its JSON-schema entry (`type`, `description`)."""
    key_columns: tuple[str, ...]
    key_inferred: bool = False
    """The key was inferred (no `--key`), so the command says which one it took."""
    instructions: str = ""
    """Extra guidance for every sub-agent (`--instructions`)."""
    batch_size: int = 1
    label: str = "enrich"
    """Names the list: the start of the run's `query` (the CLI's is `enrich-<file name>`)."""
    keys: list[tuple[str, ...]] = field(default_factory=list, repr=False)
    """Each row's normalised key, in row order (how the enriched table's rows are found again)."""

    @classmethod
    def of(cls, frame: pd.DataFrame, columns: Sequence[str] | Mapping[str, Any], *,
           key_columns: Sequence[str] | None = None, instructions: str | None = None,
           batch_size: int | None = None, label: str = "enrich") -> EnrichRequest:
        """Check `frame` against what is asked (see the module's docstring).

        Raises:
            UserError: no rows, a column name that is not text, an unknown or repeated key column,
                a blank or repeated key, no column that could be the key, a column asked twice or
                already in the input, an output column name taken, a batch size below 1.
        """
        names = list(frame.columns)
        if len(frame) == 0:
            raise UserError(f"the list has no rows (columns: {names}); there is nothing to enrich.")
        if not all(isinstance(n, str) and n.strip() for n in names):
            raise UserError(f"every input column needs a name (text), got {names!r}.")
        if len(set(names)) != len(names):
            raise UserError(f"the input repeats column names {sorted({n for n in names if names.count(n) > 1})}.")
        wanted = _wanted(columns)
        if taken := [c for c in wanted if c in names]:
            raise UserError(f"column(s) {taken} are already in the input; --columns names only the columns to add.")
        text = [[cell_text(v) for v in row] for row in frame.itertuples(index=False, name=None)]
        if key_columns is not None and len(key_columns) > 0:
            keys = list(key_columns)
            if unknown := [k for k in keys if k not in names]:
                raise UserError(f"no such column {unknown[0]!r} for --key; the input's columns are {names}.")
            if len(set(keys)) != len(keys):
                raise UserError(f"--key repeats a column: {keys}.")
            row_keys = _row_keys(names, text, keys)
            inferred = False
        else:
            keys, row_keys = _infer_key(names, text)
            inferred = True
        added = [*wanted, ROW_STATUS_COLUMN, *(f"{c} {s}" for c in wanted for s in EVIDENCE_SUFFIXES)]
        if clash := [c for c in added if c in names]:
            raise UserError(f"the enriched list would repeat the input's column(s) {clash}; rename them in the input.")
        size = batch_size if batch_size is not None else max(1, CELLS_PER_BATCH // (len(keys) + len(wanted)))
        if size < 1:
            raise UserError(f"the batch size must be at least 1, got {size}.")
        return cls(frame=frame, columns=wanted, key_columns=tuple(keys), key_inferred=inferred,
                   instructions=(instructions or "").strip(), batch_size=size, label=label, keys=row_keys)

    @property
    def query(self) -> str:
        """What the run is asked, in words: the run directory's name, its recorded query and what the
        plan stage retrieves the memory's prior by (`companies: add CEO, Founded to 400 rows (key: Company)`)."""
        return (f"{self.label}: add {', '.join(self.columns)} to {len(self.frame)} rows "
                f"(key: {', '.join(self.key_columns)})")

    @property
    def context_columns(self) -> tuple[str, ...]:
        """The input columns that are not the key: shown to each sub-agent as what is known of its row."""
        return tuple(c for c in self.frame.columns if c not in self.key_columns)

    def template(self) -> str:
        """The atomic sub-query of one row: its key cells quoted, its other cells as context, the columns asked."""
        order = [*self.key_columns, *self.context_columns]
        entry = ", ".join(f'{c} "__{order.index(c)}__"' for c in self.key_columns)
        known = "; ".join(f'{c}: "__{order.index(c)}__"' for c in self.context_columns)
        asked = ", ".join(self.columns)
        text = f"Enrich one entry of a list: the entry with {entry}."
        if known:
            text += f" Also known about it: {known}."
        text += f" Find its {asked}, each from a source page you read."
        if self.instructions:
            text += f" {self.instructions}"
        return text

    def decision(self) -> Decision:
        """The decision that enriches every row: one task per row, in order (see the module's docstring).

        Raises:
            DecisionError: the decision is invalid (e.g. a cell that holds a `__0__` placeholder).
        """
        from amapreduce.decision.model import Decision

        order = [*self.key_columns, *self.context_columns]
        matrix = [[cell_text(v) for v in row] for row in self.frame[order].itertuples(index=False, name=None)]
        return Decision.parse({
            "task_matrix": matrix, "template": self.template(),
            "matrix_columns": [*self.key_columns, *([None] * len(self.context_columns))],
            "json_schema": {"type": "object", "properties": {**{k: {} for k in self.key_columns}, **self.columns}},
            "key_columns": list(self.key_columns),
            "batch_strategy": {"type": "per_atom", "rationale": f"{self.batch_size} rows of the list per sub-agent"},
            "batch_size": self.batch_size,
        })

    def to_json(self) -> dict[str, Any]:
        """What a resume needs to write the enriched list again (`enrich.json` of the run directory)."""
        import json

        return {"frame": json.loads(self.frame.to_json(orient="split", index=False, force_ascii=False)),
                "columns": self.columns, "key_columns": list(self.key_columns), "key_inferred": self.key_inferred,
                "instructions": self.instructions, "batch_size": self.batch_size, "label": self.label}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EnrichRequest:
        """The request `to_json` wrote (checked again).

        Raises:
            UserError: the data is not such a request.
        """
        import dataclasses
        import io
        import json

        import pandas as pd

        try:
            frame = pd.read_json(io.StringIO(json.dumps(data["frame"])), orient="split", dtype=False)
            request = cls.of(frame, dict(data["columns"]), key_columns=list(data["key_columns"]),
                             instructions=str(data["instructions"]), batch_size=int(data["batch_size"]),
                             label=str(data["label"]))
            return dataclasses.replace(request, key_inferred=bool(data["key_inferred"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"not an enrich request ({type(exc).__name__}: {exc}).") from None


def _wanted(columns: Sequence[str] | Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The columns to add with their schema entries; names trimmed, each once."""
    if isinstance(columns, str):
        columns = parse_columns(columns)
    items = list(columns.items()) if isinstance(columns, Mapping) else [(c, None) for c in columns]
    out: dict[str, dict[str, Any]] = {}
    for name, spec in items:
        if not isinstance(name, str) or not name.strip():
            raise UserError(f"a column to add needs a name (text), got {name!r}.")
        if name.strip() in out:
            raise UserError(f"column {name.strip()!r} is asked twice.")
        if spec is not None and not isinstance(spec, Mapping):
            raise UserError(f"column {name!r} must map to a schema entry such as {{\"description\": ...}}, got {spec!r}.")
        out[name.strip()] = {"type": "string", **(dict(spec) if spec else {})}
    if not out:
        raise UserError("no column to add; name at least one (e.g. columns=['CEO']).")
    return out


def _row_keys(names: list[str], rows: list[list[str]], keys: Sequence[str]) -> list[tuple[str, ...]]:
    """Each row's normalised key (as the table compares keys).

    Raises:
        UserError: a blank or marker key cell, or two rows with one key.
    """
    from amapreduce.table.table import Table

    probe = Table(list(keys), list(keys))
    at = [names.index(k) for k in keys]
    seen: dict[tuple[str, ...], int] = {}
    out = []
    for line, row in enumerate(rows, 2):  # line 1 of a CSV is its header
        values = {k: row[i] for k, i in zip(keys, at, strict=True)}
        key = probe.key_of(values)
        if key is None:
            raise UserError(f"row {line - 1} (file line {line}) has no usable key: {values} (a key cell is blank or "
                            "reads like N/A); fill it in or choose other --key columns.")
        if key in seen:
            raise UserError(f"duplicate key {list(values.values())} in rows {seen[key]} and {line - 1} (key columns "
                            f"{list(keys)}); each row needs its own key: remove the duplicate or add --key columns.")
        seen[key] = line - 1
        out.append(key)
    return out


def _infer_key(names: list[str], rows: list[list[str]]) -> tuple[list[str], list[tuple[str, ...]]]:
    """The first input column whose cells name every row once, and the rows' keys.

    Raises:
        UserError: no single column does.
    """
    for name in names:
        try:
            return [name], _row_keys(names, rows, [name])
        except UserError:
            continue
    raise UserError(f"no input column names every row once (blank or repeated values in each of {names}); "
                    "give the key with --key COL (repeat --key for a key of several columns).")
