"""Discovery as MapReduce on the sandbox, with the simulated model (deterministic code, not an LLM).

Issue 12's "Done when": the 321-entity task `sbx_disc_001` (three list series over 58 pages, every
city under three spellings) is discovered completely with no merge call over the token budget
(read from the run's trace) and the table scores 1.0; the simulated manager's `sequential`
scouting (it reads every list page itself) finds the same table with a far larger prompt; wrong
values the simulated sub-agents inject are flagged `unverified` >= 95 % while correct cells stay
`verified` >= 99 %. The simulated merge model's folding is checked on the world's own lists
(the model never reads gold; the test compares with it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from amapreduce.cli.app import main
from amapreduce.demo.atlas_reader import list_entries
from amapreduce.demo.discovery import LIST_TEMPLATE, fold, list_question, merge_groups, spelling_rank
from amapreduce.demo.faults import FaultPlan
from amapreduce.demo.model import SimulatedAtlasModel
from amapreduce.demo.run import DemoOutcome, load_sandbox_tasks, run_demo, score_answer
from amapreduce.demo.serve import serving_model
from amapreduce.llm.guard import allow_model_requests
from amapreduce.mapreduce.merge import Candidate, ModelMerger
from amapreduce.mapreduce.tree_reduce import Node
from amapreduce.sandbox import SandboxWorld, sandbox_world
from amapreduce.session import RunOptions, Session
from amapreduce.settings import Settings, load_settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import ToolCall
from amapreduce.web.service import WebService
from tests.test_demo_evidence import CatchRates

TASK = "sbx_disc_001"
HUB = "corpus://sandbox/city-lists/index.html"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def world(cache: Path) -> SandboxWorld:
    return sandbox_world(cache)


@pytest.fixture(scope="module")
def gold(world: SandboxWorld) -> pd.DataFrame:
    return pd.read_csv(world.discovery_gold_dir / f"{TASK}.csv", dtype=str, keep_default_na=False)


def settings(cache: Path, runs: Path, **extra: Any) -> Settings:
    # 100 batches: the fill stage's 321 cities at 5 per sub-agent (what one answer holds)
    return Settings.model_validate({"cache_dir": cache, "runs_dir": runs, "workers": 8, "max_batches": 100, **extra})


@pytest.fixture(scope="module")
def discovered(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> DemoOutcome:
    return run_demo(TASK, settings(cache, tmp_path_factory.mktemp("runs")))


@pytest.fixture(scope="module")
def scouted(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> DemoOutcome:
    return run_demo(TASK, settings(cache, tmp_path_factory.mktemp("runs")), scouting="sequential")


def trace_of(outcome: DemoOutcome) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (outcome.ask.run_dir.path / "trace.jsonl").read_text().splitlines()]


def test_the_simulated_merge_folds_the_lists_into_the_gold_entities(cache: Path, world: SandboxWorld,
                                                                    gold: pd.DataFrame) -> None:
    service = WebService.from_settings(Settings(cache_dir=cache), backend=f"corpus:{world.index_dir}")
    rows = [(e.name, e.cells[0]) for page in list_entries(service.crawl(HUB, 100_000).text)
            for e in list_entries(service.crawl(page.url, 100_000).text)]
    candidates = [{"id": f"c{i}", "City": city, "Country": country} for i, (city, country) in enumerate(rows)]
    groups = merge_groups(candidates)
    by_id = {c["id"]: c for c in candidates}
    kept = {(by_id[g["keep"]]["City"], by_id[g["keep"]]["Country"]) for g in groups}
    assert len(groups) == len(gold) == len(kept)
    assert kept == {(row.City, row.Country) for row in gold.itertuples(index=False)}  # the pages' own spelling
    assert fold("St. Petersburg") == fold("Saint Petersburg") and fold("Ho Chi Minh") == fold("Ho Chi Minh City")
    assert fold("Brazil (BR)") == fold("Brazil") and fold("Xi'an") == fold("Xi’an") == "xian"
    assert fold("Sao Paulo") == fold("São Paulo") != fold("Paulo")
    assert spelling_rank(["São Paulo", "Brazil"]) > spelling_rank(["Sao Paulo", "Brazil"])
    assert spelling_rank(["Port-au-Prince", "Haiti"]) > spelling_rank(["Port au Prince", "Haiti"])
    assert list_question(LIST_TEMPLATE.replace("__0__", HUB)) == HUB and list_question("List every city") is None


def test_the_merge_prompt_is_answered_through_the_model_merger() -> None:
    merger = ModelMerger(SimulatedAtlasModel())
    candidates = [Candidate("c0", {"City": "St. Petersburg", "Country": "Russia (RU)"}),
                  Candidate("c1", {"City": "Moscow", "Country": "Russia"}),
                  Candidate("c2", {"City": "Saint Petersburg", "Country": "Russia"})]
    reply = merger.merge(candidates, Node("final", 1, 0, 1, 30))
    assert [(g.ids, g.keep) for g in reply.groups] == [(("c0", "c2"), "c2"), (("c1",), "c1")]
    assert reply.warnings == () and reply.prompt_tokens > 0


def test_a_300_entity_task_is_discovered_completely_under_the_token_budget(discovered: DemoOutcome,
                                                                           gold: pd.DataFrame) -> None:
    assert discovered.ask.status == "complete" and discovered.score["score"] == 1.0
    assert len(discovered.ask.table.rows) == len(gold) >= 300
    saved = json.loads((discovered.ask.run_dir.path / "result.json").read_text())
    [summary] = saved["discoveries"]  # one per execution that discovered
    budget = summary["token_budget"]
    assert summary["sources"] == 58 and summary["candidates"] == 3 * len(gold) and summary["entities"] == len(gold)
    events = trace_of(discovered)
    merges = [e for e in events if e["event"] == "merge_call"]
    nodes = [e for e in events if e["event"] == "tree_node" and e["node"] != "map"]
    assert len(merges) == summary["merge_calls"] >= 2 and "reduce L1" in summary["nodes"] and summary["nodes"][-1] == "final"
    assert [e["node"] for e in nodes] == [n for n in summary["nodes"] if n != "map"]
    assert all(e["prompt_tokens"] <= budget for e in merges)  # no single model call over the budget
    assert all(e["input_tokens"] <= budget for e in nodes)
    assert summary["peak_prompt_tokens"] == max(e["prompt_tokens"] for e in merges)
    # ... and one call could not have held them all: the map's candidates exceed the budget
    assert sum(e["input_tokens"] for e in nodes if e["level"] == 1) > budget
    assert summary["warnings"] == []


def test_sequential_scouting_finds_the_same_table_with_a_far_larger_prompt(
        discovered: DemoOutcome, scouted: DemoOutcome) -> None:
    assert scouted.ask.status == "complete" and scouted.score["score"] == 1.0
    assert scouted.ask.markdown == discovered.ask.markdown
    assert "discoveries" not in json.loads((scouted.ask.run_dir.path / "result.json").read_text())

    def manager_peak(outcome: DemoOutcome) -> int:
        return max(int(e["usage"]["prompt_tokens"]) for e in trace_of(outcome)
                   if e["event"] == "model_call" and e["role"] == "manager")

    assert manager_peak(scouted) > 2 * manager_peak(discovered)
    assert manager_peak(scouted) > 20_000  # every list page in one context


def test_discovery_over_http_through_smolagents(cache: Path, world: SandboxWorld, tmp_path: Path) -> None:
    tasks, _ = load_sandbox_tasks(Settings(cache_dir=cache))
    task = tasks[TASK]
    with OpenAICompatibleServer(serving_model(), keep_requests=False) as server, allow_model_requests():
        run = load_settings({}, model="simulated", api_base=server.base_url, api_key="sk-local",
                            runs_dir=tmp_path / "runs", cache_dir=cache, search_backend=f"corpus:{world.index_dir}",
                            extraction_model="none", workers=8, max_batches=100)
        with Session(run, RunOptions(query=task.query, task_id=TASK, show_progress=False)) as session:
            outcome = session.ask()
    assert outcome.status == "complete"
    assert score_answer(task, world.discovery_gold_dir, outcome.markdown)["score"] == 1.0
    assert type(session.models["subagent"].inner).__name__ == "OpenAIModel"
    [summary] = outcome.record.discoveries
    assert summary.entities == 321 and summary.merge_calls >= 2


def test_wrong_values_on_the_discovery_task_are_flagged(cache: Path, tmp_path: Path) -> None:
    out = run_demo(TASK, settings(cache, tmp_path / "runs"), faults=FaultPlan(seed=7, wrong_values=0.2))
    rates = CatchRates()
    rates.add(out)
    rates.check()


def test_demo_cli_runs_a_discovery_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AMAPREDUCE_MAX_BATCHES", "100")
    assert main(["demo", TASK, "--no-memory", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["task_id"] == TASK and out["rows"] == 321 and out["score"]["score"] == 1.0
    assert out["discoveries"][0]["entities"] == 321 and out["evidence"]["verified"] == 321
    assert main(["demo", TASK, "--no-memory", "--scouting", "nearby", "--json"]) == 2


def test_a_discovery_follow_up_asks_only_the_missing_cities_without_discovering_again() -> None:
    decision = {"discover": {"sources": [HUB], "template": LIST_TEMPLATE, "json_schema": ["City", "Country"],
                             "key_columns": ["City", "Country"]},
                "template": 'In the Sandbox Atlas, find the population of the city "__0__" in __1__.',
                "json_schema": ["City", "Country", "Population"], "batch_size": 5}
    executed = ['Calling tools:\n{"name": "mapreduce", "arguments": {}}'] * 2 + [
        '{"call_stage": "execute", "complete": false, "missing_cells": 1}\n'
        '{"still_missing": [{"key": {"City": "Peshawar", "Country": "Pakistan"}, "missing": ["Population"]}]}']
    reply = SimulatedAtlasModel()._drive(decision, executed)
    assert isinstance(reply, ToolCall) and reply.name == "mapreduce"
    assert reply.arguments["task_matrix"] == [["Peshawar", "Pakistan"]] and "discover" not in reply.arguments
    done = SimulatedAtlasModel()._drive(decision, [*executed, 'Calling tools:\n{"name": "mapreduce"}'])
    assert isinstance(done, ToolCall) and done.name == "final_answer"
