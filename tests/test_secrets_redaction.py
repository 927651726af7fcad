"""Secrets are redacted by value wherever text is stored or sent; the trace is private, flushed per
event and takes any text (issue 17, item 2, and the trace writer of item 1).

A provider that refuses a key echoes it ("Incorrect API key provided: sk-..."). That text used to
reach 27 lines of `trace.jsonl` per run (every attempt's `error`, 18 retry prompts), the journal,
`result.json`, and the retry prompts sent back to the model: only `model_call` events were
redacted. Now every configured key is registered (`trace.register_secrets`) and masked wherever
text becomes ours: model errors, search errors, the engine's retry prompts, every message a
managed model sends, and, as the last line of defence, the trace writer and `result.json`.

Offline: a simulated model (deterministic code, not an LLM) behind the loopback OpenAI-compatible
server, which refuses a wrong key with OpenAI's 401 and echoes the key, driven through the CLI.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from records import record
from smolagents.models import ChatMessage, MessageRole

from amapreduce.cli.app import main
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.models import ManagedModel
from amapreduce.session.rundir import RunDir
from amapreduce.settings import load_settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply
from amapreduce.trace import REDACTED, TraceWriter, redact, redact_secrets, register_secrets
from amapreduce.web.backends.base import BackendError
from amapreduce.web.backends.tavily import TavilyBackend
from tests.test_cli_exit_codes import Items, decision_file, workdir  # noqa: F401 - `workdir`: an autouse fixture

KEY = "sk-proj-ECHOEDkey0123456789abcdefXYZ"
"""The key the run is configured with; the server wants another and echoes this one."""


def everything_written(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


# -- the registry ----------------------------------------------------------------------------------


def test_registered_values_are_masked_at_any_depth_and_short_ones_never() -> None:
    register_secrets([KEY, "short", None, "  tvly-0123456789  "])
    assert redact_secrets(f"Incorrect API key provided: {KEY}.") == f"Incorrect API key provided: {REDACTED}."
    assert redact_secrets("a short text") == "a short text"  # "short" (5 characters) was not registered
    assert redact_secrets("Bearer tvly-0123456789") == f"Bearer {REDACTED}"
    clean = "nothing to hide"
    assert redact_secrets(clean) is clean  # the same object: callers can tell nothing was masked
    nested = {"attempts": [{"error": f"401: {KEY}", "n": 1}], "api_key": "anything", KEY: ("x", KEY)}
    assert redact(nested) == {"attempts": [{"error": f"401: {REDACTED}", "n": 1}], "api_key": REDACTED,
                              REDACTED: ["x", REDACTED]}


def test_a_key_that_contains_another_is_masked_whole() -> None:
    register_secrets(["sk-abcdefgh", "sk-abcdefgh-longer-key"])
    assert redact_secrets("key sk-abcdefgh-longer-key") == f"key {REDACTED}"


def test_settings_name_every_key_they_know_including_the_environments() -> None:
    """LiteLLM reads a provider's key from the environment itself, so those variables count too."""
    settings = load_settings(
        {"AMAPREDUCE_API_KEY": "model-key-123", "SERPER_API_KEY": "serper-key-123",
         "ANTHROPIC_API_KEY": "anthropic-key-123", "HF_TOKEN": "hf-token-123", "AMAPREDUCE_MAX_TOKENS": "100000000"},
    )
    assert set(settings.secret_values()) == {"model-key-123", "serper-key-123", "anthropic-key-123", "hf-token-123"}


# -- the trace writer ------------------------------------------------------------------------------


def test_the_trace_is_created_0600_and_flushed_per_event(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask, under which a plain `open` makes a 0644 file
    try:
        trace = TraceWriter(tmp_path / "trace.jsonl")
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE((tmp_path / "trace.jsonl").stat().st_mode) == 0o600
        trace.write("first", n=1)
        # Read through another handle while the writer is open: a kill now keeps the line.
        lines = (tmp_path / "trace.jsonl").read_text(encoding="utf-8").splitlines()
        assert [json.loads(line)["event"] for line in lines] == ["first"]
    finally:
        trace.close()


def test_the_trace_takes_lone_surrogates_and_masks_keys_in_any_field(tmp_path: Path) -> None:
    """A model's split emoji (`"\\ud83d"`) used to raise UnicodeEncodeError here and end the run."""
    register_secrets([KEY])

    class Odd:
        def __str__(self) -> str:
            return f"odd \udc80 {KEY}"

    trace = TraceWriter(tmp_path / "trace.jsonl")
    trace.write("attempt", raw_output='[{"name": "caf\ud83d"}]', prompt=f"retry: {KEY}", extra=Odd(), **{"k\ud800": 1})
    trace.close()
    text = (tmp_path / "trace.jsonl").read_text(encoding="utf-8")
    event = json.loads(text)
    assert event["raw_output"] == '[{"name": "caf\ufffd"}]' and event["prompt"] == f"retry: {REDACTED}"
    assert event["extra"] == f"odd \ufffd {REDACTED}" and event["k\ufffd"] == 1
    assert KEY not in text


def test_result_json_masks_a_key_by_value_and_by_key_name(tmp_path: Path) -> None:
    """`result.json` is written as the trace is (`redacted_json`): a registered key is masked wherever
    its record holds it (an error, a decision's nested text), and a credential-named key's value too."""
    register_secrets([KEY])
    run_dir = RunDir.create(tmp_path, "secret")
    try:
        run_dir.write_result(record(status="failed", error=f"refused: {KEY}",
                                    decision={"api_key": "anything", "nested": [{"note": f"saw {KEY}"}]}))
    finally:
        run_dir.close()
    text = (run_dir.path / "result.json").read_text(encoding="utf-8")
    saved = json.loads(text)
    assert KEY not in text and saved["error"] == f"refused: {REDACTED}"
    assert saved["decision"] == {"api_key": REDACTED, "nested": [{"note": f"saw {REDACTED}"}]}


# -- what is sent ----------------------------------------------------------------------------------


def test_a_managed_model_never_sends_a_registered_key() -> None:
    """Whatever prompt was built from whatever text, the messages leave with the key masked; the
    caller's messages (the agent's memory) are not changed."""
    seen: list[str] = []

    def record(messages: list[Any], info: ModelInfo) -> Reply:
        seen.extend(message_text(m) for m in messages)
        return "ok"

    model = ManagedModel(FunctionModel(record), role="subagent", meter=UsageMeter())
    register_secrets([KEY])
    parts = ChatMessage(role=MessageRole.USER, content=[{"type": "text", "text": f"the error was {KEY}"}])
    plain = ChatMessage(role=MessageRole.USER, content="nothing secret")
    model.generate([parts, plain])
    assert seen == [f"the error was {REDACTED}", "nothing secret"]
    assert parts.content == [{"type": "text", "text": f"the error was {KEY}"}]


def test_a_search_backend_that_echoes_its_key_is_masked_in_the_error() -> None:
    key = "tvly-secret-0123456789"

    def echo(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, text=f"bad request for key {key}")

    backend = TavilyBackend(key, transport=httpx.MockTransport(echo), min_interval_s=0.0)
    with pytest.raises(BackendError) as caught:
        backend.search("q", 3)
    assert key not in str(caught.value) and REDACTED in str(caught.value)


# -- whole runs against a provider that echoes the key ------------------------------------------------


@pytest.fixture
def echoing_server() -> Iterator[OpenAICompatibleServer]:
    """Wants another key than `KEY` and answers 401 "Incorrect API key provided: <the key sent>"."""
    model = FunctionModel(Items(), model_id="sim-model")
    with OpenAICompatibleServer(model, api_key="sk-the-right-one-000000") as server, allow_model_requests():
        yield server


@pytest.mark.parametrize("command", ["mapreduce", "ask"])
def test_a_key_the_provider_echoes_is_in_no_file_of_the_run_and_in_no_request(
    command: str, echoing_server: OpenAICompatibleServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Was: the key in 54 lines of `trace.jsonl`, 54 of `journal.jsonl` and 36 request bodies of one
    `mapreduce run`; in `result.json` of an `ask`."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    common = ["--model", "sim-model", "--api-base", echoing_server.base_url, "--json"]
    if command == "mapreduce":
        code = main(["mapreduce", "run", decision_file(tmp_path), *common])
    else:
        code = main(["ask", "What is the code of each item?", "--no-memory", *common])
    printed = capsys.readouterr()
    assert code == 1 and json.loads(printed.out)["status"] == "failed"
    assert echoing_server.request_count >= 1
    assert all(auth == f"Bearer {KEY}" for auth in echoing_server.authorization)  # the key was sent, and echoed
    files = everything_written(tmp_path / "runs")
    assert any(name.endswith("trace.jsonl") for name in files)
    assert [name for name, data in files.items() if KEY.encode() in data] == []
    assert any(b"Incorrect API key provided: [REDACTED]" in data for data in files.values())
    assert KEY not in json.dumps(echoing_server.requests) and KEY not in printed.out + printed.err


def test_a_retry_prompt_never_quotes_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider error that echoes the key fails an attempt; the engine's continuation prompt names
    the problem to the next attempt. It used to carry the key to the model."""
    lock, items = threading.Lock(), Items()
    failed: list[bool] = []

    def world(messages: list[Any], info: ModelInfo) -> Reply:
        with lock:
            first = not failed
            failed.append(True)
        if first:  # the server turns this into a 500 whose message quotes it
            raise RuntimeError(f"upstream refused key {KEY}")
        return items(messages, info)

    monkeypatch.setenv("AMAPREDUCE_API_KEY", KEY)
    monkeypatch.setenv("AMAPREDUCE_RETRY_MAX_RETRIES", "0")  # the 500 fails the attempt at once
    with OpenAICompatibleServer(FunctionModel(world, model_id="sim-model")) as server, allow_model_requests():
        code = main(["mapreduce", "run", decision_file(tmp_path), "--model", "sim-model", "--api-base", server.base_url,
                     "--workers", "1", "--json"])
    assert code == 0
    prompts = [message_text(m) for body in server.requests for m in body["messages"]]
    continuations = [p for p in prompts if "upstream refused key" in p]
    assert continuations and all(f"upstream refused key {REDACTED}" in p for p in continuations)
    assert KEY not in json.dumps(server.requests)
    assert [name for name, data in everything_written(tmp_path / "runs").items() if KEY.encode() in data] == []
