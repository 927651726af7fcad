"""`amapreduce ui` in a real browser: Debian's headless Chromium, driven by Selenium through the
system chromedriver (nothing is downloaded), loads the Run page of a demo run served by uvicorn
and checks the table's cells, a status colour and that HTML in a cell stays text; the screenshot
is kept in the test's tmp folder.

Skipped only when Chromium or its driver is not installed (`.ci/run` installs both).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from records import cell, write_record
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from test_ui import run_offline

from amapreduce.ui import UIConfig, bind, make_server

CHROMIUM = next(filter(None, (shutil.which(n) for n in ("chromium", "chromium-browser"))), None)
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="the browser test needs Debian's chromium and chromium-driver packages (.ci/run installs them: "
           "apt-get install chromium chromium-driver)",
)
SCRIPT = "<script>document.title='pwned'</script>"
FOUND_GREEN = "rgba(217, 242, 223, 1)"
"""`--found` in style.css (#d9f2df): the background of a found cell."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A demo run (and a run with HTML in a cell) served by the real app on a free loopback port."""
    root = tmp_path_factory.mktemp("browser")
    run_offline(root, ["demo", "--no-memory", "--json"])
    crafted = root / "runs" / "20990101-000000-html"
    write_record(crafted, query="html", table={
        "columns": ["Name", "Capital"], "key_columns": ["Name"],
        "rows": [{"task_index": 0, "cells": {"Name": cell(SCRIPT), "Capital": cell("", "missing")}}]})
    config = UIConfig(runs_dir=root / "runs", memory=root / "store", plot_dir=root / "plots", port=0)
    server = make_server(config)
    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:  # uvicorn sets it once it accepts connections
        if not thread.is_alive():
            pytest.fail("the server thread ended before it started")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", root
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,1800"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(DRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_run_page_in_chromium_shows_cells_statuses_and_timeline(
    served: tuple[str, Path], browser: webdriver.Chrome, tmp_path: Path
) -> None:
    base, root = served
    run = next(p for p in (root / "runs").iterdir() if not p.name.startswith("2099"))
    browser.get(f"{base}/runs/{run.name}")
    assert browser.title == f"{run.name} · amapreduce ui"
    cells = browser.find_elements(By.CSS_SELECTOR, "#result-table tbody td[data-status]")
    assert len(cells) == 14 * 5
    assert [c.text for c in cells[:5]] == ["Argentina", "Buenos Aires", "44494502", "2766890", "ARS"]
    assert {c.get_attribute("data-status") for c in cells} == {"found"}
    assert cells[1].value_of_css_property("background-color") == FOUND_GREEN
    hover = cells[1].get_attribute("title").splitlines()
    assert hover == ["status: found, verified, confidence 0.9", "source: corpus://sandbox/countries/ar.html",
                     "quote: Capital | Buenos Aires"]
    bars = browser.find_elements(By.CSS_SELECTOR, "#timeline rect.bar")
    assert len(bars) == json.loads((run / "result.json").read_text())["completeness"]["attempts"]
    assert bars[0].value_of_css_property("fill") == "rgb(63, 163, 91)"  # an ok attempt is green
    shot = tmp_path / "run-page.png"
    assert browser.save_screenshot(str(shot)) and shot.read_bytes().startswith(b"\x89PNG")
    assert shot.stat().st_size > 20_000


def test_html_in_a_cell_stays_text_in_chromium(served: tuple[str, Path], browser: webdriver.Chrome) -> None:
    base, _ = served
    browser.get(f"{base}/runs/20990101-000000-html")
    assert browser.title == "20990101-000000-html · amapreduce ui"  # the cell's script never ran
    cells = browser.find_elements(By.CSS_SELECTOR, "#result-table tbody td[data-status]")
    assert [c.text for c in cells] == [SCRIPT, ""]
    assert cells[1].value_of_css_property("background-color") == "rgba(253, 226, 225, 1)"  # missing: red
    assert browser.find_elements(By.CSS_SELECTOR, "#result-table script") == []
