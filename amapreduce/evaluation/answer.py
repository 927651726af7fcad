"""Parse a model's markdown answer into a table exactly as the official scorers do.

Why a faithful copy and not a "better" parser: published WideSearch / DeepWideSearch numbers are
produced by `WideSearchResponse.extract_dataframe` (docs/scorer-rules.md §3), including its
quirks (first vs last fence, the pipe fallback, separator-line removal, `read_csv(sep="|")` NA
strings and per-column dtype inference). Any deviation changes scores, so this module reproduces
that behaviour step by step and leaves the corrections to the `--corrected` mode of the scorer.

An answer is a model's text: it is scrubbed of lone surrogates (`amapreduce._text.scrub`) before
extraction, so the cells, the detail files and the judges' prompts only ever hold encodable text
(clean text, the official case, passes through unchanged).

pandas is imported inside the functions: the CLI imports this package at startup only lazily,
and `amapreduce --help` must stay fast.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from io import BytesIO, StringIO
from typing import TYPE_CHECKING, Any, Literal

from amapreduce._text import scrub
from amapreduce.errors import RunError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "AnswerParseError",
    "Benchmark",
    "CellTable",
    "extract_answer_dataframe",
    "extract_table_text",
    "legacy_str",
    "corrected_str",
    "norm_column",
    "parse_answer_table",
    "read_table_cells",
    "read_table_frame",
    "reconcile_column",
]

Benchmark = Literal["widesearch", "deepwidesearch"]

_FENCE_RE = re.compile(r"```markdown(.*?)```", re.DOTALL)
_LOOSE_FENCE_RE = re.compile(r"```[ \t]*(?:markdown|md)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_GFM_SEPARATOR_RE = re.compile(r"^\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?$")
_PIPE_BLOCK_RE = re.compile(r"((?:\|.*\n?)+)")
_SEPARATOR_CHARS = frozenset("|- :")


class AnswerParseError(RunError):
    """pandas could not read the extracted table (the official code's "evaluator error").

    The official scorer turns this into an all-zero result; we raise it so callers can tell
    "no table" (None) from "a table pandas rejects" and show the reason.
    """


def norm_column(name: str) -> str:
    """Official header normalisation: strip, lower-case, delete ASCII spaces (nothing else)."""
    return name.strip().lower().replace(" ", "")


def extract_table_text(
    text: str, *, benchmark: Benchmark = "widesearch", corrected: bool = False
) -> str | None:
    """Return the cleaned `|`-separated table text the official parser hands to pandas.

    Steps (docs/scorer-rules.md §3): the first (WideSearch) or last (DeepWideSearch)
    case-sensitive closed ```` ```markdown ```` block; otherwise, with at least 4 pipes in the
    text, the pipe-line fallback; then strip, remove spaces from and lower-case the header line,
    drop lines without `|` or made only of `| - :` and spaces, and strip every cell.

    With `corrected` (bug B11): the last block is used for both benchmarks, ```` ```md ```` and
    any-case fences count, a table without outer pipes is found by its separator line, and only
    the separator line right under the header is dropped (a data row of `-` cells is kept). An
    unfenced table without a separator line is still found, as the official fallback finds it,
    but as whole `|`-containing lines (the last such run of two or more lines).

    Returns:
        The text to parse, or None when the official code finds no table at all.
    """
    if benchmark not in ("widesearch", "deepwidesearch"):
        raise ValueError(f"benchmark must be 'widesearch' or 'deepwidesearch', got {benchmark!r}")
    text = scrub(text)
    if corrected:
        return _extract_corrected(text)
    blocks: list[str] = _FENCE_RE.findall(text)
    if not blocks:
        pipes = [m.start() for m in re.finditer(r"\|", text)]
        if len(pipes) >= 4:
            start = text.rfind("\n", 0, pipes[0])
            start = 0 if start == -1 else start
            end = text.find("\n", pipes[-1])
            end = len(text) if end == -1 else end
            blocks = _PIPE_BLOCK_RE.findall(text[start:end])
    if not blocks:
        return None
    block = (blocks[0] if benchmark == "widesearch" else blocks[-1]).strip()
    lines = block.split("\n")
    lines[0] = lines[0].replace(" ", "").lower()
    kept: list[str] = []
    for raw in lines:
        line = raw.strip()
        if set(line).issubset(_SEPARATOR_CHARS) or "|" not in line:
            continue
        kept.append("|".join(cell.strip() for cell in line.split("|")))
    return "\n".join(kept)


def _extract_corrected(text: str) -> str | None:
    """The B11-corrected extraction (see `extract_table_text`)."""
    blocks = [b for b in (_LOOSE_FENCE_RE.findall(text) or _FENCE_RE.findall(text)) if "|" in b]
    lines = [line.strip() for line in (blocks[-1] if blocks else text).strip().split("\n")]
    tables: list[list[str]] = []
    i = 1
    while i < len(lines):
        if "|" in lines[i - 1] and _GFM_SEPARATOR_RE.match(lines[i]):
            end = i + 1
            while end < len(lines) and "|" in lines[end]:
                end += 1
            tables.append([lines[i - 1], *lines[i + 1 : end]])
            i = end + 1
        else:
            i += 1
    if tables:
        table = tables[-1]
    elif blocks:
        table = [line for line in lines if "|" in line]
    else:
        table = _separatorless_table(text, lines)
    if not table:
        return None
    table[0] = table[0].replace(" ", "").lower()
    return "\n".join("|".join(cell.strip() for cell in _strip_outer_pipes(line).split("|")) for line in table)


def _separatorless_table(text: str, lines: list[str]) -> list[str]:
    """Unfenced table with no separator line: the last run of `|` lines with a header and a row.

    Why: the official pipe fallback accepts such a table (with the same "at least 4 pipes"
    gate), so the corrected mode must too, or `--corrected` would score 0 where the official
    scorer scores 1. Unlike the official fallback (B11), a run is made of whole lines that
    merely *contain* `|`, so rows without a leading pipe keep their first cell. A run of one
    line (a stray pipe in prose) is not a table. No separator line can follow a `|` line here
    (the caller found none), so only a separator-like first line is dropped.
    """
    if text.count("|") < 4:
        return []
    runs: list[list[str]] = [[]]
    for line in lines:
        if "|" in line:
            runs[-1].append(line)
        elif runs[-1]:
            runs.append([])
    candidates = [run for run in runs if len(run) >= 2]
    if not candidates:
        return []
    run = candidates[-1]
    return run[1:] if _GFM_SEPARATOR_RE.match(run[0]) else run


def _strip_outer_pipes(line: str) -> str:
    """Drop one leading and one trailing `|`, so rows with and without outer pipes agree."""
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|"):
        line = line[:-1]
    return line


def legacy_str(value: Any) -> str:
    """`str()` of one cell the way pandas 2 `astype(str)` rendered it (NaN -> "nan").

    Why: the official numbers were produced with pandas 2, where `astype(str)` turns a missing
    value into the string "nan" and a float into `repr` ("2019.0"). pandas 3 keeps NaN as
    missing, so we convert cell by cell with Python's `str`, which equals numpy's float repr.
    """
    return str(value)


def corrected_str(value: Any) -> str:
    """B1 fix: an integral float renders as an integer ("2019", not "2019.0"); NaN stays "nan"."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)


@dataclass
class CellTable:
    """A stringified table, column-major: what both the gold and the answer become.

    Attributes:
        columns: column labels (normalised for answers, as read for gold files).
        cells: one list of `str` cells per column, all the same length.
        b1_changed: cells the B1 fix rendered differently (only with `corrected`).
        b12_cells: cells kept with a literal leading quote (only with `corrected`).
        kinds: per column, how pandas read it: "number" (int or float with a value), "text",
            or "other" (bool, or every cell NA); None when not read `corrected`.
        as_text: per column read as numbers, its cells read as text: as written (NA still
            "nan") where the number reading changed them (`+55` read `55`), else as rendered
            (so `-32.0` keeps its B1 rendering `-32`); None for other columns, and when not
            read `corrected`. The B13 fix (`reconcile_column`) needs them.
    """

    columns: list[str]
    cells: list[list[str]]
    b1_changed: int = 0
    b12_cells: int = 0
    kinds: list[str] | None = None
    as_text: list[list[str] | None] | None = None

    @property
    def n_rows(self) -> int:
        """Number of rows."""
        return len(self.cells[0]) if self.cells else 0

    def to_frame(self) -> pd.DataFrame:
        """An object-dtype DataFrame of the cells (labels kept, duplicates allowed)."""
        import pandas as pd

        frame = pd.DataFrame(dict(enumerate(self.cells)), index=range(self.n_rows), dtype=object)
        frame.columns = list(self.columns)
        frame.attrs["b1_changed"] = self.b1_changed
        frame.attrs["b12_cells"] = self.b12_cells
        return frame


def _cells(frame: pd.DataFrame, *, corrected: bool, text: pd.DataFrame | None = None) -> CellTable:
    """Per column: keep the inferred dtype's rendering, then `str` every cell (pandas 2 style).

    `text` is the same table read with `dtype=object` (corrected mode): the cells as written,
    kept for the columns pandas read as numbers (B13).
    """
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    cells: list[list[str]] = []
    kinds: list[str] = []
    as_text: list[list[str] | None] = []
    changed = 0
    for i, (_, series) in enumerate(frame.items()):  # by position: duplicate labels are fine
        values = series.tolist()
        legacy = [legacy_str(v) for v in values]
        out = legacy
        if corrected:
            out = [corrected_str(v) for v in values]
            changed += sum(1 for a, b in zip(legacy, out, strict=True) if a != b)
        cells.append(out)
        if text is None:
            continue
        kind = "other" if is_bool_dtype(series.dtype) or not series.notna().any() else (
            "number" if is_numeric_dtype(series.dtype) else "text")
        kinds.append(kind)
        if kind != "number":
            as_text.append(None)
            continue
        # the text a cell loses to the number reading (`+55` read `55`) comes back; a cell the
        # number reading renders as written (`-32.0`) keeps its B1 rendering (`-32`)
        written = [legacy_str(v) for v in text.iloc[:, i].tolist()]
        as_text.append([w if w != old else new for w, old, new in zip(written, legacy, out, strict=True)])
    if text is None:
        return CellTable([str(c) for c in frame.columns], cells, b1_changed=changed)
    return CellTable([str(c) for c in frame.columns], cells, b1_changed=changed, kinds=kinds, as_text=as_text)


def reconcile_column(
    a: list[str], a_kind: str, a_text: list[str] | None, b: list[str], b_kind: str, b_text: list[str] | None
) -> tuple[list[str], list[str], int]:
    """B13 fix: read one column of two tables (gold and answer) the same way.

    Why: pandas decides per table and column whether a column holds numbers, so one word in
    the answer's `+55` column keeps its `+55` text while the all-numeric gold column reads `55`,
    and no row of the column matches. Here a column is read as numbers only when it reads as
    numbers on both sides; when one side reads it as numbers and the other as text, the number
    side takes back the text its cells lost (`CellTable.as_text`). Both sides numbers, both
    text, or a side with no value (or booleans): unchanged.

    Returns:
        Both columns and how many cells changed.
    """
    if a_kind == "number" and b_kind == "text" and a_text is not None:
        return a_text, b, sum(1 for x, y in zip(a, a_text, strict=True) if x != y)
    if b_kind == "number" and a_kind == "text" and b_text is not None:
        return a, b_text, sum(1 for x, y in zip(b, b_text, strict=True) if x != y)
    return a, b, 0


def _read(source: Any, *, corrected: bool, **options: Any) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """`pd.read_csv(source, **options)`; corrected, the same source read as text too (B13)."""
    import pandas as pd

    if not corrected:
        return pd.read_csv(source, **options), None
    if hasattr(source, "read"):  # a stream is read twice
        data = source.read()
        source = BytesIO(data) if isinstance(data, bytes) else StringIO(data)
    frame = pd.read_csv(source, **options)
    if hasattr(source, "seek"):
        source.seek(0)
    return frame, pd.read_csv(source, dtype=object, **options)


def read_table_cells(source: Any, *, corrected: bool = False) -> CellTable:
    """Read a CSV file with plain `pd.read_csv` (the official gold loader) into a `CellTable`."""
    frame, text = _read(source, corrected=corrected)
    return _cells(frame, corrected=corrected, text=text)


def read_table_frame(source: Any, *, corrected: bool = False) -> pd.DataFrame:
    """Read a CSV-like source with plain `pd.read_csv` options and stringify it pandas-2 style.

    Args:
        source: what `pd.read_csv` accepts (a path or a file-like object); extra keyword
            arguments are deliberately not supported so gold and answer stay symmetrical.
        corrected: B1 fix (integral floats rendered as integers).

    Returns:
        An object-dtype frame of Python `str` cells, with the original column labels.
    """
    return read_table_cells(source, corrected=corrected).to_frame()


def parse_answer_table(
    text: str, *, benchmark: Benchmark = "widesearch", corrected: bool = False
) -> CellTable | None:
    """`extract_answer_dataframe` without building a DataFrame (the scorer's fast path)."""
    import csv

    import pandas as pd

    table = extract_table_text(text, benchmark=benchmark, corrected=corrected)
    if table is None:
        return None
    try:
        if corrected:
            frame, written = _read(StringIO(table), corrected=True, sep="|", quoting=csv.QUOTE_NONE)
        else:
            frame, written = _read(StringIO(table), corrected=False, sep="|")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        raise AnswerParseError(
            f"the answer's table cannot be read as `|`-separated values: {str(exc).strip()}. "
            f"Check for a stray `|` inside a cell or an empty table."
        ) from exc
    keep = [not str(c).startswith("Unnamed") for c in frame.columns]
    out = _cells(frame.loc[:, keep], corrected=corrected, text=None if written is None else written.loc[:, keep])
    out.columns = [norm_column(c) for c in out.columns]
    if corrected:
        out.b12_cells = sum(1 for col in out.cells for v in col if v.startswith('"'))
    return out


def extract_answer_dataframe(
    text: str, *, benchmark: Benchmark = "widesearch", corrected: bool = False
) -> pd.DataFrame | None:
    """Parse a markdown answer into the table the official scorer would score.

    Reproduces `WideSearchResponse.extract_dataframe` then the scorer's header normalisation
    and per-column `astype(str)`: `pd.read_csv(sep="|")` with its default NA strings and
    per-column dtype inference (so an int column with one blank cell reads "2019.0"), the
    `Unnamed` columns from outer pipes dropped, headers passed through `norm_column`.

    Args:
        text: the full model answer.
        benchmark: "widesearch" uses the first ```` ```markdown ```` block, "deepwidesearch" the last.
        corrected: apply the B1, B11 and B12 fixes (integral floats as integers, the relaxed
            extraction of `extract_table_text`, a leading `"` kept as text). Off by default.

    Returns:
        An object-dtype frame of `str` cells, or None when the official code finds no table.

    Raises:
        AnswerParseError: pandas rejects the extracted table (the official code then scores 0
            with an "evaluator error" message).
    """
    table = parse_answer_table(text, benchmark=benchmark, corrected=corrected)
    return None if table is None else table.to_frame()
