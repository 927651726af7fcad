"""A run's `result.json` is one typed record (`amapreduce.session.record.RunRecord`): every run's
record is validated when it is written, the published JSON Schema (`docs/reference/result.schema.json`)
is generated from the model and kept current here, records of each kind validate against it, and a
folder written before records were versioned still reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError
from sessions import ask as run_ask
from sessions import mapreduce_run
from test_run_failures import DECISION

from amapreduce.cli.app import main
from amapreduce.errors import UserError
from amapreduce.mapreduce.solver import BatchRequest, SolverReply
from amapreduce.session.record import RECORD_VERSION, RunRecord, schema
from amapreduce.settings import load_settings
from amapreduce.table.table import Table
from amapreduce.testing.scripted import FunctionModel, ModelInfo

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "result.schema.json"


def test_the_published_schema_is_generated_from_the_record() -> None:
    assert json.loads(SCHEMA_FILE.read_text(encoding="utf-8")) == schema(), (
        "docs/reference/result.schema.json is stale: python -m amapreduce.session.record > "
        "docs/reference/result.schema.json")


class Capitals:
    """A sub-agent that answers every sub-question with the capital it knows, and one it does not."""

    def solve(self, request: BatchRequest) -> SolverReply:
        return SolverReply(output=json.dumps([{"country": "France", "capital": "Paris"}]))


def _records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> dict[str, Path]:
    """One finished run folder of each kind the test can make offline: a demo (the `ask` lifecycle),
    a `mapreduce run`, and a failed `ask` and `mapreduce run`."""
    runs = tmp_path / "runs"
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(runs / "demo"))
    assert main(["demo", "sbx_en_005", "--json"]) == 0
    capsys.readouterr()
    settings = load_settings({}, model="m", runs_dir=runs / "run", extraction_model="none")
    mapreduce_run(DECISION, settings, label="capitals", inner=lambda role: FunctionModel(lambda m, i: "x"),
                  solver=Capitals(), web_tools=[], show_progress=False)

    def crashing(messages: list[Any], info: ModelInfo) -> Any:
        raise RuntimeError("the model process crashed")

    failed = load_settings({}, model="m", runs_dir=runs / "failed", extraction_model="none")
    run_ask("Capitals?", failed, inner=lambda role: FunctionModel(crashing, model_id="m"), web_tools=[],
        show_progress=False)
    return {name: next((runs / name).iterdir()) for name in ("demo", "run", "failed")}


def test_every_kind_of_record_validates_against_the_published_schema(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))
    folders = _records(tmp_path, monkeypatch, capsys)
    for name, folder in folders.items():
        data = json.loads((folder / "result.json").read_text(encoding="utf-8"))
        assert not list(validator.iter_errors(data)), (name, [e.message for e in validator.iter_errors(data)][:3])
        record = RunRecord.read(folder)
        assert record.version == RECORD_VERSION and record.to_json() == data
    assert RunRecord.read(folders["demo"]).kind == "demo" and RunRecord.read(folders["failed"]).status == "failed"
    failed = RunRecord.read(folders["failed"])
    assert failed.error and "the model process crashed" in failed.error and failed.completeness.rows == 0
    made = RunRecord.read(folders["run"])
    assert made.kind == "mapreduce_run" and made.decision is not None and made.table is not None
    table = Table.from_json(made.table.model_dump(mode="json"))
    assert table.to_json() == made.table.model_dump(mode="json", exclude_unset=True)
    assert table.find({"country": "France"}) is not None and table.rows[0].cells["capital"].value == "Paris"

    assert main(["runs", "show", str(folders["run"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == made.to_json()  # `runs show --json` prints the record


def test_a_folder_written_before_versions_reads_as_version_zero(tmp_path: Path) -> None:
    record = {"kind": "ask", "query": "q", "status": "failed", "error": "boom", "error_type": "RuntimeError",
              "completeness": {"rows": 0, "expected_rows": None, "missing_cells": 0, "incomplete_tasks": 0,
                               "complete": False, "mapreduce_calls": None, "executions": 0, "batches": 0,
                               "patch_rounds": 0, "attempts": 0, "retries": 0, "timeouts": 0, "failures": 0,
                               "backups": 0},
              "usage": {"by_role": {}, "total": {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                                 "cached_tokens": 0, "cost_usd": 0.0}, "unpriced_models": []},
              "timings": {"wall_s": 0.1, "executions": []}}
    (tmp_path / "result.json").write_text(json.dumps(record), encoding="utf-8")
    old = RunRecord.read(tmp_path)
    assert old.version == 0 and old.error == "boom" and old.to_json() == {"version": 0, **record}


def test_a_record_the_schema_does_not_know_is_refused_before_it_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="surprise"):
        RunRecord.of({"kind": "ask", "query": "q", "status": "complete", "surprise": 1})
    (tmp_path / "result.json").write_text('{"kind": "nonsense"}', encoding="utf-8")
    with pytest.raises(UserError, match="is not a run record"):
        RunRecord.read(tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        RunRecord.read(tmp_path / "missing")
