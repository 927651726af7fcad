"""MCP servers' tools for the agents: `--mcp CONFIG` (or `AMAPREDUCE_MCP`) names a JSON file of
servers (`agents.mcp_config`, Claude Desktop's format) whose tools every search sub-agent gets,
and the manager too with `--mcp-manager`.

Why our own bridge over the `mcp` SDK instead of smolagents' `MCPClient`: that class is a thin
wrapper of `mcpadapt`, whose last release for Python 3.11 (0.1.19) imports the mcp 1.x API and
fails to import against the current mcp 2; it also waits its whole 30 s connect timeout for a
server that already failed, and ignores a session timeout given as an int.

Threads. One event-loop thread per `McpToolbox` owns every session; a tool call from any
sub-agent thread is a coroutine handed to that loop (`asyncio.run_coroutine_threadsafe`), and the
MCP session multiplexes concurrent requests by their JSON-RPC id. So one session per server is
shared safely by all worker threads, and calls run concurrently (tests/test_mcp.py calls one tool
from several sub-agents at once and sees them in flight together). `close` ends the sessions and
stops every server process the toolbox started.

Safety. MCP servers are started only from the user's own config file, never because a model
asked; a model can only call the tools those servers list. Their tools are trusted as the user's
own programs: a stdio server runs with the user's privileges, and what a tool returns enters the
model's context like a web page does. A stdio server gets only the SDK's minimal environment
(`PATH`, `HOME`, ...) plus the `env` its entry gives, so the run's keys reach it only when the
config passes them. A `url` server is not subject to the crawler's refusal of loopback and
private addresses: that refusal guards against URLs a model chooses, and a local MCP server is the
usual case of a URL the user chose. Credential-looking `env` values and header values are
registered for redaction (`trace.register_secrets`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import keyword
import os
import re
import sys
import threading
from collections.abc import Collection, Iterator, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from smolagents import Tool

from amapreduce._text import scrub, scrub_data
from amapreduce.agents.mcp_config import (
    McpConfig,
    McpServer,
    StdioServer,
    load_mcp_config,
    register_config_secrets,
    require_mcp,
)
from amapreduce.errors import ConfigError, ToolCallFailed, ToolCallRefused
from amapreduce.trace import redact_secrets

if TYPE_CHECKING:
    from types import TracebackType

    import mcp_types
    from mcp import Client

__all__ = ["McpTool", "McpToolbox", "open_mcp_tools", "result_text"]

# -- the tools -------------------------------------------------------------------------------------


def _identifier(text: str) -> str:
    """`text` as a tool name smolagents accepts: a Python identifier that is not a keyword."""
    name = re.sub(r"\W", "_", text) or "_"
    if name[0].isdigit():
        name = "_" + name
    return name + "_" if keyword.iskeyword(name) else name


def _resolve_refs(node: Any, defs: Mapping[str, Any], seen: frozenset[str] = frozenset()) -> Any:
    """`node` with local `#/$defs/...` references replaced by what they name (a cycle stays a
    plain object): model providers reject a tool schema whose `$ref` points nowhere."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/")):
            key = ref.rsplit("/", 1)[-1]
            if key in seen or key not in defs:
                return {"type": "object"}
            return _resolve_refs(defs[key], defs, seen | {key})
        return {k: _resolve_refs(v, defs, seen) for k, v in node.items() if k not in ("$defs", "definitions")}
    if isinstance(node, list):
        return [_resolve_refs(v, defs, seen) for v in node]
    return node


def _inputs(schema: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A tool's JSON-schema arguments as smolagents `inputs`: every property has a `type` and a
    `description`, and one the schema does not require is `nullable` (the model may leave it out)."""
    defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    resolved = _resolve_refs(dict(schema), defs)
    required = set(resolved.get("required") or ())
    inputs: dict[str, dict[str, Any]] = {}
    for key, raw in (resolved.get("properties") or {}).items():
        prop = dict(raw) if isinstance(raw, dict) else {}
        if "type" not in prop:
            options = [o for o in prop.get("anyOf", prop.get("oneOf", [])) if isinstance(o, dict)]
            kinds = [o["type"] for o in options if isinstance(o.get("type"), str)]
            if "null" in kinds:
                prop["nullable"] = True
            kinds = [k for k in kinds if k != "null"]
            prop["type"] = kinds[0] if len(kinds) == 1 else "any"
        elif isinstance(prop["type"], list) and "null" in prop["type"]:
            prop["nullable"] = True
        prop["description"] = str(prop.get("description") or prop.get("title") or "see the tool's description")
        if key not in required:
            prop["nullable"] = True
        inputs[key] = prop
    return inputs


def _content_text(item: Any) -> str:
    """One content item of a tool result as text (media are named, not inlined)."""
    kind = getattr(item, "type", "")
    if kind == "text":
        return str(item.text)
    if kind in ("image", "audio"):
        return f"[{kind} ({getattr(item, 'mime_type', '?')}) omitted]"
    if kind == "resource":
        resource = item.resource
        text = getattr(resource, "text", None)
        return str(text) if text is not None else f"[resource {resource.uri} omitted]"
    if kind == "resource_link":
        return f"[resource link: {item.uri}]"
    return f"[{kind or type(item).__name__} content omitted]"


def result_text(result: mcp_types.CallToolResult) -> str:
    """A tool result as the model reads it: its content items' text, or its structured content."""
    parts = [_content_text(item) for item in result.content]
    if not any(p.strip() for p in parts) and result.structured_content is not None:
        parts = [json.dumps(result.structured_content, ensure_ascii=False, default=str)]
    return "\n\n".join(parts)


class McpTool(Tool):  # type: ignore[misc,unused-ignore]  # smolagents may be untyped
    """One MCP server tool as a smolagents tool; its calls go through the toolbox's session.

    Output is always text, cut at `max_chars`. An error result, a timeout or a lost connection
    raises `ToolCallFailed`, which the agent shows to the model as the observation.
    """

    output_type = "string"
    skip_forward_signature_validation = True

    def __init__(self, toolbox: McpToolbox, server: str, spec: mcp_types.Tool, *, name: str,
                 timeout_s: float, max_chars: int) -> None:
        self.name = name
        self.server = server
        self.mcp_name = spec.name
        about = scrub(spec.description or spec.title or "")
        self.description = f"{about} (tool `{spec.name}` of the MCP server `{server}`)".strip()
        self.inputs = _inputs(spec.input_schema or {})
        self._toolbox = toolbox
        self._timeout_s = timeout_s
        self._max_chars = max_chars
        super().__init__()

    def forward(self, *args: Any, **kwargs: Any) -> str:
        if args:  # smolagents passes keyword arguments; a lone dict is the arguments
            if len(args) != 1 or not isinstance(args[0], dict) or kwargs:
                raise ToolCallRefused(f"call {self.name} with named arguments: {', '.join(self.inputs) or 'none'}.")
            kwargs = args[0]
        arguments = {k: scrub_data(v) for k, v in kwargs.items() if v is not None}
        result = self._toolbox.call(self.server, self.mcp_name, arguments, timeout_s=self._timeout_s)
        text = scrub(redact_secrets(result_text(result)))
        if result.is_error:
            raise ToolCallFailed(f"the MCP tool {self.mcp_name} (server {self.server!r}) returned an error: "
                                 f"{text[:2000] or '(no message)'}", cause="mcp")
        if len(text) > self._max_chars:
            text = f"{text[:self._max_chars]}\n[... cut: {len(text) - self._max_chars} more characters]"
        return text


# -- the sessions ----------------------------------------------------------------------------------


def _leaf_errors(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside (nested) exception groups: what anyio's task groups wrap."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaf_errors(inner)
    else:
        yield exc


def _describe(exc: BaseException) -> str:
    leaves = list(_leaf_errors(exc))
    return redact_secrets("; ".join(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__ for e in leaves))


def _server_stderr() -> TextIO:
    """Where a stdio server's own stderr goes: ours, when it is a real file. A subprocess needs a
    file descriptor, which a captured or notebook `sys.stderr` may not have; then the process's
    original stderr, else nowhere."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (OSError, ValueError, AttributeError):
            continue
    return open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115  # lives as long as the server


class McpToolbox:
    """The tools of the MCP servers a config names, connected for one run.

    Use as a context manager, or `start()` then `close()`. `tools` is ready after `start` (a
    second `start` does nothing, so `with open_mcp_tools(path) as toolbox:` works too).

    Args:
        config: the servers (the disabled ones are skipped).
        max_chars: longest tool output a model sees; the rest is cut with a note.
        reserved: tool names already taken (`web_search`, `final_answer`, ...): an MCP tool of
            such a name, or of a name an earlier server took, is renamed `SERVER_NAME`.
    """

    def __init__(self, config: McpConfig, *, max_chars: int = 20_000, reserved: Collection[str] = ()) -> None:
        self.config = config
        self.servers = config.enabled()
        self.max_chars = max_chars
        self.reserved = frozenset(reserved)
        self.tools: list[McpTool] = []
        self._clients: dict[str, Client] = {}
        self._started: concurrent.futures.Future[dict[str, list[mcp_types.Tool]]] = concurrent.futures.Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._run, name="mcp-sessions", daemon=True)
        self._closed = False

    # The loop thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # a failure of the thread itself is the start's failure
            if not self._started.done():
                self._started.set_exception(exc)

    def _client(self, server: McpServer, stack: AsyncExitStack) -> Client:
        from mcp import Client, StdioServerParameters, stdio_client

        if isinstance(server, StdioServer):
            params = StdioServerParameters(command=server.command, args=list(server.args), env=server.env or None,
                                           cwd=server.cwd)
            return Client(stdio_client(params, errlog=_server_stderr()), read_timeout_seconds=server.timeout)
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        http = httpx2.AsyncClient(headers=server.headers, timeout=httpx2.Timeout(30.0, read=max(server.timeout, 300.0)))
        stack.push_async_callback(http.aclose)
        return Client(streamable_http_client(server.url, http_client=http), read_timeout_seconds=server.timeout)

    async def _connect(self, name: str, server: McpServer, stack: AsyncExitStack) -> list[mcp_types.Tool]:
        # No timeout scope of our own around this: the client's task groups outlive the call, and an
        # anyio scope must close in the order it opened. Each request has the client's read timeout.
        try:
            client = await stack.enter_async_context(self._client(server, stack))
            listed: list[mcp_types.Tool] = []
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                listed += page.tools
                cursor = page.next_cursor
                if not cursor:
                    break
        except Exception as exc:
            raise ConfigError(
                f"MCP server {name!r} ({server.where()}) from {self.config.source or 'the MCP config'} could not be "
                f"started: {_describe(exc)}. Check its entry, or run it by hand to see its error."
            ) from None
        self._clients[name] = client
        return listed

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._task = asyncio.current_task()
        failure: ConfigError | None = None
        try:
            async with AsyncExitStack() as stack:
                listed: dict[str, list[mcp_types.Tool]] = {}
                for name, server in self.servers.items():
                    try:
                        listed[name] = await self._connect(name, server, stack)
                    except ConfigError as exc:
                        # Not raised in here: leaving the stack through the sessions' task groups
                        # would wrap it in exception groups. The stack closes what did start.
                        failure = exc
                        break
                if failure is None:
                    self._started.set_result(listed)
                    await self._stop.wait()
        except BaseException as exc:
            if not self._started.done():
                self._started.set_exception(exc)
            # A failure while closing leaves nothing to report to: the run has its result already.
        if failure is not None and not self._started.done():
            self._started.set_exception(failure)

    # The caller's side -----------------------------------------------------------------------

    def start(self) -> McpToolbox:
        """Start every server, list its tools and build `tools`.

        Raises:
            ConfigError: the `mcp` extra is missing, or a server could not be started (the
                message names it); every server already started is stopped again.
        """
        if self._closed:
            raise RuntimeError("this MCP toolbox is closed; open a new one")
        if self._thread.ident is not None:  # started already (`with open_mcp_tools(...)`)
            return self
        require_mcp()
        register_config_secrets(self.servers)
        self._thread.start()
        # The SDK times out each request of the handshake, but a version probe, its fallback and
        # the listing add up: this limit only guards against a start that never ends.
        limit_s = 5 * sum(server.timeout for server in self.servers.values()) + 30.0
        try:
            listed = self._started.result(timeout=limit_s)
        except concurrent.futures.TimeoutError:
            loop, task = self._loop, self._task
            if loop is not None and task is not None:
                loop.call_soon_threadsafe(task.cancel)
            self.close()
            raise ConfigError(f"the MCP servers of {self.config.source or 'the MCP config'} did not finish starting "
                              f"within {limit_s:g} s. Run each by hand to see why, or raise its `timeout`.") from None
        except BaseException:
            self.close()
            raise
        taken = set(self.reserved)
        for server, specs in listed.items():
            timeout = self.servers[server].timeout
            for spec in specs:
                name = _identifier(spec.name)
                if name in taken:
                    name = _identifier(f"{server}_{spec.name}")
                if name in taken:
                    self.close()
                    raise ConfigError(f"MCP server {server!r}: its tool {spec.name!r} clashes with another tool named "
                                      f"{name!r}; give the server another name in {self.config.source or 'the config'}.")
                taken.add(name)
                self.tools.append(McpTool(self, server, spec, name=name, timeout_s=timeout, max_chars=self.max_chars))
        return self

    def call(self, server: str, tool: str, arguments: dict[str, Any], *, timeout_s: float) -> mcp_types.CallToolResult:
        """Call `tool` of `server` from any thread and wait for its result.

        Raises:
            ToolCallFailed: the toolbox is closed, the call timed out, or the session failed.
        """
        loop, client = self._loop, self._clients.get(server)
        if self._closed or loop is None or client is None:
            raise ToolCallFailed(f"the MCP server {server!r} is no longer connected (the run is ending).", cause="mcp")
        try:
            future = asyncio.run_coroutine_threadsafe(
                client.call_tool(tool, arguments, read_timeout_seconds=timeout_s), loop)
        except RuntimeError:  # the loop has stopped
            raise ToolCallFailed(f"the MCP server {server!r} is no longer connected.", cause="mcp") from None
        try:
            # The session times the call out itself; the margin only guards a loop that stopped answering.
            return future.result(timeout=timeout_s + 5.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ToolCallFailed(f"the MCP tool {tool} (server {server!r}) did not answer within {timeout_s:g} s. "
                                 "Try again with a smaller request, or use another tool.", cause="mcp") from None
        except Exception as exc:
            raise ToolCallFailed(f"the MCP tool {tool} (server {server!r}) failed: {_describe(exc)}",
                                 cause="mcp") from None

    def close(self, timeout_s: float = 30.0) -> None:
        """End every session and stop the servers this toolbox started (idempotent).

        Waits at most `timeout_s` for the loop thread: a stdio server that ignores the end of its
        input is terminated, then killed, by the SDK within that time.
        """
        if self._closed:
            return
        self._closed = True
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop already ended
                pass
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def __enter__(self) -> McpToolbox:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def open_mcp_tools(path: Path | str, *, max_chars: int = 20_000, reserved: Collection[str] = ()) -> McpToolbox:
    """Load the MCP config at `path` and start its servers; the caller closes the toolbox.

    Raises:
        ConfigError: the config is invalid, or a server could not be started.
    """
    return McpToolbox(load_mcp_config(path), max_chars=max_chars, reserved=reserved).start()
