"""Ctrl-C (issue 17, point 5): exit 130, the partial table saved, and no model request started
after the signal.

The probe behind the issue pressed Ctrl-C during a `mapreduce run`: the command exited 1 and 3 more
requests reached the provider afterwards. Here the provider is a simulated model (deterministic
code, not an LLM) behind the loopback OpenAI-compatible server. It answers the first sub-agent
requests, then holds every further one until the test lets it go, so the signal always lands with
the same requests in flight and no assertion depends on how fast anything runs.
"""

from __future__ import annotations

import _thread
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply, final_answer
from tests.test_cli_mapreduce import per_atom_decision

ROWS, WORKERS, ANSWERED = 8, 2, 3
WAIT_S = 120.0
"""Only a bound on a wait for an event that must come; never reached when the code is right."""


class HeldSubAgents:
    """Sub-agents of a world where each item's code is its name in capitals.

    The first `ANSWERED` requests get their rows; every later one is held until `release` is set,
    then answered as `after_release` says: `think` (a step without a tool call, after which an agent
    still running would ask again) or `fail` (a server error, which a retry loop would send again).
    Every request is counted, and those that arrive after `signalled` is set are counted apart (and
    answered with rows at once, so a defect shows as a count, not as a hang).
    """

    def __init__(self, after_release: str = "think") -> None:
        self.after_release = after_release
        self.release = threading.Event()
        self.signalled = threading.Event()
        self.requests = 0
        self.after_signal = 0
        self.held = 0
        self._cond = threading.Condition()

    def __call__(self, messages: list[Any], info: ModelInfo) -> Reply:
        with self._cond:
            self.requests += 1
            turn = self.requests
            late = self.signalled.is_set()
            self.after_signal += late
        if turn > ANSWERED and not late:  # a request after the signal (a defect) is answered, so its agent ends
            with self._cond:
                self.held += 1
                self._cond.notify_all()
            self.release.wait(WAIT_S)
            if self.after_release == "fail":
                raise RuntimeError("simulated server error")  # the server answers 500
            return "Still looking; no tool call in this step."
        text = "\n".join(message_text(m) for m in messages).rsplit("Sub-questions:", 1)[-1]
        items = re.findall(r"code of (item\d{3})\?", text)
        return final_answer(json.dumps([{"task": 1, "item": item, "code": item.upper()} for item in items]))

    def wait_until_held(self, count: int) -> None:
        """Block until `count` requests are held (every worker is then waiting on a reply)."""
        with self._cond:
            assert self._cond.wait_for(lambda: self.held >= count, WAIT_S), f"only {self.held} requests held"


def serve(agents: HeldSubAgents) -> OpenAICompatibleServer:
    return OpenAICompatibleServer(FunctionModel(agents, model_id="sim-model"))


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries (if any were made) would go out at once: a retry after the signal is not hidden by a sleep."""
    monkeypatch.setenv("AMAPREDUCE_RETRY_BASE_DELAY_S", "0")
    monkeypatch.setenv("AMAPREDUCE_RETRY_MAX_DELAY_S", "0")


def _check_saved_partial_run(run_dir: Path) -> None:
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    assert result["status"] == "stopped: interrupted"
    assert result["completeness"]["rows"] == ROWS
    table = (run_dir / "table.md").read_text(encoding="utf-8")
    found = re.findall(r"ITEM\d{3}", table)
    assert len(found) == ANSWERED, table  # the rows answered before Ctrl-C are kept


def test_sigint_exits_130_saves_the_partial_table_and_sends_nothing_after_the_signal(tmp_path: Path) -> None:
    agents = HeldSubAgents()
    runs = tmp_path / "runs"
    # A shell that starts a job in the background makes it ignore SIGINT, and Python keeps that;
    # the child restores Python's own Ctrl-C handler, as an interactive terminal would have it.
    code = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from amapreduce.cli.app import run; run()")
    with serve(agents) as server:
        env = {**os.environ, "AMAPREDUCE_RUNS_DIR": str(runs), "OPENAI_API_KEY": "sk-local"}
        child = subprocess.Popen(
            [sys.executable, "-c", code, "mapreduce", "run", str(per_atom_decision(tmp_path, ROWS)), "--model",
             "sim-model", "--api-base", server.base_url, "--workers", str(WORKERS), "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        try:
            agents.wait_until_held(WORKERS)
            agents.signalled.set()
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(timeout=WAIT_S)  # exits without waiting for the held replies
        finally:
            agents.release.set()
            if child.poll() is None:
                child.kill()
                child.wait()
    assert child.returncode == 130, err.decode()[-2000:]  # was 1
    assert b"Traceback" not in err
    reported = json.loads(out)
    assert reported["status"] == "stopped: interrupted"
    _check_saved_partial_run(Path(reported["run_dir"]))
    assert agents.after_signal == 0
    assert agents.requests == ANSWERED + WORKERS  # the answered ones and those in flight, nothing queued


@pytest.mark.usefixtures("python_sigint")
@pytest.mark.parametrize("after_release", ["think", "fail"])
def test_attempts_in_flight_at_ctrl_c_send_no_further_request(tmp_path: Path, after_release: str) -> None:
    """The engine itself, in process: its worker threads outlive the interrupted run, so the held
    replies are let go only after `run` returned; a sub-agent that took one more step, or a retry
    loop that sent a failed call again, would reach the server. (Through the CLI the run's trace
    is closed by then, which would end such a sub-agent by accident, so the trace here is a
    `NullTrace` that stays open.)"""
    from amapreduce.decision.model import load_decision
    from amapreduce.llm.factory import new_meter
    from amapreduce.mapreduce.result import RunStatus
    from amapreduce.session.parts import build_models, build_parts
    from amapreduce.settings import load_settings
    from amapreduce.trace import NullTrace

    agents = HeldSubAgents(after_release)
    decision = load_decision(per_atom_decision(tmp_path, ROWS))
    before = set(threading.enumerate())

    def press_ctrl_c() -> None:
        agents.wait_until_held(WORKERS)
        agents.signalled.set()
        _thread.interrupt_main()

    with serve(agents) as server, allow_model_requests():
        settings = load_settings({}, model="sim-model", api_base=server.base_url, api_key="sk-local",
                                 runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache", workers=WORKERS,
                                 extraction_model="none", retry_base_delay_s=0, retry_max_delay_s=0)
        models = build_models(settings, ("subagent",), meter=new_meter(settings))
        parts = build_parts(settings, models=models, trace=NullTrace(), decisions_by="user")
        presser = threading.Thread(target=press_ctrl_c, daemon=True)
        presser.start()
        partial = parts.engine.run(decision)  # Ctrl-C: the result so far, ended `interrupted`
        presser.join(WAIT_S)
        agents.release.set()
        for thread in _started_since(before):  # the engine's workers finish their held attempts
            thread.join(WAIT_S)
            assert not thread.is_alive(), f"{thread.name} still runs"
    assert partial.ending.status is RunStatus.INTERRUPTED
    assert sum(1 for row in partial.table.records() if row.get("code")) == ANSWERED
    assert agents.after_signal == 0
    assert agents.requests == ANSWERED + WORKERS


def _started_since(before: set[threading.Thread]) -> Iterator[threading.Thread]:
    """Threads started after `before` was taken, except the loopback server's own."""
    for thread in threading.enumerate():
        if thread not in before and thread is not threading.current_thread() and "server" not in thread.name:
            yield thread
