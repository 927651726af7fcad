"""A run that fails still leaves a record: `result.json` with status `failed` and the error.

A run directory holding only an empty trace is invisible to `runs list` and says nothing about
what went wrong; a mistyped `--memory` path is a usage error that makes no run directory at all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sessions import ask as run_ask
from sessions import mapreduce_run

from amapreduce.cli.app import main
from amapreduce.decision.model import Decision
from amapreduce.errors import ConfigError, ProviderRejected
from amapreduce.mapreduce.solver import BatchRequest, SolverReply
from amapreduce.settings import load_settings
from amapreduce.testing.scripted import FunctionModel, ModelInfo

DECISION = Decision.parse(
    {"task_matrix": [["France"]], "template": "Capital of __0__?", "json_schema": ["country", "capital"]}
)


def only_run(runs: Path) -> dict:
    (folder,) = list(runs.iterdir())
    return json.loads((folder / "result.json").read_text(encoding="utf-8"))


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("AMAPREDUCE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "runs"


def test_a_setup_failure_creates_nothing(tmp_path: Path) -> None:
    """What a run needs is built in its session's pre-flight: a setup failure raises before any
    run directory exists (the CLI exits 2 and leaves nothing behind)."""
    settings = load_settings({}, runs_dir=tmp_path / "runs")  # no model
    with pytest.raises(ConfigError, match="no model is configured"):
        run_ask("Capitals?", settings, web_tools=[], show_progress=False)

    def broken(role: str) -> object:
        raise RuntimeError(f"cannot build the {role} client")

    with pytest.raises(RuntimeError, match="cannot build the subagent client"):
        mapreduce_run(DECISION, load_settings({}, model="m", runs_dir=tmp_path / "runs"), label="capitals", inner=broken,
                     web_tools=[], show_progress=False)
    assert not (tmp_path / "runs").exists()


def test_a_failure_during_the_run_writes_a_failed_result(tmp_path: Path) -> None:
    def failing(messages: list[Any], info: ModelInfo) -> Any:
        raise RuntimeError("the model process crashed")

    settings = load_settings({}, model="m", runs_dir=tmp_path / "runs", extraction_model="none")
    outcome = run_ask("Capitals?", settings, inner=lambda role: FunctionModel(failing, model_id="m"), web_tools=[],
                      show_progress=False)
    saved = only_run(tmp_path / "runs")
    assert outcome.status == saved["status"] == "failed" and saved["kind"] == "ask"
    assert "the model process crashed" in saved["error"]
    assert saved["timings"]["wall_s"] >= 0 and saved["timings"]["executions"] == []
    events = [json.loads(x) for x in next((tmp_path / "runs").iterdir()).joinpath("trace.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "run_finished" and events[-1]["status"] == "failed"


def test_mapreduce_run_stopped_by_a_refusing_provider_writes_a_failed_result(tmp_path: Path) -> None:
    class Refusing:
        def solve(self, request: BatchRequest) -> SolverReply:
            raise ProviderRejected("401 wrong key", provider="x", failures=1, last_error="401")

    settings = load_settings({}, model="m", runs_dir=tmp_path / "runs")
    outcome = mapreduce_run(DECISION, settings, label="capitals", inner=lambda role: FunctionModel(lambda m, i: "x"),
                           solver=Refusing(), web_tools=[], show_progress=False)
    saved = only_run(tmp_path / "runs")
    assert outcome.status == saved["status"] == "failed" and saved["kind"] == "mapreduce_run"
    assert "401 wrong key" in saved["error"]


def test_a_file_that_is_not_a_memory_store_is_refused_before_any_run_folder(
    env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "memory.sqlite3").write_text("not a database", encoding="utf-8")
    code = main(["ask", "q", "--model", "m", "--api-base", "http://127.0.0.1:9/v1", "--memory", str(store), "--json"])
    # A file that is not a store is bad input (exit 2, issue 17), refused in one line, and the
    # refusal comes before the run: no `failed` run folder is left behind for a usage mistake.
    assert code == 2 and "is empty or not an amapreduce memory store" in capsys.readouterr().err
    assert not env.exists()
    assert (store / "memory.sqlite3").read_text(encoding="utf-8") == "not a database"  # never written


def test_missing_memory_store_is_a_usage_error_naming_the_flag(
    env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["ask", "q", "--model", "m", "--api-base", "http://127.0.0.1:9/v1", "--memory", str(tmp_path / "nostore")])
    err = capsys.readouterr().err
    assert code == 2 and "--memory" in err and "nostore" in err and "--store" not in err
    assert not env.exists()  # a usage error makes no run directory
