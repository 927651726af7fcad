"""The sandbox where memory has to be right (issue 24): more families than k_H, conflicting best batchings,
decisions that can fail, and the ablation benchmark's arms and regret.

Runs go through the real pipeline (manager agent, mapreduce tool, engine, sub-agents, reducer) with
the simulated model (deterministic code, not an LLM) and the sandbox benchmark's trial settings;
`ForcedModel` (`benchmarks/bench_evolution.py`) replaces the manager's batching with a fixed one.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from amapreduce.bench.journal import benchmark_defaults
from amapreduce.demo.benchmark import BENCHMARK_CAPACITY_CELLS
from amapreduce.demo.model import SimulatedAtlasModel
from amapreduce.demo.plan import Batching
from amapreduce.demo.run import demo_settings, score_answer
from amapreduce.evaluation.loaders import load_tasks
from amapreduce.llm.factory import new_meter
from amapreduce.memory import MemoryConfig
from amapreduce.sandbox import SandboxWorld, sandbox_families, sandbox_world
from amapreduce.session import RunOptions, Session
from amapreduce.settings import Settings
from amapreduce.testing.scripted import SIMULATED_PRICES

REPO = Path(__file__).resolve().parents[1]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_evolution", REPO / "benchmarks" / "bench_evolution.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return sys.modules[spec.name]


BENCH = _bench()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> SandboxWorld:
    return sandbox_world(tmp_path_factory.mktemp("sbx"))


@pytest.fixture(scope="module")
def settings(world: SandboxWorld, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    root = tmp_path_factory.mktemp("runs")
    base = Settings(cache_dir=root / "cache", runs_dir=root / "runs", workers=4,
                    **benchmark_defaults("sandbox").settings)
    return demo_settings(base, world.index_dir)


def _run(world: SandboxWorld, settings: Settings, instance_id: str, model: SimulatedAtlasModel) -> dict[str, Any]:
    task = load_tasks(world.tasks_file, "widesearch")[instance_id]
    options = RunOptions(query=task.query, inner=lambda role: model, task_id=instance_id, show_progress=False,
                         meter=new_meter(settings, prices_by_prefix=SIMULATED_PRICES))
    with Session(settings, options) as session:
        outcome = session.ask()
    score = score_answer(task, world.gold_dir, outcome.markdown)
    return {**score, "subagents": int(outcome.record.completeness.attempts),
            "tokens": outcome.meter.total().total_tokens}


def _forced(rows: int | None, strategy: str = "per_atom") -> SimulatedAtlasModel:
    model: SimulatedAtlasModel = BENCH.ForcedModel(Batching(strategy=strategy, rows=rows))  # type: ignore[arg-type]
    return model


def test_the_sandbox_has_more_families_than_hints_and_trials_that_can_fail(world: SandboxWorld) -> None:
    defaults = benchmark_defaults("sandbox")
    assert BENCH.ForcedModel(Batching()).capacity_cells == BENCHMARK_CAPACITY_CELLS
    config = MemoryConfig(**defaults.memory)
    assert len(set(sandbox_families(world).values())) >= 10 > config.k_hints == 3
    assert dict(defaults.settings) == {"max_attempts": 2, "patch_rounds": 0}
    Settings(**defaults.settings)  # valid settings
    for name, overrides in BENCH.ARMS.items():  # every arm is a valid memory configuration (or no memory)
        assert overrides is None if name == "off" else MemoryConfig(**{**defaults.memory, **overrides})


def test_a_wide_family_loses_rows_where_a_narrow_one_is_complete(world: SandboxWorld, settings: Settings) -> None:
    """sbx_en_059 (dossier, 7 cells a row) and sbx_en_040 (sizes, 2 cells a row), with the benchmark's
    capacity (24 cells): 6 rows per sub-agent fit the narrow rows and cut the wide ones, so a family's
    batch size hurts another family; the default (one row per sub-agent) and 2 rows complete the wide ones."""
    families = sandbox_families(world)
    assert (families["sbx_en_059"], families["sbx_en_040"]) == ("dossier", "sizes")
    narrow = _run(world, settings, "sbx_en_040", _forced(6))
    assert narrow["score"] == 1.0
    wide = _run(world, settings, "sbx_en_059", _forced(6))
    assert wide["score"] == 0.0 and wide["f1_by_item"] < 0.9  # rows missing: a negative record
    two = _run(world, settings, "sbx_en_059", _forced(2))
    default = _run(world, settings, "sbx_en_059", SimulatedAtlasModel(capacity_cells=BENCHMARK_CAPACITY_CELLS))
    assert two["score"] == default["score"] == 1.0 and two["subagents"] < default["subagents"]


def test_leaders_batch_best_by_continent(world: SandboxWorld, settings: Settings) -> None:
    """sbx_en_052 (leaders: the top three of six continents, 3 cells a row): one sub-agent per
    continent (by_attr) reads each continent's pages once; per_atom batches of 4 or 5 rows mix
    continents and read two continents' pages, at a higher cost for the same table."""
    assert sandbox_families(world)["sbx_en_052"] == "leaders"
    grouped = _run(world, settings, "sbx_en_052", _forced(None, "by_attr"))
    assert grouped["score"] == 1.0
    for rows in (4, 5):
        mixed = _run(world, settings, "sbx_en_052", _forced(rows))
        assert mixed["tokens"] > 1.1 * grouped["tokens"], (rows, mixed, grouped)


def test_the_grid_and_the_regret() -> None:
    one = [BENCH._label(b) for b in BENCH.grid_choices(1)]
    two = [BENCH._label(b) for b in BENCH.grid_choices(2)]
    assert one == [f"per_atom:{k}" for k in BENCH.PER_ATOM] and "by_attr:all" not in one
    assert two[: len(one)] == one and {"by_attr:all", "by_attr:2"} <= set(two)
    grid = {"sizes": {"per_atom:1": 0.8, "per_atom:6": 0.95}, "leaders": {"by_attr:all": 0.9}}
    regret = BENCH.regrets(grid, {"sizes": 0.9025, "leaders": 0.95, "other": 0.1})
    assert regret == pytest.approx({"sizes": 5.0, "leaders": -100 * 0.05 / 0.9})


def test_the_json_document_has_every_arm_and_its_five_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert BENCH.main(["--smoke", "--json", "--arms", "off,full", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    document = json.loads(out)  # exactly one JSON object on stdout
    assert list(document) == ["arms"] and set(document["arms"]) == {"off", "full"}
    for figures in document["arms"].values():
        assert {"subagents", "model_calls", "prompt_tokens", "item_f1", "regret_max", "hints"} <= set(figures)
    assert list(BENCH.ARMS) == ["off", "full", "random_retrieval", "no_credit", "no_distillation", "credit_all",
                                "paper_credit", "prose_only"]
