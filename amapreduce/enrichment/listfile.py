"""Reading the user's list: a CSV, TSV, Excel, Parquet, JSON Lines or JSON file into a DataFrame.

Why a module of its own: the list is outside input, so everything that can be wrong with the
file (no such file, a format pandas cannot read, a file larger than the size cap, no rows) is
refused here with one clear `UserError` (exit 2), before a run directory or a model call exists.

Text formats are read with every cell as text, as written (`keep_default_na=False`): a country
code `NA` or an id `007` must come back unchanged in the enriched copy, not as NaN or 7.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from amapreduce.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["LIST_FORMATS", "list_format", "read_list", "write_list"]

LIST_FORMATS: dict[str, str] = {
    ".csv": "csv", ".tsv": "tsv", ".xlsx": "excel", ".xls": "excel", ".parquet": "parquet",
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json",
}
"""File suffix → format of the lists `enrich` reads and writes."""

_ENGINES = {"excel": "openpyxl", "parquet": "pyarrow"}
"""The optional library pandas needs for a format (the message of a missing one names it)."""
_MIB = 1024 * 1024


def list_format(path: Path) -> str:
    """The format of the list at `path`, by its suffix.

    Raises:
        UserError: a suffix `enrich` does not read.
    """
    fmt = LIST_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UserError(f"{str(path)!r} is not a list file enrich reads: give a file ending in "
                        f"{', '.join(LIST_FORMATS)}.")
    return fmt


def read_list(path: str | Path, *, max_mb: float) -> pd.DataFrame:
    """The rows of the list file at `path`, every column in its order.

    Args:
        path: the file; its suffix says its format (`LIST_FORMATS`).
        max_mb: the size cap in MiB (`Settings.enrich_max_file_mb`): a larger file is refused unread.

    Raises:
        UserError: no such file, an unknown suffix, a file over the cap, an empty file or one
            without rows, one pandas cannot parse, or a format whose library is not installed.
    """
    import pandas as pd

    p = Path(path)
    fmt = list_format(p)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise UserError(f"input file {str(p)!r} does not exist; check the path.") from None
    except OSError as exc:
        raise UserError(f"cannot read input file {str(p)!r}: {exc.strerror or exc}.") from None
    if not p.is_file():
        raise UserError(f"input {str(p)!r} is not a file; give the list file itself.")
    if size > max_mb * _MIB:
        raise UserError(
            f"input file {str(p)!r} is {size / _MIB:,.1f} MiB, larger than the {max_mb:g} MiB enrich reads "
            "(AMAPREDUCE_ENRICH_MAX_FILE_MB or --max-file-mb raises the cap); split the list into smaller files.")
    if size == 0:
        raise UserError(f"input file {str(p)!r} is empty; it needs a header and at least one row.")
    try:
        if fmt in ("csv", "tsv"):
            frame = pd.read_csv(p, sep="\t" if fmt == "tsv" else ",", dtype=str, keep_default_na=False,
                                encoding="utf-8-sig")
        elif fmt == "excel":
            frame = pd.read_excel(p, dtype=str, keep_default_na=False)
        elif fmt == "parquet":
            frame = pd.read_parquet(p)
        else:
            frame = pd.read_json(p, lines=fmt == "jsonl", dtype=False)
    except ImportError as exc:
        raise UserError(f"reading {str(p)!r} needs {_ENGINES.get(fmt, 'a library pandas uses')}, which is not "
                        f"installed ({exc}); install it, or save the list as CSV.") from None
    except pd.errors.EmptyDataError:
        raise UserError(f"input file {str(p)!r} has no header and no rows.") from None
    except (ValueError, UnicodeDecodeError, OSError, pd.errors.ParserError, zipfile.BadZipFile) as exc:
        reason = " ".join(str(exc).split())
        raise UserError(f"cannot read {str(p)!r} as {fmt}: {reason}.") from None
    if frame.empty:
        raise UserError(f"input file {str(p)!r} has no rows (columns: {list(map(str, frame.columns))}).")
    return frame


def write_list(frame: pd.DataFrame, path: str | Path) -> None:
    """Write `frame` to `path` atomically in the format its suffix names (CSV when unknown: a
    copy's name is the user's choice)."""
    from amapreduce._atomic import atomic_open

    p = Path(path)
    fmt = LIST_FORMATS.get(p.suffix.lower(), "csv")
    if fmt in ("csv", "tsv"):
        with atomic_open(p, "w", newline="") as handle:
            frame.to_csv(handle, index=False, sep="\t" if fmt == "tsv" else ",")
    elif fmt in ("jsonl", "json"):
        with atomic_open(p, "w") as handle:
            frame.to_json(handle, orient="records", lines=fmt == "jsonl", force_ascii=False)
    else:
        try:
            with atomic_open(p, "wb") as handle:
                if fmt == "excel":
                    frame.to_excel(handle, index=False)
                else:
                    frame.to_parquet(handle, index=False)
        except ImportError as exc:
            raise UserError(f"writing {str(p)!r} needs {_ENGINES[fmt]}, which is not installed ({exc}); "
                            "install it, or write a .csv copy.") from None
