"""The sandbox's discovery-heavy world (`amapreduce.sandbox.discovery`): at least 300 entities
over at least 20 list pages, every entity named in more than one spelling across the pages, every
entity with a page of its own that search finds, a gold table in the spelling of those pages, and
none of it touching the 42 wide-search tasks."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pandas as pd
import pytest

from amapreduce.demo.atlas_reader import infobox, list_entries, plain_number, title_name
from amapreduce.sandbox import SandboxWorld
from amapreduce.sandbox.discovery import variant_name
from amapreduce.table.keys import normalize_value
from amapreduce.web.service import WebService
from tests import test_sandbox_solvable

HUB = "corpus://sandbox/city-lists/index.html"

world = test_sandbox_solvable.world  # the module fixtures: the built world and its search, built once here too
service = test_sandbox_solvable.service


@pytest.fixture(scope="module")
def gold(world: SandboxWorld) -> pd.DataFrame:
    return pd.read_csv(world.discovery_gold_dir / "sbx_disc_001.csv", dtype=str, keep_default_na=False)


@pytest.fixture(scope="module")
def listed(service: WebService) -> dict[str, list[tuple[str, str, str]]]:
    """Every list page the hub links: (name shown, country shown, linked page) per row."""
    hub = list_entries(service.crawl(HUB, 100_000).text)
    return {e.url: [(r.name, r.cells[0], r.url) for r in list_entries(service.crawl(e.url, 100_000).text)] for e in hub}


def test_the_discovery_task_is_widesearch_and_apart_from_the_42(world: SandboxWorld, gold: pd.DataFrame) -> None:
    lines = world.discovery_tasks_file.read_text(encoding="utf-8").splitlines()
    tasks = [json.loads(line) for line in lines]
    assert [t["instance_id"] for t in tasks] == ["sbx_disc_001"]
    task = tasks[0]
    assert set(task) == {"instance_id", "query", "evaluation", "language"}
    evaluation = json.loads(task["evaluation"])
    assert evaluation["unique_columns"] == ["city", "country"] and evaluation["required"] == ["city", "country", "population"]
    assert "with at least 1,500,000 inhabitants" in task["query"]
    assert list(gold.columns) == ["City", "Country", "Population"]
    regular = [json.loads(line)["instance_id"] for line in world.tasks_file.read_text(encoding="utf-8").splitlines()]
    assert len(regular) >= 42 and all(i.startswith("sbx_en_") for i in regular)  # `eval run --benchmark sandbox` never gets it
    assert not (world.gold_dir / "sbx_disc_001.csv").exists()


def test_gold_is_consistent(gold: pd.DataFrame) -> None:
    assert len(gold) >= 300
    assert not (gold == "").any().any()
    assert not gold.duplicated(subset=["City", "Country"]).any()
    assert (gold["Population"].astype(int) >= 1_500_000).all()
    assert gold["Country"].nunique() >= 50


def test_at_least_20_list_pages_name_every_entity_in_several_spellings(
        gold: pd.DataFrame, listed: dict[str, list[tuple[str, str, str]]]) -> None:
    assert len(listed) >= 20 and all(rows for rows in listed.values())
    by_page: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for rows in listed.values():
        for name, country, page in rows:
            by_page[page].add((name, country))
    entities = {(row.City, row.Country) for row in gold.itertuples(index=False)}
    assert len(by_page) == len(entities)  # one linked page per entity, all of them listed
    spellings = Counter(len({(normalize_value(n), normalize_value(c)) for n, c in names}) for names in by_page.values())
    assert set(spellings) == {3}  # every city under three spellings no exact-key dedup merges
    cities = {name for names in by_page.values() for name, _country in names}
    assert {"São Paulo", "Sao Paulo", "Saint Petersburg", "St. Petersburg", "Mexico City", "Mexico"} <= cities
    candidates = sum(len(rows) for rows in listed.values())
    assert candidates == 3 * len(entities)


def test_every_entity_has_its_own_page_that_search_finds(
        service: WebService, gold: pd.DataFrame, listed: dict[str, list[tuple[str, str, str]]]) -> None:
    page_of = {(name, country): page for rows in listed.values() for name, country, page in rows}
    missed = []
    for row in gold.itertuples(index=False):
        url = page_of[(row.City, row.Country)]  # the atlas's own series links it under the gold spelling
        page = service.crawl(url, 100_000)
        text = page.text
        assert text.splitlines()[0] == f"# {row.City}" and title_name(page.title) == f"{row.City}, {row.Country}"
        assert plain_number(infobox(text)["Population"]) == row.Population
        # as the simulated sub-agent looks a city up: "<city> <country>" in the top 5, else its title
        # in the top 10 ("İzmir" needs the second: the corpus query splits "i̇zmir" after lowercasing)
        hits = [h.url for h in service.search(f"{row.City} {row.Country}", 5)]
        hits += [h.url for h in service.search(f"{row.City}, {row.Country} Sandbox Atlas", 10)]
        if url not in hits:
            missed.append(row.City)
    assert missed == []


def test_variant_spellings_only_drop_accents_and_letters() -> None:
    assert variant_name("São Paulo") == "Sao Paulo"
    assert variant_name("Saint Petersburg") == "St. Petersburg" == variant_name("Saint Petersburg", plain=False)
    assert variant_name("Ho Chi Minh City") == "Ho Chi Minh"
    assert variant_name("Xi’an") == "Xi'an" == variant_name("Xi’an", plain=False)
    assert variant_name("Port-au-Prince") == "Port au Prince"
    assert variant_name("Diyarbakır") == "Diyarbakir"
    assert variant_name("Bogotá", plain=False) == "Bogotá"


def test_the_older_pages_are_untouched(world: SandboxWorld) -> None:
    counts = {kind: len(list((world.pages_dir / kind).glob("*.html"))) for kind in
              ("countries", "cities", "lists", "archive", "travel", "metros", "city-lists")}
    assert counts == {"countries": 244, "cities": 75, "lists": 12, "archive": 41, "travel": 31, "metros": 284,
                      "city-lists": 59}
    assert sum(p.stat().st_size for p in Path(world.pages_dir).rglob("*") if p.is_file()) < 1_500_000
