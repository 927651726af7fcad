"""Ray that survives its workers, on a real cluster: `ray start --head` on loopback, stopped after (issue 26).

The module's cluster is started by the test with Ray's own command line, as a user starts one, with
the token authentication Ray 2.60 turns on (`RAY_AUTH_MODE=token` and a token of the test's own in
`RAY_AUTH_TOKEN`, for the cluster and for the drivers that join it). It runs in a temporary folder
of its own, and is stopped by ending the processes that hold that folder open (never `ray stop`,
which would stop every cluster of the machine).

The simulated models (deterministic code, not LLMs) are served over loopback HTTP by this test
process (`testing.openai_server`), so a question can be held there: while it is, the test kills
the worker process asking it (by its PID, found by its Ray process title), then lets it go.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amapreduce.cli.app import main

pytestmark = pytest.mark.slow

ROWS = 8
CLI = "import sys; from amapreduce.cli.app import main; sys.exit(main(sys.argv[1:]))"
RAY = Path(sys.executable).with_name("ray")


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _holding(folder: Path) -> list[int]:
    """Processes (not this one) that run from, or hold open a file under, `folder`: one cluster's."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if str(folder) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(entry.name))
                continue
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd).startswith(str(folder)):
                        pids.append(int(entry.name))
                        break
    return pids


def _workers(folder: Path, task: str) -> list[int]:
    """The cluster's worker processes running `task` now (Ray titles them `ray::TASK`)."""
    found = []
    for pid in _holding(folder):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").startswith(f"ray::{task}"):
                found.append(pid)
    return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, Path, dict[str, str]]]:
    """(address, its folder, the environment of a driver that joins it with the cluster's token)."""
    folder = Path(tempfile.mkdtemp(prefix="amr-ray-", dir="/tmp"))  # short: Ray's socket paths have a limit
    port, agent = _free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMAPREDUCE_", "RAY_"))}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex)
    try:
        subprocess.run([str(RAY), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                        "--num-cpus", "2", "--temp-dir", str(folder), "--include-dashboard", "false",
                        "--disable-usage-stats", "--dashboard-agent-listen-port", str(agent)],
                       env=env, check=True, capture_output=True, timeout=180)
        yield f"127.0.0.1:{port}", folder, env | {"AMAPREDUCE_ENV_FILE": os.devnull}
    finally:
        for _ in range(5):
            pids = _holding(folder)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
                subprocess.run(["sleep", "0.5"], check=False, timeout=5)
        shutil.rmtree(folder, ignore_errors=True)


def _decision(tmp_path: Path) -> Path:
    path = tmp_path / "wide.json"
    path.write_text(json.dumps({
        "task_matrix": [[f"item{i:03d}", "north" if i % 2 == 0 else "south"] for i in range(ROWS)],
        "template": "What is the code of __0__ (region __1__)?",
        "json_schema": ["item", "region", "code"],
        "batch_strategy": {"type": "by_attr", "attribute_index": 1, "max_group_size": 2,
                           "rationale": "items of one region share a catalogue"},
    }), encoding="utf-8")
    return path


class _Held:
    """The sub-agent of a world where each item's code is its name in capitals, counting what each
    stage asks; while `hold` is set, the first question of the stage for an item of `held` waits
    until the test lets it go (`release`), and `arrived` says it came."""

    def __init__(self, held: set[str]) -> None:
        self.held, self.stage, self.hold = held, "local", False
        self.asked: dict[str, list[list[str]]] = {"local": [], "ray": []}
        self.arrived, self.release = threading.Event(), threading.Event()

    def __call__(self, messages: list[Any], info: Any) -> Any:
        from amapreduce.llm.messages import message_text
        from amapreduce.testing.scripted import final_answer

        text = "\n".join(message_text(m) for m in messages).rsplit("Sub-questions:", 1)[-1]
        asked = re.findall(r"code of (item\d{3}) \(region (\w+)\)\?", text)
        self.asked[self.stage].append([item for item, _ in asked])
        if self.hold and self.held & {item for item, _ in asked} and not self.arrived.is_set():
            self.arrived.set()
            self.release.wait(150)
        return final_answer(json.dumps([{"task": k + 1, "item": item, "region": region, "code": item.upper()}
                                        for k, (item, region) in enumerate(asked)]))


def _wait(what: Any, driver: subprocess.Popen[str], label: str) -> None:
    """Wait (150 s at most) until `what()` holds, while the driver runs."""
    for _ in range(3000):
        if what():
            return
        try:
            driver.wait(0.05)
        except subprocess.TimeoutExpired:
            continue
        raise AssertionError(f"the driver ended before {label}: {driver.stderr.read() if driver.stderr else ''}")
    raise AssertionError(f"timed out waiting for {label}")


def _result(runs: Path) -> tuple[dict[str, Any], Path]:
    (folder,) = runs.iterdir()
    return json.loads((folder / "result.json").read_text(encoding="utf-8")), folder


def test_a_chunk_whose_worker_is_killed_runs_again_from_its_settled_batches(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        cluster: tuple[str, Path, dict[str, str]]) -> None:
    """Two chunks of two batches: chunk 1's second question is held, chunk 0 finishes, then chunk
    1's worker is killed. The run retries chunk 1 from its settled first batch, ends `complete` with
    the local run's table, and `--json` prints one object."""
    from amapreduce.cluster.wide import chunk_plan
    from amapreduce.decision.model import load_decision
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.mapreduce.batching import plan_batches
    from amapreduce.testing.openai_server import OpenAICompatibleServer
    from amapreduce.testing.scripted import FunctionModel

    address, folder, env = cluster
    decision = _decision(tmp_path)
    loaded = load_decision(str(decision))
    _, (rows, plan) = chunk_plan(loaded, plan_batches(loaded, max_batches=None), 2)
    first, second = ({f"item{rows[i]:03d}" for i in batch.indices} for batch in plan.batches)
    model = _Held(second)
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "local"))
    with OpenAICompatibleServer(FunctionModel(model, model_id="sim-model")) as server, allow_model_requests():
        args = [str(decision), "--model", "sim-model", "--api-base", server.base_url, "--workers", "1", "--json"]
        assert main(["mapreduce", "run", *args]) == 0
        local_out = json.loads(capsys.readouterr().out)
        model.stage, model.hold = "ray", True
        driver = subprocess.Popen([sys.executable, "-c", CLI, "mapreduce", "run", *args, "--max-batches", "2",
                                   "--executor", f"ray:{address}"],
                                  env=env | {"AMAPREDUCE_RUNS_DIR": str(tmp_path / "ray")}, cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait(model.arrived.is_set, driver, "chunk 1's second question")
            journals = tmp_path / "ray"
            _wait(lambda: any('"chunk_done"' in j.read_text() for j in journals.glob("*/journal.jsonl")), driver,
                  "chunk 0 was journaled")
            _wait(lambda: len(_workers(folder, "run_chunk")) == 1, driver, "one chunk left running")
            (pid,) = _workers(folder, "run_chunk")
            os.kill(pid, signal.SIGKILL)
        finally:
            model.release.set()
            out, err = driver.communicate(timeout=300)
    assert driver.returncode == 0, err[-3000:]
    ray_out = json.loads(out)  # one JSON object, and nothing else, on stdout
    assert ray_out["status"] == local_out["status"] == "complete"
    assert ray_out["table_markdown"] == local_out["table_markdown"]
    mine, local_dir = _result(tmp_path / "local")
    theirs, ray_dir = _result(tmp_path / "ray")
    assert theirs["table"] == mine["table"] and theirs["status"] == "complete"
    assert (local_dir / "table.csv").read_text() == (ray_dir / "table.csv").read_text()
    assert theirs["executor"] == {"kind": "ray", "chunks": 2, "finished": 2}
    # the retry went on from the batch the dead worker had settled: only the held question was asked again
    asked = [set(items) for items in model.asked["ray"]]
    assert asked.count(first) == 1 and asked.count(second) == 2
    # every call that came back was counted once (the killed one never came back)
    assert theirs["usage"]["total"]["requests"] == mine["usage"]["total"]["requests"] == len(asked) - 1
    trace = [json.loads(line) for line in (ray_dir / "trace.jsonl").read_text().splitlines()]
    (retried,) = [e for e in trace if e.get("event") == "chunk_retried"]
    assert retried["chunk"] == 1 and "WorkerCrashedError" in retried["error"]
    assert "worker died" in err and "retry 1 of 3" in err


def test_an_evaluation_trial_whose_worker_is_killed_runs_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], cluster: tuple[str, Path, dict[str, str]]) -> None:
    """A trial's first question is held, its worker killed: the trial runs afresh on another worker,
    and the evaluation's scores are the local one's."""
    from amapreduce.demo.model import SimulatedAtlasModel
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.testing.openai_server import OpenAICompatibleServer
    from amapreduce.testing.scripted import FunctionModel

    address, folder, env = cluster
    atlas = SimulatedAtlasModel(model_id="simulated-sandbox")
    arrived, release = threading.Event(), threading.Event()
    holding = {"on": False}

    def reply(messages: list[Any], info: Any) -> Any:
        if holding["on"] and not arrived.is_set():
            arrived.set()
            release.wait(150)
        return atlas.function(messages, info)

    with OpenAICompatibleServer(FunctionModel(reply, model_id="simulated-sandbox")) as server, allow_model_requests():
        args = ["eval", "run", "--benchmark", "sandbox", "--ids", "sbx_en_001", "--trials", "1", "--no-memory",
                "--model", "simulated-sandbox", "--api-base", server.base_url, "--workers", "1", "--json"]
        assert main([*args, "--out", str(tmp_path / "local")]) == 0
        capsys.readouterr()
        holding["on"] = True
        driver = subprocess.Popen([sys.executable, "-c", CLI, *args, "--out", str(tmp_path / "ray"),
                                   "--executor", f"ray:{address}"], env=env, cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait(arrived.is_set, driver, "the trial's first question")
            _wait(lambda: len(_workers(folder, "run_detached")) == 1, driver, "the trial's worker")
            (pid,) = _workers(folder, "run_detached")
            os.kill(pid, signal.SIGKILL)
        finally:
            release.set()
            out, err = driver.communicate(timeout=300)
    assert driver.returncode == 0, err[-3000:]
    assert json.loads(out)["status"] == "complete"  # one JSON object on stdout
    mine, theirs = (json.loads((tmp_path / f / "results.json").read_text()) for f in ("local", "ray"))
    per_process = {"wall_s", "run_dir"}
    assert [{k: v for k, v in r.items() if k not in per_process} for r in mine["per_task"]["sbx_en_001"]] == \
           [{k: v for k, v in r.items() if k not in per_process} for r in theirs["per_task"]["sbx_en_001"]]
    assert "worker died" in err and "retry 1 of 3" in err


def test_a_cluster_that_wants_a_token_is_refused_at_once_and_leaves_no_run(
        tmp_path: Path, cluster: tuple[str, Path, dict[str, str]]) -> None:
    """Without `RAY_AUTH_MODE=token`, joining the cluster is refused in one line that names it: exit 2,
    no run folder (Ray alone retried for about 20 s)."""
    address, _, env = cluster
    bare = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")} | {"AMAPREDUCE_RUNS_DIR": str(tmp_path / "runs")}
    proc = subprocess.run([sys.executable, "-c", CLI, "mapreduce", "run", str(_decision(tmp_path)), "--model", "sim",
                           "--api-base", "http://127.0.0.1:9/v1", "--max-batches", "2", "--executor", f"ray:{address}"],
                          env=bare, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert "requires Ray token authentication" in line and "RAY_AUTH_MODE=token" in line
    assert proc.stdout == "" and not (tmp_path / "runs").exists()
