"""The sandbox's wide-search tasks: queries, WideSearch evaluation specs, gold rows and lookups.

`build_tasks` turns the atlas data into task dicts; `build` writes them out (`tasks.jsonl`, gold
CSVs, `families.json`, `lookups.jsonl`). Gold values are read off the same data the country and
city pages print, so every gold cell is answerable from exactly one page.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from amapreduce.sandbox.atlas import (
    CITY_COUNTRIES,
    CONTINENTS,
    City,
    Country,
    city_rel,
    country_rel,
    page_url,
)

__all__ = ["FAMILIES", "MORE_FAMILIES", "build_tasks", "evaluation", "wide_query"]

FAMILIES = ("domains", "sizes", "profile", "codes", "euro", "ranked", "cities")
"""Question families, in the round-robin order of the task ids after `sbx_en_005`: the two families
that no original task has come first, so the first seven tasks already hold all seven families."""
MORE_FAMILIES = ("dossier", "leaders", "podium", "zones")
"""The second generation of families (issue 24), ids from `sbx_en_043` on, round-robin in this order.
They make the best batching conflict across families: `dossier` rows are wide (7 cells: 2 rows fill
a sub-agent's answer), `leaders` (3 cells, a continent's whole ranking per batch) needs `by_attr`
because its k varies and a batch that mixes continents reads two continents' pages, `podium`
(7 cells, the top two of each continent) is best with `by_attr` too, `zones` is narrow with two
key columns. Their questions open with a sentence of
their own, so the memory's embedding tells them from the older families."""
_ATTRIBUTES: dict[str, tuple[str, Callable[[Country], Any]]] = {
    "Capital": ("capital", lambda c: c["capital"]),
    "Population": ("population", lambda c: c["population"]),
    "Area (km2)": ("area in square kilometres", lambda c: int(c["areakm2"])),
    "Currency Code": ("ISO currency code", lambda c: c["currencycode"]),
    "ISO3 Code": ("three-letter ISO code", lambda c: c["iso3"]),  # not ISO2: pandas reads Namibia's "NA" as NaN
    # As the page prints it: GeoNames' "+1-264" (Anguilla) becomes "++1-264" there, and the gold copies the page.
    "Calling Code": ("international calling code", lambda c: f"+{c['phone']}" if c["phone"] else ""),
    "Top-level Domain": ("top-level domain", lambda c: c["tld"]),
}
"""Country columns a task may ask: (how the question words it, the gold value), read from the infobox."""
_NUMERIC_COLUMNS = {"Population", "Area (km2)", "Rank"}
_NOTES = {
    "Calling Code": "Write calling codes as in the atlas, e.g. +33.\n",
    "Top-level Domain": "Write top-level domains as in the atlas, e.g. .fr.\n",
}
_NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
_PANDAS_NA = {"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>",
              "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"}
"""Cells plain `pd.read_csv` (the official gold loader) reads as missing: no gold cell may be one."""


def _norm(col: str) -> str:
    """WideSearch's `norm_column`: strip, lower, drop ASCII spaces."""
    return col.strip().lower().replace(" ", "")


def wide_query(ask: str, columns: list[str], note: str = "") -> str:
    """A WideSearch-style query: the ask, the table's columns, the format instructions."""
    return (
        f"{ask}\n\nPlease organize the results in one Markdown table with the following columns:\n"
        f"{', '.join(columns)}\n{note}Use only Arabic numerals for numbers, without thousands separators.\n"
        "Don't ask me any questions, just output the results according to the columns without omitting "
        "cells arbitrarily. The output format is \n```markdown\n{data_content}\n```."
    )


def evaluation(columns: list[str], keys: list[str], numeric: set[str]) -> str:
    """A task's WideSearch `evaluation` JSON: numeric columns compare numbers exactly, others
    normalised strings, rows are matched on `keys`; column names are normalised as WideSearch does."""
    pipeline: dict[str, Any] = {}
    for col in columns:
        name = _norm(col)
        if col in numeric:
            pipeline[name] = {"preprocess": ["extract_number"], "metric": ["number_near"], "criterion": 0.0}
        else:
            pipeline[name] = {"preprocess": ["norm_str"], "metric": ["exact_match"]}
    return json.dumps({"unique_columns": [_norm(k) for k in keys], "required": [_norm(c) for c in columns],
                       "eval_pipeline": pipeline})


def build_tasks(countries: list[Country], cities: dict[str, list[City]]) -> list[dict[str, Any]]:
    """The wide-search tasks: each has a query, evaluation, gold header/rows and lookups."""
    by_cont: dict[str, list[Country]] = {c: [] for c in CONTINENTS}
    for country in countries:
        by_cont[country["continentcode"]].append(country)
    by_iso = {c["iso"]: c for c in countries}

    def lookup(c: Country) -> dict[str, str]:
        return {"query": f"{c['name']} population capital", "url": page_url(country_rel(c))}

    tasks: list[dict[str, Any]] = []
    sa = sorted(by_cont["SA"], key=lambda c: c["name"])
    cols = ["Country", "Capital", "Population", "Area (km2)", "Currency Code"]
    tasks.append({
        "id": "sbx_en_001",
        "query": wide_query("List every country and territory of South America in the Sandbox Atlas, with its capital, "
                        "population, area in square kilometres and ISO currency code.", cols),
        "columns": cols, "keys": ["Country"], "numeric": {"Population", "Area (km2)"},
        "rows": [[c["name"], c["capital"], c["population"], int(c["areakm2"]), c["currencycode"]] for c in sa],
        "lookups": [lookup(c) for c in sa],
    })
    cols = ["Continent", "Rank", "Country", "Population"]
    rows, looks = [], []
    for code, cont in CONTINENTS.items():
        top = sorted(by_cont[code], key=lambda c: -c["population"])[:3]
        for rank, c in enumerate(top, 1):
            rows.append([cont, rank, c["name"], c["population"]])
            looks.append(lookup(c))
    tasks.append({
        "id": "sbx_en_002",
        "query": wide_query("For each continent (Africa, Asia, Europe, North America, Oceania, South America), find the "
                        "three most populous countries or territories in the Sandbox Atlas, ranked 1 to 3 within "
                        "the continent, with their population.", cols),
        "columns": cols, "keys": ["Continent", "Country"], "numeric": {"Rank", "Population"},
        "rows": rows, "lookups": looks,
    })
    af = sorted(by_cont["AF"], key=lambda c: c["name"])
    cols = ["Country", "ISO3 Code", "Capital", "Calling Code"]  # not ISO2: pandas reads Namibia's "NA" as NaN
    tasks.append({
        "id": "sbx_en_003",
        "query": wide_query("List every country and territory of Africa in the Sandbox Atlas with its three-letter ISO "
                        "code, its capital and its international calling code.", cols,
                        "Write calling codes as in the atlas, e.g. +33.\n"),
        "columns": cols, "keys": ["Country"], "numeric": set(),
        "rows": [[c["name"], c["iso3"], c["capital"], f"+{c['phone']}"] for c in af],
        "lookups": [lookup(c) for c in af],
    })
    cols = ["Country", "City", "Population", "Time Zone"]
    rows, looks = [], []
    for cc in CITY_COUNTRIES:
        country = by_iso[cc]
        for city in cities[cc][:5]:
            rows.append([country["name"], city["name"], city["population"], city["timezone"]])
            looks.append({"query": f"{city['name']} {country['name']} city population", "url": page_url(city_rel(cc, city))})
    names = ", ".join(by_iso[cc]["name"] for cc in CITY_COUNTRIES)
    tasks.append({
        "id": "sbx_en_004",
        "query": wide_query(f"For each of these countries: {names}, find the five most populous cities listed in the "
                        "Sandbox Atlas, with each city's population and IANA time zone.", cols),
        "columns": cols, "keys": ["Country", "City"], "numeric": {"Population"}, "rows": rows, "lookups": looks,
    })
    euro = sorted((c for c in by_cont["EU"] if c["currencycode"] == "EUR"), key=lambda c: c["name"])
    cols = ["Country", "Capital", "Area (km2)", "Population"]  # not the TLD: Kosovo has none
    tasks.append({
        "id": "sbx_en_005",
        "query": wide_query("Which countries and territories in Europe use the euro as their currency according to the "
                        "Sandbox Atlas? Give each one's capital, area in square kilometres and population.", cols),
        "columns": cols, "keys": ["Country"], "numeric": {"Area (km2)", "Population"},
        "rows": [[c["name"], c["capital"], int(c["areakm2"]), c["population"]] for c in euro],
        "lookups": [lookup(c) for c in euro],
    })
    # sbx_en_001..005 predate the families: their lines, gold and lookups never change (tests pin them).
    for task, family in zip(tasks, ("profile", "ranked", "codes", "cities", "euro"), strict=True):
        task["family"] = family
    _append(tasks, _round_robin(_family_tasks(by_cont, by_iso, cities), FAMILIES))
    # sbx_en_001..042 never change either: the second generation of families comes after them.
    _append(tasks, _round_robin(_more_family_tasks(by_cont, by_iso, cities), MORE_FAMILIES))
    for task in tasks:
        _check_gold(task)
    return tasks


def _append(tasks: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
    """Number `new` after `tasks` and append them."""
    covered = {item["url"] for task in tasks for item in task["lookups"]}
    for number, task in enumerate(new, len(tasks) + 1):
        task["id"] = f"sbx_en_{number:03d}"
        # Lookups only for pages no earlier task looks up: the same (query, URL) pair again tests nothing.
        task["lookups"] = [item for item in task["lookups"] if item["url"] not in covered]
        covered |= {item["url"] for item in task["lookups"]}
        tasks.append(task)


def _round_robin(by_family: dict[str, list[dict[str, Any]]], order: tuple[str, ...]) -> list[dict[str, Any]]:
    """Tasks in `order` of families, one of each family per round, so every prefix mixes families."""
    queues = [list(by_family[family]) for family in order]
    out = []
    while any(queues):
        out += [queue.pop(0) for queue in queues if queue]
    return out


def _check_gold(task: dict[str, Any]) -> None:
    """Fail the build on a gold cell the official loader would read as missing (e.g. Kosovo's empty
    TLD) or one with spaces around it, which no answer read off the page would carry."""
    for row in task["rows"]:
        bad = [col for col, cell in zip(task["columns"], row, strict=True)
               if str(cell).strip() in _PANDAS_NA or str(cell) != str(cell).strip()]
        if bad:
            raise ValueError(f"task {task['id']}: row {row} has empty, NA-like or space-padded cells in {bad}; "
                             "choose other columns or continents for it")


def _cell(value: Any) -> Any:
    """A gold cell as the page shows it: GeoNames has stray spaces (Curacao's " Willemstad")
    that HTML text extraction drops, so the gold drops them too."""
    return value.strip() if isinstance(value, str) else value


def _phrase(columns: list[str], own: bool = False) -> str:
    """`capital, population and area in square kilometres` (with `its` before each when `own`)."""
    words = [("its " if own else "") + _ATTRIBUTES[col][0] for col in columns]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _notes(columns: list[str]) -> str:
    return "".join(_NOTES.get(col, "") for col in columns)


def _country_task(family: str, members: list[Country], ask: str, attributes: list[str]) -> dict[str, Any]:
    """A one-row-per-country task: `Country` plus `attributes`, all read from the country pages."""
    cols = ["Country", *attributes]
    return {
        "family": family, "query": wide_query(ask, cols, _notes(attributes)), "columns": cols, "keys": ["Country"],
        "numeric": {c for c in attributes if c in _NUMERIC_COLUMNS},
        "rows": [[c["name"], *(_cell(_ATTRIBUTES[a][1](c)) for a in attributes)] for c in members],
        "lookups": [{"query": f"{c['name']} population capital", "url": page_url(country_rel(c))} for c in members],
    }


def _family_tasks(by_cont: dict[str, list[Country]], by_iso: dict[str, Country],
                  cities: dict[str, list[City]]) -> dict[str, list[dict[str, Any]]]:
    """The tasks after sbx_en_005, by family (ids are given in round-robin order afterwards).

    Europe is left out of `codes` and `domains` because Kosovo has neither a calling code nor a
    top-level domain; the euro tasks of Europe ask no such column either.
    """
    def members(code: str) -> list[Country]:
        return sorted(by_cont[code], key=lambda c: c["name"])

    def euro(code: str) -> list[Country]:
        return [c for c in members(code) if c["currencycode"] == "EUR"]

    out: dict[str, list[dict[str, Any]]] = {family: [] for family in FAMILIES}
    profile = ["Capital", "Population", "Area (km2)", "Currency Code"]
    for code in ("AF", "AS", "EU", "NA", "OC"):
        cont = CONTINENTS[code]
        out["profile"].append(_country_task("profile", members(code), f"List every country and territory of {cont} "
                                            f"in the Sandbox Atlas, with its {_phrase(profile)}.", profile))
    codes = ["ISO3 Code", "Capital", "Calling Code"]
    for code in ("AS", "NA", "OC", "SA"):
        cont = CONTINENTS[code]
        out["codes"].append(_country_task("codes", members(code), f"List every country and territory of {cont} in "
                                          f"the Sandbox Atlas with {_phrase(codes, own=True)}.", codes))
    for code, attributes in (("EU", ["ISO3 Code", "Capital", "Population"]),
                             ("NA", ["Capital", "Population", "Calling Code"]),
                             ("EU", ["Capital", "ISO3 Code", "Area (km2)"]),
                             ("AF", ["ISO3 Code", "Capital", "Calling Code"]),
                             ("NA", ["ISO3 Code", "Area (km2)", "Top-level Domain"])):
        out["euro"].append(_country_task("euro", euro(code), f"Which countries and territories in {CONTINENTS[code]} "
                                         "use the euro as their currency according to the Sandbox Atlas? Give each "
                                         f"one's {_phrase(attributes)}.", attributes))
    for k, codes_ in ((5, ("AS", "EU")), (2, ("AF", "NA", "OC")), (4, ("EU", "SA")), (5, ("AF", "NA")),
                      (3, ("AS", "OC", "SA")), (2, tuple(CONTINENTS))):
        out["ranked"].append(_ranked_task(by_cont, k, codes_))
    for k, ccs in ((10, ("JP", "DE")), (3, CITY_COUNTRIES), (7, ("BR", "MX", "NG")), (10, ("MX", "NG")),
                   (4, ("DE", "BR", "JP")), (8, ("NG", "JP", "MX"))):
        out["cities"].append(_cities_task(by_iso, cities, k, ccs))
    domains = ["Top-level Domain", "Calling Code"]
    for code in ("AF", "AS", "NA", "OC", "SA"):
        cont = CONTINENTS[code]
        out["domains"].append(_country_task("domains", members(code), f"List every country and territory of {cont} "
                                            f"in the Sandbox Atlas, with {_phrase(domains, own=True)}.", domains))
    for code in CONTINENTS:
        cont = CONTINENTS[code]
        out["sizes"].append(_country_task("sizes", members(code), f"List every country and territory of {cont} in "
                                          "the Sandbox Atlas, with its area in square kilometres.", ["Area (km2)"]))
    return out


def _ranked_task(by_cont: dict[str, list[Country]], k: int, codes: tuple[str, ...], *, family: str = "ranked",
                 lead: str = "", attributes: tuple[str, ...] = ("Population",)) -> dict[str, Any]:
    """The `k` most populous countries of each continent in `codes`, ranked within the continent,
    with `attributes` of each (`_ATTRIBUTES`); `lead` opens the question (a family's own wording)."""
    cols = ["Continent", "Rank", "Country", *attributes]
    rows, looks = [], []
    for code in codes:
        top = sorted(by_cont[code], key=lambda c: -c["population"])[:k]
        for rank, c in enumerate(top, 1):
            rows.append([CONTINENTS[code], rank, c["name"], *(_cell(_ATTRIBUTES[a][1](c)) for a in attributes)])
            looks.append({"query": f"{c['name']} population capital", "url": page_url(country_rel(c))})
    names = ", ".join(CONTINENTS[code] for code in codes)
    ask = (f"{lead}For each continent ({names}), find the {_NUMBER_WORDS[k]} most populous countries or territories in "
           f"the Sandbox Atlas, ranked 1 to {k} within the continent"
           + (f", with their {_phrase(list(attributes))}." if attributes else "."))
    return {"family": family, "query": wide_query(ask, cols, _notes(list(attributes))), "columns": cols,
            "keys": ["Continent", "Country"], "numeric": {"Rank", *(a for a in attributes if a in _NUMERIC_COLUMNS)},
            "rows": rows, "lookups": looks}


def _cities_task(by_iso: dict[str, Country], cities: dict[str, list[City]], k: int, ccs: tuple[str, ...], *,
                 family: str = "cities", lead: str = "", population: bool = True) -> dict[str, Any]:
    """The `k` most populous atlas cities of each country in `ccs`, with (`population`) each one's
    population and its time zone; `lead` opens the question (a family's own wording)."""
    cols = ["Country", "City", *(["Population"] if population else []), "Time Zone"]
    rows, looks = [], []
    for cc in ccs:
        country = by_iso[cc]
        for city in cities[cc][:k]:
            rows.append([country["name"], city["name"], *([city["population"]] if population else []), city["timezone"]])
            looks.append({"query": f"{city['name']} {country['name']} city population", "url": page_url(city_rel(cc, city))})
    names = ", ".join(by_iso[cc]["name"] for cc in ccs)
    what = "each city's population and IANA time zone" if population else "each city's IANA time zone"
    ask = (f"{lead}For each of these countries: {names}, find the {_NUMBER_WORDS[k]} most populous cities listed in the "
           f"Sandbox Atlas, with {what}.")
    return {"family": family, "query": wide_query(ask, cols), "columns": cols, "keys": ["Country", "City"],
            "numeric": {"Population"} if population else set(), "rows": rows, "lookups": looks}


def _more_family_tasks(by_cont: dict[str, list[Country]], by_iso: dict[str, Country],
                       cities: dict[str, list[City]]) -> dict[str, list[dict[str, Any]]]:
    """The tasks of `MORE_FAMILIES` (ids from sbx_en_043 on, given in round-robin order afterwards).

    `dossier` leaves Europe out (Kosovo has no calling code); `podium` asks the top two of each
    continent: a continent's two wide rows (14 cells) just fit one sub-agent's answer.
    """
    out: dict[str, list[dict[str, Any]]] = {family: [] for family in MORE_FAMILIES}
    dossier = ["Capital", "Population", "Area (km2)", "Currency Code", "ISO3 Code", "Calling Code"]
    for code in ("AF", "AS", "NA", "OC", "SA"):
        members = sorted(by_cont[code], key=lambda c: c["name"])
        out["dossier"].append(_country_task(
            "dossier", members, f"Compile a full country dossier. For every country and territory of {CONTINENTS[code]} "
            f"in the Sandbox Atlas, give {_phrase(dossier, own=True)}.", dossier))
    lead = "Name the population leaders of each continent, nothing else. "
    for k, codes in ((4, ("AF", "EU", "OC")), (5, ("AS", "NA", "SA")), (3, tuple(CONTINENTS)),
                     (2, ("AS", "EU", "NA", "SA")), (5, ("AF", "OC"))):
        out["leaders"].append(_ranked_task(by_cont, k, codes, family="leaders", lead=lead, attributes=()))
    lead = "Profile the giants of each continent in depth. "
    podium = ("Capital", "Population", "Area (km2)", "Currency Code")
    for k, codes in ((2, ("AF", "SA", "OC")), (2, ("AS", "EU")), (2, ("NA", "EU", "AS")), (2, ("AF", "OC")),
                     (2, ("SA", "NA", "AS", "EU"))):
        out["podium"].append(_ranked_task(by_cont, k, codes, family="podium", lead=lead, attributes=podium))
    lead = "Which clock do the big cities keep? "
    for k, ccs in ((5, ("BR", "JP", "MX")), (4, ("DE", "NG")), (6, ("NG", "DE")), (3, CITY_COUNTRIES),
                   (4, ("MX", "JP", "BR"))):
        out["zones"].append(_cities_task(by_iso, cities, k, ccs, family="zones", lead=lead, population=False))
    return out
