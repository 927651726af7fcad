"""`amapreduce mcp serve`: wide search as tools of an MCP server (the official `mcp` SDK's `MCPServer`).

Five tools, each a call of the public Python API (`api`, `enrich_api`) or of what the `runs` and
`mapreduce plan` commands read, so a client's run is the run a user gets from the command line:

* `wide_search` (question -> table and run id): `ask_async`;
* `enrich` (rows and the columns to add -> the rows, in their order, with the columns): `enrich_async`;
* `plan` (a decision -> its batch plan and the estimate of `mapreduce plan --estimate`);
* `run_status`, `run_table` (a run id -> what `runs show` shows of it; its table as rows).

A run id is the run folder's name under the runs folder the server was started with.

Progress: a run's `ProgressEvent`s (from its threads) become MCP progress notifications, in order,
each with a message that names the run (the first: `run <id> started`), so a client whose call is
cancelled still knows which run to ask `run_status` about. Cancellation: a cancelled call
interrupts its run as Ctrl-C does (`api`'s async variants); the call ends once the run folder
records `stopped: interrupted` with the rows found so far, which `runs resume` can finish.

Errors are translated here, at the boundary: a bad argument, a refused configuration or a failed
run is a tool error (`isError`) with the package's one-line message; the server keeps serving.
Stdio carries nothing but JSON-RPC (the SDK diverts stray writes to stdout onto stderr); with
`--http` the streamable-HTTP endpoint binds 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from amapreduce._version import __version__
from amapreduce.errors import AmapreduceError, UserError
from amapreduce.progress import ProgressEvent, ProgressSink
from amapreduce.settings import Settings, load_settings

if TYPE_CHECKING:
    from amapreduce.session.rundir import StoredRun
    from amapreduce.table.table import Table

__all__ = ["HOST", "TOOL_NAMES", "ServerOptions", "build_server", "serve"]

HOST = "127.0.0.1"
"""Where `--http` listens: loopback only."""
TOOL_NAMES = ("wide_search", "enrich", "plan", "run_status", "run_table")
"""The server's tools, in the order `tools/list` gives them."""

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class ServerOptions:
    """The `ask` options every run of the server gets (None: the environment's, else the default)."""

    model: str | None = None
    api_base: str | None = None
    search: str | None = None
    allow_web_crawl: bool | None = None
    """With a corpus search backend, also crawl http(s) pages (`Settings.allow_web_crawl`)."""
    workers: int | None = None
    memory: Path | bool | None = None
    """An experiential-memory store; None: the default store when it holds one; False: none."""
    max_cost: float | None = None
    max_tokens: int | None = None
    runs_dir: Path | None = None

    def keywords(self) -> dict[str, Any]:
        """The keywords of an `amapreduce.ask` (or `enrich`) call, unset ones left out."""
        named = {"model": self.model, "api_base": self.api_base, "search": self.search, "workers": self.workers,
                 "memory": self.memory, "max_cost": self.max_cost, "max_tokens": self.max_tokens,
                 "runs_dir": self.runs_dir, "allow_web_crawl": self.allow_web_crawl}
        return {k: v for k, v in named.items() if v is not None}

    def settings(self) -> Settings:
        """The settings these options give (the runs folder, the plan's model and workers)."""
        return load_settings(model=self.model, api_base=self.api_base, search_backend=self.search,
                             workers=self.workers, max_cost_usd=self.max_cost, max_tokens=self.max_tokens,
                             runs_dir=self.runs_dir, allow_web_crawl=self.allow_web_crawl)


class _Progress:
    """A run's progress events, sent from its threads, forwarded in order as the call's MCP
    progress notifications (progress: the events so far; the message: the run and the event)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[ProgressEvent | None] = asyncio.Queue()
        self.run_id: str | None = None

    def __call__(self, event: ProgressEvent) -> None:
        if event.kind == "started":
            self.run_id = str(event.data.get("run"))
        if event.kind != "attempt":  # a batch's attempts show in its `batch_done`; a retry in the run's status
            with contextlib.suppress(RuntimeError):  # the server has stopped: nobody to tell
                self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    def close(self) -> None:
        """No more events (called on the event loop)."""
        self._queue.put_nowait(None)

    async def forward(self) -> None:
        sent = 0
        while (event := await self._queue.get()) is not None:
            sent += 1
            text = (f"run {self.run_id} started" if event.kind == "started"
                    else f"run {self.run_id}: {event.line()}")
            await self._ctx.report_progress(sent, None, text)


async def _running(ctx: Context, call: Callable[[ProgressSink], Awaitable[T]]) -> tuple[T, str | None]:
    """`call(progress)` (an `api` async variant) with its progress sent to the client; a cancelled
    call interrupts the run and waits, shielded, until its folder records the interruption."""
    progress = _Progress(ctx)
    forwarder = asyncio.ensure_future(progress.forward())
    running = asyncio.ensure_future(call(progress))
    try:
        try:
            result = await asyncio.shield(running)
        except asyncio.CancelledError:
            running.cancel()  # the API's variant interrupts the run's thread as Ctrl-C does ...
            with anyio.CancelScope(shield=True):
                await asyncio.wait({running})  # ... and returns once the run folder says so
            forwarder.cancel()
            raise
        except AmapreduceError as exc:
            raise ToolError(_one_line(exc)) from None
        progress.close()
        await forwarder  # every notification goes out before the result
        return result, progress.run_id
    finally:
        if not forwarder.done():
            forwarder.cancel()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _rows(table: Table) -> tuple[list[str], list[dict[str, Any]]]:
    """A table's columns and its rows as plain objects (a missing cell: null)."""
    from amapreduce.table.table import CellStatus

    return list(table.columns), [{c: None if cell.status is CellStatus.MISSING else cell.value
                                  for c, cell in row.cells.items()} for row in table.rows]


def _records(frame: Any) -> list[dict[str, Any]]:
    """A DataFrame's rows as JSON objects in order, a missing value as null."""
    plain = frame.astype(object).where(frame.notna(), None)
    return [dict(r) for r in plain.to_dict(orient="records")]


def _run_name(run_id: str) -> str:
    """`run_id` checked to be a run folder's name (never a path: the server reads its own runs folder)."""
    if not run_id or Path(run_id).name != run_id or run_id in (".", ".."):
        raise ToolError(f"run_id must be a run id as wide_search or enrich returned it (a folder name), got {run_id!r}.")
    return run_id


def build_server(options: ServerOptions) -> MCPServer:
    """The MCP server whose tools run with `options` (see the module's docstring)."""
    server: MCPServer = MCPServer(
        name="amapreduce", version=__version__, log_level="WARNING",
        instructions=("Wide search: questions whose answer is a table over many entities. `wide_search` answers "
                      "one with a table; `enrich` adds columns to rows you have; `plan` checks a decision and "
                      "estimates it; `run_status` and `run_table` read a run by its id."),
    )
    keywords = options.keywords()

    @server.tool(name="wide_search", description=(
        "Answer a wide-search question (one whose answer is a table over many entities; name the columns you "
        "want) with a table: a manager agent plans the work, search sub-agents fan out, their rows are reduced "
        "into one table. Returns run_id, status, columns and rows (a missing cell is null). Progress "
        "notifications name the run; a cancelled call stops the run and keeps the rows found so far."))
    async def wide_search(
        question: Annotated[str, Field(description="The question, e.g. 'List the EU member states with their capitals.'")],
        ctx: Context,
    ) -> dict[str, Any]:
        from amapreduce.api import ask_async

        if not question.strip():
            raise ToolError("question must not be empty.")
        result, run_id = await _running(ctx, lambda sink: ask_async(question, on_progress=sink, **keywords))
        columns, rows = _rows(result.table)
        c = result.completeness
        return {"run_id": run_id or result.run_dir.name, "status": result.ending.label, "columns": columns,
                "rows": rows, "missing_cells": c.missing_cells, "answer": result.markdown if not columns else None,
                "run_dir": str(result.run_dir)}

    @server.tool(name="enrich", description=(
        "Enrich rows you already have: each row becomes one sub-question and the named columns are searched for "
        "it. Returns run_id, status and the rows in their input order, every input field kept, then the new "
        "columns (null where not found) and enrich_status (complete, partial or failed)."))
    async def enrich(
        rows: Annotated[list[dict[str, Any]], Field(description="The rows, e.g. [{\"company\": \"Acme\"}].")],
        columns: Annotated[list[str], Field(description="The columns to add, e.g. [\"CEO\", \"Founded\"].")],
        ctx: Context,
        key: Annotated[list[str] | str | None, Field(description=(
            "The field(s) that name each row (default: the first field whose values name every row once)."))] = None,
        instructions: Annotated[str | None, Field(description="Extra guidance for every sub-agent.")] = None,
    ) -> dict[str, Any]:
        import pandas as pd

        from amapreduce.enrich_api import enrich_async

        if not rows:
            raise ToolError("rows must hold at least one row.")
        frame = pd.DataFrame(rows)
        out, run_id = await _running(ctx, lambda sink: enrich_async(
            frame, columns=columns, key=key, instructions=instructions, on_progress=sink, **keywords))
        return {"run_id": run_id or Path(out.attrs["run_dir"]).name, "status": out.attrs["status"],
                "columns": [str(c) for c in out.columns], "rows": _records(out), "run_dir": out.attrs["run_dir"]}

    @server.tool(name="plan", description=(
        "Check a MapReduce decision (task matrix, template, output columns, batch strategy; the format of "
        "`amapreduce mapreduce plan`) without running it: its batch plan and an estimate of the sub-agent calls, "
        "tokens, cost and wall time, from past runs of sub-questions worded alike (else documented defaults)."))
    def plan(
        decision: Annotated[dict[str, Any], Field(description="The decision, as in a decision JSON file.")],
    ) -> dict[str, Any]:
        from amapreduce.decision.model import Decision
        from amapreduce.session.estimate import plan_decision

        try:
            planned = plan_decision(Decision.parse(decision), options.settings(), estimate=True)
        except AmapreduceError as exc:
            raise ToolError(_one_line(exc)) from None
        return planned.to_json()

    @server.tool(name="run_status", description=(
        "How a run stands, by its id: kind, question, status (running, complete, incomplete, stopped: ..., "
        "interrupted, failed), batches done of total, completeness, usage, its folder."))
    def run_status(run_id: Annotated[str, Field(description="The run id a call returned.")]) -> dict[str, Any]:
        run = _load(options, run_id)
        record = run.record
        return {"run_id": run_id, "kind": run.kind, "query": run.query, "status": run.status, "state": run.state,
                "progress": run.progress,
                "completeness": record.completeness.model_dump(mode="json") if record is not None else None,
                "error": record.error if record is not None else None, "run_dir": str(run.path),
                "usage": record.usage.total.model_dump(mode="json") if record is not None else None}

    @server.tool(name="run_table", description=(
        "A run's table, by its id: columns and rows (a missing cell is null), as its folder keeps it; a stopped "
        "or interrupted run's rows are those found before it stopped."))
    def run_table(run_id: Annotated[str, Field(description="The run id a call returned.")]) -> dict[str, Any]:
        run = _load(options, run_id)
        if run.record is None or run.record.table is None:
            raise ToolError(f"run {run_id!r} has no table yet (status {run.status}).")
        columns, rows = _rows(run.record.table.to_table())
        return {"run_id": run_id, "status": run.status, "columns": columns, "rows": rows}

    return server


def _load(options: ServerOptions, run_id: str) -> StoredRun:
    """`read_run` of `run_id` in the server's runs folder, a missing or unreadable run as a tool error."""
    from amapreduce.session.rundir import read_run

    try:
        return read_run(options.settings().runs_dir, _run_name(run_id))
    except UserError as exc:
        raise ToolError(_one_line(exc)) from None


def serve(options: ServerOptions, *, http: bool = False, port: int = 8000) -> None:
    """Serve until the client closes stdio (or, with `http`, until Ctrl-C) on 127.0.0.1:`port`.

    Raises:
        UserError: with `http`, the port cannot be bound (taken, or not allowed).
    """
    server = build_server(options)
    if http:
        with socket.socket() as probe:  # a port in use is the user's to change, said in one line
            try:
                probe.bind((HOST, port))
            except OSError as exc:
                raise UserError(f"cannot serve on {HOST}:{port}: {exc.strerror or exc}. Choose another --port.") from None
        server.run("streamable-http", host=HOST, port=port)
    else:
        server.run("stdio")

