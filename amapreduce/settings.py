"""Configuration enters here and nowhere else.

Library code receives settings objects; only `load_settings` reads the environment, and only
when the CLI (or a caller) asks for it. Nothing is read at import time.

Precedence (highest first): explicit overrides (CLI flags) > the process environment
(`AMAPREDUCE_*`) > the `.env` file (`load_env_file`: `AMAPREDUCE_ENV_FILE`, else `./.env`) >
the defaults below.

Every default of a run's limits is written once, here: library objects that have their own
defaults (`mapreduce.engine.EngineConfig`, `mapreduce.batching.plan_batches`, the manager's
instructions) take them from `Settings` with `default_setting`, and the retry fields take theirs
from `RetryPolicy`, the retry loop's own model.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from amapreduce._retry import RetryPolicy
from amapreduce.errors import ConfigError

__all__ = [
    "ENV_ALIASES",
    "BackupMode",
    "ENV_FILE_VARIABLE",
    "ENV_PREFIX",
    "DecisionAuthor",
    "Settings",
    "default_setting",
    "is_credential_name",
    "load_env_file",
    "load_settings",
    "normalize_domains",
]

ENV_PREFIX = "AMAPREDUCE_"

DecisionAuthor = Literal["manager", "user"]
"""Who wrote a decision: `ask`'s manager agent, or the user (`mapreduce run`/`plan`)."""
VerifyMode = Literal["off", "record", "strict"]
"""How cells' quotes are checked (`Settings.verify`)."""
BackupMode = Literal["auto", "off"]
"""Whether stragglers get hedged model calls and backup attempts (`Settings.backup`): `auto` under
their rules (`llm.hedge`, `mapreduce.backup`), `off` never."""

_RETRY_DEFAULTS = RetryPolicy()

# Conventional provider variable names, read only when the `AMAPREDUCE_*` one is unset, so a
# user who already exports `SERPER_API_KEY` for other tools needs nothing new.
ENV_ALIASES: dict[str, str] = {
    "serper_api_key": "SERPER_API_KEY",
    "tavily_api_key": "TAVILY_API_KEY",
    "api_key": "OPENAI_API_KEY",
    "api_base": "OPENAI_BASE_URL",
}

_CREDENTIAL_VARIABLE = re.compile(r"(API[_-]?KEY|ACCESS[_-]?KEY|SECRET|SECRET[_-]?KEY|TOKEN|PASSWORD)$", re.IGNORECASE)
"""Environment variables whose values are credentials (`ANTHROPIC_API_KEY`, `HF_TOKEN`, ...).
LiteLLM reads its providers' keys from them itself, so they are keys of the run without being
settings; `Settings.secret_values` names them for redaction. (`AMAPREDUCE_MAX_TOKENS` does not
match: it ends in `TOKENS`.)"""


def is_credential_name(name: str) -> bool:
    """Whether a variable (or header) of this name holds a credential (`..._API_KEY`, `..._TOKEN`,
    `..._SECRET`, `..._PASSWORD`): what configuration from outside the settings (an MCP server's
    `env`) registers for redaction, by the same rule as the process environment."""
    return bool(_CREDENTIAL_VARIABLE.search(name))


def normalize_domains(value: object) -> tuple[str, ...]:
    """A domain list from a comma-separated string or a sequence: trimmed, lower case, without a
    leading `*.`/`.` or a trailing dot, empties dropped, order kept.

    The one parser of domain lists: the settings read `AMAPREDUCE_ALLOWED_DOMAINS` with it and
    `web.policy.UrlPolicy` reads its lists with it, so both spell a list the same way (it lives
    here because configuration must not import the web layer)."""
    if value is None:
        return ()
    if isinstance(value, str):
        items: list[object] = list(value.split(","))
    elif isinstance(value, Iterable):
        items = list(value)
    else:
        raise ValueError(f"expected a comma-separated string or a list of domains, got {value!r}")
    out: list[str] = []
    for item in items:
        text = str(item).strip().lower().removeprefix("*.").strip(".")
        if text and text not in out:
            out.append(text)
    return tuple(out)


class Settings(BaseModel):
    """Run-level settings shared by the CLI commands."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int = Field(default=8, ge=1, le=1024)
    """Sub-agents running at once (`AMAPREDUCE_WORKERS`; `auto`: `workers_auto`)."""
    workers_auto: bool = False
    """Fit the sub-agents running at once to the server (`--workers auto`, `AMAPREDUCE_WORKERS=auto`; the default
    for an `--api-base` endpoint given no `--workers N`): its
    slots where it reports them (llama.cpp's `/props`), else adapted as the run goes (`mapreduce.concurrency`:
    from 2, doubled then grown by one while throughput rises, halved on a timeout or a 429, up to 32); `workers`
    is not used then."""
    max_attempts: int = Field(default=3, ge=1, le=20)
    """Attempts per batch: the first plus retries (`AMAPREDUCE_MAX_ATTEMPTS`; the paper's 2 retries)."""
    batch_timeout_s: float = Field(default=900.0, gt=0)
    """Deadline of one sub-agent attempt in seconds (`AMAPREDUCE_BATCH_TIMEOUT_S`)."""
    patch_rounds: int = Field(default=2, ge=0, le=10)
    """Delta-patch rounds after the map (`AMAPREDUCE_PATCH_ROUNDS`)."""
    backup: BackupMode = "auto"
    """Hedged model calls and backup attempts for stragglers (`AMAPREDUCE_BACKUP`). With `auto`, a
    sub-agent's model request to an `--api-base` endpoint that runs far longer than the calls of the
    same step finished lately (twice their 75th percentile, at least 0.1 s) is sent once more,
    the first valid reply wins and the other request is cancelled (`llm.hedge`); and where calls
    are not hedged, an attempt that runs far longer than the run's finished attempts (1.5 times
    their 75th percentile, at least 0.5 s) gets one backup on a fresh sub-agent when a worker slot
    is free and no batch waits for one (`mapreduce.backup`). `off`: neither."""
    backup_max_extra: float = Field(default=0.05, ge=0, le=1, allow_inf_nan=False)
    """Cap on the model calls hedges and backups add together, as a share of the calls a run needs:
    its planned batches times the calls a finished attempt made (`AMAPREDUCE_BACKUP_MAX_EXTRA`,
    default 0.05: at most 5 % extra calls)."""
    verify: VerifyMode = "record"
    """Cells' quotes checked against the pages fetched (`AMAPREDUCE_VERIFY`, `--verify`): `off`
    checks nothing, `record` records each cell's evidence, `strict` also counts `unverified` cells
    as missing, so retries and delta-patch rounds ask for them again."""
    max_batches: int = Field(default=50, ge=1)
    """Largest batch plan accepted (`AMAPREDUCE_MAX_BATCHES`, `--max-batches`). The default is
    the paper's cap on plans a manager writes (`ask`); a decision the user wrote (`mapreduce
    run`/`plan`) is capped only when this is set explicitly. See `batch_cap`."""
    retry_max_retries: int = Field(default=_RETRY_DEFAULTS.max_retries, ge=0)
    """Retries of a failed model call (429, 5xx, timeout) after its first try
    (`AMAPREDUCE_RETRY_MAX_RETRIES`). Model calls only: search backends keep their own, shorter
    policy (`web.backends.base.SEARCH_RETRY`)."""
    retry_base_delay_s: float = Field(default=_RETRY_DEFAULTS.base_delay_s, ge=0, allow_inf_nan=False)
    """First backoff of a model-call retry in seconds, doubled each retry (`AMAPREDUCE_RETRY_BASE_DELAY_S`)."""
    retry_max_delay_s: float = Field(default=_RETRY_DEFAULTS.max_delay_s, ge=0, allow_inf_nan=False)
    """Cap on one model-call backoff in seconds; a longer `Retry-After` from the provider is still
    honoured (`AMAPREDUCE_RETRY_MAX_DELAY_S`)."""
    breaker_failures: int = Field(default=5, ge=1)
    """Model requests in a row that failed because the provider did not answer (5xx, timeout,
    connection error) before the provider's circuit breaker opens and stops sending
    (`AMAPREDUCE_BREAKER_FAILURES`). Shared by the whole process; any answer resets the count."""
    breaker_cooldown_s: float = Field(default=30.0, ge=0, allow_inf_nan=False)
    """Seconds an open breaker sends nothing before one probe request (`AMAPREDUCE_BREAKER_COOLDOWN_S`)."""
    breaker_max_wait_s: float = Field(default=120.0, ge=0, allow_inf_nan=False)
    """Seconds after a provider's outage began that a model call still waits for it; then calls
    raise `ProviderUnavailable` at once and the run ends `failed` (`AMAPREDUCE_BREAKER_MAX_WAIT_S`;
    0: fail at once while the breaker is open)."""
    max_decision_bytes: int = Field(default=16 * 1024 * 1024, ge=1)
    """Largest decision file `mapreduce plan`, `mapreduce run` and `run_decision` read, in bytes
    (`AMAPREDUCE_MAX_DECISION_BYTES`; default 16 MiB): a larger one is refused before it is read."""
    max_decision_rows: int = Field(default=100_000, ge=1)
    """Most `task_matrix` rows a decision file may hold (`AMAPREDUCE_MAX_DECISION_ROWS`): a larger
    matrix is refused before it is validated or planned."""
    max_tool_calls: int = Field(default=4, ge=1)
    """`mapreduce` tool calls allowed per manager run (`AMAPREDUCE_MAX_TOOL_CALLS`)."""
    runs_dir: Path = Path("runs")
    """Where run directories are written (`AMAPREDUCE_RUNS_DIR`)."""
    memory_store: Path = Path("memory_store/default")
    """Default experiential-memory namespace (`AMAPREDUCE_MEMORY_STORE`)."""
    cache_dir: Path = Path(".amapreduce-cache")
    """Search/crawl cache folder (`AMAPREDUCE_CACHE_DIR`)."""
    search_backend: str = "ddgs"
    """Default `web_search` backend: `ddgs`, `searxng:URL`, `serper`, `tavily` or `corpus:INDEX`
    (`AMAPREDUCE_SEARCH_BACKEND`)."""
    searxng_url: str | None = None
    """SearXNG base URL used by the plain `searxng` backend spec (`AMAPREDUCE_SEARXNG_URL`)."""
    serper_api_key: SecretStr | None = None
    """Serper key (`AMAPREDUCE_SERPER_API_KEY`, or the conventional `SERPER_API_KEY`); never printed."""
    tavily_api_key: SecretStr | None = None
    """Tavily key (`AMAPREDUCE_TAVILY_API_KEY`, or the conventional `TAVILY_API_KEY`); never printed."""
    cache_ttl_s: float = Field(default=7 * 24 * 3600.0, ge=0)
    """Lifetime of cached search results and pages in seconds; 0 disables the cache (`AMAPREDUCE_CACHE_TTL_S`)."""
    allow_private_urls: bool = False
    """Let `crawl_page` reach loopback/private addresses; cloud metadata stays refused
    (`AMAPREDUCE_ALLOW_PRIVATE_URLS`)."""
    allowed_domains: tuple[str, ...] = ()
    """When not empty, `crawl_page` may fetch only these domains and their subdomains (an IP-literal
    URL only when its address is listed); comma-separated in `AMAPREDUCE_ALLOWED_DOMAINS`."""
    denied_domains: tuple[str, ...] = ()
    """Domains (and their subdomains) `crawl_page` never fetches; beats the allow list;
    comma-separated in `AMAPREDUCE_DENIED_DOMAINS`."""
    allow_web_crawl: bool = False
    """With a `corpus:INDEX` search backend, let `crawl_page` also fetch http(s) pages
    (`AMAPREDUCE_ALLOW_WEB_CRAWL`, `--allow-web-crawl`). Off: private mode, nothing leaves the
    machine through the tools: `crawl_page` reads only the corpus and refuses any other URL before
    its host is looked up (`web.service`). Other backends search the web anyway and ignore it."""
    crawl_max_chars: int = Field(default=20_000, ge=100)
    """Character budget of one crawled page's text (`AMAPREDUCE_CRAWL_MAX_CHARS`)."""
    enrich_max_file_mb: float = Field(default=200.0, gt=0)
    """Largest input file `amapreduce enrich` (and `amapreduce.enrich` given a path) reads, in MiB
    (`AMAPREDUCE_ENRICH_MAX_FILE_MB`): a larger one is refused before it is read."""
    search_min_interval_s: float = Field(default=1.0, ge=0)
    """Minimum seconds between two calls to one remote search backend (`AMAPREDUCE_SEARCH_MIN_INTERVAL_S`)."""
    search_breaker_failures: int = Field(default=5, ge=1)
    """Search requests in a row that failed because the backend did not answer (connection or
    DNS error, timeout, 5xx; an empty result or a 429 is an answer) before the backend's circuit
    breaker opens (`AMAPREDUCE_SEARCH_BREAKER_FAILURES`). Each attempt counts, retries included."""
    search_breaker_cooldown_s: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    """Seconds an open search breaker sends nothing before one probe request
    (`AMAPREDUCE_SEARCH_BREAKER_COOLDOWN_S`)."""
    search_breaker_max_wait_s: float = Field(default=30.0, ge=0, allow_inf_nan=False)
    """Seconds after a search backend's outage began that a search still waits for it; then
    searches raise `SearchUnavailable` at once and the run ends `failed` with that one line
    (`AMAPREDUCE_SEARCH_BREAKER_MAX_WAIT_S`; 0: fail at once while the breaker is open)."""
    crawl_breaker_failures: int = Field(default=3, ge=1)
    """Crawls of one host in a row that failed because it did not answer (DNS or connection
    error, timeout, 5xx) before that host's breaker opens and its pages fail at once, telling the
    model to try another source (`AMAPREDUCE_CRAWL_BREAKER_FAILURES`). Per host and per run: one
    dead site never stops a run."""
    crawl_breaker_cooldown_s: float = Field(default=60.0, ge=0, allow_inf_nan=False)
    """Seconds an open host breaker refuses crawls of that host before one probe is let through
    (`AMAPREDUCE_CRAWL_BREAKER_COOLDOWN_S`)."""
    model: str | None = None
    """Default model of every role: a LiteLLM id (`openai/gpt-5-mini`) or, with `api_base`, the
    server's model name (`AMAPREDUCE_MODEL`)."""
    api_base: str | None = None
    """OpenAI-compatible endpoint (vLLM, llama.cpp, Ollama) (`AMAPREDUCE_API_BASE` or `OPENAI_BASE_URL`)."""
    api_key: SecretStr | None = None
    """Key for `api_base` (`AMAPREDUCE_API_KEY` or `OPENAI_API_KEY`); LiteLLM ids read their
    provider's usual variable themselves. Never printed or traced."""
    subagent_model: str | None = None
    """Model of the search sub-agents (default: `model`) (`AMAPREDUCE_SUBAGENT_MODEL`)."""
    extraction_model: str | None = None
    """Model of query-focused page extraction; `none` turns extraction off (`AMAPREDUCE_EXTRACTION_MODEL`)."""
    memory_model: str | None = None
    """Model of the memory's projection and distillation (`AMAPREDUCE_MEMORY_MODEL`)."""
    judge_model: str | None = None
    """Model of LLM judging in evaluations (`AMAPREDUCE_JUDGE_MODEL`)."""
    model_rpm: int | None = Field(default=None, ge=1)
    """Requests per minute allowed by the provider, shared by the process (`AMAPREDUCE_MODEL_RPM`)."""
    model_tpm: int | None = Field(default=None, ge=1)
    """Tokens per minute allowed by the provider (`AMAPREDUCE_MODEL_TPM`)."""
    max_cost_usd: float | None = Field(default=None, gt=0)
    """Stop a run once it has spent this many dollars (`AMAPREDUCE_MAX_COST_USD`)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Stop a run once it has used this many tokens (`AMAPREDUCE_MAX_TOKENS`)."""
    prices_file: Path | None = None
    """JSON price overrides, `{"model_id": {"input": $/token, "output": $/token}}`, consulted
    before LiteLLM's price map (`AMAPREDUCE_PRICES_FILE`)."""
    memory_advice: Literal["suggest", "apply"] = "suggest"
    """What the plan stage does with the structured advice the memory computes for a draft
    (`AMAPREDUCE_MEMORY_ADVICE`): `suggest` (the paper's behaviour) shows it to the manager, who may
    accept it with `use_advice: true`; `apply` has the plan stage apply supported advice itself."""
    memory_encoder: str = "minilm"
    """Encoder of NEW memory stores: `minilm`, `st:MODEL` (e.g. a multilingual model) or
    `hashing[:DIM]`; an existing store keeps its own (`AMAPREDUCE_MEMORY_ENCODER`)."""
    utility_cost_weight: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """λ_c of the evaluation utility u = Q − λ_c·C − λ_t·D, per million tokens
    (`AMAPREDUCE_UTILITY_COST_WEIGHT`); None: the benchmark's default (0 for WideSearch and
    DeepWideSearch, as in the paper; the sandbox benchmark weighs cost)."""
    utility_delay_weight: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """λ_t of the evaluation utility, per second of wall time (`AMAPREDUCE_UTILITY_DELAY_WEIGHT`);
    None: the benchmark's default (0)."""
    context_window: int | None = Field(default=None, ge=1_000, le=100_000_000)
    """Context window of the sub-agent model in tokens (`AMAPREDUCE_CONTEXT_WINDOW`); discovery's
    merge calls get `budget_ratio` of it when a decision gives no `chunk_size`/`token_budget`.
    None: the model's own, from LiteLLM's model info when the `litellm` extra knows the model,
    else 128,000."""
    model_timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Seconds one model request may take (`AMAPREDUCE_MODEL_TIMEOUT_S`, `--model-timeout`). None:
    300 s for an `api_base` on this machine or a private network (a CPU server queues requests
    behind its slots and takes seconds per call), else 120 s."""
    endpoint_probe: bool = True
    """Ask an `api_base` endpoint once what it accepts before a run uses it (`AMAPREDUCE_ENDPOINT_PROBE`;
    `llm.endpoint`: message content, tool choices, structured output, context window, slots),
    kept in the cache folder per server. False: assume OpenAI's own dialect."""
    message_content: Literal["detect", "list", "string"] = "detect"
    """How message content is sent to an `api_base` endpoint (`AMAPREDUCE_MESSAGE_CONTENT`,
    `--message-content`): as the probe found it (`detect`), as a list of parts, or as strings."""
    tool_choice: Literal["detect", "required", "auto", "off"] = "detect"
    """Which `tool_choice` the agents send (`AMAPREDUCE_TOOL_CHOICE`, `--tool-choice`): as the probe
    found it works (`detect`), `required`, `auto`, or `off` (the endpoint has no usable tool calling:
    sub-agents use the read solver and `ask`'s manager writes its decision in one structured call)."""
    structured_output: Literal["detect", "json_schema", "json_object_schema", "json_object", "none"] = "detect"
    """How a JSON schema for a reply is sent (`AMAPREDUCE_STRUCTURED_OUTPUT`, `--structured-output`): as
    the probe found it (`detect`), OpenAI's `json_schema`, llama-cpp-python's `json_object_schema`
    (`{"type": "json_object", "schema": ...}`), a bare `json_object`, or `none` (the schema is written
    into the prompt and the reply read leniently)."""
    solver: Literal["auto", "agent", "read"] = "auto"
    """Who fills a batch (`AMAPREDUCE_SOLVER`, `--solver`): `agent`, a tool-calling search sub-agent
    per attempt; `read`, code searches and reads and the model fills the rows in one structured call
    (made for small models; fewer calls with any model); `auto`: `read` when the sub-agent endpoint
    has no reliable tool calling (its probe, or `tool_choice=off`), a context window under 4,096 tokens,
    or a model id that names a size under 3B parameters, else `agent`."""
    subagent_max_steps: int = Field(default=20, ge=1)
    """Agent steps per sub-agent attempt (`AMAPREDUCE_SUBAGENT_MAX_STEPS`)."""
    manager_max_steps: int = Field(default=30, ge=1)
    """Agent steps of the manager (`AMAPREDUCE_MANAGER_MAX_STEPS`)."""
    executor: str = "local"
    """Where wide work runs (`AMAPREDUCE_EXECUTOR`, `--executor`): `local` (this process), `ray` (a
    Ray instance here, or the one `RAY_ADDRESS` names) or `ray:ADDRESS` (a running cluster); read
    by the CLI and the Python API alike, and parsed where an executor is built
    (`session.executor.parse_executor`, whose refusal names the flag or the variable it came from)."""
    ray_retries: int = Field(default=3, ge=0)
    """Times a Ray chunk or evaluation trial whose worker or node died is run again, on another
    worker, before the run ends `failed` (`AMAPREDUCE_RAY_RETRIES`); a chunk goes on from the
    batches its dead worker had settled."""
    mcp: Path | None = None
    """A JSON file of MCP servers, in Claude Desktop's `{"mcpServers": {...}}` format, whose tools
    every search sub-agent gets (`AMAPREDUCE_MCP`, `--mcp`; needs the `mcp` extra)."""
    mcp_manager: bool = False
    """Give the MCP servers' tools to the manager too (`AMAPREDUCE_MCP_MANAGER`, `--mcp-manager`)."""
    otel: bool = False
    """Send OpenTelemetry traces of every run, one trace per run (`AMAPREDUCE_OTEL`, `--otel`;
    needs the `otel` extra). Where they go is set by the standard `OTEL_*` variables
    (`OTEL_EXPORTER_OTLP_ENDPOINT`, ...); the JSONL trace is written either way."""

    _environ_secrets: tuple[str, ...] = PrivateAttr(default=())
    """The credential variables `load_settings` saw (see `_CREDENTIAL_VARIABLE`)."""

    def secret_values(self) -> tuple[str, ...]:
        """Every credential of this configuration: each secret field's value (model and search
        backend keys) and the credential-named environment variables `load_settings` read.

        Why: a provider that refuses a key echoes it in its error; the run masks these values in
        everything it stores or sends (`trace.register_secrets`, called where runs start and
        models are built, since configuration imports no feature layer).
        """
        fields = (getattr(self, name) for name in type(self).model_fields)
        return (*(v.get_secret_value() for v in fields if isinstance(v, SecretStr)), *self._environ_secrets)

    @model_validator(mode="before")
    @classmethod
    def _workers_auto(cls, data: Any) -> Any:
        """`workers: auto` (the flag or the variable) is `workers_auto`, and so is an `--api-base` endpoint's
        default: a run against a server given neither a number of workers nor `workers_auto` fits it."""
        if not isinstance(data, Mapping):
            return data
        if isinstance(data.get("workers"), str) and data["workers"].strip().lower() == "auto":
            data = {k: v for k, v in data.items() if k != "workers"}
            data["workers_auto"] = True
        elif data.get("api_base") and "workers" not in data and "workers_auto" not in data:
            data = {**data, "workers_auto": True}
        return data

    @field_validator("allowed_domains", "denied_domains", mode="before")
    @classmethod
    def _split_domains(cls, value: object) -> tuple[str, ...]:
        # Environment values arrive as one comma-separated string.
        return normalize_domains(value)

    def batch_cap(self, author: DecisionAuthor) -> int | None:
        """The largest batch plan accepted for a decision written by `author` (None: no cap).

        The paper's cap exists so that a manager LLM cannot fan out an absurd plan, so plans a
        manager writes are always capped at `max_batches`. A user who wrote a 100-row `per_atom`
        decision asked for 100 batches: their decision is capped only when they set
        `max_batches` themselves (`--max-batches` or `AMAPREDUCE_MAX_BATCHES`).
        """
        if author == "manager" or "max_batches" in self.model_fields_set:
            return self.max_batches
        return None

    def model_retry_policy(self) -> RetryPolicy:
        """How model calls are retried: the `retry_*` settings, the rest from `RetryPolicy`."""
        return RetryPolicy(
            max_retries=self.retry_max_retries,
            base_delay_s=self.retry_base_delay_s,
            max_delay_s=self.retry_max_delay_s,
        )


def default_setting(name: str) -> Any:
    """The default of the setting `name`, for library objects whose own defaults must agree with
    the settings' (`EngineConfig`, `plan_batches`, the manager's instructions)."""
    return Settings.model_fields[name].default


_FLAGS = {
    "search_backend": "--search",
    "max_cost_usd": "--max-cost",
    "crawl_max_chars": "--max-chars",
    "allowed_domains": "--allow-domain",
    "denied_domains": "--deny-domain",
    "memory_model": "--model",
}
"""The command-line flag of each setting whose flag is not `--` plus its name with dashes: an
override passed to `load_settings` comes from that flag, and a bad value's message names it."""

ENV_FILE_VARIABLE = "AMAPREDUCE_ENV_FILE"
"""Names the `.env` file to read instead of `./.env` (`/dev/null`: read none)."""


def load_env_file(environ: MutableMapping[str, str] | None = None) -> tuple[Path | None, dict[str, str]]:
    """Read the `.env` file and export to `environ` (default `os.environ`) each of its variables
    that `environ` lacks (or has empty); return the file read (None: none) and its variables.

    Which file: the one `AMAPREDUCE_ENV_FILE` names (it must exist), else `.env` in the current
    folder when there is one. Why export, as python-dotenv's `load_dotenv` does: LiteLLM reads
    its providers' keys (`ANTHROPIC_API_KEY`, ...) from the process environment itself, and a
    user who keeps them in `.env` expects them to work. The process environment always wins: a
    variable already set is never replaced.

    Raises:
        ConfigError: the named file is missing or unreadable, or a line is not `NAME=value`; the
            message names the file and the line, never a value (it may be a key).
    """
    import io

    from dotenv import dotenv_values
    from dotenv.parser import parse_stream

    env = os.environ if environ is None else environ
    named = env.get(ENV_FILE_VARIABLE)
    path = Path(named).expanduser() if named else Path(".env")
    if not named and not path.is_file():
        return None, {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = "does not exist" if isinstance(exc, FileNotFoundError) else f"cannot be read ({type(exc).__name__})"
        where = f"`{ENV_FILE_VARIABLE}` names {str(path)!r}, which" if named else f"{str(path)!r}"
        raise ConfigError(f"{where} {why}. Point {ENV_FILE_VARIABLE} at a file of NAME=value lines, "
                          "or unset it to read ./.env.") from None
    bad = next((b.original.line for b in parse_stream(io.StringIO(text)) if b.error), None)
    if bad is not None:
        raise ConfigError(f"{str(path)!r} line {bad} is not a `NAME=value` line. Fix or remove it "
                          "(quote values with spaces or #).")
    values = {k: v for k, v in dotenv_values(stream=io.StringIO(text)).items() if v is not None}
    for key, value in values.items():
        if not env.get(key):
            env[key] = value
    return path, values


def load_settings(
    environ: Mapping[str, str] | None = None, **overrides: Any
) -> Settings:
    """Build `Settings` from the environment plus explicit overrides.

    Args:
        environ: the environment to read, exactly; when None, `os.environ` after the `.env`
            file's variables it lacked were added to it (`load_env_file`).
        **overrides: values that win over the environment (None values are ignored).

    Secret fields also accept the conventional variable names in `ENV_ALIASES`
    (e.g. `SERPER_API_KEY`) when their `AMAPREDUCE_*` variable is unset. The values of every
    credential-named variable are kept for redaction (`Settings.secret_values`).

    Raises:
        ConfigError: a variable or override has an invalid value; the message names the variable
            (and the `.env` file it came from), or the command-line flag an override comes from.
            The `.env` file is invalid (`load_env_file`).
    """
    env_file, from_file = load_env_file() if environ is None else (None, {})
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name in Settings.model_fields:
        raw = env.get(ENV_PREFIX + name.upper())
        if (raw is None or raw == "") and name in ENV_ALIASES:
            raw = env.get(ENV_ALIASES[name])
        if raw is not None and raw != "":
            values[name] = raw
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        settings = Settings.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        if overrides.get(field) is not None:  # a flag given (None: not given, the value is the environment's)
            raise ConfigError(
                f"{_FLAGS.get(field, '--' + field.replace('_', '-'))} is invalid (setting `{field}`): {err['msg']}, "
                f"got {err.get('input')!r}."
            ) from None
        variable = ENV_PREFIX + field.upper()
        where = f" (set in {str(env_file)!r})" if variable in from_file and from_file[variable] == env.get(variable) else ""
        raise ConfigError(
            f"`{variable}`{where} is invalid (setting `{field}`): {err['msg']}, got {err.get('input')!r}. "
            f"Fix the value or unset it to use the default."
        ) from None
    settings._environ_secrets = tuple(v for k, v in env.items() if v and _CREDENTIAL_VARIABLE.search(k))
    return settings
