"""The sandbox benchmark's size and mix: >= 40 tasks in >= 6 question families, ordered round-robin,
with the five original tasks frozen and every gold cell filled."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from amapreduce.errors import UserError
from amapreduce.sandbox import SandboxWorld, benchmark_order, sandbox_families, sandbox_world
from amapreduce.sandbox.build import FAMILIES
from amapreduce.sandbox.tasks import MORE_FAMILIES

# sha256 of the committed task lines and gold files of sbx_en_001..005 (issue 6): other tests,
# the demo and recorded runs depend on them, so growing the benchmark must not touch them.
ORIGINAL_LINES = {
    "sbx_en_001": "13421f53a7d16d36c75b3c045bed76e52c1a5ab1b9a286b883c8f41d83cd3f1b",
    "sbx_en_002": "a2128ce17598b2901427d7ad4a7bc7107edcd8536a1b7aa01387d9b3447dc215",
    "sbx_en_003": "56d6c3917ca75e8359ed6de17d79ee83523c47aefe0a95c6936d9611e80ce2fc",
    "sbx_en_004": "2bc8c2c0e70c5cebf81f6923e0fe8d66688cb50f1e1cc5a9552cb4acfe21f5ce",
    "sbx_en_005": "40cef091d28369c1f09822f053ef25cd543a7d7171bd35f91e1f68e44847d1fa",
}
ORIGINAL_GOLD = {
    "sbx_en_001": "ed349724d212e157fd6b078bff4ae271869f145c3f844bb58ed603be77a52098",
    "sbx_en_002": "12fd0383c019992c1246d61db89591ae9079c347fbd4d12d9b1b7f3fa020a9f0",
    "sbx_en_003": "163e44202a47bcc7fea8e3378e8254b97e81e294374aad68bd6ba74712261485",
    "sbx_en_004": "b38f2b1835011ddcc36586a122bcddfae974834261ed1ddd253ec9423e42b002",
    "sbx_en_005": "0292ef5c64d7f388f6fc0e1fb40e83ba30de53898fb881f432713b79181ef4f4",
}
ORIGINAL_LOOKUPS = "9b1620e49187f21f8f7c344be047e18903e669278eb014964ec089cae09accba"
"""sha256 of the 142 lookup lines of sbx_en_001..005, in file order."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> SandboxWorld:
    return sandbox_world(tmp_path_factory.mktemp("sbx"))


@pytest.fixture(scope="module")
def tasks(world: SandboxWorld) -> list[dict[str, Any]]:
    return [json.loads(line) for line in world.tasks_file.read_text(encoding="utf-8").splitlines()]


def _attributes(task: dict[str, Any]) -> list[str]:
    """The asked columns that are not the row's key (what a sub-agent looks up per row)."""
    evaluation = json.loads(task["evaluation"])
    return [c for c in evaluation["required"] if c not in evaluation["unique_columns"]]


def test_the_benchmark_has_40_tasks_in_6_families_of_5(world: SandboxWorld, tasks: list[dict[str, Any]]) -> None:
    families = sandbox_families(world)
    ids = [t["instance_id"] for t in tasks]
    assert len(ids) >= 40 and ids == [f"sbx_en_{n:03d}" for n in range(1, len(ids) + 1)]
    assert list(families) == ids
    sizes = Counter(families.values())
    assert len(sizes) >= 6 and min(sizes.values()) >= 5, sizes
    assert set(sizes) == set(FAMILIES) | set(MORE_FAMILIES)
    assert json.loads(world.families_file.read_text(encoding="utf-8")) == families


def _round_robin(order: list[str], families: tuple[str, ...]) -> list[str]:
    left = Counter(order)
    expected = []
    while sum(left.values()):  # one task of each family with tasks left, in `families` order, per round
        for family in families:
            if left[family]:
                expected.append(family)
                left[family] -= 1
    return expected


def test_new_tasks_are_ordered_round_robin_across_families(world: SandboxWorld) -> None:
    whole = list(sandbox_families(world).values())
    order = whole[5:42]
    assert order == _round_robin(order, FAMILIES)
    assert order[: len(FAMILIES)] == list(FAMILIES)
    assert len(set(whole[:7])) == len(FAMILIES)  # any prefix of 7 or more tasks holds every first family
    more = whole[42:]  # the second generation (issue 24), after the 42 tasks that never change
    assert more == _round_robin(more, MORE_FAMILIES) and set(more) == set(MORE_FAMILIES)


def test_the_benchmark_order_mixes_every_family_into_both_halves(world: SandboxWorld) -> None:
    families = sandbox_families(world)
    order = benchmark_order(families)
    assert sorted(order) == sorted(families)
    first, second = order[: len(order) // 2], order[len(order) // 2:]
    every = set(FAMILIES) | set(MORE_FAMILIES)
    assert {families[i] for i in first} == every and {families[i] for i in second} == every
    assert [families[i] for i in order[: len(every)]] == list(dict.fromkeys(families.values()))
    for family in every:  # each family's tasks keep their file order
        ids = [i for i in order if families[i] == family]
        assert ids == sorted(ids)


def test_each_family_asks_one_attribute_count_and_counts_span_1_to_6(
    world: SandboxWorld, tasks: list[dict[str, Any]]
) -> None:
    families = sandbox_families(world)
    counts: dict[str, set[int]] = {}
    for task in tasks:
        counts.setdefault(families[task["instance_id"]], set()).add(len(_attributes(task)))
    assert all(len(c) == 1 for c in counts.values()), counts
    assert set().union(*counts.values()) == {1, 2, 3, 4, 5, 6}
    assert counts["dossier"] == {6} and counts["leaders"] == {1} and counts["zones"] == {1}


def test_the_five_original_tasks_are_unchanged(world: SandboxWorld, tasks: list[dict[str, Any]]) -> None:
    lines = world.tasks_file.read_text(encoding="utf-8").splitlines()
    assert {json.loads(line)["instance_id"]: _sha(line.encode()) for line in lines[:5]} == ORIGINAL_LINES
    assert {i: _sha((world.gold_dir / f"{i}.csv").read_bytes()) for i in ORIGINAL_GOLD} == ORIGINAL_GOLD
    lookups = [line for line in world.lookups_file.read_text(encoding="utf-8").splitlines()
               if json.loads(line)["instance_id"] in ORIGINAL_LINES]
    assert len(lookups) == 142 and _sha(("\n".join(lookups) + "\n").encode()) == ORIGINAL_LOOKUPS
    assert {t["instance_id"] for t in tasks[5:]}.isdisjoint(ORIGINAL_LINES)


def test_every_gold_table_is_full_and_moderate(world: SandboxWorld, tasks: list[dict[str, Any]]) -> None:
    for task in tasks:
        path = world.gold_dir / f"{task['instance_id']}.csv"
        official = pd.read_csv(path)  # the official loader: "NA" or "" would become NaN
        raw = pd.read_csv(path, dtype=str, keep_default_na=False)
        assert not official.isna().any().any(), task["instance_id"]
        assert not (raw.map(str.strip) == "").any().any(), task["instance_id"]
        assert 1 <= len(raw) <= 60, task["instance_id"]
    assert sorted(p.stem for p in world.gold_dir.glob("*.csv")) == [t["instance_id"] for t in tasks]


def test_new_tasks_add_no_pages(world: SandboxWorld) -> None:
    """The corpus index and the retrieval tests depend on the pages: tasks are built from existing ones."""
    counts = {kind: len(list((world.pages_dir / kind).glob("*.html"))) for kind in
              ("countries", "cities", "lists", "archive", "travel")}
    assert counts == {"countries": 244, "cities": 75, "lists": 12, "archive": 41, "travel": 31}


def test_a_families_file_that_disagrees_with_the_tasks_is_refused(tmp_path: Path, world: SandboxWorld) -> None:
    shutil.copy(world.tasks_file, tmp_path / "tasks.jsonl")
    families = json.loads(world.families_file.read_text(encoding="utf-8"))
    broken = world.model_copy(update={"tasks_file": tmp_path / "tasks.jsonl", "families_file": tmp_path / "f.json"})
    (tmp_path / "f.json").write_text(json.dumps({k: v for k, v in families.items() if k != "sbx_en_007"}))
    with pytest.raises(UserError, match=r"missing \['sbx_en_007'\]"):
        sandbox_families(broken)
    (tmp_path / "f.json").write_text(json.dumps({**families, "sbx_en_999": "sizes"}))
    with pytest.raises(UserError, match=r"unknown \['sbx_en_999'\]"):
        sandbox_families(broken)
    (tmp_path / "f.json").write_text('{"sbx_en_001": 3}')
    with pytest.raises(UserError, match="cannot read the sandbox task families"):
        sandbox_families(broken)
