"""`amapreduce mcp serve` (`mcp_server`): amapreduce's tools for MCP clients, tested with real clients.

The server is a real subprocess (`python -m amapreduce mcp serve ...`), talked to by the official
SDK's client over stdio and over streamable HTTP, and by the official MCP Inspector's CLI mode
(when node and the inspector are installed). Its runs use the simulated model (deterministic
code, not an LLM) behind the loopback OpenAI-compatible server, over the sandbox corpus: the real
client path, and no test leaves the machine. Nothing here waits on a clock: a run is held by the
simulated model until the test lets it go, and every wait is for an event that must come.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

import amapreduce
from amapreduce.cli.app import main
from amapreduce.demo.run import load_sandbox_tasks
from amapreduce.demo.serve import SERVED_MODEL_NAME, serving_model
from amapreduce.mcp_server import TOOL_NAMES
from amapreduce.settings import Settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply

REPO = Path(amapreduce.__file__).resolve().parents[1]
QUESTION_TASK = "sbx_en_017"  # the euro in North America: a short table
SLOW_TASK = "sbx_en_005"  # the euro in Europe: 27 batches, one at a time with --workers 1
ANSWERED = 2
"""Sub-agents (batches) the held model answers before it holds the next one."""
WAIT_S = 120.0
"""Only a bound on a wait for an event that must come; never reached when the code is right."""
INSPECTOR_VARIABLE = "AMAPREDUCE_MCP_INSPECTOR"
"""The MCP Inspector's CLI entry (`node_modules/@modelcontextprotocol/inspector/cli/build/cli.js`); CI sets it."""
INSPECTOR_ENTRY = os.environ.get(INSPECTOR_VARIABLE)
"""Read once, at import: the tests' autouse fixture removes every AMAPREDUCE_* variable."""
DECISION = {
    "task_matrix": [["Austria"], ["Malta"], ["Estonia"]],
    "template": "What is the capital of __0__?",
    "json_schema": {"type": "object", "properties": {"Country": {}, "Capital": {"description": "the capital city"}}},
    "batch_strategy": {"type": "open", "chunk_size": 2, "rationale": "two countries each"},
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, Path]:
    """The sandbox's tasks, its corpus index and the cache folder it was built in."""
    cache = tmp_path_factory.mktemp("cache")
    tasks, sandbox = load_sandbox_tasks(Settings(cache_dir=cache))
    return tasks, Path(sandbox.index_dir), cache


@pytest.fixture(scope="module")
def served() -> Iterator[OpenAICompatibleServer]:
    with OpenAICompatibleServer(serving_model()) as server:
        yield server


def server_args(base_url: str, index: Path, runs: Path, *extra: str) -> list[str]:
    """`mcp serve`'s arguments for runs of the served simulated model over the sandbox corpus."""
    return ["-m", "amapreduce", "mcp", "serve", "--model", SERVED_MODEL_NAME, "--api-base", base_url,
            "--search", f"corpus:{index}", "--no-memory", "--runs-dir", str(runs), *extra]


def server_env(cache: Path) -> dict[str, str]:
    """The server's own variables (the SDK's clients pass only these and a safe few: PATH, HOME)."""
    return {"PYTHONPATH": str(REPO), "AMAPREDUCE_EXTRACTION_MODEL": "none", "AMAPREDUCE_CACHE_DIR": str(cache),
            "AMAPREDUCE_ENV_FILE": os.devnull, "AMAPREDUCE_RETRY_BASE_DELAY_S": "0", "AMAPREDUCE_RETRY_MAX_DELAY_S": "0"}


def over_stdio(args: list[str], cache: Path, tmp_path: Path, work: Callable[[Client], Awaitable[None]]) -> None:
    """Run `work` with an SDK client of the server started (and stopped) over stdio."""
    params = StdioServerParameters(command=sys.executable, args=args, env=server_env(cache), cwd=tmp_path)

    async def main() -> None:
        with (tmp_path / "server-stderr.log").open("w", encoding="utf-8") as errlog:
            async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=WAIT_S) as client:
                await work(client)

    anyio.run(main)


def result_of(result: Any) -> dict[str, Any]:
    """A successful tool call's structured result."""
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def test_a_client_over_stdio_lists_the_tools_and_runs_each(
    world: tuple[dict[str, Any], Path, Path], served: OpenAICompatibleServer, tmp_path: Path
) -> None:
    tasks, index, cache = world
    runs = tmp_path / "runs"
    notified: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notified.append((progress, total, message))

    async def work(client: Client) -> None:
        listed = await client.list_tools()
        assert [t.name for t in listed.tools] == list(TOOL_NAMES)

        found = result_of(await client.call_tool("wide_search", {"question": tasks[QUESTION_TASK].query},
                                                 progress_callback=on_progress))
        assert found["status"] == "complete" and found["rows"]
        assert found["columns"] == list(found["rows"][0])
        run_id = found["run_id"]
        assert (runs / run_id / "result.json").is_file()
        assert notified[0][2] == f"run {run_id} started"
        assert any("batches" in (m or "") for _, _, m in notified[1:])
        assert [p for p, _, _ in notified] == sorted({p for p, _, _ in notified})  # it only ever grows

        status = result_of(await client.call_tool("run_status", {"run_id": run_id}))
        assert status["status"] == "complete" and status["kind"] == "ask"
        assert status["completeness"]["rows"] == len(found["rows"])
        table = result_of(await client.call_tool("run_table", {"run_id": run_id}))
        assert (table["columns"], table["rows"]) == (found["columns"], found["rows"])

        rows = [{"Country": "Malta", "Note": "first"}, {"Country": "Austria", "Note": None},
                {"Country": "Estonia", "Note": "last"}]
        enriched = result_of(await client.call_tool("enrich", {"rows": rows, "columns": ["Capital"], "key": "Country"}))
        assert enriched["columns"] == ["Country", "Note", "Capital", "enrich_status"]
        assert [(r["Country"], r["Note"], r["Capital"]) for r in enriched["rows"]] == [
            ("Malta", "first", "Valletta"), ("Austria", None, "Vienna"), ("Estonia", "last", "Tallinn")]
        assert result_of(await client.call_tool("run_status", {"run_id": enriched["run_id"]}))["kind"] == "enrich"

        planned = result_of(await client.call_tool("plan", {"decision": DECISION}))
        assert [b["indices"] for b in planned["batches"]] == [[0, 1], [2]]
        assert planned["stage"] == "fill"
        assert planned["estimate"]["batches"] == 2 and planned["estimate"]["calls"]["low"] >= 2

        # Bad arguments are tool errors with the reason; the server keeps serving.
        refused: list[tuple[str, dict[str, Any], str]] = [
            ("run_status", {"run_id": "../elsewhere"}, "run_id must be a run id"),
            ("run_table", {"run_id": "no-such-run"}, "no run 'no-such-run'"),
            ("plan", {"decision": {"task_matrix": []}}, "decision"),
            ("enrich", {"rows": [{"Country": "Malta"}], "columns": ["Country"]}, "Country"),
            ("wide_search", {"question": " "}, "question must not be empty"),
        ]
        for name, arguments, reason in refused:
            failed = await client.call_tool(name, arguments)
            assert failed.is_error, (name, failed)
            assert reason in getattr(failed.content[0], "text", "")
        assert [t.name for t in (await client.list_tools()).tools] == list(TOOL_NAMES)

    over_stdio(server_args(served.base_url, index, runs), cache, tmp_path, work)


class HeldSubAgents:
    """The served simulated model, whose first `ANSWERED` sub-agents (one batch each, with
    `--workers 1`) are answered; the next sub-agent's first request is held until `release` is set.
    From then on every sub-agent request is answered with a step that finds nothing, so no row is
    found after the hold, however long the run takes to stop."""

    def __init__(self) -> None:
        self.inner = serving_model()
        self.release = threading.Event()
        self.holding = threading.Event()
        self._lock = threading.Lock()
        self._started = 0

    def __call__(self, messages: list[Any], info: ModelInfo) -> Reply:
        if "mapreduce" in info.tools:  # the manager
            return self.inner.function(messages, info)
        with self._lock:
            first_step = len(messages) <= 2  # a system prompt and the task: a new sub-agent
            self._started += first_step
            hold = first_step and self._started == ANSWERED + 1
            answer = self._started <= ANSWERED
        if answer:
            return self.inner.function(messages, info)
        if hold:
            self.holding.set()
            self.release.wait(WAIT_S)
        return "Still looking; nothing found in this step."


def test_a_cancelled_wide_search_stops_its_run_and_keeps_the_rows_found(
    world: tuple[dict[str, Any], Path, Path], tmp_path: Path
) -> None:
    tasks, index, cache = world
    runs = tmp_path / "runs"
    model = HeldSubAgents()
    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    async def work(client: Client) -> None:
        async with anyio.create_task_group() as group:
            async def call() -> None:
                await client.call_tool("wide_search", {"question": tasks[SLOW_TASK].query}, progress_callback=on_progress)
                raise AssertionError("the call was to be cancelled")

            group.start_soon(call)
            assert await anyio.to_thread.run_sync(model.holding.wait, WAIT_S)
            group.cancel_scope.cancel()  # the SDK sends notifications/cancelled for the call
        model.release.set()
        run_id = messages[0].removeprefix("run ").removesuffix(" started")
        status: dict[str, Any] = {"status": "running"}
        for _ in range(10_000):  # polled until the run records how it stopped (an event that must come)
            status = result_of(await client.call_tool("run_status", {"run_id": run_id}))
            if status["status"] not in ("running", None):
                break
            await anyio.sleep(0.05)
        assert status["status"] == "stopped: interrupted"
        table = result_of(await client.call_tool("run_table", {"run_id": run_id}))
        found = [r for r in table["rows"] if r["Capital"] is not None]
        assert found and len(found) < len(table["rows"])  # the first batches' rows are kept, the rest missing
        assert status["completeness"]["missing_cells"] > 0

    with OpenAICompatibleServer(FunctionModel(model, model_id="simulated")) as server:
        try:
            over_stdio(server_args(server.base_url, index, runs, "--workers", "1"), cache, tmp_path, work)
        finally:
            model.release.set()
    (run_dir,) = runs.iterdir()
    assert json.loads((run_dir / "result.json").read_text(encoding="utf-8"))["status"] == "stopped: interrupted"
    journal = (run_dir / "journal.jsonl").read_text(encoding="utf-8")
    assert "interrupted" in journal  # `runs resume` can finish it


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_client_over_streamable_http_on_loopback(
    world: tuple[dict[str, Any], Path, Path], served: OpenAICompatibleServer, tmp_path: Path
) -> None:
    tasks, index, cache = world
    port = free_port()
    args = server_args(served.base_url, index, tmp_path / "runs", "--http", "--port", str(port))
    with (tmp_path / "server-stderr.log").open("w", encoding="utf-8") as errlog:
        process = subprocess.Popen([sys.executable, *args], env={**os.environ, **server_env(cache)}, cwd=tmp_path,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errlog)
    try:
        for _ in range(100_000):  # until it listens (or has died)
            assert process.poll() is None, (tmp_path / "server-stderr.log").read_text(encoding="utf-8")
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            threading.Event().wait(0.05)

        async def main() -> None:
            async with Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp"), read_timeout_seconds=WAIT_S) as client:
                assert [t.name for t in (await client.list_tools()).tools] == list(TOOL_NAMES)
                found = result_of(await client.call_tool("wide_search", {"question": tasks[QUESTION_TASK].query}))
                assert found["status"] == "complete" and found["rows"]
                assert result_of(await client.call_tool("run_status", {"run_id": found["run_id"]}))["status"] == "complete"

        anyio.run(main)
    finally:
        process.terminate()
        process.wait(WAIT_S)


def test_a_taken_port_or_no_model_is_a_usage_error_before_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["mcp", "serve", "--http", "--port", str(port), "--model", "simulated"]) == 2
    assert f"cannot serve on 127.0.0.1:{port}" in capsys.readouterr().err
    assert main(["mcp", "serve"]) == 2
    assert "no model" in capsys.readouterr().err


def inspector() -> list[str]:
    """How to run the MCP Inspector's CLI here, or a skip saying why it cannot run."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the MCP Inspector test needs node and @modelcontextprotocol/inspector")
    entry = INSPECTOR_ENTRY
    local = REPO / ".ci" / "node" / "node_modules" / "@modelcontextprotocol" / "inspector" / "cli" / "build" / "cli.js"
    path = Path(entry) if entry else local
    if not path.is_file():
        pytest.skip(f"the MCP Inspector is not installed: set {INSPECTOR_VARIABLE} to its cli/build/cli.js, or "
                    "`npm install --prefix .ci/node @modelcontextprotocol/inspector` (as .ci/run does)")
    return [node, str(path)]


def test_the_mcp_inspector_cli_lists_the_tools_and_calls_wide_search_and_enrich(
    world: tuple[dict[str, Any], Path, Path], served: OpenAICompatibleServer, tmp_path: Path
) -> None:
    command = inspector()
    tasks, index, cache = world
    env_flags = [flag for name, value in server_env(cache).items() for flag in ("-e", f"{name}={value}")]
    target = ["--", sys.executable, *server_args(served.base_url, index, tmp_path / "runs")]

    def inspect(*method: str) -> dict[str, Any]:
        done = subprocess.run([*command, "--cli", *env_flags, *target, *method], capture_output=True, text=True,
                              cwd=tmp_path, timeout=WAIT_S, check=False)
        assert done.returncode == 0, done.stderr + done.stdout
        out = json.loads(done.stdout)
        assert isinstance(out, dict)
        return out

    listed = inspect("--method", "tools/list")
    assert [t["name"] for t in listed["tools"]] == list(TOOL_NAMES)
    assert listed["tools"][0]["inputSchema"]["required"] == ["question"]

    found = inspect("--method", "tools/call", "--tool-name", "wide_search",
                    "--tool-arg", f"question={tasks[QUESTION_TASK].query}")
    assert found["isError"] is False
    assert found["structuredContent"]["status"] == "complete" and found["structuredContent"]["rows"]

    enriched = inspect("--method", "tools/call", "--tool-name", "enrich", "--tool-arg",
                       'rows=[{"Country": "Austria"}, {"Country": "Malta"}]', 'columns=["Capital"]')
    assert enriched["isError"] is False
    assert [(r["Country"], r["Capital"]) for r in enriched["structuredContent"]["rows"]] == [
        ("Austria", "Vienna"), ("Malta", "Valletta")]
