"""The bundled sandbox world: WideSearch-format tasks, gold tables, retrieval quality, determinism."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from amapreduce.sandbox import WORLD_DIR, sandbox_world
from amapreduce.sandbox.build import build_world, main
from amapreduce.web.corpus import CorpusIndex


def _norm(col: str) -> str:
    return col.strip().lower().replace(" ", "")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return sandbox_world(tmp_path_factory.mktemp("sbx"))


@pytest.fixture(scope="module")
def tasks(world: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in world.tasks_file.read_text(encoding="utf-8").splitlines()]


def test_tasks_use_the_exact_widesearch_format(world: Any, tasks: list[dict[str, Any]], benchmark_data: Path) -> None:
    reference = json.loads((benchmark_data / "widesearch" / "widesearch.jsonl").read_text().splitlines()[0])
    assert len(tasks) >= 40
    for task in tasks:
        assert set(task) == set(reference)
        assert isinstance(task["evaluation"], str)
        evaluation = json.loads(task["evaluation"])
        assert set(evaluation) >= {"unique_columns", "required", "eval_pipeline"}
        required = evaluation["required"]
        assert set(evaluation["unique_columns"]) <= set(required)
        assert set(evaluation["eval_pipeline"]) == set(required)
        assert all(col == _norm(col) for col in required)
        for spec in evaluation["eval_pipeline"].values():
            assert len(spec["preprocess"]) == 1 and len(spec["metric"]) == 1
            if spec["metric"] == ["number_near"]:
                assert isinstance(spec["criterion"], float)
        gold = pd.read_csv(world.gold_dir / f"{task['instance_id']}.csv")
        assert [_norm(c) for c in gold.columns] == required
        assert not gold.isna().any().any()
        assert not gold.duplicated(subset=list(gold.columns[[required.index(k) for k in evaluation["unique_columns"]]])).any()
        header = task["query"].split("following columns:\n", 1)[1].splitlines()[0]
        assert [_norm(c) for c in header.split(", ")] == required
        assert task["query"].endswith("```markdown\n{data_content}\n```.")


def test_task_mix_has_a_grouping_task_and_a_wide_task(world: Any, tasks: list[dict[str, Any]]) -> None:
    sizes = {t["instance_id"]: len(pd.read_csv(world.gold_dir / f"{t['instance_id']}.csv")) for t in tasks}
    assert max(sizes.values()) >= 50
    grouped = [t for t in tasks if len(json.loads(t["evaluation"])["unique_columns"]) >= 2]
    assert grouped
    gold = pd.read_csv(world.gold_dir / f"{grouped[0]['instance_id']}.csv")
    group_col = gold.columns[0]
    assert gold[group_col].nunique() >= 5 and gold.groupby(group_col).size().min() >= 3


def test_gold_facts_appear_on_the_entity_pages(world: Any) -> None:
    index = CorpusIndex.open(world.index_dir)
    gold = pd.read_csv(world.gold_dir / "sbx_en_001.csv")
    for row in gold.itertuples(index=False):
        hit = index.search(f"{row.Country} population capital", 1)[0]
        doc = index.get(hit.url)
        assert doc is not None
        assert f"| Capital | {row.Capital} |" in doc.text
        assert f"| Population | {row.Population:,} |" in doc.text


def test_every_sandbox_lookup_finds_its_entity_page_in_the_top_3(world: Any) -> None:
    index = CorpusIndex.open(world.index_dir)
    lookups = [json.loads(line) for line in world.lookups_file.read_text(encoding="utf-8").splitlines()]
    assert len(lookups) >= 100
    missed = [(lk["query"], lk["url"]) for lk in lookups if lk["url"] not in [r.url for r in index.search(lk["query"], 3)]]
    assert missed == []


def test_world_has_lists_distractors_and_near_duplicates(world: Any) -> None:
    pages = world.pages_dir
    counts = {kind: len(list((pages / kind).glob("*.html"))) for kind in ("countries", "cities", "lists", "archive", "travel")}
    assert 200 <= sum(counts.values()) <= 1000
    assert all(counts.values())
    size = sum(p.stat().st_size for p in WORLD_DIR.rglob("*") if p.is_file())
    assert size < 5_000_000
    index = CorpusIndex.open(world.index_dir)
    listing = index.get("corpus://sandbox/lists/continent-sa.html")
    assert listing is not None and "[Brazil](corpus://sandbox/countries/br.html)" in listing.text
    archived = index.get("corpus://sandbox/archive/ad-2010.html")
    assert archived is not None and "outdated" in archived.text


def test_builder_is_deterministic_and_the_committed_world_is_current(tmp_path: Path) -> None:
    messages: list[str] = []
    assert main(["--check"], echo=messages.append) == 0, messages
    build_world(tmp_path / "a")
    stale = tmp_path / "a" / "tasks.jsonl"
    stale.write_text(stale.read_text() + "\n")
    assert main(["--check", "--out", str(tmp_path / "a")], echo=messages.append) == 1
    assert "stale" in messages[-1]


def test_index_is_reused_and_keyed_by_content(tmp_path: Path) -> None:
    first = sandbox_world(tmp_path)
    mtime = (first.index_dir / "manifest.json").stat().st_mtime_ns
    second = sandbox_world(tmp_path)
    assert second.index_dir == first.index_dir
    assert (second.index_dir / "manifest.json").stat().st_mtime_ns == mtime
