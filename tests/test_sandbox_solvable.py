"""Every sandbox task can be solved through the real tools alone: discover entities on list pages
(found with web_search), read each entity page with crawl_page, parse its infobox, and the table
equals the gold CSV. This is the path a simulated model (issue 6) takes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from amapreduce.demo.atlas import infobox, list_entries, plain_number
from amapreduce.sandbox import sandbox_world
from amapreduce.settings import Settings
from amapreduce.web.service import WebService


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> WebService:
    world = sandbox_world(tmp_path_factory.mktemp("sbx"))
    return WebService.from_settings(Settings(cache_dir=tmp_path_factory.mktemp("cache")),
                                    backend=f"corpus:{world.index_dir}")


@pytest.fixture(scope="module")
def gold_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sandbox_world(tmp_path_factory.mktemp("sbx2")).gold_dir


def _find_list(service: WebService, query: str, title: str) -> str:
    for result in service.search(query, 5):
        if result.title.startswith(title):
            return result.url
    raise AssertionError(f"no list page titled {title!r} for {query!r}")


def _links(service: WebService, url: str) -> list[tuple[str, str, list[str]]]:
    """(name, url, other cells) of every linked row in a list page's table."""
    return [(e.name, e.url, list(e.cells)) for e in list_entries(service.crawl(url, 100_000).text)]


def _infobox(service: WebService, url: str) -> dict[str, str]:
    return infobox(service.crawl(url, 100_000).text)


def _num(text: str) -> str:
    return plain_number(text)


def _gold(gold_dir: Path, instance_id: str) -> list[list[str]]:
    return pd.read_csv(gold_dir / f"{instance_id}.csv", dtype=str, keep_default_na=False).values.tolist()


def _countries(service: WebService, continent: str) -> list[dict[str, Any]]:
    url = _find_list(service, f"countries of {continent} list", f"Countries of {continent}")
    return [_infobox(service, link) | {"_url": link} for _name, link, _cells in _links(service, url)]


def test_sbx_en_001_south_america(service: WebService, gold_dir: Path) -> None:
    rows = [[f["Official name"], f["Capital"], _num(f["Population"]), _num(f["Area (km2)"]),
             re.search(r"\((\w+)\)", f["Currency"]).group(1)]  # type: ignore[union-attr]
            for f in _countries(service, "South America")]
    assert rows == _gold(gold_dir, "sbx_en_001")


def test_sbx_en_002_top_three_per_continent(service: WebService, gold_dir: Path) -> None:
    rows = []
    for continent in ("Africa", "Asia", "Europe", "North America", "Oceania", "South America"):
        ranked = sorted(_countries(service, continent), key=lambda f: -int(_num(f["Population"])))[:3]
        rows += [[continent, str(i), f["Official name"], _num(f["Population"])] for i, f in enumerate(ranked, 1)]
    assert rows == _gold(gold_dir, "sbx_en_002")


def test_sbx_en_003_africa_codes(service: WebService, gold_dir: Path) -> None:
    rows = [[f["Official name"], f["ISO3 code"], f["Capital"], f["Calling code"]] for f in _countries(service, "Africa")]
    gold = _gold(gold_dir, "sbx_en_003")
    assert len(gold) >= 50 and rows == gold


def test_sbx_en_004_cities(service: WebService, gold_dir: Path) -> None:
    rows = []
    for country in ("Japan", "Germany", "Brazil", "Mexico", "Nigeria"):
        url = _find_list(service, f"large cities of {country}", f"Large cities of {country}")
        cities = [(name, _infobox(service, link)) for name, link, _cells in _links(service, url)]
        top = sorted(cities, key=lambda c: -int(_num(c[1]["Population"])))[:5]
        rows += [[country, name, _num(f["Population"]), f["Time zone"]] for name, f in top]
    assert rows == _gold(gold_dir, "sbx_en_004")


def test_sbx_en_005_euro_in_europe_filters_the_distractors(service: WebService, gold_dir: Path) -> None:
    url = _find_list(service, "countries using the euro", "Countries and territories using the euro")
    listed = _links(service, url)
    assert any(cells[0] != "Europe" for _n, _u, cells in listed)  # the list also has non-European members
    rows = []
    for _name, link, cells in listed:
        if cells[0] == "Europe":
            f = _infobox(service, link)
            rows.append([f["Official name"], f["Capital"], _num(f["Area (km2)"]), _num(f["Population"])])
    assert rows == _gold(gold_dir, "sbx_en_005")
