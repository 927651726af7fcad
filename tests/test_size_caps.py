"""Hostile sizes (issue 29, point 3): caps checked before anything is spent, with clear errors,
and cells cut with a marker instead of sent whole. Every input here is generated."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amapreduce._text import MAX_CELL_CHARS
from amapreduce.cli.app import main
from amapreduce.decision.model import DEFAULT_MAX_BYTES, Decision
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.mapreduce.replies import cell_text
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, final_answer
from amapreduce.trace import MAX_TRACE_TEXT, TraceWriter, read_trace

SCHEMA = {"type": "object", "properties": {"item": {}, "code": {"description": "the item's code"}}}


def write_decision(path: Path, rows: list[list[str]], **extra: Any) -> Path:
    path.write_text(json.dumps({"task_matrix": rows, "template": "What is the code of __0__?",
                                "json_schema": SCHEMA, **extra}), encoding="utf-8")
    return path


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_a_decision_over_the_default_size_cap_is_refused_before_it_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "huge.json"
    with path.open("w", encoding="utf-8") as handle:  # ~17 MB of rows, written without holding it
        handle.write('{"template": "What is the code of __0__?", "json_schema": ["item", "code"], "task_matrix": [')
        handle.write(",".join(f'["item{i:07d}"]' for i in range(1_300_000)))
        handle.write("]}")
    assert path.stat().st_size > DEFAULT_MAX_BYTES
    for command in (["mapreduce", "plan", str(path), "--json"], ["mapreduce", "run", str(path), "--model", "m"]):
        assert main(command) == 2
        err = one_error_line(capsys)
        assert f"over the {DEFAULT_MAX_BYTES:,}-byte cap" in err and "AMAPREDUCE_MAX_DECISION_BYTES" in err
    assert not (tmp_path / "runs").exists()


def test_the_size_and_row_caps_are_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_decision(tmp_path / "d.json", [[f"item{i:03d}"] for i in range(11)])
    monkeypatch.setenv("AMAPREDUCE_MAX_DECISION_ROWS", "10")
    assert main(["mapreduce", "plan", str(path)]) == 2
    assert "11 task_matrix rows, over the 10-row cap" in one_error_line(capsys)
    assert main(["mapreduce", "run", str(path), "--model", "m"]) == 2
    assert "AMAPREDUCE_MAX_DECISION_ROWS" in one_error_line(capsys)
    monkeypatch.setenv("AMAPREDUCE_MAX_DECISION_ROWS", "11")
    monkeypatch.setenv("AMAPREDUCE_MAX_DECISION_BYTES", str(path.stat().st_size - 1))
    assert main(["mapreduce", "plan", str(path)]) == 2
    assert "byte cap" in one_error_line(capsys)
    monkeypatch.setenv("AMAPREDUCE_MAX_DECISION_BYTES", str(path.stat().st_size))
    assert main(["mapreduce", "plan", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_rows"] == 11
    assert not (tmp_path / "runs").exists()


def test_a_long_matrix_cell_is_cut_with_a_marker() -> None:
    decision = Decision.parse({"task_matrix": [["a" * 50_000], ["b"]], "template": "What is the code of __0__?",
                               "json_schema": SCHEMA})
    cell = decision.task_matrix[0][0]
    assert cell.startswith("a" * MAX_CELL_CHARS) and cell.endswith(f"… [cut: {50_000 - MAX_CELL_CHARS} more characters]")
    assert len(decision.task_text(0)) < MAX_CELL_CHARS + 100
    assert decision.task_matrix[1] == ["b"]


def test_a_long_reply_cell_is_cut_with_a_marker() -> None:
    assert cell_text("z" * (MAX_CELL_CHARS + 5)) == "z" * MAX_CELL_CHARS + "… [cut: 5 more characters]"
    assert cell_text("short") == "short"


def test_the_trace_keeps_at_most_max_trace_text_of_one_field(tmp_path: Path) -> None:
    trace = TraceWriter(tmp_path / "trace.jsonl")
    trace.write("model_call", output="r" * (MAX_TRACE_TEXT * 3), messages=[{"content": "m" * (MAX_TRACE_TEXT + 1)}])
    trace.close()
    (event,) = read_trace(tmp_path / "trace.jsonl")
    assert event["output"].endswith(f"… [cut: {MAX_TRACE_TEXT * 2} more characters, not kept in the trace]")
    assert event["messages"][0]["content"].startswith("m" * MAX_TRACE_TEXT)
    assert (tmp_path / "trace.jsonl").stat().st_size < 3 * MAX_TRACE_TEXT


def test_a_large_plan_is_summarised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_decision(tmp_path / "d.json", [[f"item{i:04d}"] for i in range(500)],
                          batch_strategy={"type": "per_atom", "rationale": "one each"})
    assert main(["mapreduce", "plan", str(path), "--max-batches", "1000"]) == 0
    out = capsys.readouterr().out
    assert "500 atomic tasks → 500 batches" in out and "475 more batches" in out
    shown = set(re.findall(r"\bb\d+\b", out))
    assert len(shown) <= 25, sorted(shown)
    assert main(["mapreduce", "plan", str(path), "--max-batches", "1000", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["batches"]) == 500  # --json lists every batch


def huge_cell_agent(messages: list[Any], info: ModelInfo) -> Any:
    """A sub-agent whose answer has a 2 MB cell."""
    text = "\n".join(message_text(m) for m in messages).rsplit("Sub-questions:", 1)[-1]
    items = re.findall(r"code of (item\d{3})\?", text)
    return final_answer(json.dumps([{"task": 1, "item": i, "code": "c" * 2_000_000} for i in items]))


@pytest.fixture
def server() -> Iterator[OpenAICompatibleServer]:
    with OpenAICompatibleServer(FunctionModel(huge_cell_agent, model_id="sim-model")) as srv:
        yield srv


def test_a_reply_with_a_huge_cell_keeps_it_cut_in_the_table_and_the_trace(
        server: OpenAICompatibleServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = write_decision(tmp_path / "d.json", [["item000"], ["item001"]])
    monkeypatch.setenv("OPENAI_API_KEY", "sk-size-caps-test")
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "runs"))
    with allow_model_requests():
        code = main(["mapreduce", "run", str(path), "--model", "sim-model", "--api-base", server.base_url, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    run_dir = Path(out["run_dir"])
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    cells = [row["cells"]["code"]["value"] if isinstance(row["cells"]["code"], dict) else row["cells"]["code"]
             for row in result["table"]["rows"]]
    assert all(c.endswith("more characters]") and len(c) < MAX_CELL_CHARS + 50 for c in cells), [c[-60:] for c in cells]
    assert (run_dir / "trace.jsonl").stat().st_size < 2_000_000  # two 2 MB replies, each cut to 100,000 characters
