"""`amapreduce demo`: offline, simulated model, exactly one JSON document with `--json`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amapreduce.cli.app import main

KEYS = {"task_id", "status", "rows", "missing_cells", "completeness", "score", "score_corrected", "score_corrections",
        "run_dir", "table_markdown", "memory", "evidence"}
METRICS = {"score", "precision_by_row", "recall_by_row", "f1_by_row", "precision_by_item", "recall_by_item", "f1_by_item"}


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("AMAPREDUCE_RUNS_DIR", "AMAPREDUCE_CACHE_DIR", "AMAPREDUCE_MODEL", "AMAPREDUCE_SEARCH_BACKEND"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("extra", [[], ["--faults", "0.3", "--seed", "11"]])
def test_demo_json_scores_success_one(extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *extra, "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)  # exactly one JSON document on stdout
    assert set(out) == KEYS and set(out["score"]) == METRICS
    assert out["task_id"] == "sbx_en_001" and out["rows"] == 14 and out["missing_cells"] == 0
    assert out["score"]["score"] == 1.0 and out["score"]["f1_by_item"] == 1.0
    assert out["evidence"] == {"verified": 14 * 4, "unverified": 0, "no_evidence": 0}  # the Country cells are the matrix's
    assert out["table_markdown"].startswith("```markdown\n| Country | Capital | Population | Area (km2) | Currency Code |")
    run_dir = Path(out["run_dir"])
    assert run_dir.is_dir() and run_dir.parent.resolve() == (tmp_path / "runs").resolve()
    assert "simulated" in captured.err.lower() and "not an llm" in captured.err.lower()


def test_demo_text_output_says_simulated(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "sbx_en_005"]) == 0
    out = capsys.readouterr().out
    assert "| Austria | Vienna | 83858 | 8847037 |" in out
    assert "27 rows, 0 missing cells" in out and "success 1" in out
    assert "Model: simulated (not an LLM)" in out and "Run directory: runs" in out


def test_unknown_task_exits_2_with_the_ids(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "sbx_en_999"]) == 2
    err = capsys.readouterr().err
    assert "unknown sandbox task 'sbx_en_999'" in err and "sbx_en_001, sbx_en_002, sbx_en_003, sbx_en_004, sbx_en_005" in err


def test_fault_rate_out_of_range_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--faults", "1.5"]) == 2


def test_demo_teaches_its_memory_and_the_next_task_of_the_family_uses_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "sbx_en_001", "--sample", "1", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    store = tmp_path / ".amapreduce-cache" / "demo-memory"
    assert Path(first["memory"]["store"]).resolve() == store.resolve() and first["memory"]["prior"]["hint_ids"] == []
    learned = first["memory"]["learned"]
    assert learned["committed"] and learned["label"] is True and learned["records"] == 1
    assert learned["distillation"]["created"] == 1 and learned["hints"] == 1
    assert main(["demo", "sbx_en_008", "--json"]) == 0  # the same question family, another continent
    second = json.loads(capsys.readouterr().out)
    prior = second["memory"]["prior"]
    assert len(prior["hint_ids"]) == 1 and "put up to 3 rows in one sub-agent batch" in prior["text"]
    decision = json.loads((Path(second["run_dir"]) / "result.json").read_text())["decisions"][0]
    assert decision["batch_size"] == 3 and decision["batch_strategy"]["rationale"].startswith("following the typed advice")
    credit = second["memory"]["learned"]["prior_hints"]
    assert [(c["w_before"], c["w_after"]) for c in credit] == [(2, 4)]  # +2: the run succeeded
    assert second["memory"]["learned"]["records"] == 2


def test_demo_without_memory_makes_no_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "sbx_en_005", "--no-memory", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["memory"] is None
    assert not (tmp_path / ".amapreduce-cache" / "demo-memory").exists()
    assert main(["demo", "--no-memory", "--memory", str(tmp_path / "m")]) == 2
