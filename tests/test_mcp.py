"""MCP tools for the agents (`--mcp CONFIG`, `agents/mcp.py`): sub-agents call an MCP server's
tools, one session shared by every worker thread, and the server is stopped when the run ends.

The server is tests/mcp_server.py, a small stdio MCP server started as a real subprocess. The
models are simulated (deterministic code, not an LLM) behind the loopback OpenAI-compatible server,
the real client path; no test leaves the machine.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from amapreduce.agents.mcp import McpToolbox, open_mcp_tools
from amapreduce.agents.mcp_config import load_mcp_config
from amapreduce.cli.app import main
from amapreduce.errors import ConfigError, ToolCallFailed
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.settings import load_settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply, final_answer, tool_call
from amapreduce.trace import redact_secrets

SERVER = Path(__file__).resolve().parent / "mcp_server.py"
COUNTRIES = ["France", "Japan", "Kenya", "Peru"]
DECISION = {
    "task_matrix": [[country] for country in COUNTRIES],
    "template": "What is the capital of __0__?",
    "json_schema": {"type": "object", "properties": {"country": {}, "capital": {"description": "the capital city"}}},
    "batch_strategy": {"type": "per_atom", "rationale": "one country each"},
}


@pytest.fixture(autouse=True)
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory (its `runs/` is the default runs folder); retries do not sleep."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AMAPREDUCE_RETRY_BASE_DELAY_S", "0")
    monkeypatch.setenv("AMAPREDUCE_RETRY_MAX_DELAY_S", "0")
    return tmp_path


def facts_server(tmp_path: Path, **env: str) -> dict[str, Any]:
    """The test server's `mcpServers` entry; it writes its pid to `tmp_path/pid`."""
    return {"command": sys.executable, "args": [str(SERVER)],
            "env": {"MCP_TEST_PID_FILE": str(tmp_path / "pid"), **env}}


def write_config(tmp_path: Path, servers: dict[str, Any], name: str = "mcp.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")
    return path


def process_gone(pid_file: Path) -> bool:
    """Whether the process whose pid the server wrote has exited (and was reaped)."""
    try:
        os.kill(int(pid_file.read_text(encoding="utf-8")), 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def facts(tmp_path: Path) -> Iterator[McpToolbox]:
    toolbox = open_mcp_tools(write_config(tmp_path, {"facts": facts_server(tmp_path)}),
                             reserved={"web_search", "final_answer"})
    try:
        yield toolbox
    finally:
        toolbox.close()


class CapitalSubagents:
    """Plays the search sub-agents: asks the MCP tool `capital` for its batch's country, then
    answers with the capital the tool's observation names. Records the tools every call offered."""

    def __init__(self) -> None:
        self.offered: list[tuple[str, ...]] = []
        self._lock = threading.Lock()

    def __call__(self, messages: list[Any], info: ModelInfo) -> Reply:
        with self._lock:
            self.offered.append(info.tools)
        text = "\n".join(message_text(m) for m in messages)
        asked = re.findall(r"capital of (\w+)\?", text.rsplit("Sub-questions:", 1)[-1])
        found = dict(re.findall(r"The capital of (\w+) is (\w+)\.", text))
        missing = [country for country in asked if country not in found]
        if missing:
            return [tool_call("capital", country=country) for country in missing]
        return final_answer(json.dumps([{"task": k, "country": c, "capital": found[c]} for k, c in enumerate(asked, 1)]))


def test_subagents_call_an_mcp_tool_from_several_threads_through_one_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`mapreduce run --mcp`: four sub-agents on four worker threads call the server's `capital`
    tool at once. The server answers only once all four calls are in flight together, so a client
    that sent them one at a time would never see an answer: the calls share one session
    concurrently. The rows carry the tool's answers, and the server process is gone at the end."""
    log = tmp_path / "calls.jsonl"
    config = write_config(tmp_path, {"facts": facts_server(
        tmp_path, MCP_TEST_GATHER=str(len(COUNTRIES)), MCP_TEST_LOG=str(log))})
    decision = tmp_path / "capitals.json"
    decision.write_text(json.dumps(DECISION), encoding="utf-8")
    world = CapitalSubagents()
    with OpenAICompatibleServer(FunctionModel(world, model_id="sim-model")) as server, allow_model_requests():
        code = main(["mapreduce", "run", str(decision), "--model", "sim-model", "--api-base", server.base_url,
                     "--workers", str(len(COUNTRIES)), "--mcp", str(config), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)
    assert out["status"] == "complete" and out["rows"] == len(COUNTRIES)
    for capital in ("Paris", "Tokyo", "Nairobi", "Lima"):
        assert capital in out["table_markdown"]
    calls = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert sorted(c["country"] for c in calls) == sorted(COUNTRIES)
    assert max(c["in_flight"] for c in calls) == len(COUNTRIES) and all(c["gathered"] for c in calls)
    # Every sub-agent was offered the MCP tools beside its own; the clashing `web_search` was renamed.
    assert world.offered and all({"capital", "echo", "facts_web_search", "web_search"} <= set(t) for t in world.offered)
    trace = (Path(out["run_dir"]) / "trace.jsonl").read_text(encoding="utf-8")
    assert '"mcp_tools"' in trace and "facts/web_search" in trace
    assert process_gone(tmp_path / "pid")


def test_tools_keep_their_arguments_and_report_errors(facts: McpToolbox) -> None:
    tools = {tool.name: tool for tool in facts.tools}
    assert set(tools) == {"capital", "echo", "describe", "facts_web_search", "broken"}
    assert tools["facts_web_search"].mcp_name == "web_search"
    assert tools["facts_web_search"](query="q") == "mcp results for q"
    # Required arguments stay required; an argument with a default may be left out.
    assert tools["echo"].inputs["text"].get("nullable") is None and tools["echo"].inputs["times"]["nullable"] is True
    assert tools["echo"](text="ab") == "ab" and tools["echo"](text="ab", times=3) == "ababab"
    assert "MCP server `facts`" in tools["capital"].description
    # A nested model is inlined (no `$ref` left for a provider to reject); `str | None` is an optional string.
    place, note = tools["describe"].inputs["place"], tools["describe"].inputs["note"]
    assert "$ref" not in json.dumps(place) and set(place["properties"]) == {"city", "country"}
    assert (note["type"], note["nullable"]) == ("string", True)
    assert tools["describe"](place={"city": "Lima", "country": "Peru"}) == "Lima, Peru"
    assert tools["describe"](place={"city": "Lima", "country": "Peru"}, note="coast") == "Lima, Peru (coast)"
    with pytest.raises(ToolCallFailed, match="returned an error: .*the broken tool broke"):
        tools["broken"]()


def test_calls_from_many_threads_at_once(facts: McpToolbox) -> None:
    echo = next(tool for tool in facts.tools if tool.name == "echo")
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda i: echo(text=f"<{i}>", times=2), range(40)))
    assert replies == [f"<{i}><{i}>" for i in range(40)]


def test_long_output_is_cut_and_close_stops_the_server(tmp_path: Path) -> None:
    toolbox = open_mcp_tools(write_config(tmp_path, {"facts": facts_server(tmp_path)}), max_chars=100)
    echo = next(tool for tool in toolbox.tools if tool.name == "echo")
    assert echo(text="x", times=250).endswith("[... cut: 150 more characters]")
    assert not process_gone(tmp_path / "pid")
    toolbox.close()
    toolbox.close()  # idempotent
    assert process_gone(tmp_path / "pid")
    with pytest.raises(ToolCallFailed, match="no longer connected"):
        echo(text="x")


def test_a_server_that_does_not_start_is_named(tmp_path: Path) -> None:
    config = write_config(tmp_path, {
        "facts": facts_server(tmp_path),
        "dies": {"command": sys.executable, "args": ["-c", "import sys; sys.exit(3)"]},
    })
    with pytest.raises(ConfigError, match=r"MCP server 'dies' \(.*\) from .*mcp.json could not be started"):
        open_mcp_tools(config)
    assert process_gone(tmp_path / "pid")  # the server that did start is stopped again


def test_manager_gets_the_tools_only_when_asked_and_close_stops_the_server(tmp_path: Path) -> None:
    from amapreduce.session import RunOptions, Session

    config = write_config(tmp_path, {"facts": facts_server(tmp_path), "off": {"command": "no-such", "disabled": True}})
    for manager in (False, True):
        settings = load_settings({}, model="sim", mcp=config, mcp_manager=manager or None, runs_dir=tmp_path / "runs")
        options = RunOptions(query="q", inner=lambda role: FunctionModel(lambda m, i: "x"), web_tools=[],
                             roles=("manager", "subagent"), show_progress=False)
        with Session(settings, options) as session:  # the servers start when the run opens and stop when it ends
            parts = session.parts
            assert sorted(t.name for t in parts.mcp_tools) == ["broken", "capital", "describe", "echo", "web_search"]
            assert [t.name for t in parts.manager_tools] == ([t.name for t in parts.mcp_tools] if manager else [])
        assert process_gone(tmp_path / "pid")


def test_credentials_in_the_config_are_redacted(tmp_path: Path) -> None:
    secret = "sk-mcp-secret-0123456789"
    config = write_config(tmp_path, {"facts": facts_server(tmp_path, FACTS_API_KEY=secret, PLAIN_SETTING="visible-value-1")})
    with open_mcp_tools(config):
        assert redact_secrets(f"key {secret}") == "key [REDACTED]"
        assert redact_secrets("visible-value-1") == "visible-value-1"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "does not exist"),
        ("{oops", "is not valid JSON"),
        ('{"servers": {}}', 'must be a JSON object with an "mcpServers" object'),
        ('{"mcpServers": {}, "preferences": {}}', "unknown top-level key 'preferences'"),
        ('{"mcpServers": {"a": {"comand": "x"}}}', "server 'a': needs `command` (a stdio server) or `url`"),
        ('{"mcpServers": {"a": {"command": "python3", "arg": []}}}', "server 'a': `arg` (unknown key)"),
        ('{"mcpServers": {"a": {"command": "x", "url": "http://h/mcp"}}}', "not both"),
        ('{"mcpServers": {"a": {"url": "http://127.0.0.1:1/sse"}}}', "legacy HTTP+SSE transport is not supported"),
        ('{"mcpServers": {"a": {"url": "ftp://h/mcp"}}}', "must be an http:// or https:// URL"),
        ('{"mcpServers": {"a": {"command": "python3", "timeout": 0}}}', "`timeout`: Input should be greater than 0"),
        ('{"mcpServers": {"a": {"command": "no-such-mcp-server-xyz"}}}', "command 'no-such-mcp-server-xyz' was not found"),
    ],
)
def test_a_bad_config_exits_2_with_one_line_and_leaves_no_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, reason: str
) -> None:
    config = tmp_path / "mcp.json"
    if content is not None:
        config.write_text(content, encoding="utf-8")
    decision = tmp_path / "capitals.json"
    decision.write_text(json.dumps(DECISION), encoding="utf-8")
    code = main(["mapreduce", "run", str(decision), "--model", "sim", "--api-base", "http://127.0.0.1:9/v1",
                 "--mcp", str(config), "--json"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert reason in captured.err and len(captured.err.strip().splitlines()) == 1, captured.err
    assert not (tmp_path / "runs").exists()


def test_the_environment_names_the_config_and_claude_desktop_entries_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/data"], "env": {}},
        "docs": {"type": "http", "url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer t0ken-abcdefgh"}},
        "old": {"command": "uvx", "args": ["x"], "disabled": True},
    })
    monkeypatch.setenv("AMAPREDUCE_MCP", str(config))
    monkeypatch.setenv("AMAPREDUCE_MCP_MANAGER", "1")
    settings = load_settings()
    assert settings.mcp == config and settings.mcp_manager is True
    loaded = load_mcp_config(settings.mcp)
    assert sorted(loaded.enabled()) == ["docs", "files"] and loaded.servers["old"].disabled


@pytest.fixture
def http_url() -> Iterator[str]:
    """The test server's tools over streamable HTTP, served in process on a loopback port."""
    import time

    import mcp_server
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(mcp_server.server.streamable_http_app(), host="127.0.0.1", port=0,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, name="mcp-http-test-server", daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.01)  # start-up only; the test itself waits on nothing
    assert server.started, "the test MCP server did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/mcp"
    server.should_exit = True
    thread.join(30)


def test_a_streamable_http_server(tmp_path: Path, http_url: str) -> None:
    token = "http-secret-token-0123456789"
    config = write_config(tmp_path, {"web": {"url": http_url, "headers": {"Authorization": f"Bearer {token}"}}})
    with open_mcp_tools(config, reserved={"web_search"}) as toolbox:
        tools = {tool.name: tool for tool in toolbox.tools}
        assert tools["capital"](country="Chile") == "The capital of Chile is Santiago."
        assert tools["web_web_search"](query="q") == "mcp results for q"
        assert redact_secrets(token) == "[REDACTED]"
