"""Exit codes a script can trust, and nothing left behind by bad input (issue 16, points 2 and 7).

One mapping from how a run ended to the exit status, the same for `ask`, `mapreduce run`, `demo`,
`runs resume` and `eval run`: 0 complete, 3 incomplete (table saved), 4 stopped by a budget
(partial table saved), 1 failed, 2 bad input, 130 interrupted. Before, every finished run exited 0
(an incomplete table, no table at all) and every early end exited 1 (a budget stop as a crash, Ctrl-C
too). A command refused for bad input used to leave a `failed` run folder or an evaluation folder.

Offline throughout: the demo's simulated model in process, or a simulated model (deterministic
code, not an LLM) behind the loopback OpenAI-compatible server, which is the real client path.
"""

from __future__ import annotations

import _thread
import contextlib
import json
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from records import write_record

from amapreduce.cli.app import main
from amapreduce.cli.exit_codes import run_exit_code
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.mapreduce.result import RunStatus
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply, final_answer, tool_call

ITEMS = [f"item{i}" for i in range(6)]
DECISION = {
    "task_matrix": [[item] for item in ITEMS],
    "template": "What is the code of __0__?",
    "json_schema": {"type": "object", "properties": {"item": {}, "code": {"description": "the item's code"}}},
    "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
}
CLOSED_PORT = "http://127.0.0.1:9/v1"  # the discard port: nothing listens, every request is refused


class Items:
    """Plays the manager (it is offered `mapreduce`) and the sub-agents of a world where each item's
    code is its name in capitals.

    Args:
        missing: items whose code the sub-agents never find (their cell stays missing).
        interrupt_on: the sub-agent request (1-based) that presses Ctrl-C in the main thread.
        answer_only: the manager answers at once, without executing a decision.
    """

    def __init__(self, *, missing: set[str] | None = None, interrupt_on: int | None = None,
                 answer_only: bool = False) -> None:
        self.missing = missing or set()
        self.interrupt_on = interrupt_on
        self.answer_only = answer_only
        self.subagent_requests = 0
        self._lock = threading.Lock()

    def __call__(self, messages: list[Any], info: ModelInfo) -> Reply:
        text = "\n".join(message_text(m) for m in messages)
        if "mapreduce" in info.tools:
            if self.answer_only:
                return final_answer("I found no table to build.")
            if '"call_stage": "execute"' in text:
                return final_answer("Done.")
            return tool_call("mapreduce", **DECISION)  # the plan stage, then the same call executes
        with self._lock:
            self.subagent_requests += 1
            if self.subagent_requests == self.interrupt_on:
                _thread.interrupt_main()  # Ctrl-C, delivered to the main thread (the CLI's) as SIGINT would be
        asked = re.findall(r"code of (item\d+)\?", text.rsplit("Sub-questions:", 1)[-1])
        rows = [{"task": k, "item": item, "code": None if item in self.missing else item.upper()}
                for k, item in enumerate(asked, 1)]
        return final_answer(json.dumps(rows))


@contextlib.contextmanager
def serving(world: Items, *, model_id: str = "sim-model") -> Iterator[OpenAICompatibleServer]:
    """`world` behind the loopback OpenAI-compatible server, with model requests allowed."""
    with OpenAICompatibleServer(FunctionModel(world, model_id=model_id)) as server, allow_model_requests():
        yield server


@pytest.fixture(autouse=True)
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory: its `runs/` is the default runs folder; retries do not sleep."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AMAPREDUCE_RETRY_BASE_DELAY_S", "0")
    monkeypatch.setenv("AMAPREDUCE_RETRY_MAX_DELAY_S", "0")
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path


def decision_file(tmp_path: Path) -> str:
    path = tmp_path / "items.json"
    path.write_text(json.dumps(DECISION), encoding="utf-8")
    return str(path)


def down_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider that refuses every request is given up at once: the first refusal opens its
    breaker, and the retry finds it open (`ProviderUnavailable`: the run ends `failed`)."""
    for name, value in {"BREAKER_FAILURES": "1", "BREAKER_MAX_WAIT_S": "0", "RETRY_MAX_RETRIES": "1"}.items():
        monkeypatch.setenv(f"AMAPREDUCE_{name}", value)


def json_out(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_every_run_status_has_its_documented_exit_code() -> None:
    """The one mapping; `no_table` (the manager never built a table) counts as incomplete."""
    assert {s: run_exit_code(s) for s in RunStatus} == {
        RunStatus.COMPLETE: 0, RunStatus.INCOMPLETE: 3, RunStatus.NO_TABLE: 3, RunStatus.STOPPED: 4,
        RunStatus.FAILED: 1, RunStatus.INTERRUPTED: 130,
    }


@pytest.mark.parametrize("command", [["ask"], ["mapreduce", "run"], ["demo"], ["runs", "resume"], ["eval", "run"], []])
def test_help_documents_the_exit_codes(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit codes" in text and "1 failed" in text and "2 bad input" in text and "130 interrupted" in text
    if command == ["eval", "run"]:
        assert "0 the evaluation completed (answers that are incomplete included); 4 stopped by --max-cost" in text
    else:
        assert "0 complete; 3 incomplete (table saved); 4 stopped by a budget (partial table saved)" in text


# -- demo (the simulated model in process) ---------------------------------------------------------


def test_demo_with_missing_cells_exits_3_with_its_table_saved(capsys: pytest.CaptureFixture[str]) -> None:
    """`demo --faults 0.9` used to exit 0 with cells missing (seed 0 leaves some on this task)."""
    code = main(["demo", "sbx_en_005", "--faults", "0.9", "--seed", "0", "--no-memory", "--json"])
    out = json_out(capsys)
    assert out["status"] == "incomplete" and out["missing_cells"] > 0
    assert code == 3
    assert (Path(out["run_dir"]) / "table.md").is_file()


def test_demo_stopped_by_a_token_budget_exits_4(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AMAPREDUCE_MAX_TOKENS", "2000")
    code = main(["demo", "--no-memory", "--json"])
    out = json_out(capsys)
    assert out["status"].startswith("stopped: the token budget of 2000 is spent")
    assert code == 4  # was 1, as for a crash
    assert (Path(out["run_dir"]) / "table.md").is_file()


# -- ask -------------------------------------------------------------------------------------------


def test_ask_exits_0_complete_3_incomplete_3_without_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["ask", "What is the code of each item?", "--model", "sim-model", "--no-memory", "--json"]
    with serving(Items()) as server:
        assert main([*base, "--api-base", server.base_url]) == 0
        assert json_out(capsys)["status"] == "complete"
    with serving(Items(missing={"item3"})) as server:
        code = main([*base, "--api-base", server.base_url])
        out = json_out(capsys)
        assert out["status"] == "incomplete" and out["missing_cells"] == 1 and code == 3
    with serving(Items(answer_only=True)) as server:
        code = main([*base, "--api-base", server.base_url])
        assert json_out(capsys)["status"] == "no_table" and code == 3


def test_ask_tells_a_budget_stop_4_from_a_failure_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both used to exit 1: a script could not tell "raise the budget" from "the provider is down"."""
    base = ["ask", "What is the code of each item?", "--model", "sim-model", "--no-memory", "--json"]
    with serving(Items()) as server, monkeypatch.context() as m:
        m.setenv("AMAPREDUCE_MAX_TOKENS", "1")  # the first call spends it; the next one is refused
        code = main([*base, "--api-base", server.base_url])
        out = json_out(capsys)
    assert out["status"].startswith("stopped: the token budget of 1 is spent") and code == 4
    down_fast(monkeypatch)
    with allow_model_requests():
        code = main([*base, "--api-base", CLOSED_PORT])
    out = json_out(capsys)
    assert out["status"] == "failed" and code == 1
    # a failure after the run started leaves its `failed` run folder, and says how to go on with it
    assert json.loads((Path(out["run_dir"]) / "result.json").read_text())["status"] == "failed"
    assert out["resume"] == f"amapreduce runs resume {out['run_dir']}"
    with allow_model_requests():
        assert main([*base[:-1], "--api-base", CLOSED_PORT]) == 1
    assert "Continue it with: amapreduce runs resume " in capsys.readouterr().err


@pytest.mark.usefixtures("python_sigint")
def test_ask_interrupted_by_ctrl_c_exits_130(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serving(Items(interrupt_on=2)) as server:
        code = main(["ask", "What is the code of each item?", "--model", "sim-model", "--api-base", server.base_url,
                     "--workers", "1", "--no-memory", "--json"])
    assert code == 130  # was 1
    (run_dir,) = (workdir / "runs").iterdir()
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    assert result["status"] == "stopped: interrupted" and (run_dir / "table.md").is_file()
    capsys.readouterr()


# -- mapreduce run and runs resume ------------------------------------------------------------------


def test_mapreduce_run_exits_3_when_cells_are_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serving(Items(missing={"item1", "item4"})) as server:
        code = main(["mapreduce", "run", decision_file(tmp_path), "--model", "sim-model", "--api-base",
                     server.base_url, "--json"])
    out = json_out(capsys)
    assert out["status"] == "incomplete" and out["missing_cells"] == 2
    assert code == 3  # was 0
    assert (Path(out["run_dir"]) / "table.md").is_file()


def test_mapreduce_run_tells_a_budget_stop_4_from_a_failure_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["mapreduce", "run", decision_file(tmp_path), "--model", "sim-model", "--workers", "1", "--json"]
    with serving(Items()) as server, monkeypatch.context() as m:
        m.setenv("AMAPREDUCE_MAX_TOKENS", "1")
        code = main([*base, "--api-base", server.base_url])
        out = json_out(capsys)
    assert out["status"].startswith("stopped: the token budget of 1 is spent") and code == 4  # was 1
    assert out["rows"] == len(ITEMS) and (Path(out["run_dir"]) / "table.md").is_file()  # the partial table
    down_fast(monkeypatch)
    with allow_model_requests():
        code = main([*base, "--api-base", CLOSED_PORT])
    out = json_out(capsys)
    assert out["status"] == "failed" and code == 1


@pytest.mark.usefixtures("python_sigint")
def test_ctrl_c_exits_130_and_runs_resume_exits_by_how_the_resumed_run_ended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C used to exit 1; the resumed run that ends incomplete used to exit 0."""
    with serving(Items(interrupt_on=2)) as server:
        code = main(["mapreduce", "run", decision_file(tmp_path), "--model", "sim-model", "--api-base",
                     server.base_url, "--workers", "1", "--json"])
        out = json_out(capsys)
        assert out["status"] == "stopped: interrupted" and code == 130
        server.model = FunctionModel(Items(missing={"item5"}), model_id="sim-model")  # the rest: one code not found
        code = main(["runs", "resume", Path(out["run_dir"]).name, "--json"])
        resumed = json_out(capsys)
    assert resumed["run_dir"] == out["run_dir"] and resumed["status"] == "incomplete"
    assert code == 3


# -- eval run --------------------------------------------------------------------------------------


def test_eval_run_stopped_by_max_cost_exits_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The simulated sandbox model is free, so it is served and priced here: the first trial spends the
    budget and the second is never started. An evaluation stopped that way used to exit 1."""
    from amapreduce.demo.model import SimulatedAtlasModel

    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"simulated-sandbox": {"input": 1e-3, "output": 1e-3}}), encoding="utf-8")
    monkeypatch.setenv("AMAPREDUCE_PRICES_FILE", str(prices))
    with OpenAICompatibleServer(SimulatedAtlasModel(model_id="simulated-sandbox")) as server, allow_model_requests():
        code = main(["eval", "run", "--benchmark", "sandbox", "--ids", "sbx_en_005,sbx_en_001", "--no-memory",
                     "--model", "simulated-sandbox", "--api-base", server.base_url, "--max-cost", "0.01",
                     "--out", str(tmp_path / "ev"), "--json"])
    out = json_out(capsys)
    assert out["status"] == "stopped" and "--max-cost" in out["reason"]
    assert code == 4


# -- bad input creates nothing ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["ask", "q", "--model", "sim-model", "--api-base", CLOSED_PORT, "--search", "bing"],
        ["ask", "q", "--model", "sim-model", "--api-base", CLOSED_PORT, "--search", "searxng"],  # no URL
        ["ask", "q", "--model", "no-provider-prefix", "--no-memory"],  # neither provider/ nor --api-base
        ["mapreduce", "run", "DECISION", "--model", "sim-model", "--api-base", CLOSED_PORT, "--search", "bing"],
        ["mapreduce", "run", "DECISION", "--model", "no-provider-prefix"],
        ["eval", "run", "--benchmark", "sandbox", "--ids", "sbx_en_001", "--out", "ev", "--search", "bing"],
        ["eval", "run", "--benchmark", "sandbox", "--ids", "sbx_en_001", "--out", "ev", "--encoder", "bogus"],
        # a Ray cluster nothing answers at, and an MCP server that will not start (issue 26)
        ["mapreduce", "run", "DECISION", "--model", "sim-model", "--api-base", CLOSED_PORT, "--executor", "ray:127.0.0.1:9"],
        ["ask", "q", "--model", "sim-model", "--api-base", CLOSED_PORT, "--no-memory", "--executor", "ray:127.0.0.1:9"],
        ["mapreduce", "run", "DECISION", "--model", "sim-model", "--api-base", CLOSED_PORT, "--mcp", "MCP"],
    ],
)
def test_bad_input_exits_2_and_creates_no_run_folder(
    argv: list[str], workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """These used to leave a `failed` run in runs/ (or, for `eval run`, an evaluation folder with a
    store, and `--search bing` even ran it: every trial failed and the evaluation exited 0)."""
    mcp = workdir / "mcp.json"
    mcp.write_text(json.dumps({"mcpServers": {"dies": {"command": sys.executable,
                                                       "args": ["-c", "import sys; sys.exit(3)"]}}}))
    argv = [decision_file(workdir) if a == "DECISION" else str(mcp) if a == "MCP" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert not (workdir / "runs").exists() and not (workdir / "ev").exists()


# -- runs list names its folder ---------------------------------------------------------------------


def test_runs_list_says_which_folder_it_read(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """In a folder without runs/ it used to print an empty table, as if there were no runs anywhere."""
    assert main(["runs", "list"]) == 0
    out = capsys.readouterr().out
    assert str(workdir.resolve() / "runs") in out and "no such folder" in out and "--runs-dir" in out
    assert main(["runs", "list", "--json"]) == 0
    assert json_out(capsys) == {"runs_dir": str(workdir.resolve() / "runs"), "runs": []}
    other = workdir / "elsewhere"
    run = other / "20260101-000000-q"
    write_record(run)
    assert main(["runs", "list", "--runs-dir", str(other)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Runs in {other.resolve()}:") and run.name in out
    assert main(["runs", "list", "--runs-dir", str(other), "--status", "failed"]) == 0
    assert f"No runs with status failed in {other.resolve()}" in capsys.readouterr().out
    assert main(["runs", "list", "--runs-dir", str(other), "--json"]) == 0
    listed = json_out(capsys)
    assert listed["runs_dir"] == str(other.resolve()) and [r["run"] for r in listed["runs"]] == [run.name]


def test_demo_whose_manager_model_fails_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A manager whose own model call fails (not a budget, not an outage) is a failed run, not a budget stop."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AMAPREDUCE_RETRY_BASE_DELAY_S", "0")
    monkeypatch.setenv("AMAPREDUCE_RETRY_MAX_DELAY_S", "0")
    code = main(["demo", "sbx_en_001", "--faults", "0.6", "--seed", "1", "--no-memory", "--json"])
    assert json.loads(capsys.readouterr().out)["status"] == "failed" and code == 1
