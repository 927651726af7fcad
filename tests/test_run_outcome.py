"""One typed run outcome (issue 10, point 3): one status enum, one completeness structure, one
definition of "complete" — a task that yields fewer than `rows_per_task` rows is incomplete in
`ask`, `mapreduce run`, the demo's JSON, `result.json` and the tool's summary alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sessions import ask as run_ask
from sessions import offline_settings, tool_session
from solvers import WorldSolver, world, world_decision

from amapreduce.cli.app import main
from amapreduce.decision.model import Decision
from amapreduce.demo.run import DemoOutcome
from amapreduce.errors import BudgetExceeded
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.result import Completeness, RunEnding, RunStatus
from amapreduce.mapreduce.solver import BatchRequest
from amapreduce.settings import load_settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, final_answer, tool_call

CITIES = {"Asia": ["Tokyo", "Delhi"], "Europe": ["Moscow", "London"]}
SHORT = {  # asks three cities per region; the sub-agents only ever find two
    "task_matrix": [[region] for region in CITIES],
    "template": "The three largest cities of __0__",
    "json_schema": {"type": "object", "properties": {"region": {}, "rank": {}, "city": {}}},
    "key_columns": ["region", "rank"],
    "rows_per_task": 3,
    "batch_strategy": {"type": "per_atom", "rationale": "one region each"},
}


def short_of_rows(messages: list[Any], info: ModelInfo) -> Any:
    text = "\n".join(message_text(m) for m in messages)
    if "mapreduce" in info.tools:
        if '"call_stage": "execute"' in text:
            return final_answer("Done.")
        return tool_call("mapreduce", **SHORT)
    tasks = text.rsplit("Sub-questions:", 1)[-1]
    region = next(r for r in CITIES if f"cities of {r}" in tasks)
    return final_answer(
        json.dumps([{"task": 1, "rank": str(i), "city": c} for i, c in enumerate(CITIES[region], 1)])
    )


@pytest.fixture
def server() -> Any:
    with (
        OpenAICompatibleServer(FunctionModel(short_of_rows, model_id="sim-model")) as srv,
        allow_model_requests(),
    ):
        yield srv


def assert_short(completeness: dict[str, Any]) -> None:
    assert (
        completeness["rows"] == 4
        and completeness["expected_rows"] == 6
        and completeness["missing_cells"] == 0
    )
    assert completeness["incomplete_tasks"] == 2 and completeness["complete"] is False


def test_a_short_task_run_is_incomplete_everywhere(
    server: OpenAICompatibleServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = load_settings(
        {}, model="sim-model", api_base=server.base_url, api_key="k", runs_dir=tmp_path / "runs", workers=2
    )
    asked = run_ask("Three largest cities of Asia and Europe?", settings, web_tools=[], show_progress=False)
    assert asked.ending == RunEnding(RunStatus.INCOMPLETE) and asked.status == "incomplete"
    assert asked.completeness == Completeness(rows=4, expected_rows=6, missing_cells=0, incomplete_tasks=2)
    assert_short(asked.record.completeness.model_dump())
    saved = json.loads((asked.run_dir.path / "result.json").read_text())
    assert saved["status"] == "incomplete"
    assert_short(saved["completeness"])
    assert saved["completeness"]["mapreduce_calls"] == 2 and saved["completeness"]["executions"] == 1

    demo = DemoOutcome(task_id="t", ask=asked, score={}, faults={}).to_json()
    assert demo["status"] == "incomplete"
    assert_short(demo["completeness"])

    path = tmp_path / "short.json"
    path.write_text(json.dumps(SHORT), encoding="utf-8")
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("AMAPREDUCE_API_KEY", "k")
    from amapreduce.sandbox import sandbox_world

    index = sandbox_world(cache_dir=tmp_path / "cache").index_dir  # offline search for the sub-agents' tools
    monkeypatch.setenv("AMAPREDUCE_SEARCH_BACKEND", f"corpus:{index}")
    monkeypatch.setenv("AMAPREDUCE_CACHE_DIR", str(tmp_path / "cache"))
    capsys.readouterr()
    code = main(
        ["mapreduce", "run", str(path), "--model", "sim-model", "--api-base", server.base_url, "--json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 3 and out["status"] == "incomplete"  # exit 3: incomplete, the table saved
    assert_short(out["completeness"])
    saved = json.loads((Path(out["run_dir"]) / "result.json").read_text())
    assert saved["status"] == "incomplete" and saved["completeness"] == out["completeness"]
    assert set(saved["completeness"]) == set(asked.record.completeness.model_dump())  # one shape for every command


def test_the_tool_summary_counts_short_tasks(tmp_path: Path) -> None:
    class TwoRows:
        def solve(self, request: BatchRequest) -> Any:
            from amapreduce.mapreduce.solver import SolverReply

            region = next(r for r in CITIES if r in request.tasks[0])
            return SolverReply(output=[{"rank": str(i), "city": c} for i, c in enumerate(CITIES[region], 1)])

    with tool_session(offline_settings(tmp_path, patch_rounds=0), TwoRows()) as (_, tool):
        tool(**SHORT)  # the plan stage
        head = json.loads(tool(**SHORT).splitlines()[0])
    assert head["status"] == "incomplete"
    assert_short(head)


def test_each_status_comes_from_its_cause() -> None:
    truth = world(3)
    decision = Decision.parse(world_decision(truth))
    assert MapReduceEngine(WorldSolver(truth)).run(decision).ending == RunEnding(RunStatus.COMPLETE)
    dropped = MapReduceEngine(
        WorldSolver(truth, drop_rate=1.0), config=EngineConfig(max_attempts=1, patch_rounds=0)
    )
    assert dropped.run(decision).ending.status is RunStatus.INCOMPLETE

    def over_budget(request: BatchRequest) -> None:
        raise BudgetExceeded("token budget spent")

    stopped = MapReduceEngine(WorldSolver(truth, hook=over_budget)).run(decision)
    assert stopped.ending == RunEnding(RunStatus.STOPPED, "token budget spent")

    engine: MapReduceEngine

    def cancel(request: BatchRequest) -> None:
        engine.cancel()

    engine = MapReduceEngine(WorldSolver(truth, hook=cancel))
    assert engine.run(decision).ending.status is RunStatus.STOPPED

    assert RunEnding(RunStatus.INTERRUPTED, "interrupted").label == "stopped: interrupted"
    assert [s for s in RunStatus if s.ended_early] == [
        RunStatus.STOPPED,
        RunStatus.INTERRUPTED,
        RunStatus.FAILED,
    ]


def test_a_run_whose_provider_goes_down_ends_failed_fast_with_its_partial_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 10, point 8, end to end over HTTP: the breaker opens after K failed requests, the run
    stops at once (no worker spends all its retries), ends `failed` with a one-line reason, and the
    rows found before the outage are saved."""
    import re

    answered: list[str] = []

    def provider(messages: list[Any], info: ModelInfo) -> Any:
        item = re.findall(r"code of (item\d)\?", "\n".join(message_text(m) for m in messages))[-1]
        if len(answered) >= 2:
            raise RuntimeError("upstream down")  # the loopback server answers it with a 500
        answered.append(item)
        return final_answer(json.dumps([{"task": 1, "item": item, "code": item.upper()}]))

    decision = tmp_path / "d.json"
    decision.write_text(json.dumps({
        "task_matrix": [[f"item{i}"] for i in range(6)], "template": "What is the code of __0__?",
        "json_schema": ["item", "code"], "batch_strategy": "per_atom",
    }), encoding="utf-8")
    for name, value in {"RUNS_DIR": str(tmp_path / "runs"), "BREAKER_FAILURES": "2", "BREAKER_MAX_WAIT_S": "0",
                        "RETRY_MAX_RETRIES": "0"}.items():
        monkeypatch.setenv(f"AMAPREDUCE_{name}", value)
    with OpenAICompatibleServer(FunctionModel(provider, model_id="sim-model")) as server, allow_model_requests():
        code = main(["mapreduce", "run", str(decision), "--model", "sim-model", "--api-base", server.base_url,
                     "--workers", "1", "--json"])
        requests = len(server.requests)
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "failed" and code == 1 and out["error"].startswith("provider ")
    assert requests == 4  # two answers, then K=2 failed requests: the breaker sends nothing more
    result = json.loads((Path(out["run_dir"]) / "result.json").read_text(encoding="utf-8"))
    assert result["status"] == "failed" and len(result["error"].splitlines()) == 1
    assert "unavailable" in result["error"].lower()
    assert len(answered) == 2 and all(f"| {item} | {item.upper()} |" in out["table_markdown"] for item in answered)
    assert result["completeness"]["rows"] == 6 and result["completeness"]["complete"] is False
