"""The sandbox's enrichment tasks: a given list of entities, columns to add, and the gold table.

Unlike the wide-search tasks, the entities are not discovered: the task hands over a list file
(`enrich/<instance_id>.csv`, what a user would bring to `amapreduce enrich`) and asks for columns
that the atlas's country pages print, so every gold cell is answerable from exactly one page.
Each task line is in the WideSearch format (its `query` says the same in words, so the scorer and
`eval score` read it as any other task) plus an `enrich` field: the input file, the columns to add
and the key columns. The input keeps the atlas's order by ISO code, which is not the order of
names, so an enriched list that sorted its rows would be caught.
"""

from __future__ import annotations

from typing import Any

from amapreduce.sandbox.atlas import CONTINENTS, Country

__all__ = ["ENRICH_DIR", "ENRICH_GOLD_DIR", "ENRICH_TASKS_FILE", "enrich_tasks"]

ENRICH_TASKS_FILE = "enrich_tasks.jsonl"
ENRICH_DIR = "enrich"
"""The input lists, `<instance_id>.csv`, under the world folder."""
ENRICH_GOLD_DIR = "enrich_gold"
_NA_LIKE = {"", "#N/A", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null", "<NA>"}


def _check(task: dict[str, Any]) -> None:
    """Fail the build on a gold or input cell a CSV reader would read as missing, or with spaces around it."""
    for row in [*task["rows"], *task["input_rows"]]:
        if bad := [cell for cell in row if str(cell).strip() in _NA_LIKE or str(cell) != str(cell).strip()]:
            raise ValueError(f"task {task['id']}: row {row} has empty, NA-like or space-padded cells {bad}")


def enrich_tasks(countries: list[Country], wide_query: Any, evaluation: Any) -> list[dict[str, Any]]:
    """The enrichment tasks: id, query, evaluation, the input list (`input_columns`, `input_rows`),
    the columns to add, the key and the gold (`columns`, `rows`)."""
    tasks: list[dict[str, Any]] = []
    added = ["Capital", "ISO3 Code", "Currency Code"]
    cols = ["Country", *added]
    tasks.append({
        "id": "sbx_enrich_001",
        "query": wide_query(f"Here is a list of all {len(countries)} countries and territories of the Sandbox Atlas "
                            f"(the file enrich/sbx_enrich_001.csv, one column Country). Add each one's capital, "
                            "three-letter ISO code and ISO currency code.", cols),
        "input_columns": ["Country"], "input_rows": [[c["name"]] for c in countries],
        "added": added, "keys": ["Country"], "columns": cols, "numeric": set(),
        "rows": [[c["name"], c["capital"].strip(), c["iso3"], c["currencycode"]] for c in countries],
    })
    south = [c for c in countries if c["continentcode"] == "SA"]
    added = ["Capital", "Population", "Area (km2)"]
    cols = ["Country", *added]
    tasks.append({
        "id": "sbx_enrich_002",
        "query": wide_query(f"Here is a list of the countries and territories of {CONTINENTS['SA']} in the Sandbox "
                            "Atlas with their ISO codes (the file enrich/sbx_enrich_002.csv, columns Country and ISO "
                            "code). Add each one's capital, population and area in square kilometres.", cols),
        "input_columns": ["Country", "ISO code"], "input_rows": [[c["name"], c["iso"]] for c in south],
        "added": added, "keys": ["Country"], "columns": cols, "numeric": {"Population", "Area (km2)"},
        "rows": [[c["name"], c["capital"].strip(), c["population"], int(c["areakm2"])] for c in south],
    })
    for task in tasks:
        _check(task)
    return tasks
