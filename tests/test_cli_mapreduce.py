"""`amapreduce mapreduce plan`: the --json contract and exit code 2 with a one-line reason."""

from __future__ import annotations

import json
from pathlib import Path

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

    def broken(path: str) -> None:
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
