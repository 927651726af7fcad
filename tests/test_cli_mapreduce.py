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
