"""`ask --executor ray`: the manager runs in the driver, a decision wider than one chunk runs its
chunks on Ray, and the table is the one a local `ask` gives.

The simulated model (deterministic code, not an LLM) plays the manager (it is offered `mapreduce`)
and the sub-agents, served over loopback HTTP by this test process
(`testing.openai_server`): the Ray workers are other processes and reach it as they would reach a
provider. The Ray run happens in a child process that starts a local Ray itself
(`ray.init(num_cpus=2)`), as in test_ray_wide.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from amapreduce.cli.app import main

ROWS = 8
DECISION = {
    "task_matrix": [[f"item{i:03d}"] for i in range(ROWS)],
    "template": "What is the code of __0__?",
    "json_schema": {"type": "object", "properties": {"item": {}, "code": {"description": "the item's code"}}},
    "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
}
RAY_DRIVER = r"""
import sys
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
from amapreduce.cli.app import main
code = main(sys.argv[1:])
ray.shutdown()
sys.exit(code)
"""


class _Simulated:
    """Plays the manager (plan, then execute the same decision, then answer) and the sub-agents
    (each row's code, but item005's is nowhere); counts the manager's and the sub-agents' calls."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.manager = self.subagent = 0

    def __call__(self, messages: list[Any], info: Any) -> Any:
        from amapreduce.llm.messages import message_text
        from amapreduce.testing.scripted import final_answer, tool_call

        text = "\n".join(message_text(m) for m in messages)
        if "mapreduce" in info.tools:
            with self.lock:
                self.manager += 1
            if '"call_stage": "execute"' in text:
                return final_answer("The table is as complete as the sources allow.")
            return tool_call("mapreduce", **DECISION)
        with self.lock:
            self.subagent += 1
        asked = re.findall(r"code of (item\d{3})\?", text.rsplit("Sub-questions:", 1)[-1])
        return final_answer(json.dumps([{"task": k + 1, "item": item, "code": "" if item == "item005" else item.upper()}
                                        for k, item in enumerate(asked)]))


def _result(runs: Path) -> dict[str, Any]:
    (folder,) = runs.iterdir()
    record: dict[str, Any] = json.loads((folder / "result.json").read_text(encoding="utf-8"))
    return record


def _local_then_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: _Simulated,
                    between: Callable[[], dict[str, str]]) -> subprocess.CompletedProcess[str]:
    """`ask` here (exit 3: item005's code is missing), then in a child process on its own Ray with
    the variables `between` gives; --workers 1 makes a chunk 4 batches, so the 8 per-row batches
    are 2 chunks on Ray."""
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.testing.openai_server import OpenAICompatibleServer
    from amapreduce.testing.scripted import FunctionModel

    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "local"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")}
    env.update(AMAPREDUCE_ENV_FILE=os.devnull, RAY_USAGE_STATS_ENABLED="0", AMAPREDUCE_RUNS_DIR=str(tmp_path / "ray"))
    with OpenAICompatibleServer(FunctionModel(model, model_id="sim-model")) as server, allow_model_requests():
        args = ["Codes of the eight items?", "--model", "sim-model", "--api-base", server.base_url, "--workers", "1",
                "--no-memory", "--json"]
        assert main(["ask", *args]) == 3
        env.update(between())
        return subprocess.run([sys.executable, "-c", RAY_DRIVER, "ask", *args, "--executor", "ray"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_ask_on_ray_runs_a_wide_decision_in_chunks_and_gives_the_local_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    model = _Simulated()
    local_calls: list[int] = []

    def count() -> dict[str, str]:
        local_calls.extend([model.manager, model.subagent])
        return {}

    proc = _local_then_ray(tmp_path, monkeypatch, model, count)
    local_out = json.loads(capsys.readouterr().out)
    assert proc.returncode == 3, proc.stderr[-3000:]
    ray_out = json.loads(proc.stdout.strip().splitlines()[-1])
    mine, theirs = _result(tmp_path / "local"), _result(tmp_path / "ray")
    assert theirs["table"] == mine["table"] and ray_out["table_markdown"] == local_out["table_markdown"]
    assert "| item004 | ITEM004 |" in ray_out["table_markdown"]
    assert theirs["completeness"] == mine["completeness"] and theirs["status"] == mine["status"] == "incomplete"
    # the same calls, manager and sub-agents, each in the driver's usage and trace
    assert [model.manager - local_calls[0], model.subagent - local_calls[1]] == local_calls
    assert theirs["usage"]["by_role"]["manager"]["requests"] == local_calls[0] == 3
    assert theirs["usage"]["by_role"]["subagent"]["requests"] == local_calls[1] > ROWS
    trace = [json.loads(line) for line in _trace(tmp_path / "ray").splitlines()]
    chunks = {e["chunk"] for e in trace if e["event"] == "model_call" and "chunk" in e}
    assert chunks == {0, 1}  # the sub-agents ran in 2 chunks on Ray; the manager in the driver
    assert any(e["event"] == "manager_step" for e in trace)
    # a decision run in chunks is not journaled as an execution: the run keeps it for a resume
    (folder,) = (tmp_path / "ray").iterdir()
    kept = json.loads((folder / "executed.json").read_text(encoding="utf-8"))
    assert [e["decision"]["task_matrix"] for e in kept] == [DECISION["task_matrix"]]


def _trace(runs: Path) -> str:
    (folder,) = runs.iterdir()
    return (folder / "trace.jsonl").read_text(encoding="utf-8")


@pytest.mark.slow
def test_the_managers_spend_counts_against_the_clusters_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token budget the manager's first two calls spend: the chunks on Ray see it spent (the
    manager's calls are charged to the cluster's sum) and ask no sub-agent; each chunk, with a
    budget of its own, would have asked."""
    model = _Simulated()
    asked: list[int] = []

    def budget() -> dict[str, str]:
        first, second = [e["usage"]["prompt_tokens"] + e["usage"]["completion_tokens"]
                         for e in map(json.loads, _trace(tmp_path / "local").splitlines())
                         if e["event"] == "model_call" and e["role"] == "manager"][:2]
        asked.append(model.subagent)
        return {"AMAPREDUCE_MAX_TOKENS": str(first + second // 2)}  # the second call is admitted, then it is spent

    proc = _local_then_ray(tmp_path, monkeypatch, model, budget)
    assert proc.returncode == 4, proc.stderr[-3000:]  # stopped by the budget
    record = _result(tmp_path / "ray")
    assert "spent across the cluster" in record["status"]
    assert [model.subagent] == asked  # no chunk asked a sub-agent
    assert record["usage"]["by_role"]["manager"]["requests"] == 2 and "subagent" not in record["usage"]["by_role"]
