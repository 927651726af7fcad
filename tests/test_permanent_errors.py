"""Permanent errors stop a run at once; only transient ones are retried (issue 17, item 3).

A provider that refuses the run's requests for good — a wrong key (401), no access (403), no such
model (404), a request invalid for the model (400, 422) — will refuse every later request the same
way. Before, each refusal failed one sub-agent attempt, the engine tried the batch again with a
continuation prompt and then again in both patch rounds: a wrong key cost 9 requests per task
and the run ended `incomplete`, exit 3 (0 before the exit codes), as if the web had no answer.
Now the first refusal raises `ProviderRejected` (a run-stopping error): the run ends `failed`,
exit 1, with a one-line reason that says what to check.

Offline: a simulated model (deterministic code, not an LLM) behind the loopback OpenAI-compatible
server, which refuses a wrong key with 401 and an unknown model with 404 as OpenAI does, driven
through the real client path and the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from amapreduce.cli.app import main
from amapreduce.errors import ProviderRejected, ProviderUnavailable
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.retry import ModelCallError, RetryPolicy, call_with_retries, rejected_status
from amapreduce.mapreduce.result import RunEnding, RunStatus, stop_ending
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel
from amapreduce.web.backends.serper import SerperBackend
from amapreduce.web.service import WebService
from amapreduce.web.tools import build_web_tools
from tests.test_cli_exit_codes import Items, decision_file, workdir  # noqa: F401 - `workdir`: an autouse fixture

RIGHT_KEY = "sk-right-key-0123456789abcdef"
WRONG_KEY = "sk-wrong-key-9876543210fedcba"


@pytest.fixture
def server() -> Iterator[OpenAICompatibleServer]:
    """The items world behind a server that takes only `RIGHT_KEY` and serves only `sim-model`."""
    model = FunctionModel(Items(), model_id="sim-model")
    with OpenAICompatibleServer(model, api_key=RIGHT_KEY, models=("sim-model",)) as srv, allow_model_requests():
        yield srv


def status_error(cls: type[openai.APIStatusError], status: int, body: object = None) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    return cls("refused", response=httpx.Response(status, request=request), body=body)


class ContextWindowExceededError(Exception):
    """Shaped like LiteLLM's: a 400 about one request's length, not about the run's configuration."""

    status_code = 400


class AuthenticationError(Exception):
    """Shaped like an error that names its kind but carries no status code."""


# -- classification ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (status_error(openai.AuthenticationError, 401), 401),
        (status_error(openai.PermissionDeniedError, 403), 403),
        (status_error(openai.NotFoundError, 404), 404),
        (status_error(openai.BadRequestError, 400), 400),
        (status_error(openai.UnprocessableEntityError, 422), 422),
        (AuthenticationError("no key"), 401),
        (status_error(openai.BadRequestError, 400, {"message": "too long", "code": "context_length_exceeded"}), None),
        (ContextWindowExceededError("too long"), None),
        (status_error(openai.RateLimitError, 429), None),
        (status_error(openai.InternalServerError, 503), None),
        (status_error(openai.ConflictError, 409), None),
        (ValueError("unreadable reply"), None),
    ],
)
def test_refusals_are_told_from_other_errors_by_type_and_status(error: Exception, status: int | None) -> None:
    assert rejected_status(error) == status


def test_a_refusal_is_sent_once_and_raised_as_one_run_stopping_line() -> None:
    calls: list[int] = []
    body = {"message": "Your organization\nhas no access\n to model x.", "type": "invalid_request_error"}

    def call() -> str:
        calls.append(1)
        raise status_error(openai.PermissionDeniedError, 403, body)

    with pytest.raises(ProviderRejected) as caught:
        call_with_retries(call, what="subagent model 'x'", policy=RetryPolicy(), sleep=lambda s: None, provider="p")
    err = caught.value
    assert len(calls) == 1  # not retried
    assert str(err) == (
        "subagent model 'x' was refused by the provider: HTTP 403 PermissionDeniedError: Your organization has no "
        "access to model x. The key has no access to this model: check the account's permissions, or choose "
        "another --model."
    )
    assert (err.provider, err.status, err.failures) == ("p", 403, 1)
    assert isinstance(err, ProviderUnavailable)  # stops a run wherever an outage does
    assert stop_ending(err) == RunEnding(RunStatus.FAILED, str(err))


def test_a_request_too_long_for_the_context_fails_only_its_call() -> None:
    """Another batch's prompt may fit: the call fails (the engine may retry the batch), the run goes on."""
    body = {"message": "maximum context length exceeded", "code": "context_length_exceeded"}

    def call() -> str:
        raise status_error(openai.BadRequestError, 400, body)

    with pytest.raises(ModelCallError) as caught:
        call_with_retries(call, what="x", policy=RetryPolicy(), sleep=lambda s: None)
    assert not isinstance(caught.value, ProviderUnavailable) and caught.value.fields["kind"] == "context_overflow"


def test_a_refused_search_key_stops_the_run_instead_of_failing_each_search() -> None:
    """A keyed backend's 401 reaches the agent as the run-stopping error, not as a `ToolCallFailed`
    the model would read and try again with another query."""
    requests: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(401, json={"message": "Unauthorized."})

    backend = SerperBackend("serper-key-0123456789", transport=httpx.MockTransport(refuse), min_interval_s=0.0)
    search, _crawl = build_web_tools(service=WebService(backend))
    with pytest.raises(ProviderRejected, match=r"`serper` refused its API key \(HTTP 401\).*SERPER_API_KEY"):
        search(query="q")
    assert len(requests) == 1


# -- whole runs through the CLI ----------------------------------------------------------------------


def run_record(tmp_path: Path) -> dict[str, Any]:
    (run_dir,) = (tmp_path / "runs").iterdir()
    record: dict[str, Any] = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    return record


@pytest.mark.parametrize(
    ("key", "model", "reason"),
    [
        (WRONG_KEY, "sim-model", "HTTP 401 AuthenticationError: Incorrect API key provided"),
        (RIGHT_KEY, "no-such-model", "HTTP 404 NotFoundError: The model `no-such-model` does not exist"),
    ],
)
def test_mapreduce_run_refused_by_the_provider_fails_at_once_with_exit_1(
    key: str, model: str, reason: str, server: OpenAICompatibleServer, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """Was: 54 requests (6 tasks x 3 attempts x the map and 2 patch rounds), `incomplete`, exit 3."""
    monkeypatch.setenv("AMAPREDUCE_API_KEY", key)
    code = main(["mapreduce", "run", decision_file(tmp_path), "--model", model, "--api-base", server.base_url,
                 "--workers", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    assert out["status"] == "failed" and reason in out["error"] and "\n" not in out["error"]
    assert server.request_count <= 2  # at most the attempts already in flight: one per worker
    record = run_record(tmp_path)
    assert record["status"] == "failed" and record["error"] == out["error"]


def test_ask_refused_by_the_provider_fails_after_the_managers_one_request(
    server: OpenAICompatibleServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Was: `failed` with "manager failed: Error while generating output:" and the provider's reply
    (the key in it) over several lines."""
    monkeypatch.setenv("AMAPREDUCE_API_KEY", WRONG_KEY)
    code = main(["ask", "What is the code of each item?", "--model", "sim-model", "--api-base", server.base_url,
                 "--no-memory", "--json"])
    assert code == 1 and json.loads(capsys.readouterr().out)["status"] == "failed"
    assert server.request_count == 1
    error = run_record(tmp_path)["error"]
    assert error.startswith("manager model 'sim-model' was refused by the provider: HTTP 401 AuthenticationError")
    assert "AMAPREDUCE_API_KEY" in error and "\n" not in error
