"""`amapreduce memory ...`: every command, through `main(argv)`, in text and --json modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_memory_fixtures import QUERY, ranked_store

from amapreduce.cli import memory as memory_cli
from amapreduce.cli.app import main
from amapreduce.testing.scripted import FunctionModel


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    capsys.readouterr()
    assert main(["memory", *argv, "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)  # exactly one JSON document


@pytest.fixture()
def store(tmp_path: Path) -> str:
    ranked_store(tmp_path / "store")[0].close()
    return str(tmp_path / "store")


def test_search_json_shape_and_order(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "search", QUERY, "--store", store)
    assert isinstance(data, dict) and set(data) == {"positives", "negatives", "hints", "prior", "advice"}
    assert data["advice"] is None  # no draft decision given: nothing to compute advice for
    assert [p["id"] for p in data["positives"]] == ["P1", "P2", "P3", "P4"]
    assert data["positives"][0] == {"id": "P1", "query": "question P1", "similarity": pytest.approx(0.9)}
    assert [n["id"] for n in data["negatives"]] == ["N1", "N2"]
    assert data["hints"] == [{"id": "hB", "text": "hint hB.", "w": 6, "v": 1, "s": 7, "advice": None},
                             {"id": "hE", "text": "hint hE.", "w": 3, "v": 2, "s": 5, "advice": None},
                             {"id": "hA", "text": "hint hA.", "w": 1, "v": 3, "s": 4, "advice": None}]
    assert "- hint hB." in data["prior"]
    data = run_json(capsys, "search", QUERY, "--store", store, "--task-id", "T-P1", "--k-hints", "1")
    assert data["positives"][0]["id"] == "P2" and [h["id"] for h in data["hints"]] == ["hD"]


def test_search_text_mode(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "search", QUERY, "--store", store]) == 0
    out = capsys.readouterr().out
    assert "s=7 w=6 v=1  hB  hint hB." in out and "Prior (raw hints, not projected):" in out


def test_list_filters_and_sorts(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    both = run_json(capsys, "list", "--store", store)
    assert isinstance(both, list) and all("id" in i for i in both) and len(both) == 13
    hints = run_json(capsys, "list", "--hints", "--store", store)
    assert [h["id"] for h in hints] == ["hD", "hB", "hE", "hC", "hA"]  # best score first
    assert run_json(capsys, "list", "--hints", "--sort", "support", "--desc", "--limit", "1", "--store", store)[0]["id"] == "hA"
    negatives = run_json(capsys, "list", "--records", "--label", "negative", "--store", store)
    assert [r["id"] for r in negatives] == ["N1", "N2", "N3"] and all(r["type"] == "record" for r in negatives)
    assert [r["id"] for r in run_json(capsys, "list", "--records", "--contains", "p4", "--store", store)] == ["P4"]
    assert main(["memory", "list", "--label", "maybe", "--store", store]) == 2
    assert main(["memory", "list", "--hints", "--sort", "colour", "--store", store]) == 2


def test_show_record_and_hint(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    rec = run_json(capsys, "show", "P1", "--store", store)
    assert rec["type"] == "record" and rec["task_id"] == "T-P1" and sorted(rec["hints"]) == ["hA", "hE"]
    hint = run_json(capsys, "show", "hE", "--store", store)
    assert hint["provenance"] == ["P1", "N1"] and hint["w"] == 3 and hint["events"][0]["kind"] == "hint_added"
    assert main(["memory", "show", "zzz", "--store", store]) == 2
    assert "no record or hint with id 'zzz'" in capsys.readouterr().err


def test_stats(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "stats", "--store", store)
    assert (data["records"], data["positive"], data["negative"], data["hints"]) == (8, 5, 3, 5)
    assert data["score_histogram"] == {"1": 1, "2": 1, "3": 1, "6": 1, "10": 1}
    assert data["clusters"] == {"none": 8} and data["encoder"] == "test:vectors"
    assert main(["memory", "stats", "--store", store]) == 0
    assert "records: 8" in capsys.readouterr().out


def test_add_edit_remove_and_prune(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    added = run_json(capsys, "add", "Check  totals twice.", "--score", "1", "--provenance", "P2", "--store", store)
    assert added["text"] == "Check totals twice." and added["w"] == 1
    edited = run_json(capsys, "edit", added["id"], "--score", "0", "--store", store)
    assert edited["w"] == 0
    assert main(["memory", "edit", added["id"], "--store", store]) == 2  # nothing to edit
    dry = run_json(capsys, "prune", "--threshold", "1", "--dry-run", "--store", store)
    assert sorted(h["id"] for h in dry["pruned"]) == sorted(["hA", added["id"]])
    assert len(run_json(capsys, "list", "--hints", "--store", store)) == 6  # dry run removed nothing
    done = run_json(capsys, "prune", "--store", store)  # default threshold 0
    assert [h["id"] for h in done["pruned"]] == [added["id"]]
    assert run_json(capsys, "remove", "hD", "--store", store) == {"id": "hD", "removed": True}
    assert [h["id"] for h in run_json(capsys, "list", "--hints", "--store", store)] == ["hB", "hE", "hC", "hA"]
    assert main(["memory", "remove", "hD", "--store", store]) == 2
    assert main(["memory", "add", "x", "--provenance", "missing", "--store", store]) == 2


def test_export_import_round_trip(store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dump.jsonl"
    assert run_json(capsys, "export", str(out), "--store", store) == {"file": str(out), "records": 8, "hints": 5}
    target = str(tmp_path / "copy")
    result = run_json(capsys, "import", str(out), "--store", target, "--encoder", "test:vectors")
    assert result == {"file": str(out), "records": 8, "hints": 5, "skipped": 0}
    assert run_json(capsys, "search", QUERY, "--store", target) == run_json(capsys, "search", QUERY, "--store", store)
    ref = tmp_path / "insights.json"
    ref.write_text(json.dumps([{"rule": "Ref rule.", "score": 4, "correlation_tasks": ["question N2"]}]))
    assert run_json(capsys, "import", str(ref), "--store", target)["linked"] == 1
    assert main(["memory", "import", str(tmp_path / "nope.jsonl"), "--store", target]) == 2


def test_distill_dry_run_and_with_a_model(store: str, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    dry = run_json(capsys, "distill", "--dry-run", "--store", store)
    assert dry["dry_run"] is True and dry["records"] == 8 and dry["calls"]
    assert main(["memory", "distill", "--store", store]) == 2  # no model given
    model = FunctionModel(lambda m, i: "ADD: Split matrices larger than fifty rows.\n1. merged rule")
    seen = []
    monkeypatch.setattr(memory_cli, "_build_model", lambda mid, settings: seen.append((mid, settings.api_base)) or model)
    report = run_json(capsys, "distill", "--model", "m", "--api-base", "http://127.0.0.1:9", "--no-merge",
                      "--store", store)
    assert seen == [("m", "http://127.0.0.1:9")] and report["dry_run"] is False and model.calls == len(report["calls"])
    hints = run_json(capsys, "list", "--hints", "--contains", "fifty rows", "--store", store)
    assert [h["text"] for h in hints] == ["Split matrices larger than fifty rows."]
    assert run_json(capsys, "stats", "--store", store)["clusters"] != {"none": 8}


def test_reindex_and_errors_for_bad_stores(store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_json(capsys, "reindex", "--store", store) == {"vectors": 8}
    # A missing store is "not found", exit 2 like every other (was 1: a newcomer's first hour, issue 16).
    assert main(["memory", "stats", "--store", str(tmp_path / "absent")]) == 2
    assert "no memory store at" in capsys.readouterr().err and not (tmp_path / "absent").exists()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "memory.sqlite3").write_bytes(b"garbage" * 1000)
    assert main(["memory", "list", "--store", str(bad)]) == 2  # not a store: bad input (issue 17)
    assert "is empty or not an amapreduce memory store" in capsys.readouterr().err


def test_default_store_comes_from_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AMAPREDUCE_MEMORY_STORE", str(tmp_path / "envstore"))
    added = run_json(capsys, "add", "From the environment.")
    assert (tmp_path / "envstore" / "memory.sqlite3").exists() and added["w"] == 2


def test_cli_startup_imports_no_heavy_library() -> None:
    import subprocess
    import sys

    code = ("import sys, amapreduce.cli.app; heavy = {'torch', 'faiss', 'numpy', 'sentence_transformers', 'finch', "
            "'amapreduce.memory'}; print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_search_with_a_draft_decision_shows_the_typed_advice(store: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps({"task_matrix": [["a"], ["b"]], "template": "Facts of __0__",
                                 "json_schema": ["name", "capital"], "batch_size": 1}))
    data = run_json(capsys, "search", QUERY, "--store", store, "--decision", str(draft))
    assert set(data["advice"]) >= {"shape", "draft", "similar_records", "choices", "proposal", "rule", "hints"}
    assert data["advice"]["shape"] == {"rows": 2, "matrix_cols": 1, "cols": 2}
    assert data["advice"]["draft"] == {"strategy": "per_atom", "batch_size": 1}
