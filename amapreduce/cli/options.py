"""The flags the run commands (`ask`, `mapreduce run`, `runs resume`, `demo`, `eval run`) share, defined once.

Why one module: `--otel`, `--verify`, `--evidence`, `--mcp`, `--search`, `--allow-web-crawl` and the
table copies mean the same on every command that takes them; one `Annotated` definition each keeps
their names, metavars and help from drifting apart. Only typer is imported here: every command module
imports this one, and `amapreduce --help` must stay fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from amapreduce.session.executor import Executor
    from amapreduce.settings import Settings

__all__ = [
    "ALLOW_WEB_CRAWL_HELP",
    "AllowWebCrawlOpt",
    "ApiBaseOpt",
    "CsvOpt",
    "EVIDENCE_HELP",
    "EvidenceOpt",
    "EXECUTOR_HELP",
    "ExecutorOpt",
    "endpoint_overrides",
    "executor_for",
    "MaxCostOpt",
    "McpOpt",
    "MessageContentOpt",
    "ModelTimeoutOpt",
    "OTEL_HELP",
    "OtelOpt",
    "OutOpt",
    "SearchOpt",
    "SolverOpt",
    "StructuredOutputOpt",
    "ToolChoiceOpt",
    "VERIFY_HELP",
    "VerifyOpt",
    "WorkersAutoOpt",
    "WorkersOpt",
]

OTEL_HELP = (
    "Send OpenTelemetry traces (one trace per run; smolagents spans plus ours) to the collector the OTEL_* "
    "variables name (default OTLP http://localhost:4318). Needs: pip install 'amapreduce[otel]'. Or AMAPREDUCE_OTEL=1."
)
EVIDENCE_HELP = "The --csv copy also holds each cell's quote and evidence (verified/unverified/no_evidence)."
VERIFY_HELP = ("Check each cell's quote against the pages fetched: off, record (default; AMAPREDUCE_VERIFY), "
               "or strict (unverified cells count as missing and are asked again).")

OtelOpt = Annotated[bool, typer.Option("--otel", help=OTEL_HELP)]
VerifyOpt = Annotated[str | None, typer.Option("--verify", metavar="off|record|strict", help=VERIFY_HELP)]
EvidenceOpt = Annotated[bool, typer.Option("--evidence", help=EVIDENCE_HELP)]
McpOpt = Annotated[Path | None, typer.Option("--mcp", metavar="CONFIG", help=(
    "JSON file of MCP servers (Claude Desktop's {\"mcpServers\": ...} format) whose tools every search "
    "sub-agent gets; needs the `mcp` extra."))]
SearchOpt = Annotated[str | None, typer.Option("--search", help=(
    "ddgs | searxng:URL | serper | tavily | corpus:INDEX, or an installed plug-in's NAME[:ARG] "
    "(`amapreduce search --list-backends`)."))]
ALLOW_WEB_CRAWL_HELP = (
    "With --search corpus:INDEX, let crawl_page also fetch http(s) pages. Off (default): private mode, crawl_page "
    "reads only the corpus and refuses any other URL before any DNS lookup. Or AMAPREDUCE_ALLOW_WEB_CRAWL=1."
)
AllowWebCrawlOpt = Annotated[bool, typer.Option("--allow-web-crawl", help=ALLOW_WEB_CRAWL_HELP)]
ApiBaseOpt = Annotated[str | None, typer.Option(
    "--api-base", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1.")]
ModelTimeoutOpt = Annotated[float | None, typer.Option("--model-timeout", metavar="S", min=0.001, help=(
    "Seconds one model request may take (default: 300 for an --api-base on this machine or a private "
    "network, else 120; AMAPREDUCE_MODEL_TIMEOUT_S)."))]
SolverOpt = Annotated[str | None, typer.Option("--solver", metavar="auto|agent|read", help=(
    "Who fills a batch: agent (a tool-calling search sub-agent), read (code searches and reads, the model "
    "fills the rows in one structured call: for small models), auto (default: read when the endpoint has no "
    "reliable tool calling or the model is small). Or AMAPREDUCE_SOLVER."))]
ToolChoiceOpt = Annotated[str | None, typer.Option("--tool-choice", metavar="detect|required|auto|off", help=(
    "The tool_choice sent to an --api-base endpoint: as its probe found (detect, default), required, auto, or "
    "off (no tool calling: the read solver, and ask's planner). Or AMAPREDUCE_TOOL_CHOICE."))]
StructuredOutputOpt = Annotated[str | None, typer.Option(
    "--structured-output", metavar="detect|json_schema|json_object_schema|json_object|none", help=(
        "How a reply's JSON schema is sent to an --api-base endpoint: as its probe found (detect, default), "
        "OpenAI's json_schema, llama-cpp-python's json_object_schema, a bare json_object, or none (the schema "
        "goes into the prompt). Or AMAPREDUCE_STRUCTURED_OUTPUT."))]
MessageContentOpt = Annotated[str | None, typer.Option("--message-content", metavar="detect|list|string", help=(
    "How message content is sent to an --api-base endpoint: as its probe found (detect, default), a list of "
    "parts, or strings. Or AMAPREDUCE_MESSAGE_CONTENT."))]


def endpoint_overrides(*, model_timeout: float | None, solver: str | None, tool_choice: str | None,
                       structured_output: str | None, message_content: str | None) -> dict[str, Any]:
    """The settings the endpoint flags give (`load_settings` keywords; None: not given, so the
    environment or the default applies; a bad value is refused there, naming the setting)."""
    return {"model_timeout_s": model_timeout, "solver": solver, "tool_choice": tool_choice,
            "structured_output": structured_output, "message_content": message_content}
WorkersOpt = Annotated[int | None, typer.Option("--workers", min=1, help="Sub-agents running at once.")]


def _workers_value(value: str | None) -> str | None:
    """`--workers`: a number of at least 1, or `auto`."""
    if value is None or value.strip().lower() == "auto" or (value.strip().isdigit() and int(value) >= 1):
        return value
    raise typer.BadParameter(f"{value!r} is neither a number of at least 1 nor `auto`")


WorkersAutoOpt = Annotated[str | None, typer.Option("--workers", callback=_workers_value, metavar="N|auto", help=(
    "Sub-agents running at once, or `auto`: the server's slots where it reports them, else adapted to its "
    "throughput (from 2, halved on timeouts and 429s, up to 32). Default: 8, `auto` with --api-base."))]
ModelOpt = Annotated[str | None, typer.Option(
    "--model", help="LiteLLM id (openai/gpt-5-mini) or the server's model name.")]
MemoryOpt = Annotated[Path | None, typer.Option("--memory", help="Experiential-memory store for the plan stage.")]
NoMemoryOpt = Annotated[bool, typer.Option("--no-memory", help="Run without experiential memory.")]
MaxTokensOpt = Annotated[int | None, typer.Option("--max-tokens", help="Stop after this many tokens.")]
MaxCostOpt = Annotated[float | None, typer.Option("--max-cost", metavar="USD", help=(
    "Stop after spending this many dollars, and refuse up front (exit 4, nothing run) a fan-out whose estimate's "
    "low end costs more (see --estimate). Default: AMAPREDUCE_MAX_COST_USD. Models with no known price (a local "
    "vLLM or llama.cpp model) count as $0: price them in the JSON file named by AMAPREDUCE_PRICES_FILE, or use "
    "--max-tokens."))]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Also write the markdown table here.")]
CsvOpt = Annotated[Path | None, typer.Option("--csv", help="Also write the table as CSV here.")]
EXECUTOR_HELP = ("Where the work runs: local (threads here), ray (a Ray instance on this machine) or ray:ADDRESS "
                 "(a running cluster). Default: AMAPREDUCE_EXECUTOR, else local. Ray needs: pip install 'amapreduce[ray]'.")
ExecutorOpt = Annotated[str | None, typer.Option("--executor", metavar="local|ray[:ADDRESS]", help=EXECUTOR_HELP)]


def executor_for(settings: Settings, flag: str | None) -> Executor | None:
    """The run's executor from `Settings.executor` (the `--executor` flag, else `AMAPREDUCE_EXECUTOR`,
    else local), Ray checked importable before anything is made (`cluster.executor_for`); a bad
    value is refused naming the flag, or the variable when the flag was not given.

    Raises:
        ConfigError: a value that is not local, ray or ray:ADDRESS, or ray without the `ray` extra.
    """
    from amapreduce.cluster import executor_for as build
    from amapreduce.session.executor import EXECUTOR_VARIABLE

    return build(settings.executor, source="--executor" if flag is not None else EXECUTOR_VARIABLE)
