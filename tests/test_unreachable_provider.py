"""A provider that has never answered and cannot be reached fails the run at once, saying which host
and why (issue 25).

Was: connection errors retried for about 51 s (the default retry policy, on every attempt), then
`failed` with "Connection error.. Check the provider's status and your rate limits, or lower
--workers" — advice for 429s — and LiteLLM's "turn_on_debug" lines on stdout. A connection that
has never once succeeded in this process is a setup problem (DNS, refused, TLS, proxy): the first
attempt raises `ProviderUnreachable` (a run-stopping error), exit 1, with the host and the cause.
Once the provider has answered, a connection error is an outage again and is retried.

Offline: loopback only (a closed port, a plain-HTTP server spoken to over TLS); the default retry
policy is kept, so a retried connection error would take far longer than the bound checked here.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from amapreduce.cli.app import main
from amapreduce.errors import ProviderUnreachable
from amapreduce.llm.breaker import record_answer, unreachable
from amapreduce.llm.guard import allow_model_requests
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel
from tests.test_cli_exit_codes import Items, decision_file

BOUND_S = 10.0
"""The contract: the run fails within this long (a bound, not a speed measurement)."""


@pytest.fixture(autouse=True)
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AMAPREDUCE_API_KEY", "sk-test-0123456789")
    with allow_model_requests():
        yield tmp_path


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def run_record(tmp_path: Path) -> dict[str, object]:
    (run_dir,) = (tmp_path / "runs").iterdir()
    record: dict[str, object] = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    return record


@pytest.mark.parametrize("probe", ["1", "0"])
@pytest.mark.parametrize("command", ["ask", "mapreduce"])
def test_a_closed_port_fails_at_once_naming_the_host_and_refused(
    command: str, probe: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An `--api-base` endpoint is asked what it accepts before the run (`llm.endpoint`): one that cannot
    be reached is a setup failure, exit 2, and no run directory is made. Without the probe
    (`AMAPREDUCE_ENDPOINT_PROBE=0`) the run's first model call finds it: exit 1 at once, the run `failed`."""
    monkeypatch.setenv("AMAPREDUCE_ENDPOINT_PROBE", probe)
    port = closed_port()
    api_base = f"http://127.0.0.1:{port}/v1"
    head = (["ask", "What is the code of each item?", "--no-memory"] if command == "ask"
            else ["mapreduce", "run", decision_file(tmp_path)])
    started = time.monotonic()
    code = main([*head, "--model", "sim-model", "--api-base", api_base, "--json"])
    elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    if probe == "1":
        assert code == 2 and captured.out == "" and not (tmp_path / "runs").exists()
        error = captured.err.strip()
    else:
        out = json.loads(captured.out)
        assert code == 1 and out["status"] == "failed"
        error = out["error"]
        assert run_record(tmp_path)["error"] == error
    assert f"127.0.0.1:{port}" in error and "refused" in error and "\n" not in error
    assert "rate limits" not in error and "LiteLLM" not in captured.out
    assert elapsed < BOUND_S, f"took {elapsed:.1f} s"


@pytest.mark.parametrize("probe", ["1", "0"])
def test_tls_to_a_plain_http_server_is_told_as_tls(probe: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMAPREDUCE_ENDPOINT_PROBE", probe)
    with OpenAICompatibleServer(FunctionModel(Items(), model_id="sim-model")) as server:
        api_base = server.base_url.replace("http://", "https://")
        code = main(["mapreduce", "run", decision_file(tmp_path), "--model", "sim-model", "--api-base", api_base,
                     "--json"])
    captured = capsys.readouterr()
    error = json.loads(captured.out)["error"] if probe == "0" else captured.err
    assert code == (1 if probe == "0" else 2)
    assert "(TLS: " in error and api_base.split("/")[2] in error and "https://" in error


def litellm_shaped_dns_failure() -> openai.InternalServerError:
    """How LiteLLM reports a host that does not resolve: an HTTP 500 raised from the OpenAI SDK's
    connection error, raised from httpx's, raised from the resolver's."""
    request = httpx.Request("POST", "https://api.example.invalid/v1/chat/completions")
    resolver = socket.gaierror(-2, "Name or service not known")
    transport = httpx.ConnectError("[Errno -2] Name or service not known", request=request)
    transport.__cause__ = resolver
    connection = openai.APIConnectionError(request=request)
    connection.__cause__ = transport
    mapped = openai.InternalServerError("Connection error.", response=httpx.Response(500, request=request), body=None)
    mapped.__context__ = connection
    return mapped


def test_a_connection_error_reported_as_a_500_is_no_answer_and_is_told_as_dns() -> None:
    error = litellm_shaped_dns_failure()
    record_answer("example", error)  # a 500 that only wraps a failed connection is not an answer
    verdict = unreachable(error, what="manager model 'openai/m'", provider="example")
    assert isinstance(verdict, ProviderUnreachable)
    assert verdict.host == "api.example.invalid:443" and "(DNS: gaierror" in str(verdict) and verdict.status is None


def test_once_the_provider_has_answered_a_connection_error_is_an_outage_again() -> None:
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    refused = openai.APIConnectionError(request=request)
    refused.__cause__ = httpx.ConnectError("[Errno 111] Connection refused", request=request)
    refused.__cause__.__cause__ = ConnectionRefusedError(111, "Connection refused")
    assert unreachable(refused, what="m", provider="127.0.0.1:1") is not None
    record_answer("127.0.0.1:1", openai.RateLimitError("slow down", response=httpx.Response(429, request=request),
                                                        body=None))
    assert unreachable(refused, what="m", provider="127.0.0.1:1") is None


@pytest.mark.parametrize("model", ["openai/gpt-5-mini", "anthropic/claude-3-5-haiku-latest"])
def test_a_litellm_model_without_its_key_is_refused_before_the_run(
    model: str, workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """Was: LiteLLM reports the missing key as an HTTP 500 on each call, so the run retried it for about
    a minute and ended `failed`. Now the pre-flight refuses it: exit 2, the variable named, no run folder."""
    for name in ("AMAPREDUCE_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AMAPREDUCE_ENV_FILE", os.devnull)  # no .env key either
    assert main(["ask", "What is the capital of France?", "--model", model, "--json"]) == 2
    captured = capsys.readouterr()
    variable = "OPENAI_API_KEY" if model.startswith("openai/") else "ANTHROPIC_API_KEY"
    assert f"needs an API key and none is set: export {variable}" in captured.err and captured.out == ""
    assert not (workdir / "runs").exists()


def test_a_local_litellm_provider_that_takes_no_key_is_not_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ollama names `OLLAMA_API_BASE` (it has a default), not a key: nothing to refuse before the run."""
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.llm.models import ModelSpec, build_model

    monkeypatch.delenv("AMAPREDUCE_API_KEY", raising=False)
    model = build_model(ModelSpec(model_id="ollama/llama3"), role="subagent", meter=UsageMeter())
    assert model.model_id == "ollama/llama3"
