"""Cell preprocess functions of the official scorer, plus their `--corrected` variants.

Why copies of the official rules: every cell of both the gold and the answer passes through
these before the join and the metrics (docs/scorer-rules.md §4), so a one-character
difference changes scores. The corrected variants fix bugs B5, B6 and B11 (exponents) and are
used only when the caller asks for them.

Corrected, a cell is also read as the column type a preprocess stands for before it runs (the
reducer's canonical form, `decision.column_types`: `extract_number` reads a number, so `1 234` with a
no-break space is 1234 and not 1; `norm_date` a date, so `5 March 2024` is read without dateparser),
so what the reducer counts as one value the corrected scorer does too, and a new type's reading
reaches the scorer from its one definition. The official functions never see it.

`norm_date` depends on the clock (dateparser fills a missing month or year from "today"); a
`DateContext` pins that reference date so runs are reproducible. Results are memoised per
context because dateparser costs about 2 ms a call.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from amapreduce._atomic import write_json
from amapreduce.decision.column_types import scored_as

__all__ = [
    "PREPROCESS_NAMES",
    "DateCache",
    "DateContext",
    "Preprocessor",
    "extract_number",
    "extract_number_corrected",
    "fast_date",
    "norm_str",
    "norm_str_corrected",
]

PREPROCESS_NAMES = ("norm_str", "extract_number", "norm_date")

_NUMBER_RE = re.compile(r"[-+]?\d*\.\d+%?|[-+]?\d+\.?\d*%?")
_NUMBER_EXP_RE = re.compile(r"[-+]?(?:\d*\.\d+|\d+\.?\d*)(?:[eE][-+]?\d+)?%?")
_BR_RE = re.compile(r"<br\s*/?>", re.IGNORECASE)
_YEAR_RE = re.compile(r"^\s*(\d{4})\s*$")
_HAS_DIGIT_RE = re.compile(r"\d")
_NUMERIC_DATE_RE = re.compile(r"^\s*(1[89]\d\d|20\d\d)([-/])(\d{1,2})(?:\2(\d{1,2}))?\s*$")
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_MONTH_NAMES = "|".join((*_MONTHS, *(m[:3] for m in _MONTHS)))
_MONTH_DAY_YEAR_RE = re.compile(r"^\s*(" + _MONTH_NAMES + r") (\d{1,2}), ?(1[89]\d\d|20\d\d)\s*$")
_CJK_YEAR_MONTH_RE = re.compile(r"^\s*(1[89]\d\d|20\d\d)年(\d{1,2})月\s*$")


def norm_str(content: object) -> str:
    """Official: lower-case, strip, delete ASCII spaces and `*` (keeps `\\n`, tabs: bug B5)."""
    return str(content).lower().strip().replace(" ", "").replace("*", "")


def norm_str_corrected(content: object) -> str:
    """B5 fix: also delete every Unicode whitespace and `<br>` tags, which markdown cannot carry."""
    text = _BR_RE.sub("", str(content)).lower().replace("*", "")
    return "".join(text.split())


def extract_number(content: object) -> str:
    """Official: drop `,`, return the first number-looking token (with `%`), else "NULL"."""
    found = _NUMBER_RE.findall(str(content).replace(",", ""))
    return found[0] if found else "NULL"


def extract_number_corrected(content: object) -> str:
    """B11 fix: keep an exponent, so `1.2e3` reads 1.2e3 and not 1.2."""
    found = _NUMBER_EXP_RE.findall(str(content).replace(",", ""))
    return found[0] if found else "NULL"


class DateCache:
    """dateparser results kept on disk between runs, keyed by (reference day, text).

    Why: dateparser spends about 2 s per process loading its ~200 locales the first time a
    string is not an obvious date ("nan", "incumbent"); re-scoring the same answers (another
    trial, another day of experiments) should not pay it again. The file name carries the
    dateparser version, and each key carries the reference day (the pinned date, or today's
    date when unpinned, so a relative phrase like "in 3 hours" is resolved once per day).
    """

    def __init__(self, directory: Path) -> None:
        from importlib.metadata import version

        self.path = directory / f"dateparser-{version('dateparser')}.json"
        self._data: dict[str, str | None] = {}
        self._dirty = False
        if self.path.is_file():
            try:
                loaded = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                loaded = {}  # a damaged cache is only a lost speed-up: start a new one
            if isinstance(loaded, dict):
                self._data = {str(k): (v if isinstance(v, str) else None) for k, v in loaded.items()}

    def get(self, key: str) -> tuple[bool, dt.datetime | None]:
        """`(found, value)` for a key."""
        if key not in self._data:
            return False, None
        raw = self._data[key]
        return True, (None if raw is None else dt.datetime.fromisoformat(raw))

    def put(self, key: str, value: dt.datetime | None) -> None:
        """Remember a result (saved by `save`)."""
        self._data[key] = None if value is None else value.isoformat()
        self._dirty = True

    def save(self) -> None:
        """Write the cache atomically if anything was added."""
        if not self._dirty:
            return
        write_json(self.path, self._data)
        self._dirty = False


@dataclass
class DateContext:
    """How dates are read: the reference date that fills missing parts, and the fixes.

    Attributes:
        reference: the "today" dateparser uses for a missing month/year; None means the real
            clock, as the official scorer (irreproducible: bug B6).
        corrected: B6 fix: a text with no digit is not a date, and a bare year means 1 January.
    """

    reference: dt.date | None = None
    corrected: bool = False
    store: DateCache | None = None
    _parsed: dict[str, dt.datetime | None] = field(default_factory=dict, repr=False)

    def _settings(self) -> dict[str, object]:
        settings: dict[str, object] = {"PREFER_DAY_OF_MONTH": "first"}
        if self.reference is not None:
            settings["RELATIVE_BASE"] = dt.datetime.combine(self.reference, dt.time())
        return settings

    def parse(self, text: str) -> dt.datetime | None:
        """`dateparser.parse` with the official settings (memoised); may raise like dateparser."""
        if text in self._parsed:
            return self._parsed[text]
        value: dt.datetime | None
        fast = fast_date(text)
        if fast is not None:
            # Unambiguous year-first and "Month D, YYYY" dates: same result as dateparser
            # (tests/test_evaluation_preprocess.py checks every gold date), 1000x cheaper.
            value = fast
        elif self.corrected and not _HAS_DIGIT_RE.search(text):
            value = None
        elif self.corrected and (year := _YEAR_RE.match(text)):
            value = dt.datetime(int(year.group(1)), 1, 1)
        else:
            value = self._dateparser(text)
        self._parsed[text] = value
        return value

    def _dateparser(self, text: str) -> dt.datetime | None:
        key = ""
        if self.store is not None:
            day = self.reference.isoformat() if self.reference else f"today={dt.date.today().isoformat()}"
            key = f"{day}\x1f{text}"
            found, value = self.store.get(key)
            if found:
                return value
        import dateparser

        parsed: dt.datetime | None = dateparser.parse(text, settings=self._settings())
        value = parsed
        if self.store is not None:
            self.store.put(key, value)
        return value

    def norm_date(self, content: object) -> str:
        """Official `norm_date`: `%Y-%m-%d` of the parsed date, or the input unchanged."""
        text = str(content)
        parsed = self.parse(text)
        return text if parsed is None else parsed.strftime("%Y-%m-%d")


def fast_date(text: str) -> dt.datetime | None:
    """Parse `YYYY-MM[-DD]`, `YYYY/M[/D]`, `Month D, YYYY`, `Mon D, YYYY` and `YYYY年M月` without
    dateparser, else None.

    A missing day is the 1st (`PREFER_DAY_OF_MONTH: first`); nothing depends on the clock.
    """
    if match := _NUMERIC_DATE_RE.match(text):
        year, month, day = int(match.group(1)), int(match.group(3)), int(match.group(4) or 1)
    elif match := _MONTH_DAY_YEAR_RE.match(text):
        month_index = next(i for i, m in enumerate(_MONTHS) if m.startswith(match.group(1)))
        year, month, day = int(match.group(3)), month_index + 1, int(match.group(2))
    elif match := _CJK_YEAR_MONTH_RE.match(text):
        year, month, day = int(match.group(1)), int(match.group(2)), 1
    else:
        return None
    try:
        return dt.datetime(year, month, day)
    except ValueError:
        return None


def _typed(name: str, function: Callable[[object], str]) -> Callable[[object], str]:
    """`function` reading each cell first as the column type preprocess `name` stands for (`scored_as`)."""
    kind = scored_as(name)
    if kind is None:
        return function
    return lambda content: function(kind.normalize(str(content)))


class Preprocessor:
    """Apply preprocess functions by their official names, memoised per (name, value).

    Why memoise: gold tables repeat values (years, countries), and the same gold is scored once
    per trial; dateparser dominates the cost otherwise.
    """

    def __init__(self, dates: DateContext, *, corrected: bool = False) -> None:
        self.dates = dates
        self.corrected = corrected
        functions: dict[str, Callable[[object], str]] = {
            "norm_str": norm_str_corrected if corrected else norm_str,
            "extract_number": extract_number_corrected if corrected else extract_number,
            "norm_date": dates.norm_date,
        }
        self._functions = {n: _typed(n, f) for n, f in functions.items()} if corrected else functions
        self._cache: dict[tuple[str, str], str] = {}

    def known(self, name: str) -> bool:
        """Whether `name` is an official preprocess function."""
        return name in self._functions

    def apply(self, name: str, value: str) -> str:
        """Run preprocess `name` on `value` (raises KeyError for an unknown name, like the official assert)."""
        key = (name, value)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        out = self._functions[name](value)
        self._cache[key] = out
        return out
