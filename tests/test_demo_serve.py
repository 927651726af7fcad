"""`amapreduce demo --serve`: the simulated model behind a loopback OpenAI-compatible endpoint, and the
exact `ask` line it prints, run as printed (the real client path: HTTP, JSON tool calls)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from amapreduce.cli.app import main
from amapreduce.demo.run import load_sandbox_tasks
from amapreduce.demo.serve import serve
from amapreduce.llm.guard import allow_model_requests
from amapreduce.settings import Settings


def test_the_printed_ask_command_answers_over_http(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    tasks, world = load_sandbox_tasks(Settings(cache_dir=tmp_path / ".amapreduce-cache"))
    query = tasks["sbx_en_005"].query
    printed: list[str] = []
    results: list[dict[str, object]] = []

    def run_the_printed_line() -> None:
        env, _, command = printed[-1].partition(" amapreduce ")
        name, value = env.split("=")
        monkeypatch.setenv(name, value)
        with allow_model_requests():
            assert main([*shlex.split(command), "--json"]) == 0
        results.append(json.loads(capsys.readouterr().out))

    answered = serve(0, world.index_dir, query, echo=printed.append, wait=run_the_printed_line)
    assert "not an LLM" in printed[0] and "http://127.0.0.1:" in printed[0]
    assert printed[1].startswith("AMAPREDUCE_EXTRACTION_MODEL=none amapreduce ask ")
    assert "--model simulated --api-base http://127.0.0.1:" in printed[1]
    assert results[0]["status"] == "complete" and results[0]["missing_cells"] == 0
    assert answered >= 5  # the manager's and the sub-agents' calls all went over HTTP
