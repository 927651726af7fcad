"""`ask` and `mapreduce run` end to end through the real client path: smolagents' OpenAIModel
talks HTTP to an OpenAI-compatible server on 127.0.0.1 whose replies come from a simulated model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from records import role_usage, write_record
from sessions import ask as run_ask

from amapreduce.cli.app import main
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.settings import load_settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, final_answer, tool_call

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi"}
SECRET = "sk-test-SECRET-0123456789"
DECISION = {
    "task_matrix": [[c] for c in CAPITALS],
    "template": "What is the capital of __0__?",
    "json_schema": {"type": "object", "properties": {"country": {}, "capital": {"description": "city name"}}},
    "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
}


def simulated(messages: list, info: ModelInfo) -> Any:
    """Plays the manager (it is offered `mapreduce`) and the sub-agents (they are not)."""
    text = "\n".join(message_text(m) for m in messages)
    if "mapreduce" in info.tools:
        if '"call_stage": "execute"' in text:
            return final_answer("The table is complete.")
        return tool_call("mapreduce", **DECISION)  # plan stage first, then the same call executes
    tasks = text.rsplit("Sub-questions:", 1)[-1]
    rows = [{"task": k, "country": c, "capital": CAPITALS[c]} for k, c in enumerate(CAPITALS, 1) if f"capital of {c}?" in tasks]
    for row, n in zip(rows, range(1, len(rows) + 1), strict=True):
        row["task"] = n
    return final_answer(json.dumps(rows))


@pytest.fixture
def server() -> Any:
    with OpenAICompatibleServer(FunctionModel(simulated, model_id="sim-model"), rate_limit_first=1, retry_after_s=0.05) as srv, allow_model_requests():
        yield srv


def settings_for(server: OpenAICompatibleServer, tmp_path: Path) -> Any:
    return load_settings({}, model="sim-model", api_base=server.base_url, api_key=SECRET, runs_dir=tmp_path / "runs", workers=2)


def test_ask_end_to_end_over_http(server: OpenAICompatibleServer, tmp_path: Path) -> None:
    outcome = run_ask("Capitals of France, Japan and Kenya?", settings_for(server, tmp_path), web_tools=[], show_progress=False)
    assert outcome.status == "complete"
    assert outcome.table.records() == [{"country": c, "capital": v} for c, v in CAPITALS.items()]
    assert outcome.markdown.startswith("```markdown\n| country | capital |")
    calls = outcome.record.completeness
    assert calls.mapreduce_calls == 2 and calls.executions == 1
    usage = outcome.meter.by_role()
    assert usage["manager"].requests == 3 and usage["subagent"].requests == 3
    assert server.requests[0]["model"] == "sim-model"
    assert server.authorization[-1] == f"Bearer {SECRET}"
    folder = outcome.run_dir.path
    assert {p.name for p in folder.iterdir()} == {"table.md", "table.csv", "result.json", "trace.jsonl", "journal.jsonl"}
    for f in folder.iterdir():
        assert SECRET not in f.read_text(encoding="utf-8")
    events = [json.loads(x)["event"] for x in (folder / "trace.jsonl").read_text().splitlines()]
    assert "manager_step" in events and "attempt" in events and "tool_call" in events
    result = json.loads((folder / "result.json").read_text())
    assert result["status"] == "complete" and result["decisions"][0]["template"] == DECISION["template"]


def test_mapreduce_run_cli_json(server: OpenAICompatibleServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps(DECISION), encoding="utf-8")
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("AMAPREDUCE_API_KEY", SECRET)
    from amapreduce.sandbox import sandbox_world

    index = sandbox_world(cache_dir=tmp_path / "cache").index_dir  # offline search for the sub-agents' tools
    monkeypatch.setenv("AMAPREDUCE_SEARCH_BACKEND", f"corpus:{index}")
    monkeypatch.setenv("AMAPREDUCE_CACHE_DIR", str(tmp_path / "cache"))
    code = main(["mapreduce", "run", str(path), "--model", "sim-model", "--api-base", server.base_url, "--workers", "3",
                 "--csv", str(tmp_path / "t.csv"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["rows"] == 3 and out["missing_cells"] == 0
    assert "| Japan | Tokyo |" in out["table_markdown"]
    assert set(out["usage"]) == {"requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "abandoned",
                                 "unpriced_models"}
    assert out["usage"]["requests"] == 3 and out["usage"]["unpriced_models"] == ["sim-model"]  # no known price
    assert out["usage"]["cost_usd"] is None
    assert out["timings"]["wall_s"] > 0 and Path(out["run_dir"]).is_dir()
    assert (tmp_path / "t.csv").read_text().splitlines()[1] == "France,Paris"
    saved = json.loads((Path(out["run_dir"]) / "result.json").read_text())
    assert set(saved["timings"]) == {"wall_s", "executions"} and saved["timings"]["wall_s"] >= 0
    assert set(saved["timings"]["executions"][0]) == {"map_s", "patch_s", "wall_s"}
    assert main(["runs", "list", "--runs-dir", str(tmp_path / "runs"), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["runs"]
    assert listed[0]["kind"] == "mapreduce_run" and listed[0]["rows"] == 3


NO_LITELLM = r"""
import json, sys
from amapreduce.cli.app import main
code = main(sys.argv[1:])
from amapreduce.llm.meter import PriceTable
price = PriceTable().price("openai/gpt-4o-mini")  # LiteLLM's bundled map, read as a file
print(json.dumps({"code": code, "litellm": sorted(m for m in sys.modules if m.split(".")[0] == "litellm")[:3],
                  "priced": price is not None and price.input > 0}))
"""


def test_an_api_base_run_never_imports_litellm(server: OpenAICompatibleServer, tmp_path: Path) -> None:
    """`--api-base` uses the OpenAI client, not LiteLLM: importing it (seconds of CPU) before the
    first call would only delay the run; prices still come from LiteLLM's bundled map."""
    path = tmp_path / "d.json"
    path.write_text(json.dumps(DECISION), encoding="utf-8")
    from amapreduce.sandbox import sandbox_world

    index = sandbox_world(cache_dir=tmp_path / "cache").index_dir
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMAPREDUCE_", "OPENAI_"))}
    env.update(AMAPREDUCE_RUNS_DIR=str(tmp_path / "runs"), AMAPREDUCE_API_KEY=SECRET, AMAPREDUCE_ENV_FILE=os.devnull,
               AMAPREDUCE_SEARCH_BACKEND=f"corpus:{index}", AMAPREDUCE_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", NO_LITELLM, "mapreduce", "run", str(path), "--model", "sim-model",
                           "--api-base", server.base_url, "--json"], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen == {"code": 0, "litellm": [], "priced": True}, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[0])["rows"] == 3 and len(server.requests) >= 3


def test_runs_list_prints_queries_verbatim(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    run = tmp_path / "runs" / "20261121-000000-x"
    write_record(run, query="see [/x] :smile:")
    assert main(["runs", "list", "--runs-dir", str(tmp_path / "runs")]) == 0  # markup here used to raise MarkupError
    assert "see [/x] :smile:" in capsys.readouterr().out


@pytest.mark.parametrize("columns", ["80", "250"])
def test_runs_list_shows_whole_run_names_that_runs_show_accepts(
    columns: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 80 columns (a pipe) the run column used to be cut to `20261121-1853…`."""
    monkeypatch.setenv("COLUMNS", columns)
    name = "20261121-185312-list-every-country-and-territory-of-south-2"
    write_record(tmp_path / "runs" / name, query="List every country and territory of South America",
                 completeness={"rows": 13}, usage={"by_role": {}, "total": role_usage(3, 100, 10, 0.0123)})
    assert main(["runs", "list", "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert name in out and "complete" in out and "13" in out
    listed = next(w for line in out.splitlines() for w in line.split() if w.startswith("2026"))
    assert main(["runs", "show", listed, "--runs-dir", str(tmp_path / "runs")]) == 0
    assert "status: complete" in capsys.readouterr().out


def test_ask_without_model_exits_2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AMAPREDUCE_MODEL", raising=False)
    assert main(["ask", "anything"]) == 2
    assert "no model is configured" in capsys.readouterr().err
