"""A run that fails still leaves a record: `result.json` with status `failed` and the error.

A run directory holding only an empty trace is invisible to `runs list` and says nothing about
what went wrong; a mistyped `--memory` path is a usage error that makes no run directory at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from amapreduce.session.ask import run_ask
from amapreduce.session.decision_run import run_decision

from amapreduce.cli.app import main
from amapreduce.decision.model import Decision
from amapreduce.errors import ConfigError
from amapreduce.settings import load_settings

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


def test_ask_setup_failure_writes_a_failed_result(tmp_path: Path) -> None:
    settings = load_settings({}, runs_dir=tmp_path / "runs")  # no model: building the parts fails
    with pytest.raises(ConfigError, match="no model is configured"):
        run_ask("Capitals?", settings, web_tools=[], show_progress=False)
    saved = only_run(tmp_path / "runs")
    assert saved["kind"] == "ask" and saved["status"] == "failed" and saved["error_type"] == "ConfigError"
    assert "no model is configured" in saved["error"]
    assert saved["timings"]["wall_s"] >= 0 and saved["timings"]["executions"] == []
    events = [json.loads(x) for x in next((tmp_path / "runs").iterdir()).joinpath("trace.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "run_finished" and events[-1]["status"] == "failed"


def test_mapreduce_run_setup_failure_writes_a_failed_result(tmp_path: Path) -> None:
    def broken(role: str) -> object:
        raise RuntimeError(f"cannot build the {role} client")

    settings = load_settings({}, model="m", runs_dir=tmp_path / "runs")
    with pytest.raises(RuntimeError):
        run_decision(DECISION, settings, label="capitals", inner=broken, web_tools=[], show_progress=False)
    saved = only_run(tmp_path / "runs")
    assert saved["kind"] == "mapreduce_run" and saved["status"] == "failed"
    assert saved["error"] == "cannot build the subagent client"


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
