"""`amapreduce eval run` stops the whole evaluation when the provider refuses a trial for good.

A wrong key (HTTP 401) or a model the provider does not serve refuses every trial the same way, so
the evaluation must end at the first refusal (exit 1, one `error:` line) instead of sending one more
refused request per remaining trial; what finished stays, and `--resume` with the right key goes on.
The server is a loopback OpenAI-compatible one whose model is the simulated one (code, not an LLM).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amapreduce.cli.app import main
from amapreduce.demo.serve import serving_model
from amapreduce.llm.guard import allow_model_requests
from amapreduce.mapreduce.result import RunEnding, RunStatus, stop_ending
from amapreduce.testing.openai_server import OpenAICompatibleServer

RIGHT_KEY = "sk-right-key-0123456789abcdef"
WRONG_KEY = "sk-wrong-key-9876543210fedcba"


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AMAPREDUCE_RETRY_BASE_DELAY_S", "0")
    monkeypatch.setenv("AMAPREDUCE_RETRY_MAX_DELAY_S", "0")


def _journal(folder: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (folder / "journal.jsonl").read_text().splitlines()[1:]]


def _files_holding(folder: Path, text: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_a_wrong_key_stops_the_evaluation_at_its_first_request_and_resume_continues(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ev"
    args = ["eval", "run", "--benchmark", "sandbox", "--limit", "3", "--trials", "2", "--model", "m",
            "--encoder", "hashing", "--out", str(out)]
    monkeypatch.setenv("AMAPREDUCE_API_KEY", WRONG_KEY)
    with OpenAICompatibleServer(serving_model(), api_key=RIGHT_KEY) as server, allow_model_requests():
        code = main([*args, "--api-base", server.base_url])
        refused = server.request_count
        err = capsys.readouterr().err
        assert code == 1
        assert refused == 1  # one refused request, not one per remaining trial
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "HTTP 401" in errors[0] and "--resume" in errors[0]
        journal = _journal(out)
        assert not any(e["type"] in ("trial_done", "instance_committed") for e in journal)  # the refused trial is not done
        ended = [e for e in journal if e["type"] == "eval_ended"]
        assert len(ended) == 1 and ended[0]["status"] == "stopped" and "HTTP 401" in str(ended[0]["reason"])
        assert not (out / "results.json").exists()
        assert _files_holding(tmp_path, WRONG_KEY) == [] and _files_holding(tmp_path, RIGHT_KEY) == []

        monkeypatch.setenv("AMAPREDUCE_API_KEY", RIGHT_KEY)  # the key fixed: the same evaluation goes on
        code = main(["eval", "run", "--resume", str(out), "--api-base", server.base_url])
        assert server.request_count > refused
    assert code == 0
    journal = _journal(out)
    assert sum(e["type"] == "trial_done" for e in journal) == 6
    assert sum(e["type"] == "instance_committed" for e in journal) == 3
    assert [e["status"] for e in journal if e["type"] == "eval_ended"] == ["stopped", "complete"]
    results = json.loads((out / "results.json").read_text())
    assert len(results["per_task"]) == 3
    assert _files_holding(tmp_path, WRONG_KEY) == [] and _files_holding(tmp_path, RIGHT_KEY) == []


def test_only_a_refusal_marks_its_ending_as_refused() -> None:
    """`RunEnding.rejected` comes from the error's type (`stop_ending`), the one place that knows it."""
    from amapreduce.errors import BudgetExceeded, ProviderRejected, ProviderUnavailable

    refused = stop_ending(ProviderRejected("model m was refused: HTTP 401", provider="p", status=401, failures=1,
                                           last_error="AuthenticationError"))
    down = stop_ending(ProviderUnavailable("p is down", provider="p", failures=5, last_error="timeout"))
    assert refused.rejected and refused.status is RunStatus.FAILED
    assert not down.rejected and down.status is RunStatus.FAILED
    assert not stop_ending(BudgetExceeded("token budget spent")).rejected
    assert not RunEnding(RunStatus.COMPLETE).rejected
