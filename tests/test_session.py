"""One run, one session: `ask` and `mapreduce run` are each one `Session`, which builds the run's
models once, keeps the run's one table (built by the one table builder, `--verify strict`
included) and ends in one `RunOutcome`.

The models are simulated (deterministic code behind an OpenAI-compatible server on 127.0.0.1),
reached through the real client path (smolagents' OpenAIModel over HTTP) from the real CLI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sessions import manager_then_subagents

from amapreduce.cli.app import main
from amapreduce.llm import factory
from amapreduce.llm.guard import allow_model_requests
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel

CAPITALS = {"France": "Paris", "Japan": "Tokyo"}
DECISION = {
    "task_matrix": [[c] for c in CAPITALS],
    "template": "What is the capital of __0__?",
    "json_schema": {"type": "object", "properties": {"country": {}, "capital": {}}},
    "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
}


def unverified_capitals(tasks: str) -> list[dict[str, Any]]:
    """A sub-agent's rows: each capital asked, with a quote from a page it never fetched (a quote the
    product's check finds `unverified`)."""
    return [{"country": c, "capital": v, "source": "https://atlas.example/capitals",
             "quotes": {"capital": f"The capital of {c} is {v}."}} for c, v in CAPITALS.items() if f"capital of {c}?" in tasks]


@pytest.fixture
def server() -> Any:
    with OpenAICompatibleServer(FunctionModel(manager_then_subagents(DECISION, unverified_capitals), model_id="sim-model")) as srv, allow_model_requests():
        yield srv


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from amapreduce.sandbox import sandbox_world

    index = sandbox_world(cache_dir=tmp_path / "cache").index_dir  # offline search: never touched here
    for name, value in {"RUNS_DIR": tmp_path / "runs", "CACHE_DIR": tmp_path / "cache", "SEARCH_BACKEND": f"corpus:{index}",
                        "PATCH_ROUNDS": "0", "MAX_ATTEMPTS": "1", "API_KEY": "sk-test"}.items():
        monkeypatch.setenv(f"AMAPREDUCE_{name}", str(value))
    monkeypatch.delenv("AMAPREDUCE_MEMORY_STORE", raising=False)
    return tmp_path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def test_ask_and_mapreduce_run_agree_under_verify_strict(
    server: OpenAICompatibleServer, env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same replies, whose quotes are unverified: both commands count those cells missing and
    exit 3 (incomplete); `ask` used to count them found and exit 0, since its tool built its own table."""
    model = ["--model", "sim-model", "--api-base", server.base_url, "--no-memory"]
    asked = _run(["ask", "Capitals of France and Japan?", *model, "--verify", "strict", "--json"], capsys)
    (env / "d.json").write_text(json.dumps(DECISION), encoding="utf-8")
    ran = _run(["mapreduce", "run", str(env / "d.json"), *model[:4], "--verify", "strict", "--json"], capsys)
    for code, out in (asked, ran):
        assert code == 3 and out["status"] == "incomplete"
        assert out["rows"] == 2 and out["missing_cells"] == 2
        assert out["completeness"]["missing_cells"] == 2 and not out["completeness"]["complete"]
    recorded = [json.loads((Path(out["run_dir"]) / "result.json").read_text()) for _, out in (asked, ran)]
    assert [r["completeness"]["missing_cells"] for r in recorded] == [2, 2]
    cells = recorded[0]["table"]["rows"][0]["cells"]["capital"]
    assert cells["evidence"] == "unverified" and cells["value"] == "Paris"
    # Without strict, the same replies are complete for both (the quotes are recorded, not enforced).
    assert main(["ask", "Capitals of France and Japan?", *model, "--verify", "record", "--json"]) == 0
    capsys.readouterr()
    assert main(["mapreduce", "run", str(env / "d.json"), *model[:4], "--verify", "record", "--json"]) == 0


@pytest.mark.parametrize(("memory", "roles"), [(False, ["manager", "subagent", "extraction"]),
                                                (True, ["manager", "subagent", "extraction", "memory"])])
def test_an_ask_builds_each_role_model_once(
    memory: bool, roles: list[str], server: OpenAICompatibleServer, env: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pre-flight check builds the run's models and the run keeps them: N builds for N roles
    (it used to build every role twice, once to check and once to run)."""
    built: list[str] = []
    real = factory.build_model

    def counting(spec: Any, **kwargs: Any) -> Any:
        built.append(kwargs["role"])
        return real(spec, **kwargs)

    monkeypatch.setattr(factory, "build_model", counting)
    flags = ["--model", "sim-model", "--api-base", server.base_url, "--json"]
    if memory:
        assert main(["memory", "add", "--store", str(env / "store"), "--encoder", "hashing",
                     "Batch two capitals per sub-agent.", "--question", "Capitals?"]) == 0
        capsys.readouterr()
        built.clear()
        flags += ["--memory", str(env / "store")]
    else:
        flags += ["--no-memory"]
    code, out = _run(["ask", "Capitals of France and Japan?", *flags], capsys)
    assert code == 0 and out["rows"] == 2
    assert sorted(built) == sorted(roles)


def test_a_setup_mistake_creates_nothing(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model id no provider serves fails the session's pre-flight: exit 2, no run directory."""
    assert main(["ask", "Capitals?", "--model", "no-provider-model", "--no-memory"]) == 2
    assert "no-provider-model" in capsys.readouterr().err
    assert not (env / "runs").exists() or not any((env / "runs").iterdir())
