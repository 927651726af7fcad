"""`amapreduce mapreduce plan` on composed decisions: a `discover` decision shows its discovery map
(the fill stage's matrix is not known before discovery runs), a decision with a `child` says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amapreduce.cli.app import main

DISCOVER = {
    "discover": {
        "sources": ["https://atlas.example/lists/a.html", "https://atlas.example/lists/b.html",
                    "https://atlas.example/lists/c.html"],
        "template": "List every city on __0__ with its country.",
        "json_schema": ["City", "Country"],
        "key_columns": ["City", "Country"],
        "merge": "model",
        "token_budget": 4000,
    },
    "template": "Population of __0__ (__1__)",
    "json_schema": ["City", "Country", "Population"],
}
NESTED = {
    "task_matrix": [["2019"], ["2020"]],
    "template": "Top cities of __0__",
    "json_schema": ["Year", "City", "Population"],
    "key_columns": ["Year", "City"],
    "child": "top",
    "decisions": {"top": {"task_matrix": [["Paris"], ["Lyon"]], "template": "Population of __0__ in __parent_0__",
                          "json_schema": ["City", "Population"]}},
}


def _write(tmp_path: Path, data: dict[str, object]) -> str:
    path = tmp_path / "decision.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def test_a_discover_decision_plans_its_discovery_map(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mapreduce", "plan", _write(tmp_path, DISCOVER), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stage"] == "discover" and out["num_rows"] == 3 and len(out["batches"]) == 3
    assert "discovery" in out["note"]
    assert main(["mapreduce", "plan", _write(tmp_path, DISCOVER)]) == 0
    text = " ".join(capsys.readouterr().out.split())  # rich wraps lines at the terminal's width
    assert "discovery: 3 atomic tasks" in text
    assert "List every city on https://atlas.example/lists/a.html" in text
    assert "key: City, Country" in text


def test_a_nested_decision_plans_its_parent_tasks_and_names_the_child(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mapreduce", "plan", _write(tmp_path, NESTED), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stage"] == "fill" and out["num_rows"] == 2 and out["note"] == "Each task runs the child decision 'top'."
    plain = {k: v for k, v in NESTED.items() if k not in ("child", "decisions")}
    assert main(["mapreduce", "plan", _write(tmp_path, plain), "--json"]) == 0
    assert "note" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", ["decision.json", "discover.json", "nested.json"])
def test_every_example_decision_plans_and_the_readme_shows_it_as_it_is(
    repo_root: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each example decision is valid, and the guides show the composed ones exactly as the files
    hold them (the decision format's example is a shortened `decision.json`)."""
    path = repo_root / "examples" / name
    assert main(["mapreduce", "plan", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["batches"]
    guides = repo_root / "docs" / "guides"
    pages = "".join((guides / page).read_text(encoding="utf-8") for page in ("decisions.md", "discovery.md"))
    shown = [json.loads(block.split("```", 1)[0]) for block in pages.split("```json\n")[1:]]
    if name != "decision.json":
        assert json.loads(path.read_text(encoding="utf-8")) in shown
