"""`memory search` and `memory distill` pick the memory model exactly as `ask` does.

Flags win over settings; without any configured model `search` shows the raw hints. Models are
simulated (`FunctionModel`), never real: `_build_model` is replaced.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_memory_fixtures import QUERY, ranked_store

from amapreduce.cli import memory as memory_cli
from amapreduce.cli.app import main
from amapreduce.mapreduce.prior import PriorRequest
from amapreduce.memory import ExperientialMemory
from amapreduce.testing.scripted import FunctionModel

BULLETS = "1. Split the matrix by region.\n2. Verify totals."


@pytest.fixture()
def store(tmp_path: Path) -> str:
    ranked_store(tmp_path / "store")[0].close()
    return str(tmp_path / "store")


@pytest.fixture()
def built(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | None]]:
    """Replace the model builder with a simulated projection model; record what was asked for."""
    seen: list[tuple[str, str | None]] = []

    def build(model_id: str, settings: Any) -> FunctionModel:
        seen.append((model_id, settings.api_base))
        return FunctionModel(lambda messages, info: BULLETS)

    monkeypatch.setattr(memory_cli, "_build_model", build)
    return seen


def search(capsys: pytest.CaptureFixture[str], store: str, *argv: str) -> tuple[dict[str, Any], str]:
    capsys.readouterr()
    assert main(["memory", "search", QUERY, "--store", store, "--json", *argv]) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_search_projects_with_the_memory_model_of_ask(store: str, built: list[Any], monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AMAPREDUCE_MEMORY_MODEL", "memory-m")
    data, err = search(capsys, store)
    assert built == [("memory-m", None)] and err == ""
    assert "Split the matrix by region." in data["prior"] and "hint hB." not in data["prior"]
    # The plan stage (ask opens the store read-only with the same model) gets the same prior.
    with ExperientialMemory(store, model=FunctionModel(lambda m, i: BULLETS), readonly=True) as mem:
        assert data["prior"] == mem.prior(PriorRequest(query=QUERY)).text


def test_model_choice_follows_ask_and_flags_override_settings(store: str, built: list[Any],
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AMAPREDUCE_MODEL", "default-m")  # no memory_model: the default model serves it
    monkeypatch.setenv("AMAPREDUCE_API_BASE", "http://127.0.0.1:1/v1")
    search(capsys, store)
    monkeypatch.setenv("AMAPREDUCE_MEMORY_MODEL", "memory-m")
    search(capsys, store)
    search(capsys, store, "--model", "flag-m", "--api-base", "http://127.0.0.1:2/v1")
    assert built == [("default-m", "http://127.0.0.1:1/v1"), ("memory-m", "http://127.0.0.1:1/v1"),
                     ("flag-m", "http://127.0.0.1:2/v1")]


def test_search_without_a_model_or_with_no_project_shows_raw_hints(store: str, built: list[Any],
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    raw, _ = search(capsys, store)
    assert raw["prior"].count("- hint ") == 3 and "- hint hB." in raw["prior"]
    monkeypatch.setenv("AMAPREDUCE_MEMORY_MODEL", "none")  # `none` disables the role, as in ask
    assert search(capsys, store)[0] == raw
    monkeypatch.setenv("AMAPREDUCE_MEMORY_MODEL", "memory-m")
    assert search(capsys, store, "--no-project")[0] == raw
    assert built == []  # no model was even built


def test_a_failing_projection_falls_back_to_raw_hints_with_a_warning(store: str, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    def boom(messages: Any, info: Any) -> str:
        raise RuntimeError("provider 500")

    monkeypatch.setattr(memory_cli, "_build_model", lambda mid, settings: FunctionModel(boom))
    raw, _ = search(capsys, store, "--no-project")
    data, err = search(capsys, store, "--model", "m")
    assert data == raw and "projection failed (RuntimeError: provider 500)" in err


def test_distill_uses_the_configured_memory_model(store: str, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []
    model = FunctionModel(lambda m, i: "ADD: Split matrices larger than fifty rows.")
    monkeypatch.setattr(memory_cli, "_build_model", lambda mid, settings: seen.append(mid) or model)
    assert main(["memory", "distill", "--no-merge", "--store", store]) == 2  # nothing configured
    assert "AMAPREDUCE_MEMORY_MODEL" in capsys.readouterr().err
    monkeypatch.setenv("AMAPREDUCE_MEMORY_MODEL", "memory-m")
    assert main(["memory", "distill", "--no-merge", "--store", store, "--json"]) == 0
    assert seen == ["memory-m"] and model.calls > 0
