"""Encoders: the real all-MiniLM-L6-v2 loaded offline, the hashing encoder, and the registry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_memory_fixtures import FAIL, PASS

from amapreduce.errors import ConfigError
from amapreduce.llm.embed import HashingEncoder, get_encoder
from amapreduce.memory import ExperientialMemory
from amapreduce.memory.records import DecisionSummary


def test_minilm_loads_offline_once_and_ranks_by_meaning(tmp_path: Path) -> None:
    encoder = get_encoder("minilm")
    assert get_encoder("minilm") is encoder  # one per process
    vectors = encoder.encode(["What is the capital of France?", "Paris is the capital of France.",
                              "Recipe for banana bread with walnuts."])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > 0.6 > vectors[0] @ vectors[2]

    mem = ExperientialMemory(tmp_path)  # default encoder: minilm
    assert mem.store.encoder_spec == "minilm"
    for i, (q, metrics) in enumerate([
        ("List the ten largest companies in Germany by revenue with their CEOs", PASS),
        ("Top 10 German firms by annual revenue and chief executives", FAIL),
        ("Winners of the Nobel Prize in Literature since 2000 with nationality", PASS),
        ("Chocolate cake recipe with ingredients list", PASS),
    ]):
        mem.update(None, query=q, decision=DecisionSummary(), metrics=metrics, record_id=f"r{i}")
    r = mem.retrieve("Largest companies in France by revenue and their chief executives")
    assert [n.id for n in r.positives][0] == "r0" and [n.id for n in r.negatives] == ["r1"]
    assert r.positives[-1].id == "r3"  # the recipe is the least similar positive


def test_hashing_encoder_is_deterministic_and_handles_chinese() -> None:
    enc = HashingEncoder(128)
    a = enc.encode(["2024年中国GDP前十的城市", "2024年中国GDP前十的城市及人口", "list of rivers in Europe"])
    b = HashingEncoder(128).encode(["2024年中国GDP前十的城市"])
    assert np.array_equal(a[0], b[0])
    assert a[0] @ a[1] > 0.5 > a[0] @ a[2]
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert enc.encode([""]).sum() == 0.0  # empty text: zero vector, no NaN


@pytest.mark.parametrize("spec,match", [("glove", "unknown encoder"), ("hashing:x", "integer"),
                                        ("hashing:4", ">= 8"), ("st:", "model name")])
def test_bad_encoder_specs_are_config_errors(spec: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        get_encoder(spec)


def test_missing_sentence_transformer_model_is_a_config_error(tmp_path: Path) -> None:
    enc = get_encoder(f"st:{tmp_path / 'no-such-model'}")
    with pytest.raises(ConfigError, match="could not be loaded"):
        enc.encode(["x"])
