"""The catch rate of the quote check, offline: the simulated sub-agent (deterministic code, not an
LLM) answers a seeded share of its cells wrong with made-up quotes (`--wrong-values`) and quotes
the page it really read for the others. Which cells it corrupted comes from its fault record,
never from the gold."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from amapreduce.cli.app import main
from amapreduce.demo.faults import FaultPlan
from amapreduce.demo.run import DemoOutcome, run_demo
from amapreduce.settings import Settings
from amapreduce.table.evidence import Evidence
from amapreduce.table.table import MATRIX_SOURCE, CellStatus
from amapreduce.ui.runs import download, run_view

TASKS = ["sbx_en_001", "sbx_en_003", "sbx_en_009", "sbx_en_022"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def settings(cache: Path, tmp_path: Path, **extra: object) -> Settings:
    return Settings.model_validate({"cache_dir": cache, "runs_dir": tmp_path / "runs", "workers": 4, **extra})


@dataclass
class CatchRates:
    """Cells of demo runs with wrong values injected: how many of the injected (wrong) cells the
    quote check flagged `unverified`, and how many of the others it kept `verified`."""

    wrong_total: int = 0
    wrong_caught: int = 0
    right_total: int = 0
    right_verified: int = 0

    def add(self, out: DemoOutcome) -> None:
        """Count the answered cells of one run (matrix cells and missing ones are not answers)."""
        injected = {(w.source, w.column, w.value) for w in out.wrong_cells}
        for row in out.ask.table.rows:
            for column, cell in row.cells.items():
                if cell.status is CellStatus.MISSING or cell.source == MATRIX_SOURCE:
                    continue
                if (cell.source, column, cell.value) in injected:
                    self.wrong_total += 1
                    self.wrong_caught += cell.evidence is Evidence.UNVERIFIED
                else:
                    self.right_total += 1
                    self.right_verified += cell.evidence is Evidence.VERIFIED

    def check(self) -> None:
        """Issue 12's bar: >= 95 % of the wrong values flagged, >= 99 % of the right ones verified,
        over enough cells for the rates to mean something."""
        assert self.wrong_total >= 40 and self.right_total >= 200
        assert self.wrong_caught / self.wrong_total >= 0.95
        assert self.right_verified / self.right_total >= 0.99


def test_wrong_values_are_caught_and_correct_cells_stay_verified(cache: Path, tmp_path: Path) -> None:
    rates = CatchRates()
    for task_id in TASKS:
        out = run_demo(task_id, settings(cache, tmp_path), faults=FaultPlan(seed=7, wrong_values=0.2))
        assert out.faults["wrong_value"] == len(out.wrong_cells) > 0
        rates.add(out)
    rates.check()


def test_wrong_values_are_seeded(cache: Path, tmp_path: Path) -> None:
    runs = [run_demo("sbx_en_001", settings(cache, tmp_path), faults=FaultPlan(seed=s, wrong_values=0.3)).wrong_cells
            for s in (1, 1, 2)]
    assert runs[0] == runs[1] != runs[2]
    assert run_demo("sbx_en_001", settings(cache, tmp_path)).wrong_cells == frozenset()


def test_strict_verify_asks_again_until_the_cells_are_verified(cache: Path, tmp_path: Path) -> None:
    out = run_demo("sbx_en_001", settings(cache, tmp_path, verify="strict"), faults=FaultPlan(seed=3, wrong_values=0.2))
    assert out.faults["wrong_value"] > 0
    assert out.evidence() == {"verified": 14 * 4, "unverified": 0, "no_evidence": 0}
    assert out.ask.status == "complete" and out.score["f1_by_item"] == 1.0  # every wrong value was replaced


def test_demo_cli_wrong_values_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("AMAPREDUCE_RUNS_DIR", "AMAPREDUCE_CACHE_DIR", "AMAPREDUCE_MODEL", "AMAPREDUCE_SEARCH_BACKEND",
                 "AMAPREDUCE_VERIFY"):
        monkeypatch.delenv(name, raising=False)
    assert main(["demo", "--no-memory", "--wrong-values", "0.2", "--seed", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["evidence"]["unverified"] > 0 and out["evidence"]["no_evidence"] == 0
    assert sum(out["evidence"].values()) == 14 * 4
    saved = json.loads((Path(out["run_dir"]) / "result.json").read_text())
    cells = [cell for row in saved["table"]["rows"] for cell in row["cells"].values()]
    assert all({"value", "status", "source", "quote", "evidence"} <= set(cell) for cell in cells)
    assert sum(cell["evidence"] == "unverified" for cell in cells) == out["evidence"]["unverified"]
    view = run_view(Path(out["run_dir"]))  # the UI's run page marks cells by their evidence
    assert view.table is not None
    drawn = [cell for row in view.table["rows"] for cell in row.cells]
    assert sum("cell-unverified" in cell.css for cell in drawn) == out["evidence"]["unverified"]
    assert sum("cell-verified" in cell.css for cell in drawn) == out["evidence"]["verified"]
    assert any("quote: Population | " in cell.title for cell in drawn)
    # the made-up quotes are the least sure cells: 0.3 (unverified) against at least 0.9 (verified)
    assert {c.confidence for c in drawn if "cell-unverified" in c.css} <= {0.3, 0.15}
    assert min(c.confidence or 0 for c in drawn if "cell-verified" in c.css) >= 0.9
    name, _media, text = download(Path(out["run_dir"]), "jsonl")
    rows = [json.loads(line) for line in text.splitlines()]
    assert name == "table.jsonl" and sum(list(r["_evidence"].values()).count("unverified") for r in rows) == out["evidence"]["unverified"]
    assert all(r["_quotes"] for r in rows)
    assert main(["demo", "--no-memory", "--verify", "maybe", "--json"]) == 2
