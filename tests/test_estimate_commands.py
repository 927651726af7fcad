"""Estimate before spending, on the run commands (issue 27 point 3): `ask --estimate` stops at the
manager's first fan-out and estimates its decision (no sub-agent call; the manager's calls counted),
`enrich --estimate` estimates the list's decision with no model call at all, and `--max-cost` below
an estimate's low end refuses the fan-out before any sub-agent call, with exit 4 and the numbers:
in the session's pre-flight, so the Python API gets the same refusal (`EstimateOverBudget`).

Offline: a simulated model (deterministic code, not an LLM) behind the loopback OpenAI-compatible
server, priced by a prices file; no past runs, so the estimates use the documented defaults.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

import amapreduce
from amapreduce.cli.app import main
from amapreduce.errors import EstimateOverBudget
from tests.test_cli_exit_codes import CLOSED_PORT, DECISION, ITEMS, Items, decision_file, serving

ASK = ["ask", "What is the code of each item?", "--model", "sim-model", "--no-memory"]


@pytest.fixture(autouse=True)
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory whose `runs/` is the runs folder; `sim-model` priced at $1 per
    million prompt tokens and $2 per million completion tokens."""
    monkeypatch.chdir(tmp_path)
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"sim-model": {"input": 1e-6, "output": 2e-6}}), encoding="utf-8")
    for name, value in {"PRICES_FILE": prices, "RUNS_DIR": tmp_path / "runs", "EXTRACTION_MODEL": "none",
                        "API_KEY": "sk-test", "RETRY_BASE_DELAY_S": 0, "ENV_FILE": "/dev/null"}.items():
        monkeypatch.setenv(f"AMAPREDUCE_{name}", str(value))
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path / "runs"


def items_csv(tmp_path: Path) -> Path:
    path = tmp_path / "items.csv"
    pd.DataFrame({"Item": ITEMS}).to_csv(path, index=False)
    return path


def test_ask_estimate_calls_no_sub_agent_and_counts_the_managers_calls(
    runs: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    world = Items()
    with serving(world) as server:
        code = main([*ASK, "--api-base", server.base_url, "--estimate", "--json"])
        out = json.loads(capsys.readouterr().out)
        assert code == 0 and world.subagent_requests == 0
        # defaults (no past run): 3 calls and 4,500 prompt tokens a batch of one row, ±50 %
        estimate = out["estimate"]
        assert estimate["batches"] == len(ITEMS) and estimate["calls"] == {"low": 9, "high": 27}
        assert estimate["prompt_tokens"] == {"low": 13500, "high": 40500} and estimate["source"].startswith("defaults")
        assert estimate["cost_usd"]["low"] == pytest.approx(13500e-6 + 180 * 2e-6)
        assert estimate["wall_s"]["low"] > 0 and estimate["model"] == "sim-model"
        assert out["manager_spent"]["calls"] == 2  # the plan stage, then the call that would have fanned out
        assert out["usage"]["requests"] == 2 and out["status"].startswith("stopped: estimate only")
        recorded = json.loads((Path(out["run_dir"]) / "result.json").read_text(encoding="utf-8"))
        assert recorded["estimate"] == estimate  # the run folder records what the manager spent, and the estimate

        assert main([*ASK, "--api-base", server.base_url, "--estimate"]) == 0
    printed = capsys.readouterr()
    assert "model calls 9 - 27; prompt tokens 13,500 - 40,500" in printed.out and "wall time" in printed.out
    assert "cost $0.0139 - $0.0416" in printed.out
    assert "spent by the manager to write the decision: 2 model calls" in printed.err
    assert world.subagent_requests == 0


def test_the_python_api_estimates_as_ask_estimate_does(runs: Path) -> None:
    world = Items()
    with serving(world) as server:
        result = amapreduce.ask("What is the code of each item?", model="sim-model", api_base=server.base_url,
                                memory=False, estimate=True)
        second = Items()
    assert world.subagent_requests == 0 and result.status == "stopped"
    assert result.ending.label.startswith("stopped: estimate only") and result.table.rows == []
    assert result.estimate is not None and result.estimate.batches == len(ITEMS)
    assert result.estimate.calls == (9, 27) and result.estimate.model_id == "sim-model"
    assert result.usage.requests == 2  # the manager's own calls, spent and counted
    assert json.loads((result.run_dir / "result.json").read_text(encoding="utf-8"))["estimate"] == result.estimate.to_json()
    with serving(second) as server:
        ran = amapreduce.ask("What is the code of each item?", model="sim-model", api_base=server.base_url, memory=False)
    assert ran.estimate is None and ran.status == "complete" and second.subagent_requests > 0


def test_enrich_estimate_makes_no_model_call_and_no_run_folder(
    tmp_path: Path, runs: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    # No server listens on the discard port and model requests are not allowed: any model call fails.
    argv = ["enrich", str(items_csv(tmp_path)), "--columns", "Code", "--model", "sim-model", "--api-base", CLOSED_PORT,
            "--no-memory", "--batch-size", "2", "--estimate"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] == len(ITEMS) and out["estimate"]["batches"] == 3
    assert out["estimate"]["calls"] == {"low": 4, "high": 14} and out["estimate"]["cost_usd"] is not None
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "estimate for 3 batches over 6 rows" in printed.out and "cost $" in printed.out
    assert "3 batches of up to 2 rows" in printed.err
    assert not runs.exists()


@pytest.mark.parametrize("command", ["mapreduce run", "enrich", "ask"])
def test_a_budget_below_the_estimate_is_refused_before_any_sub_agent_call(
    tmp_path: Path, runs: Path, capsys: pytest.CaptureFixture[str], command: str,
) -> None:
    world = Items()
    with serving(world) as server:
        given = {"mapreduce run": ["mapreduce", "run", decision_file(tmp_path), "--model", "sim-model"],
                 "enrich": ["enrich", str(items_csv(tmp_path)), "--columns", "code", "--model", "sim-model",
                            "--no-memory", "--batch-size", "1"],
                 "ask": ASK}[command]
        # ask: a budget its manager's two calls (about $0.005) do not spend, below the fan-out's $0.0139
        cap = "0.012" if command == "ask" else "0.001"
        code = main([*given, "--api-base", server.base_url, "--max-cost", cap])
    err = capsys.readouterr().err
    assert code == 4, err
    assert world.subagent_requests == 0
    assert re.search(r"would cost \$0\.0139 - \$0\.0416", err), err
    assert f"over the budget of ${float(cap):.4f}: nothing was run" in err
    if command == "ask":  # refused once the manager wrote its decision: its run folder records the stop
        (folder,) = runs.iterdir()
        recorded = json.loads((folder / "result.json").read_text(encoding="utf-8"))
        assert recorded["status"].startswith("stopped: the fan-out would cost $")
    else:  # refused in pre-flight: nothing was made
        assert not runs.exists()


def test_a_budget_above_the_estimate_runs(tmp_path: Path, runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    world = Items()
    with serving(world) as server:
        assert main(["mapreduce", "run", decision_file(tmp_path), "--model", "sim-model", "--api-base",
                     server.base_url, "--max-cost", "5"]) == 0
        assert main([*ASK, "--api-base", server.base_url, "--max-cost", "5"]) == 0
    capsys.readouterr()
    assert world.subagent_requests >= 2 * len(ITEMS)


def test_the_python_api_raises_the_refusal_with_its_numbers(runs: Path) -> None:
    with pytest.raises(EstimateOverBudget, match="over the budget of") as refused:
        amapreduce.run_decision(DECISION, model="sim-model", api_base=CLOSED_PORT, max_cost=0.001)
    assert refused.value.max_cost_usd == 0.001 and 0.001 < refused.value.low_usd < refused.value.high_usd
    with pytest.raises(EstimateOverBudget):
        amapreduce.enrich(pd.DataFrame({"Item": ITEMS}), columns=["Code"], model="sim-model", api_base=CLOSED_PORT,
                          max_cost=0.001, memory=False)
    assert not runs.exists()
