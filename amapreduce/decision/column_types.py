"""Column types: the closed set a decision's output columns are typed with, each type in one place.

Why one place: a column's type decides three things that must agree. What a sub-agent is asked to
write (the JSON-schema fragment its reply is held to, the hint in its prompt); how the reducer stores
the value (its canonical form, so that two sub-agents writing `1,234` and `1234` for an integer agree
instead of conflicting, and a key written either way is one entity); and how the corrected scorer reads
such a cell (the official preprocess a column of the type goes through, docs/scorer-rules.md §4, after
the same canonical form). Before, `type` was a free string shown to sub-agents only, and the replies,
the keys and the scorer's preprocess each guessed. Adding a type is one member of `ColumnType` (its
`TypeRule`); the decision parser, the reply schema, the reducer and the scorer read it from there.

Normalisers are conservative: a value is rewritten only when it reads one way (`1,234` in an integer
column, `March 5, 2024` in a date column); anything else (`1.2 million`, `03/05/2024`, `about 40`)
stays exactly as written. Every normaliser is idempotent (its output normalises to itself), since a
resumed run's replayed rows pass through it again.

Schema fragments are strings, so `""` still means "not found" (every property of a reply row is
required: `mapreduce.read_solver.rows_schema`), held by at most an anchored `pattern` or an `enum` of
plain characters: what llama.cpp's JSON-schema-to-grammar conversion and OpenAI's strict structured
outputs both accept (no lookarounds, no class escapes such as `\\d`; a negated class also leaves out
the quote, the backslash and control characters, which llama.cpp's grammar would otherwise let into
the JSON string unescaped). Text and code columns stay plain strings, so an untyped decision's reply
schema is unchanged.
"""

from __future__ import annotations

import copy
import datetime as dt
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["ColumnType", "TypeRule", "column_type", "scored_as", "type_names"]


@dataclass(frozen=True, eq=False)
class TypeRule:
    """Everything one column type means, for every stage that reads it.

    Attributes:
        name: the type as a decision spells it (`"integer"`).
        meaning: one line for people and the manager (the guide's table, error messages).
        hint: what a sub-agent is told to write in such a column (`""`: nothing beyond the column).
        schema: the JSON-schema fragment of the column's value in a sub-agent's structured reply.
        normalize: the reducer's canonical form of a value (unchanged when it does not parse).
        preprocess: the official preprocess function a scorer applies to such a column (§4).
        aliases: other spellings a decision may use (JSON-schema types: `"string"`, `"boolean"`).
        formats: JSON-schema `format`s of a `"string"` column that mean this type (`"date"`, `"uri"`).
    """

    name: str
    meaning: str
    hint: str
    schema: Mapping[str, Any]
    normalize: Callable[[str], str]
    preprocess: str
    aliases: tuple[str, ...] = ()
    formats: tuple[str, ...] = ()


# -- normalisers -----------------------------------------------------------------------------------

_GROUP_SPACES = str.maketrans({"\u00a0": ",", "\u202f": ",", "\u2009": ","})
"""Spaces that only ever group digits (no-break, narrow no-break, thin): read as a thousands comma.
A plain space is not one of them: `100 200` may be two numbers."""
_NUMBER = re.compile(r"(?P<sign>[+-]?)(?P<int>\d{1,3}(?:,\d{3})+|\d*)(?:\.(?P<frac>\d+))?")
_YEAR = re.compile(r"(?P<year>\d{1,4})(?:\.0+|年)?")
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september",
           "october", "november", "december")
_MONTH = r"(?P<month>" + "|".join((*_MONTHS, *(m[:3] for m in _MONTHS))) + r")\.?"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_DATES = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"(?P<year>\d{4})(?P<sep>[-/])(?P<mon>\d{1,2})(?:(?P=sep)(?P<day>\d{1,2}))?",
    _MONTH + r" " + _DAY + r",? (?P<year>\d{4})",
    _DAY + r" " + _MONTH + r",? (?P<year>\d{4})",
    _MONTH + r",? (?P<year>\d{4})",
    r"(?P<year>\d{4})年(?P<mon>\d{1,2})月(?:(?P<day>\d{1,2})日)?",
))
_MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\((?P<url>[^()\s]+)\)")
_WEB_URL = re.compile(r"https?://[^\s]+", re.IGNORECASE)
_TRUE, _FALSE = frozenset({"yes", "true", "y"}), frozenset({"no", "false", "n"})


def _as_written(value: str) -> str:
    """Text columns: stored as written (the table already made it one line)."""
    return value


def _decimal(value: str) -> tuple[str, str, str] | None:
    """(sign, integer digits, fraction digits) of a plain decimal, thousands separators removed;
    None when `value` is anything else (a unit, a word, an exponent, a decimal comma)."""
    text = unicodedata.normalize("NFKC", value.strip().translate(_GROUP_SPACES)).replace("\u2212", "-")
    match = _NUMBER.fullmatch(text)
    if match is None or not (match.group("int") or match.group("frac")):
        return None
    digits = match.group("int").replace(",", "").lstrip("0") or "0"
    frac = (match.group("frac") or "").rstrip("0")
    sign = "-" if match.group("sign") == "-" and (digits != "0" or frac) else ""
    return sign, digits, frac


def _number(value: str) -> str:
    """`1,234.50` → `1234.5`, `+7` → `7`, `.5` → `0.5`, `1 234` (no-break space) → `1234`."""
    parts = _decimal(value)
    if parts is None:
        return value
    sign, digits, frac = parts
    return f"{sign}{digits}.{frac}" if frac else f"{sign}{digits}"


def _integer(value: str) -> str:
    """`1,234` → `1234`, `2019.0` → `2019`, `007` → `7`; `1234.5` is no integer: as written."""
    parts = _decimal(value)
    if parts is None or parts[2]:
        return value
    return parts[0] + parts[1]


def _year(value: str) -> str:
    """`2019.0` → `2019`, `2019年` → `2019`; `FY2019` or `2019-20` stay as written."""
    match = _YEAR.fullmatch(unicodedata.normalize("NFKC", value.strip()))
    return value if match is None else match.group("year").lstrip("0") or "0"


def _date(value: str) -> str:
    """ISO 8601 at the precision given: `March 5, 2024`, `5 Mar 2024`, `2024/3/5`, `2024年3月5日` →
    `2024-03-05`; `March 2024` → `2024-03`. Day-month orders that depend on a locale (`03/05/2024`),
    dates without a year and impossible dates (`2023-02-30`) stay as written."""
    text = unicodedata.normalize("NFKC", value.strip())
    for pattern in _DATES:
        match = pattern.fullmatch(text)
        if match is None:
            continue
        found = match.groupdict()
        month = int(found["mon"]) if found.get("mon") else _MONTHS.index(_month_name(found["month"])) + 1
        year, day = int(found["year"]), found.get("day")
        try:
            dt.date(year, month, int(day) if day else 1)
        except ValueError:
            return value
        return f"{year:04d}-{month:02d}-{int(day):02d}" if day else f"{year:04d}-{month:02d}"
    return value


def _month_name(name: str) -> str:
    folded = name.casefold()
    return next(m for m in _MONTHS if m.startswith(folded))


def _url(value: str) -> str:
    """A web address alone in the cell (bare, in `<...>` or as a markdown link): scheme and host in
    lower case, a lone `/` path dropped. A bare host (`harvard.edu`) stays as written: its scheme
    is unknown."""
    text = value.strip()
    if text.startswith("<") and text.endswith(">"):
        text = text[1:-1].strip()
    if link := _MARKDOWN_LINK.fullmatch(text):
        text = link.group("url")
    if not _WEB_URL.fullmatch(text):
        return value
    scheme, _, rest = text.partition("://")
    cut = next((i for i, ch in enumerate(rest) if ch in "/?#"), len(rest))
    host, tail = rest[:cut], rest[cut:]
    return f"{scheme.lower()}://{host.lower()}{'' if tail == '/' else tail}"


def _code(value: str) -> str:
    """A code as written (`+33`, `007`, `.fr` keep their signs, zeros and dots), without the
    surrounding spaces or markdown backticks."""
    text = value.strip()
    if len(text) > 2 and text.startswith("`") and text.endswith("`"):
        text = text[1:-1].strip()
    return text or value


def _boolean(value: str) -> str:
    """`yes`, `true`, `Y` → `Yes`; `no`, `false`, `N` → `No` (any case); anything else as written."""
    folded = value.strip().casefold()
    return "Yes" if folded in _TRUE else "No" if folded in _FALSE else value


# -- the closed set --------------------------------------------------------------------------------

class ColumnType(StrEnum):
    """The closed set of column types; a member is the type's name (`ColumnType.INTEGER == "integer"`)
    and carries its `TypeRule`. Declaration order matters once: a scorer reads a gold column by the
    first type declared with its preprocess (`scored_as`), so the most general type of each comes first."""

    rule: TypeRule

    def __new__(cls, rule: TypeRule) -> ColumnType:
        member = str.__new__(cls, rule.name)
        member._value_ = rule.name
        member.rule = rule
        return member

    TEXT = TypeRule(
        name="text", meaning="free text: names, titles, descriptions (the default)", hint="",
        schema={"type": "string"}, normalize=_as_written, preprocess="norm_str", aliases=("string", "str"))
    NUMBER = TypeRule(
        name="number", meaning="a decimal number, without units or thousands separators",
        hint="a plain number such as 1234.5: no units, no thousands separators",
        schema={"type": "string", "pattern": r"^(-?[0-9]+(\.[0-9]+)?)?$"}, normalize=_number,
        preprocess="extract_number", aliases=("float", "double", "decimal"))
    INTEGER = TypeRule(
        name="integer", meaning="a whole number, digits only",
        hint="digits only, no thousands separators", schema={"type": "string", "pattern": r"^(-?[0-9]+)?$"},
        normalize=_integer, preprocess="extract_number", aliases=("int",))
    DATE = TypeRule(
        name="date", meaning="a calendar date, written YYYY-MM-DD (YYYY-MM or YYYY when that is all that is known)",
        hint="YYYY-MM-DD (YYYY-MM or YYYY when only that is known)",
        schema={"type": "string", "pattern": r"^([0-9]{4}(-[0-9]{2}(-[0-9]{2})?)?)?$"}, normalize=_date,
        preprocess="norm_date", formats=("date",))
    YEAR = TypeRule(
        name="year", meaning="a calendar year, four digits", hint="the year only, e.g. 2019",
        schema={"type": "string", "pattern": r"^([0-9]{1,4})?$"}, normalize=_year, preprocess="norm_str")
    URL = TypeRule(
        name="url", meaning="a web address with its http:// or https://", hint="the full address, with https://",
        schema={"type": "string", "pattern": r'^(https?://[^ "\\\x00-\x1f]+)?$'}, normalize=_url, preprocess="norm_str",
        aliases=("uri", "link"), formats=("uri", "url", "iri"))
    CODE = TypeRule(
        name="code", meaning="an identifier kept exactly as written: ISO codes, tickers, +33, .fr",
        hint="exactly as the source writes it, keeping any leading + or 0", schema={"type": "string"},
        normalize=_code, preprocess="norm_str")
    BOOLEAN = TypeRule(
        name="boolean", meaning="Yes or No", hint="Yes or No",
        schema={"type": "string", "enum": ["Yes", "No", ""]}, normalize=_boolean, preprocess="norm_str",
        aliases=("bool",))

    @property
    def meaning(self) -> str:
        """One line saying what the type holds."""
        return self.rule.meaning

    @property
    def hint(self) -> str:
        """What a sub-agent is told to write in a column of this type (`""`: nothing more)."""
        return self.rule.hint

    @property
    def schema(self) -> dict[str, Any]:
        """A fresh copy of the value's JSON-schema fragment (callers may extend it)."""
        return copy.deepcopy(dict(self.rule.schema))

    @property
    def preprocess(self) -> str:
        """The official preprocess function a scorer applies to a column of this type."""
        return self.rule.preprocess

    def normalize(self, value: str) -> str:
        """The reducer's canonical form of `value`, or `value` unchanged when it does not read as this type."""
        return self.rule.normalize(value)


_SPELLINGS: dict[str, ColumnType] = {
    spelling: kind for kind in ColumnType for spelling in (kind.value, *kind.rule.aliases)
}
_FORMATS: dict[str, ColumnType] = {fmt: kind for kind in ColumnType for fmt in kind.rule.formats}


def type_names() -> str:
    """The types as a decision's error message and prompt list them: `text, number, ...`."""
    return ", ".join(kind.value for kind in ColumnType)


def column_type(spelling: str, fmt: str | None = None) -> ColumnType | None:
    """The type a decision's column `type` names (any case, a JSON-schema spelling such as `"string"`
    included); with `fmt`, a `"string"` column's JSON-schema `format` may name a finer type
    (`"date"`, `"uri"`). None: no type is spelled so."""
    kind = _SPELLINGS.get(spelling.strip().casefold())
    if kind is ColumnType.TEXT and fmt is not None:
        return _FORMATS.get(fmt.strip().casefold(), kind)
    return kind


def scored_as(preprocess: str) -> ColumnType | None:
    """The type a scorer reads a column preprocessed by `preprocess` as (the first declared with it);
    None for a preprocess no type uses."""
    return next((kind for kind in ColumnType if kind.preprocess == preprocess), None)
