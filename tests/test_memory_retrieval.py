"""Retrieval follows paper Eq. 7–10 and 17–19 exactly, on a hand-made store with known cosines."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_memory_fixtures import QUERY, ranked_store

from amapreduce.decision import Decision
from amapreduce.llm.messages import message_text
from amapreduce.mapreduce.prior import PriorProvider, PriorRequest
from amapreduce.memory import MemoryConfig
from amapreduce.memory.retrieval import EMPTY_PRIOR
from amapreduce.testing.scripted import FunctionModel


def test_neighbours_are_exact_top_k_by_cosine_per_label(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path)
    r = mem.retrieve(QUERY)
    assert [n.id for n in r.positives] == ["P1", "P2", "P3", "P4"]
    assert [n.id for n in r.negatives] == ["N1", "N2"]
    assert [round(n.similarity, 5) for n in r.positives] == [0.9, 0.8, 0.7, 0.6]
    assert r.exemplar_pos is not None and r.exemplar_pos.id == "P1"
    assert r.exemplar_neg is not None and r.exemplar_neg.id == "N1"


def test_hints_rank_by_w_plus_v_not_by_votes_alone(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path)
    r = mem.retrieve(QUERY)
    assert [(h.id, h.w, h.v, h.s) for h in r.hints] == [("hB", 6, 1, 7), ("hE", 3, 2, 5), ("hA", 1, 3, 4)]
    # hD has the highest w but no provenance in N(q): it is not even a candidate.
    assert r.candidates == 4
    by_votes = sorted(r.hints, key=lambda h: -h.v)
    assert [h.id for h in by_votes][0] == "hA" != r.hints[0].id


def test_same_task_records_are_excluded_and_the_next_one_moves_in(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path)
    r = mem.retrieve(QUERY, task_id="T-P1")
    assert [n.id for n in r.positives] == ["P2", "P3", "P4", "P5"]
    assert r.excluded == 1
    # Without P1: hD becomes a candidate through P5 (s = 10 + 1), hC gains P5's vote (s = 2 + 2) and
    # ties hE (s = 3 + 1); the tie goes to the higher v.
    assert [(h.id, h.v, h.s) for h in r.hints] == [("hD", 1, 11), ("hB", 1, 7), ("hC", 2, 4)]


def test_k_values_and_similarity_floor_are_configurable(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path, MemoryConfig(k_pos=2, k_neg=1, k_hints=1, min_similarity=0.85))
    r = mem.retrieve(QUERY)
    assert [n.id for n in r.positives] == ["P1"]  # P2 (0.8) is below the floor
    assert [n.id for n in r.negatives] == ["N1"]
    assert [h.id for h in r.hints] == ["hE"]  # candidates: hA (1+1), hE (3+2), hC (2+1)


def test_prior_is_a_prior_provider_and_renders_hints_and_exemplars(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path)
    assert isinstance(mem, PriorProvider)
    prior = mem.prior(PriorRequest(query=QUERY, decision=Decision.parse({"task_matrix": [["a"]], "template": "x __0__", "json_schema": ["a"]})))
    assert prior.hint_ids == ("hB", "hE", "hA")
    assert prior.record_ids == ("P1", "P2", "P3", "P4", "N1", "N2")
    lines = prior.text.splitlines()
    assert lines[1:4] == ["- hint hB.", "- hint hE.", "- hint hA."]
    assert "question P1" in prior.text and "question N1" in prior.text
    assert prior.details["hints"][0] == {"id": "hB", "text": "hint hB.", "w": 6, "v": 1, "s": 7, "advice": None}


def test_projection_uses_the_memory_model_and_keeps_at_most_three_bullets(tmp_path: Path) -> None:
    seen: list[str] = []

    def reply(messages, info):  # type: ignore[no-untyped-def]
        seen.append(message_text(messages[1]))
        return "1. Batch by region.\n2. Keep rows atomic.\n3. Verify totals.\n4. Extra bullet."

    mem, _ = ranked_store(tmp_path)
    mem.model = FunctionModel(reply)
    prior = mem.prior(PriorRequest(query=QUERY, decision=Decision.parse({"task_matrix": [["a"]], "template": "x", "json_schema": ["a"]})))
    assert prior.text.splitlines()[1:4] == ["- Batch by region.", "- Keep rows atomic.", "- Verify totals."]
    assert "Extra bullet" not in prior.text
    assert "hint hB." in seen[0] and QUERY in seen[0]
    assert prior.details["projected"] is True
    assert prior.hint_ids == ("hB", "hE", "hA")  # credit still goes to the hints behind Φ


def test_projection_failure_falls_back_to_raw_hints_and_says_so(tmp_path: Path) -> None:
    def broken(messages, info):  # type: ignore[no-untyped-def]
        raise RuntimeError("model down")

    mem, _ = ranked_store(tmp_path)
    mem.model = FunctionModel(broken)
    prior = mem.prior(PriorRequest(query=QUERY))
    assert "- hint hB." in prior.text
    assert "model down" in prior.details["projection_error"]


def test_projection_can_be_switched_off(tmp_path: Path) -> None:
    calls = []
    mem, _ = ranked_store(tmp_path, MemoryConfig(project=False))
    mem.model = FunctionModel(lambda m, i: calls.append(1) or "1. x")
    prior = mem.prior(PriorRequest(query=QUERY))
    assert calls == [] and "- hint hB." in prior.text


def test_empty_store_gives_the_empty_prior(tmp_path: Path) -> None:
    from test_memory_fixtures import VectorEncoder

    from amapreduce.memory import ExperientialMemory

    mem = ExperientialMemory(tmp_path, encoder=VectorEncoder())
    prior = mem.prior(PriorRequest(query=QUERY))
    assert prior.text == EMPTY_PRIOR and prior.hint_ids == () and prior.record_ids == ()


@pytest.mark.parametrize("k_pos,expected", [(0, []), (1, ["P1"]), (10, ["P1", "P2", "P3", "P4", "P5"])])
def test_k_pos_bounds(tmp_path: Path, k_pos: int, expected: list[str]) -> None:
    mem, _ = ranked_store(tmp_path, MemoryConfig(k_pos=k_pos))
    assert [n.id for n in mem.retrieve(QUERY).positives] == expected
