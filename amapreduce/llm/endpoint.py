"""What an OpenAI-compatible endpoint accepts, found by asking it once, not assumed.

OpenAI-compatible servers speak dialects. Measured on llama-cpp-python's server (0.3.36): message
content sent as a list of parts is refused with an HTTP 500 whose body is a pydantic validation
error; with the model's own chat template `tools` are ignored (the reply is plain text); with
`--chat_format chatml-function-calling`, `tool_choice: "auto"` and a named tool work but
`"required"` fails (a 500), and the prompt is HTML-escaped (`&#34;` in the arguments); structured
output is `{"type": "json_object", "schema": S}` (OpenAI's `{"type": "json_schema", ...}` is a 500).
llama.cpp's own `llama-server`, vLLM and Ollama each differ again. So before a run uses an
`--api-base` endpoint, `endpoint_capabilities` learns what it accepts with a handful of tiny
requests (`max_tokens` of a few tokens each), and keeps the answer in the cache folder, one file per
endpoint, model and server fingerprint (`/v1/models` and `/props` as the server reports them), so
the next run asks nothing:

* message content: a list of parts, or only strings;
* `tools`, and which `tool_choice` values (`required`, `auto`, a named tool) make the model call one;
* structured output, in which dialect (`json_schema`, `json_object` with a `schema`, bare
  `json_object`, none), told by whether the reply is held to a schema no free reply would match;
* the context window and the parallel slots, where the server tells them (`/props`: llama.cpp;
  `/v1/models`: vLLM's `max_model_len`; an error message that names it: llama-cpp-python).

Each finding can be overridden by a setting (`message_content`, `tool_choice`, `structured_output`,
`context_window`); `endpoint_probe=False` assumes OpenAI's own dialect and asks nothing.

What the findings change is done by small request adapters (`llm.dialect`), composed into the
endpoint's client: no branch in the managed model knows any server.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from amapreduce._atomic import write_json
from amapreduce.errors import ConfigError
from amapreduce.llm.breaker import unreachable

__all__ = [
    "CACHE_TTL_S",
    "OPENAI_DIALECT",
    "SIMULATED_SERVER",
    "EndpointCapabilities",
    "ProbeReport",
    "StructuredDialect",
    "ToolChoice",
    "context_window_in",
    "endpoint_capabilities",
    "error_text",
    "probe_endpoint",
    "server_root",
]

StructuredDialect = Literal["json_schema", "json_object_schema", "json_object", "none"]
"""How an endpoint takes a JSON schema for its reply: OpenAI's `{"type": "json_schema", "json_schema":
{...}}`; llama-cpp-python's `{"type": "json_object", "schema": S}`; a bare `{"type": "json_object"}`
(JSON, no schema); or not at all (the schema goes into the prompt and the lenient reader parses)."""

ToolChoice = Literal["required", "auto", "named"]
"""The `tool_choice` values an endpoint may honour (`named`: `{"type": "function", "function": {"name": ...}}`)."""

CACHE_TTL_S = 24 * 3600.0
"""How long a probe's findings are kept (a server restarted with other flags answers another
fingerprint when its `/props` or `/v1/models` differ; else it is asked again after a day)."""

SIMULATED_SERVER = "amapreduce-simulated"
"""The `owned_by` of the models `amapreduce.testing.openai_server` serves (simulated models, OpenAI's
dialect): a server that says so is taken at its word and asked no chat request."""

PROBE_VERSION = 1
"""Bumped when the probe learns something new, so older cache files are asked again."""


class EndpointCapabilities(BaseModel):
    """What one endpoint and model accept (see the module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str
    model_id: str
    server: str = "openai-compatible"
    """What the server says it is (`llama.cpp`, `llama-cpp-python`, `vllm`, `ollama`), else `openai-compatible`."""
    list_content: bool = True
    """Whether message content may be a list of parts (else every message is flattened to a string)."""
    tool_choices: tuple[ToolChoice, ...] = ("required", "auto", "named")
    """The `tool_choice` values that made the model call a tool; empty: no reliable tool calling."""
    structured: StructuredDialect = "json_schema"
    escapes_arguments: bool = False
    """Whether tool-call arguments come back HTML-escaped (`&#34;`), to be unescaped."""
    context_window: int | None = Field(default=None, ge=1)
    """Tokens of context per request, when the server tells it."""
    slots: int | None = Field(default=None, ge=1)
    """Requests it computes at once, when the server tells it."""
    probed: bool = False
    """False: assumed (OpenAI's dialect), nothing was asked."""
    notes: tuple[str, ...] = ()
    """What the probe saw, one line per finding (for `runs show` and the docs' examples)."""
    version: int = PROBE_VERSION

    @property
    def tool_calling(self) -> bool:
        """Whether an agent loop can rely on tool calls here: `required` or `auto` made the model call
        the tool (a named tool alone is not enough: an agent chooses among its tools each step)."""
        return "required" in self.tool_choices or "auto" in self.tool_choices


OPENAI_DIALECT = EndpointCapabilities(base_url="", model_id="")
"""What an endpoint is assumed to accept when it is not asked (OpenAI's own API)."""


class ProbeReport(BaseModel):
    """The raw facts one probe request produced (kept in the notes; tests read them)."""

    model_config = ConfigDict(frozen=True)

    status: int | None
    body: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def server_root(base_url: str) -> str:
    """The server's root URL: `base_url` without a trailing `/v1` (where llama.cpp serves `/props`)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


_CONTEXT_IN_TEXT = re.compile(
    r"(?:context window of|context length of|maximum context length is|n_ctx[=: ]+|context size[^0-9]{0,20})\s*(\d{3,8})",
    re.IGNORECASE,
)


def context_window_in(text: str) -> int | None:
    """The context window an error message names ("exceed context window of 4096", OpenAI's "maximum
    context length is 8192 tokens"), else None. Read from text because these servers give no field."""
    match = _CONTEXT_IN_TEXT.search(text or "")
    return int(match.group(1)) if match else None


_PROBE_KEY = "probe_7f3"
_PROBE_VALUE = "ok-7f3"
_PROBE_SCHEMA = {
    "type": "object",
    "properties": {_PROBE_KEY: {"type": "string", "enum": [_PROBE_VALUE]}},
    "required": [_PROBE_KEY],
    "additionalProperties": False,
}
"""A schema no unconstrained reply matches by chance: only a grammar-held reply writes exactly it."""
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}


class _Prober:
    """Sends the probe requests to one endpoint (plain httpx: nothing of a run exists yet)."""

    def __init__(self, base_url: str, model_id: str, api_key: str, timeout_s: float,
                 http: httpx.Client | None = None) -> None:
        self.base = base_url.rstrip("/")
        self.model_id = model_id
        self.headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        self._owned = http is None
        self.http = http or httpx.Client(timeout=httpx.Timeout(timeout_s, connect=min(5.0, timeout_s)), trust_env=False)
        self.notes: list[str] = []
        self.failure: httpx.HTTPError | None = None
        """The last request's transport error (None: it was answered)."""

    def __enter__(self) -> _Prober:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owned:  # a client the caller gave is the caller's to close
            self.http.close()

    def get(self, url: str) -> ProbeReport:
        try:
            response = self.http.get(url, headers=self.headers)
        except httpx.HTTPError as exc:
            self.failure = exc
            return ProbeReport(status=None, error=f"{type(exc).__name__}: {exc}")
        return ProbeReport(status=response.status_code, body=_json_or_text(response))

    def chat(self, messages: list[dict[str, Any]], **extra: Any) -> ProbeReport:
        payload = {"model": self.model_id, "messages": messages, "temperature": 0, "max_tokens": 24, **extra}
        try:
            response = self.http.post(f"{self.base}/chat/completions", headers=self.headers, json=payload)
        except httpx.HTTPError as exc:
            self.failure = exc
            return ProbeReport(status=None, error=f"{type(exc).__name__}: {exc}")
        return ProbeReport(status=response.status_code, body=_json_or_text(response))


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text[:2000]


def _message(report: ProbeReport) -> Mapping[str, Any]:
    body = report.body
    if isinstance(body, Mapping):
        choices = body.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
            message = choices[0].get("message")
            if isinstance(message, Mapping):
                return message
    return {}


def error_text(report: ProbeReport) -> str:
    """The server's own message of a refused probe request (its `error.message`, else the body), one line."""
    if report.error is not None:
        return report.error
    body = report.body
    if isinstance(body, Mapping):
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, Mapping) else error
        text = message if isinstance(message, str) and message else json.dumps(body)[:600]
    else:
        text = str(body)
    return " ".join(text.split())[:600]


def _held_to_schema(report: ProbeReport) -> bool:
    content = _message(report).get("content")
    if not isinstance(content, str):
        return False
    try:
        data = json.loads(content)
    except ValueError:
        return False
    return isinstance(data, Mapping) and data.get(_PROBE_KEY) == _PROBE_VALUE


def _calls_tool(report: ProbeReport) -> tuple[bool, bool]:
    """Whether the reply called the probe tool, and whether its arguments came back HTML-escaped."""
    calls = _message(report).get("tool_calls")
    if not isinstance(calls, list) or not calls or not isinstance(calls[0], Mapping):
        return False, False
    function = calls[0].get("function")
    if not isinstance(function, Mapping) or function.get("name") != "lookup":
        return False, False
    arguments = function.get("arguments")
    escaped = isinstance(arguments, str) and html.unescape(arguments) != arguments
    return True, escaped


def _unreachable(prober: _Prober, base_url: str, report: ProbeReport) -> ConfigError:
    """The pre-flight error of an endpoint that did not answer: the cause told as a model call's would
    be (`llm.breaker.unreachable`: DNS, refused, TLS, proxy, timeout), else the transport's own words."""
    what = f"the model endpoint {base_url}"
    found = unreachable(prober.failure, what=what, provider=base_url) if prober.failure is not None else None
    if found is not None:
        return ConfigError(str(found))
    return ConfigError(f"{what} did not answer ({report.error}): check --api-base, that the server runs, and "
                       "--model-timeout if it is only slow to start.")


def _server_of(models: ProbeReport, props: ProbeReport) -> str:
    if props.ok and isinstance(props.body, Mapping) and "default_generation_settings" in props.body:
        return "llama.cpp"
    data = models.body.get("data") if isinstance(models.body, Mapping) else None
    owner = data[0].get("owned_by") if isinstance(data, list) and data and isinstance(data[0], Mapping) else None
    return {"me": "llama-cpp-python", "vllm": "vllm", "library": "ollama", "llamacpp": "llama.cpp",
            SIMULATED_SERVER: SIMULATED_SERVER}.get(
        owner if isinstance(owner, str) else "", "openai-compatible")


def _window_and_slots(models: ProbeReport, props: ProbeReport, model_id: str) -> tuple[int | None, int | None]:
    window: int | None = None
    slots: int | None = None
    if props.ok and isinstance(props.body, Mapping):
        settings = props.body.get("default_generation_settings")
        n_ctx = settings.get("n_ctx") if isinstance(settings, Mapping) else None
        window = n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None
        total = props.body.get("total_slots")
        slots = total if isinstance(total, int) and total > 0 else None
    data = models.body.get("data") if isinstance(models.body, Mapping) else None
    for item in data if isinstance(data, list) else ():
        if isinstance(item, Mapping) and item.get("id") == model_id:
            size = item.get("max_model_len")  # vLLM
            if window is None and isinstance(size, int) and size > 0:
                window = size
    return window, slots


def probe_endpoint(base_url: str, model_id: str, *, api_key: str = "not-needed", timeout_s: float = 60.0,
                   http: httpx.Client | None = None) -> EndpointCapabilities:
    """Ask the endpoint what it accepts (see the module doc): about eight requests of a few tokens each.

    Raises:
        ConfigError: the endpoint cannot be reached, or refuses even the plainest chat request
            (its own message is in the error; no run can work against it as configured).
    """
    with _Prober(base_url, model_id, api_key, timeout_s, http) as prober:
        return _probe(prober, base_url, model_id)


def _probe(prober: _Prober, base_url: str, model_id: str) -> EndpointCapabilities:
    notes = prober.notes
    models = prober.get(f"{prober.base}/models")
    props = prober.get(f"{server_root(base_url)}/props")
    server = _server_of(models, props)
    window, slots = _window_and_slots(models, props, model_id)
    notes.append(f"server: {server}")

    ask = "Reply with the single word: ok"
    parts = [{"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
             {"role": "user", "content": [{"type": "text", "text": ask}]}]
    plain = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": ask}]
    if server == SIMULATED_SERVER:  # our own loopback server of simulated models speaks OpenAI's dialect
        notes.append("the server says it serves amapreduce's simulated models: OpenAI's dialect")
        return EndpointCapabilities(base_url=base_url, model_id=model_id, server=server, context_window=window,
                                    slots=slots, probed=True, notes=tuple(notes))
    first = prober.chat(parts, max_tokens=2)
    if first.status is None:
        raise _unreachable(prober, base_url, first)
    list_content = first.ok
    if not list_content:
        notes.append(f"list content refused (HTTP {first.status}: {error_text(first)[:160]})")
        second = prober.chat(plain, max_tokens=2)
        if not second.ok:
            raise ConfigError(
                f"the model endpoint {base_url} refused a plain chat request for model {model_id!r}: HTTP "
                f"{second.status}: {error_text(second)}. Check --model (the server's model name) and --api-base.")
    messages = parts if list_content else plain
    if window is None and server == "llama-cpp-python":
        # It checks a prompt's length before computing anything and names its window in the refusal
        # (measured: 26 ms for a 3,000-token prompt); asked only of it, since another server might
        # compute a long prompt it accepts.
        over = prober.chat([{"role": "user", "content": " ".join(["apple banana"] * 16_500)}], max_tokens=1)
        window = context_window_in(error_text(over)) if not over.ok else None
        notes.append(f"context window: {window}" if window else "context window: not told")

    structured: StructuredDialect = "none"
    schema_ask = [*messages[:1], {"role": "user", "content": "Reply in JSON." if not list_content
                                  else [{"type": "text", "text": "Reply in JSON."}]}]
    for dialect, response_format in (
        ("json_schema", {"type": "json_schema", "json_schema": {"name": "probe", "schema": _PROBE_SCHEMA, "strict": True}}),
        ("json_object_schema", {"type": "json_object", "schema": _PROBE_SCHEMA}),
    ):
        reply = prober.chat(schema_ask, response_format=response_format, max_tokens=24)
        if reply.ok and _held_to_schema(reply):
            structured = dialect  # type: ignore[assignment]
            break
        notes.append(f"structured output {dialect}: " + ("not held to the schema" if reply.ok
                                                          else f"refused (HTTP {reply.status})"))
    if structured == "none":
        reply = prober.chat(schema_ask, response_format={"type": "json_object"}, max_tokens=24)
        if reply.ok and isinstance(_message(reply).get("content"), str):
            try:
                if isinstance(json.loads(_message(reply)["content"]), Mapping):
                    structured = "json_object"
            except ValueError:
                pass
    notes.append(f"structured output: {structured}")

    choices: list[ToolChoice] = []
    escaped = False
    tool_ask = [*messages[:1], {"role": "user", "content": 'Use the lookup tool on the word: "pie"'}]
    for choice, value in (("required", "required"), ("auto", "auto"),
                          ("named", {"type": "function", "function": {"name": "lookup"}})):
        reply = prober.chat(tool_ask, tools=[_PROBE_TOOL], tool_choice=value, max_tokens=40)
        called, was_escaped = _calls_tool(reply) if reply.ok else (False, False)
        escaped = escaped or was_escaped
        if called:
            choices.append(choice)  # type: ignore[arg-type]
        notes.append(f"tool_choice {choice}: " + ("calls the tool" if called else
                                                 "no tool call" if reply.ok else f"refused (HTTP {reply.status})"))
    if escaped:
        notes.append("tool-call arguments come back HTML-escaped")
    return EndpointCapabilities(
        base_url=base_url, model_id=model_id, server=server, list_content=list_content, tool_choices=tuple(choices),
        structured=structured, escapes_arguments=escaped, context_window=window, slots=slots, probed=True,
        notes=tuple(notes),
    )


def _fingerprint(base_url: str, model_id: str, http: httpx.Client | None, api_key: str) -> str | None:
    """What identifies the server as it runs now (`/v1/models` and `/props`), None when it does not answer."""
    with _Prober(base_url, model_id, api_key, 10.0, http) as prober:
        models = prober.get(f"{prober.base}/models")
        if models.status is None:
            return None
        props = prober.get(f"{server_root(base_url)}/props")
    props_body = props.body if props.ok and isinstance(props.body, Mapping) else None
    if isinstance(props_body, Mapping):  # what changes per request (slots busy, ...) is not identity
        props_body = {k: props_body.get(k) for k in ("default_generation_settings", "total_slots", "chat_template",
                                                     "model_path", "build_info") if k in props_body}
    text = json.dumps([base_url, model_id, models.status, models.body, props_body, PROBE_VERSION],
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def endpoint_capabilities(base_url: str, model_id: str, *, cache_dir: Path | None, api_key: str = "not-needed",
                          timeout_s: float = 60.0, http: httpx.Client | None = None,
                          clock: Any = time.time) -> EndpointCapabilities:
    """The endpoint's capabilities: from the cache folder when a probe of this server (same
    fingerprint) is younger than `CACHE_TTL_S`, else probed now and kept (`cache_dir`/endpoints/).

    Raises:
        ConfigError: as `probe_endpoint`.
    """
    fingerprint = _fingerprint(base_url, model_id, http, api_key)
    if fingerprint is None:  # it does not answer `/models`: the probe says why, or finds what it can
        return probe_endpoint(base_url, model_id, api_key=api_key, timeout_s=timeout_s, http=http)
    path = cache_dir / "endpoints" / f"{fingerprint}.json" if cache_dir is not None else None
    if path is not None and path.is_file():
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            if clock() - float(stored.get("probed_at", 0)) < CACHE_TTL_S:
                found = EndpointCapabilities.model_validate(stored["capabilities"])
                if found.version == PROBE_VERSION:
                    return found
        except (OSError, ValueError, KeyError, TypeError, ValidationError):
            pass  # a damaged or older cache file: asked again, and replaced
    found = probe_endpoint(base_url, model_id, api_key=api_key, timeout_s=timeout_s, http=http)
    if path is not None:
        write_json(path, {"probed_at": clock(), "capabilities": found.model_dump(mode="json")}, indent=2)
    return found
