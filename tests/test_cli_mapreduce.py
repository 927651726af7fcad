"""`amapreduce mapreduce plan` and `run`: the --json contract, exit code 2 with a one-line reason, and the
batch cap (flag > `AMAPREDUCE_MAX_BATCHES` > no cap on a decision the user wrote)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from amapreduce.cli.app import main


def test_plan_json_contract(repo_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mapreduce", "plan", str(repo_root / "examples" / "decision.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_rows"] == 7 and out["strategy"] == "by_attr"
    assert [b["indices"] for b in out["batches"]] == [[0, 1], [2, 3], [4, 5], [6]]
    assert set(out["batches"][0]) == {"batch_id", "indices", "size", "rationale"}


def test_plan_human_output(repo_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mapreduce", "plan", str(repo_root / "examples" / "decision.json")]) == 0
    out = capsys.readouterr().out
    assert "7 atomic tasks → 4 batches" in out and "batch-004" in out


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "does not exist"),
        ("{oops", "is not valid JSON"),
        ('{"task_matrix": [], "template": "x", "json_schema": ["a"]}', "task_matrix is empty"),
        ('{"task_matrix": [["a"]], "template": "__0__", "json_schema": ["a"], "batch_strategy": {"type": "zigzag"}}', "unknown batch strategy"),
    ],
)
def test_invalid_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, reason: str) -> None:
    path = tmp_path / "d.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    assert main(["mapreduce", "plan", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert reason in captured.err and len(captured.err.strip().splitlines()) == 1
    assert "Traceback" not in captured.err


def test_too_many_batches_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"task_matrix": [[f"e{i}"] for i in range(9)], "template": "__0__", "json_schema": ["a"]}))
    assert main(["mapreduce", "plan", str(path), "--max-batches", "5"]) == 2
    assert "9 batches, more than `max_batches`=5" in capsys.readouterr().err


def test_version_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("amapreduce ")
    assert main(["mapreduce", "plan"]) == 2
    assert main(["no-such-command"]) == 2


def test_plan_human_output_prints_user_text_verbatim(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rationales, templates and column names are user text: rich markup and emoji codes in them are not applied."""
    path = tmp_path / "d.json"
    decision = {
        "task_matrix": [["a"], ["b"]],
        "template": "Find [bold]x[/bold] :smile: __0__",
        "json_schema": ["col[/y]"],
        "batch_strategy": {"type": "per_atom", "rationale": "see [/x]"},
    }
    path.write_text(json.dumps(decision), encoding="utf-8")
    assert main(["mapreduce", "plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "columns: col[/y]; key: col[/y]" in out
    assert "see [/x]" in out
    assert "First sub-query: Find [bold]x[/bold] :smile: a" in out


def test_error_with_a_newline_is_printed_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from amapreduce.errors import DecisionError

    def broken(path: str, **caps: int) -> None:
        raise DecisionError("invalid decision: foo\nbar: unknown field.")

    monkeypatch.setattr("amapreduce.decision.model.load_decision", broken)
    assert main(["mapreduce", "plan", str(tmp_path / "d.json")]) == 2
    assert capsys.readouterr().err == "error: invalid decision: foo bar: unknown field.\n"


def test_unknown_key_with_a_newline_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"task_matrix": [["a"]], "template": "__0__", "json_schema": ["a"], "foo\nbar": 1}))
    assert main(["mapreduce", "plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "'foo\\nbar': unknown field" in err


@pytest.mark.parametrize("kind", ["long name", "symlink loop", "deep nesting"])
def test_unreadable_files_exit_2_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    path = tmp_path / "d.json"
    if kind == "long name":
        path = tmp_path / ("x" * 300 + ".json")
    elif kind == "symlink loop":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        path = tmp_path / "a"
    else:
        path.write_text("[" * 200_000 + "]" * 200_000, encoding="utf-8")
    assert main(["mapreduce", "plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_utf8_bom_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "d.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"task_matrix": [["a"]], "template": "__0__", "json_schema": ["a"]}).encode())
    assert main(["mapreduce", "plan", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_rows"] == 1


def per_atom_decision(tmp_path: Path, rows: int) -> Path:
    """A user's own `per_atom` decision: one batch per row."""
    path = tmp_path / f"per_atom_{rows}.json"
    path.write_text(json.dumps({
        "task_matrix": [[f"item{i:03d}"] for i in range(rows)],
        "template": "What is the code of __0__?",
        "json_schema": {"type": "object", "properties": {"item": {}, "code": {"description": "the item's code"}}},
        "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
    }), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("env", "flag", "cap"),
    [
        (None, None, None),  # default: a decision the user wrote is not capped
        ("50", None, 50),  # the environment caps it
        ("50", "70", 70),  # the flag wins over the environment
        (None, "70", 70),
    ],
)
def test_plan_max_batches_flag_then_environment_then_no_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, env: str | None, flag: str | None, cap: int | None
) -> None:
    if env is not None:
        monkeypatch.setenv("AMAPREDUCE_MAX_BATCHES", env)
    argv = ["mapreduce", "plan", str(per_atom_decision(tmp_path, 100)), "--json", *(["--max-batches", flag] if flag else [])]
    if cap is None:
        assert main(argv) == 0
        assert len(json.loads(capsys.readouterr().out)["batches"]) == 100
    else:
        assert main(argv) == 2
        assert f"100 batches, more than `max_batches`={cap}" in capsys.readouterr().err


@pytest.mark.parametrize(("env", "flag", "cap"), [("50", None, 50), ("50", "70", 70), (None, "70", 70)])
def test_run_max_batches_flag_then_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, env: str | None, flag: str | None, cap: int
) -> None:
    """The cap is checked when the plan is made, before any model call: no server is needed."""
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "runs"))
    if env is not None:
        monkeypatch.setenv("AMAPREDUCE_MAX_BATCHES", env)
    argv = ["mapreduce", "run", str(per_atom_decision(tmp_path, 100)), "--model", "sim-model",
            "--api-base", "http://127.0.0.1:9/v1", "--json", *(["--max-batches", flag] if flag else [])]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"100 batches, more than `max_batches`={cap}" in captured.err and len(captured.err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # refused before a run directory


def test_run_without_a_cap_runs_a_100_row_per_atom_decision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The measured refusal of issue 10: a user's 100-row per_atom decision is 100 batches, and it runs."""
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.llm.messages import message_text
    from amapreduce.testing.openai_server import OpenAICompatibleServer
    from amapreduce.testing.scripted import FunctionModel, ModelInfo, final_answer

    def sub_agent(messages: list[Any], info: ModelInfo) -> Any:
        asked = re.findall(r"code of (item\d{3})\?", "\n".join(message_text(m) for m in messages).rsplit("Sub-questions:", 1)[-1])
        return final_answer(json.dumps([{"task": 1, "item": item, "code": item.upper()} for item in asked]))

    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "runs"))
    # Exactly one call per batch is asserted: backup attempts for stragglers, which a loaded machine's
    # slow replies may start, are off here (their own tests count them).
    monkeypatch.setenv("AMAPREDUCE_BACKUP", "off")
    with OpenAICompatibleServer(FunctionModel(sub_agent, model_id="sim-model")) as server, allow_model_requests():
        code = main(["mapreduce", "run", str(per_atom_decision(tmp_path, 100)), "--model", "sim-model",
                     "--api-base", server.base_url, "--workers", "8", "--json"])
        out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["status"] == "complete" and out["rows"] == 100 and out["missing_cells"] == 0
    assert "| item099 | ITEM099 |" in out["table_markdown"]
    assert out["usage"]["requests"] == 100  # one sub-agent call per batch: 100 batches, nothing refused or retried


def test_bad_retry_setting_exits_2_naming_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMAPREDUCE_RETRY_BASE_DELAY_S", "-1")
    assert main(["mapreduce", "run", str(per_atom_decision(tmp_path, 2)), "--model", "sim-model", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert "`AMAPREDUCE_RETRY_BASE_DELAY_S`" in captured.err and "got '-1'" in captured.err
