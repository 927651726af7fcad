"""What the simulated model knows about discovery tasks: the sandbox's big-city questions.

This is the simulated model's "reasoning" for `sbx_disc_*` tasks, written as code (it is not an
LLM). The facts come only from what the tools return: the hub page of the city lists (found with
`web_search`), the list pages and the city pages (read with `crawl_page`). Nothing here reads the
sandbox's builder or gold tables.

* The **manager** (`DiscoveryIntent`) finds the hub page and either writes a decision with
  `discover` (`discover_decision`: the list pages as sources, a model merge under a token budget
  that no single merge call can meet with every candidate in it, then a fill stage that asks
  each city's population) or, in the `sequential` scouting mode (the baseline of
  `benchmarks/bench_discovery.py`), reads every list page itself, in its own context, dedups the
  names itself and sends a plain decision with the entities as its task matrix.
* A **search sub-agent** given a discovery sub-question (`LIST_TEMPLATE`) reads the list page and
  answers one candidate row per linked row, quoting the row as the page prints it.
* Given the **merge prompt** (recognised by `MERGE_FIRST_LINE`, the first line of its system
  message), it groups candidates by `fold` of their key values and keeps, in each group, the
  spelling `spelling_rank` prefers.

How it folds names (`fold`): accents removed, case folded, apostrophes dropped, other punctuation
made spaces, "St."/"Sta."/"Sto." read as "Saint"/"Santa"/"Santo", a trailing "City" dropped, a
trailing parenthetical (an ISO code after a country) dropped. Which spelling it keeps
(`spelling_rank`): no parenthetical first, then the most non-ASCII characters (accents, typographic
apostrophes), then the most letters (unabbreviated, with "City"), then the most punctuation
(hyphens). A rule it applies to the candidates alone, as a careful editor would.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from amapreduce.demo.atlas_reader import ListEntry, list_entries
from amapreduce.demo.plan import PageNeed, column_specs, query_columns

__all__ = [
    "LIST_TEMPLATE",
    "MERGE_FIRST_LINE",
    "ROW_EXAMPLE",
    "Scouting",
    "DiscoveryIntent",
    "candidate_rows",
    "dedup_entities",
    "fold",
    "list_question",
    "merge_groups",
    "merge_reply",
    "parse_discovery",
    "spelling_rank",
]

Scouting = Literal["mapreduce", "sequential"]
"""How the simulated manager finds the entities of a discovery task: `mapreduce` (a decision with
`discover`) or `sequential` (it reads every list page itself, as a manager does for list questions)."""
MERGE_FIRST_LINE = "You merge lists of candidate entities: decide which candidates name the same entity."
"""The first line of the merge prompt's system message (`prompts/discover_merge.yaml`)."""
LIST_TEMPLATE = "List every city on __0__ with its country, as the page writes them."
"""The discovery sub-question the simulated manager writes; `__0__` is a list page's URL."""
FILL_TEMPLATE = 'In the Sandbox Atlas, find the population of the city "__0__" in __1__.'
ROW_EXAMPLE = '{"id": "c123", "City": "Sao Paulo", "Country": "Brazil (BR)"}'
"""A typical candidate line of a merge prompt: the manager budgets merge calls by its token count
(counted as the run counts tokens, `amapreduce.llm.tokens`: a model knows its own tokenizer)."""
MERGE_SHARE = 0.8
"""Share of all listed rows the merge budget holds: the entities once each plus many spelling
variants fit, every candidate at once does not, so the merge runs as a tree."""
PROMPT_ALLOWANCE = 600
"""Tokens the manager adds to the merge budget for the merge prompt's own instructions."""
_HUB = PageNeed(title="Lists of large cities", queries=(("lists of large cities", 5), ("Lists of large cities Sandbox Atlas", 10)))
_ASK = re.compile(r"List every city in the Sandbox Atlas with at least (?P<n>[\d,]+) inhabitants")
_LIST_Q = re.compile(r"List every city on (?P<url>corpus://\S+?) with its country")
_COUNT = re.compile(r"(?P<n>\d+) cities")
_ABBREVIATIONS = {"st": "saint", "sta": "santa", "sto": "santo"}
_LETTERS = str.maketrans({"ı": "i", "ł": "l", "Ł": "L", "ø": "o", "Ø": "O", "đ": "d", "ß": "ss", "æ": "ae"})
_APOSTROPHES = re.compile(r"['’ʿʻ`]")
_PARENTHETICAL = re.compile(r"\s*\([^()]*\)\s*$")


def fold(value: str) -> str:
    """`value` as the simulated model compares names (see the module doc)."""
    text = unicodedata.normalize("NFKD", _PARENTHETICAL.sub("", value).translate(_LETTERS))
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).casefold()
    words = [_ABBREVIATIONS.get(w, w) for w in re.sub(r"[^\w\s]", " ", _APOSTROPHES.sub("", text)).split()]
    if len(words) > 1 and words[-1] == "city":
        words.pop()
    return " ".join(words)


def spelling_rank(values: Sequence[str]) -> tuple[int, int, int, int]:
    """How much the simulated model prefers a spelling (higher wins; see the module doc)."""
    text = " ".join(values)
    return (-text.count("("), sum(not ch.isascii() for ch in text), sum(ch.isalpha() for ch in text),
            sum(not ch.isalnum() and not ch.isspace() for ch in text))


def merge_groups(candidates: Sequence[dict[str, str]]) -> list[dict[str, Any]]:
    """Groups of candidate ids (`{"id": ..., <key>: <value>, ...}` each) naming one entity, with
    the id whose spelling to keep; groups in the order of their first candidate."""
    groups: dict[tuple[str, ...], list[dict[str, str]]] = {}
    for cand in candidates:
        values = [str(v) for k, v in cand.items() if k != "id"]
        groups.setdefault(tuple(fold(v) for v in values), []).append(cand)
    out = []
    for members in groups.values():
        keep = max(members, key=lambda c: spelling_rank([str(v) for k, v in c.items() if k != "id"]))
        out.append({"ids": [c["id"] for c in members], "keep": keep["id"]})
    return out


def merge_reply(user_text: str) -> str:
    """The reply to a merge prompt: its candidates (the JSON lines after "Candidates") grouped."""
    _, _, block = user_text.rpartition("Candidates (one JSON object per line):")
    candidates = []
    for line in block.splitlines():
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and "id" in data:
            candidates.append({str(k): str(v) for k, v in data.items()})
    return json.dumps({"groups": merge_groups(candidates)}, ensure_ascii=False)


def list_question(text: str) -> str | None:
    """The list page a discovery sub-question asks about (None: not one)."""
    found = _LIST_Q.search(text)
    return found.group("url") if found else None


def _row_line(page_text: str, entry: ListEntry) -> str:
    """The table line of `entry` as the page prints it (its quote)."""
    for line in page_text.splitlines():
        if f"]({entry.url})" in line:
            return line.strip().strip("|").strip()
    return f"[{entry.name}]({entry.url})"


def candidate_rows(page_text: str, url: str, number: int, columns: Sequence[str]) -> list[dict[str, Any]]:
    """One candidate row per linked row of a list page: the name and the first other cell, in the
    order of `columns`, each quoted by the row's line."""
    rows = []
    for entry in list_entries(page_text):
        values = [entry.name, entry.cells[0] if entry.cells else ""]
        line = _row_line(page_text, entry)
        cells = dict(zip(columns, values, strict=False))
        rows.append({"task": number, **cells, "source": url, "quotes": {c: line for c, v in cells.items() if v}})
    return rows


def dedup_entities(rows: Iterable[Sequence[str]]) -> list[list[str]]:
    """The entities among candidate key rows, by `fold`, each in its preferred spelling, in
    first-seen order (what the sequential manager does in its own context)."""
    listed = [list(row) for row in rows]
    candidates = [{"id": str(i), **{f"k{j}": v for j, v in enumerate(row)}} for i, row in enumerate(listed)]
    return [listed[int(group["keep"])] for group in merge_groups(candidates)]


@dataclass(frozen=True, kw_only=True)
class DiscoveryIntent:
    """A recognised discovery question: every big city with its country and other columns."""

    columns: tuple[str, ...]

    @staticmethod
    def hub() -> PageNeed:
        """The page that links every list of big cities."""
        return _HUB

    def schema(self) -> dict[str, Any]:
        """The fill stage's JSON schema: every column with its format note."""
        return {"type": "object", "properties": {c.name: {"type": "string", "description": c.description}
                                                 for c in column_specs(self.columns)}}

    def fill(self, entities: int, cap: int | None) -> dict[str, Any]:
        """The fill stage's decision parts (no matrix) for about `entities` cities: as many rows
        per sub-agent as fit one answer of 16 cells, or more when the plan cap demands it."""
        fit = max(1, 16 // max(1, len(self.columns)))
        rows = max(fit, -(-entities // cap) if cap else fit)
        why = (f"{rows} cities per sub-agent: their cells fit one answer" if rows == fit else
               f"{rows} cities per sub-agent keep about {entities} cities under the plan cap of {cap} batches")
        return {"template": FILL_TEMPLATE, "json_schema": self.schema(),
                "batch_strategy": {"type": "per_atom", "rationale": why}, "batch_size": rows}

    def discover_decision(self, hub_text: str, cap: int | None) -> dict[str, Any]:
        """The `mapreduce` arguments of the `mapreduce` scouting mode (see the module doc): every
        list the hub links is a source; the fill expects as many cities as the longest series lists."""
        lists = list_entries(hub_text)
        series: dict[str, int] = {}
        for entry in lists:
            found = _COUNT.search(" ".join(entry.cells))
            name = entry.name.partition(", page ")[0]
            series[name] = series.get(name, 0) + (int(found.group("n")) if found else 0)
        listed = sum(series.values())
        from amapreduce.llm.tokens import TokenCounter

        budget = PROMPT_ALLOWANCE + int(MERGE_SHARE * listed * TokenCounter().count(ROW_EXAMPLE))
        keys = list(self.columns[:2])
        per_batch = max(1, -(-len(lists) // cap)) if cap else 1
        return {
            "discover": {"sources": [e.url for e in lists], "template": LIST_TEMPLATE, "json_schema": keys,
                         "key_columns": keys, "batch_size": per_batch, "merge": "model", "token_budget": budget},
            **self.fill(max(series.values(), default=1), cap),
        }

    def list_urls(self, hub_text: str) -> list[str]:
        """The list pages the hub links (what the sequential manager reads itself)."""
        return [e.url for e in list_entries(hub_text)]

    def sequential_decision(self, list_pages: Sequence[str], cap: int | None) -> dict[str, Any]:
        """The `mapreduce` arguments of the `sequential` mode: the entities it found itself."""
        rows = [[e.name, e.cells[0] if e.cells else ""] for page in list_pages for e in list_entries(page)]
        matrix = dedup_entities(rows)
        return {"task_matrix": matrix, **self.fill(len(matrix), cap)}


def parse_discovery(query: str) -> DiscoveryIntent | None:
    """Recognise a discovery question (None: not one)."""
    columns = query_columns(query)
    if columns is None or not _ASK.search(query):
        return None
    return DiscoveryIntent(columns=columns)
