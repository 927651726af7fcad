"""`mapreduce run --executor ray`: a wide decision's batches in chunks on Ray give the table a local run gives.

The simulated sub-agent (deterministic code, not an LLM) is served over loopback HTTP by this test
process (`testing.openai_server`): the Ray workers are other processes, and reach it as they would
reach a provider. The Ray run happens in a child process that starts a local Ray itself
(`ray.init(num_cpus=2)`), as in test_eval_ray. The decision groups its rows by an attribute whose
values alternate, so each chunk's rows are not contiguous in the matrix: the rows must come back to
their own tasks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from amapreduce.cli.app import main

ROWS = 8
RAY_DRIVER = r"""
import sys
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
from amapreduce.cli.app import main
code = main(sys.argv[1:])
ray.shutdown()
sys.exit(code)
"""


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


def _sub_agent(messages: list[Any], info: Any) -> Any:
    from amapreduce.testing.scripted import final_answer

    asked = _asked(messages)
    # item005 has no code anywhere (a missing cell, asked again in a patch round); the rest are found
    return final_answer(json.dumps([{"task": k + 1, "item": item, "region": region,
                                     "code": "" if item == "item005" else item.upper()}
                                    for k, (item, region) in enumerate(asked)]))


def _asked(messages: list[Any]) -> list[tuple[str, str]]:
    """The (item, region) pairs a sub-agent's prompt asks for."""
    from amapreduce.llm.messages import message_text

    return re.findall(r"code of (item\d{3}) \(region (\w+)\)\?",
                      "\n".join(message_text(m) for m in messages).rsplit("Sub-questions:", 1)[-1])


def _result(runs: Path) -> tuple[dict[str, Any], Path]:
    (folder,) = runs.iterdir()
    return json.loads((folder / "result.json").read_text(encoding="utf-8")), folder


@pytest.mark.slow
def test_a_wide_run_on_ray_gives_the_local_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.testing.openai_server import OpenAICompatibleServer
    from amapreduce.testing.scripted import FunctionModel

    decision = _decision(tmp_path)
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "local"))
    with OpenAICompatibleServer(FunctionModel(_sub_agent, model_id="sim-model")) as server, allow_model_requests():
        args = [str(decision), "--model", "sim-model", "--api-base", server.base_url, "--workers", "1", "--json"]
        assert main(["mapreduce", "run", *args]) == 3  # incomplete: item005's code is missing
        local_out = json.loads(capsys.readouterr().out)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")}
        env.update(AMAPREDUCE_ENV_FILE=os.devnull, RAY_USAGE_STATS_ENABLED="0",
                   AMAPREDUCE_RUNS_DIR=str(tmp_path / "ray"))
        # --max-batches 2: locally a refusal (4 batches); on Ray, 2 chunks of 2 batches
        proc = subprocess.run([sys.executable, "-c", RAY_DRIVER, "mapreduce", "run", *args, "--max-batches", "2", "--executor", "ray"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 3, proc.stderr[-3000:]
    ray_out = json.loads(proc.stdout.strip().splitlines()[-1])
    mine, local_dir = _result(tmp_path / "local")
    theirs, ray_dir = _result(tmp_path / "ray")

    # the same table, cell by cell (values, statuses, sources, task of each row), and the same completeness
    assert theirs["table"] == mine["table"]
    assert ray_out["table_markdown"] == local_out["table_markdown"]
    assert [r["task_index"] for r in theirs["table"]["rows"]] == list(range(ROWS))
    assert "| item004 | north | ITEM004 |" in ray_out["table_markdown"]
    assert theirs["completeness"] == mine["completeness"]
    assert theirs["completeness"]["missing_cells"] == 1 and theirs["completeness"]["patch_rounds"] >= 1
    # it ran as 2 chunks on Ray, and every remote call reached the driver's meter and trace
    assert theirs["executor"] == {"kind": "ray", "chunks": 2, "finished": 2}
    assert theirs["usage"]["total"]["requests"] == mine["usage"]["total"]["requests"] > ROWS // 2
    assert theirs["usage"]["by_role"].keys() == mine["usage"]["by_role"].keys()
    calls = [json.loads(line) for line in (ray_dir / "trace.jsonl").read_text().splitlines()
             if '"model_call"' in line]
    assert len(calls) == theirs["usage"]["total"]["requests"] and {c["chunk"] for c in calls} == {0, 1}
    assert theirs["status"] == mine["status"] == "incomplete"
    assert (local_dir / "table.csv").read_text() == (ray_dir / "table.csv").read_text()


@pytest.mark.slow
def test_a_budget_spent_across_the_cluster_stops_every_chunk_and_keeps_the_rows_found(tmp_path: Path) -> None:
    """AMAPREDUCE_MAX_TOKENS=1: the first call of the cluster is admitted, no call after it is. Four
    chunks on two CPUs: at most the two running first get a call out; with a budget per worker, each
    of the four would have."""
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.testing.openai_server import OpenAICompatibleServer
    from amapreduce.testing.scripted import FunctionModel

    env = {k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")}
    env.update(AMAPREDUCE_ENV_FILE=os.devnull, RAY_USAGE_STATS_ENABLED="0", AMAPREDUCE_RUNS_DIR=str(tmp_path / "ray"),
               AMAPREDUCE_MAX_TOKENS="1")
    with OpenAICompatibleServer(FunctionModel(_sub_agent, model_id="sim-model")) as server, allow_model_requests():
        proc = subprocess.run([sys.executable, "-c", RAY_DRIVER, "mapreduce", "run", str(_decision(tmp_path)), "--model", "sim-model",
                               "--api-base", server.base_url, "--workers", "1", "--json", "--max-batches", "1",
                               "--executor", "ray"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 4, proc.stderr[-3000:]  # stopped by the budget
    record, _ = _result(tmp_path / "ray")
    assert record["status"].startswith("stopped: chunk ") and "token budget of 1 is spent across the cluster" in record["status"]
    requests = record["usage"]["total"]["requests"]
    assert 1 <= requests <= 2 and server.request_count == requests
    # what the cluster had counted when it refused a call is in the driver's usage: the call that spent
    # the budget is never lost with its chunk (it was when the stopped run cancelled the chunk that
    # made it before it came back: 0 requests, on a busy machine)
    counted = re.search(r"spent across the cluster \((\d+) tokens\)", record["status"])
    total = record["usage"]["total"]
    assert counted is not None and total["prompt_tokens"] + total["completion_tokens"] >= int(counted.group(1)) >= 1
    found = [r for r in record["table"]["rows"] if r["cells"]["code"]["status"] == "found"]
    assert requests <= len(found) <= 2 * requests  # the answers of the calls that went out are kept
    assert record["executor"]["chunks"] == 4 and record["executor"]["finished"] <= 4


class _Held:
    """The simulated sub-agent (`_sub_agent`), counting what each stage asks; while `hold` is
    set, a question for a row of `held` waits until the test lets it go (its chunk never returns)."""

    def __init__(self, held: set[str]) -> None:
        self.held, self.stage = held, "local"
        self.asked: dict[str, list[list[str]]] = {"local": [], "killed": [], "resume": []}
        self.hold, self.release = False, threading.Event()

    def __call__(self, messages: list[Any], info: Any) -> Any:
        items = [item for item, _ in _asked(messages)]
        stage = self.stage
        self.asked[stage].append(items)
        if self.hold and stage == "killed" and self.held & set(items):
            self.release.wait(120)
        return _sub_agent(messages, info)


@pytest.mark.slow
def test_a_killed_wide_run_resumes_without_asking_its_finished_chunk_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL the driver once chunk 0 is journaled (chunk 1's questions are held), then
    `runs resume` on Ray: the table is a local run's, and chunk 0's rows are never asked again."""
    from amapreduce.cluster.wide import chunk_plan
    from amapreduce.decision.model import load_decision
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.mapreduce.batching import plan_batches
    from amapreduce.testing.openai_server import OpenAICompatibleServer
    from amapreduce.testing.scripted import FunctionModel

    decision = _decision(tmp_path)
    (first, _), (second, _) = chunk_plan(load_decision(str(decision)),
                                         plan_batches(load_decision(str(decision)), max_batches=None), 2)
    model = _Held({f"item{i:03d}" for i in second})
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "local"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")}
    env.update(AMAPREDUCE_ENV_FILE=os.devnull, RAY_USAGE_STATS_ENABLED="0", AMAPREDUCE_RUNS_DIR=str(tmp_path / "ray"))
    with OpenAICompatibleServer(FunctionModel(model, model_id="sim-model")) as server, allow_model_requests():
        args = [str(decision), "--model", "sim-model", "--api-base", server.base_url, "--workers", "1", "--json"]
        assert main(["mapreduce", "run", *args]) == 3
        capsys.readouterr()
        model.stage, model.hold = "killed", True
        err = tmp_path / "driver.err"
        with err.open("w") as stderr:
            driver = subprocess.Popen([sys.executable, "-c", RAY_DRIVER, "mapreduce", "run", *args, "--max-batches",
                                       "2", "--executor", "ray"], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                      stderr=stderr, start_new_session=True)
        try:
            journal = _wait_for_chunk(tmp_path / "ray", driver, err)
        finally:
            _kill_session(driver.pid)  # the driver, and the local Ray it started (its workers too)
            driver.wait()
            model.release.set()
        lines = journal.read_text(encoding="utf-8").splitlines()
        assert sum('"chunk_done"' in line for line in lines) == 1 and '"run_end"' not in lines[-1]
        model.stage = "resume"
        proc = subprocess.run([sys.executable, "-c", RAY_DRIVER, "runs", "resume", str(journal.parent), "--json"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 3, proc.stderr[-3000:]
    mine, local_dir = _result(tmp_path / "local")
    theirs, ray_dir = _result(tmp_path / "ray")
    assert theirs["table"] == mine["table"]
    assert (local_dir / "table.csv").read_text() == (ray_dir / "table.csv").read_text()
    assert theirs["completeness"] == mine["completeness"] and theirs["status"] == "incomplete"
    assert theirs["executor"] == {"kind": "ray", "chunks": 2, "finished": 2}
    # the finished chunk's usage came from the journal: the run spent what a local run spends
    assert theirs["usage"]["by_role"] == mine["usage"]["by_role"]
    # the resume asked only chunk 1's rows, as many times as the local run asked them
    kept = {f"item{i:03d}" for i in first}
    assert model.asked["resume"] and not kept & {item for items in model.asked["resume"] for item in items}
    assert len(model.asked["resume"]) == sum(1 for items in model.asked["local"] if not kept & set(items))
    assert server.request_count == sum(len(v) for v in model.asked.values())


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid` (the driver's: Ray's workers have process groups of
    their own, so killing the driver's group would leave a worker asking on)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getsid(int(entry.name)) == sid:
                    os.kill(int(entry.name), signal.SIGKILL)


def _wait_for_chunk(runs: Path, driver: subprocess.Popen[bytes], err: Path) -> Path:
    """The journal of the run in `runs` once it records a finished chunk (the driver must still run)."""
    for _ in range(3000):  # each turn waits for the driver for 0.05 s at most: 150 s in all
        journals = list(runs.glob("*/journal.jsonl"))
        if journals and '"chunk_done"' in journals[0].read_text(encoding="utf-8"):
            return journals[0]
        try:
            driver.wait(0.05)
        except subprocess.TimeoutExpired:
            continue
        raise AssertionError(f"the driver ended before a chunk was journaled: {err.read_text()[-3000:]}")
    raise AssertionError("no chunk was journaled")


def test_executor_flag_and_variable_are_checked_before_a_run_is_made(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "runs"))
    base = ["mapreduce", "run", str(_decision(tmp_path)), "--model", "sim-model", "--api-base", "http://127.0.0.1:9/v1"]
    assert main([*base, "--executor", "dask"]) == 2
    assert "--executor 'dask': use local, ray" in capsys.readouterr().err
    monkeypatch.setenv("AMAPREDUCE_EXECUTOR", "threads")
    assert main(base) == 2
    assert "AMAPREDUCE_EXECUTOR 'threads'" in capsys.readouterr().err
    monkeypatch.setenv("AMAPREDUCE_EXECUTOR", "ray")
    monkeypatch.setitem(sys.modules, "ray", None)  # the extra not installed
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "needs the `ray` extra: pip install 'amapreduce[ray]'" in err
    assert not (tmp_path / "runs").exists()


def test_chunks_are_whole_batches_whose_rows_map_back() -> None:
    from amapreduce.cluster.wide import chunk_plan
    from amapreduce.decision.model import Decision
    from amapreduce.mapreduce.batching import plan_batches

    decision = Decision.parse({
        "task_matrix": [[f"item{i}", "north" if i % 2 == 0 else "south"] for i in range(5)],
        "template": "__0__ in __1__", "json_schema": ["item", "region", "code"],
        "batch_strategy": {"type": "by_attr", "attribute_index": 1, "max_group_size": 2},
    })
    plan = plan_batches(decision, max_batches=None)
    chunks = chunk_plan(decision, plan, 2)
    assert [len(sub.batches) for _, sub in chunks] == [2, 1]
    for rows, sub in chunks:  # each batch keeps its id and rows (numbered within the chunk)
        for batch in sub.batches:
            (whole,) = [b for b in plan.batches if b.batch_id == batch.batch_id]
            assert tuple(rows[i] for i in batch.indices) == whole.indices
        assert list(rows) == sorted(rows) and sub.num_rows == len(rows)
    assert sorted(i for rows, _ in chunks for i in rows) == list(range(5))


class _Ref:
    """A fake object ref: a value at once, or a chunk job run by the test."""

    def __init__(self, value: Any = None, job: Any = None) -> None:
        self.value, self.job = value, job


def _every_code_found(job: Any) -> Any:
    """What a chunk's engine would return (a `ChunkRun`): every row's code found."""
    from amapreduce.cluster.wide import ChunkRun
    from amapreduce.decision.model import Decision
    from amapreduce.llm.usage import Usage
    from amapreduce.mapreduce.result import MapReduceResult, RunEnding, RunStatus, RunSummary
    from amapreduce.table.table import Table

    sub = Decision.parse(job.decision)
    table = Table(sub.columns, sub.resolved_key_columns)
    for k, (item,) in enumerate(sub.task_matrix):
        table.upsert({"item": item, "code": item.upper()}, task_index=k)
    result = MapReduceResult(table=table, summary=RunSummary.of(table, sub, [], rounds=0, batches=2, timings={}),
                             plan=job.plan, attempts=(), ending=RunEnding(RunStatus.COMPLETE))
    return ChunkRun(index=job.index, result=result, usage={"subagent": Usage(requests=2, input_tokens=10)},
                    events=[], web={})


class _FakeRay:
    """Just enough of `ray` for `run_wide`'s driver loop, with no process and no clock: the first
    `wait` gives chunk 0's result, the second is a Ctrl-C."""

    class exceptions:  # noqa: N801 - as `ray.exceptions`
        RayError = RuntimeError

    def __init__(self, finish: Any) -> None:
        self.finish, self.waits = finish, 0
        self.cancelled: list[_Ref] = []
        self.submitted: list[_Ref] = []
        self.actors: list[Any] = []

    def is_initialized(self) -> bool:
        return True

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": 8.0}

    def remote(self, **_: Any) -> Any:
        def wrap(target: Any) -> Any:
            ray = self
            if isinstance(target, type):  # the limiter actor: its methods answer at once
                class Handle:
                    def options(self, **_: Any) -> Any:
                        return self

                    def remote(self, *args: Any) -> Any:
                        actor = target(*args)
                        methods = {name: getattr(actor, name) for name in dir(actor) if not name.startswith("_")}
                        handle = type("Actor", (), {name: type("M", (), {"remote": staticmethod(
                            lambda *a, m=m: _Ref(m(*a)))})() for name, m in methods.items()})()
                        ray.actors.append(handle)
                        return handle
                return Handle()

            class Task:
                @staticmethod
                def remote(job: Any) -> _Ref:
                    ref = _Ref(job=job)
                    ray.submitted.append(ref)
                    return ref
            return Task()
        return wrap

    def get(self, ref: _Ref) -> Any:
        return self.finish(ref.job) if ref.job is not None else ref.value

    def wait(self, refs: list[_Ref], num_returns: int = 1,
             timeout: float | None = None) -> tuple[list[_Ref], list[_Ref]]:
        if timeout is not None:  # the driver settling the chunks it cancelled: none came back
            return [], refs
        self.waits += 1
        if self.waits > 1:
            raise KeyboardInterrupt
        return refs[:1], refs[1:]

    def cancel(self, ref: _Ref) -> None:
        self.cancelled.append(ref)

    def kill(self, *_: Any, **__: Any) -> None:
        pass


def test_ctrl_c_cancels_the_chunks_not_finished_and_keeps_the_rows_of_those_that_were(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from amapreduce.cluster.wide import run_wide
    from amapreduce.decision.model import Decision
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.mapreduce.batching import plan_batches
    from amapreduce.mapreduce.result import RunStatus
    from amapreduce.settings import load_settings
    from amapreduce.trace import NullTrace

    decision = Decision.parse({"task_matrix": [[f"item{i}"] for i in range(6)], "template": "code of __0__",
                               "json_schema": ["item", "code"], "batch_strategy": {"type": "per_atom"}})

    fake = _FakeRay(_every_code_found)
    monkeypatch.setitem(sys.modules, "ray", fake)
    settings = load_settings({}, max_batches=2, model="sim-model")
    meter = UsageMeter()
    wide = run_wide(decision, plan_batches(decision, max_batches=None), settings, meter=meter, trace=NullTrace(),
                    role_models={"subagent": "sim-model"})
    assert wide.chunks == 3 and wide.finished == 1
    assert fake.cancelled == fake.submitted[1:]  # the two chunks not finished were cancelled
    assert wide.result.ending.status is RunStatus.INTERRUPTED
    assert [(r.task_index, r.values()["code"]) for r in wide.result.table.rows] == [(0, "ITEM0"), (1, "ITEM1")]
    assert wide.result.summary.incomplete_tasks == 4  # the tasks of the cancelled chunks
    assert meter.total().requests == 2  # the finished chunk's usage reached the run's meter


class WorkerCrashedError(RuntimeError):
    """As `ray.exceptions.WorkerCrashedError` (the fake's `RayError` is `RuntimeError`)."""


class _Steady(_FakeRay):
    """The fake Ray without the Ctrl-C: every `wait` gives the first ref."""

    def wait(self, refs: list[_Ref], num_returns: int = 1,
             timeout: float | None = None) -> tuple[list[_Ref], list[_Ref]]:
        return refs[:1], refs[1:]


def test_a_chunk_whose_worker_died_runs_again_from_its_ledger_until_its_retries_are_spent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk 1's worker dies on every attempt, after one call and one journal entry, each kept in
    the cluster limiter's ledger: it is sent again with what it settled, twice
    (AMAPREDUCE_RAY_RETRIES=2), then the run ends `failed` with the other chunks' rows, and every
    call of the dead attempts is in the run's usage and `ChunkFinished` is never written for it."""
    from amapreduce.cluster.wide import ChunkRun, run_wide
    from amapreduce.decision.model import Decision
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.llm.usage import Usage
    from amapreduce.mapreduce.batching import plan_batches
    from amapreduce.mapreduce.checkpoint import ExecutionStarted, plan_manifest
    from amapreduce.mapreduce.result import MapReduceResult, RunEnding, RunStatus, RunSummary
    from amapreduce.session.journal import ChunkFinished
    from amapreduce.settings import load_settings
    from amapreduce.table.table import Table
    from amapreduce.trace import NullTrace

    decision = Decision.parse({"task_matrix": [[f"item{i}"] for i in range(6)], "template": "code of __0__",
                               "json_schema": ["item", "code"], "batch_strategy": {"type": "per_atom"}})
    jobs: list[Any] = []

    def finish(job: Any) -> ChunkRun:
        jobs.append(job)
        if job.index == 1:  # what its worker did before it died: one call, and its execution journaled
            (actor,) = fake.actors
            actor.spend.remote(0.0, 7, job.tag, "subagent", Usage(requests=1, input_tokens=7))
            if not job.saved:
                actor.keep.remote(job.tag, 0, ExecutionStarted(execution=1, decision=job.decision,
                                                               plan=plan_manifest(job.plan)))
            raise WorkerCrashedError("the worker running the task died")
        sub = Decision.parse(job.decision)
        table = Table(sub.columns, sub.resolved_key_columns)
        for k, (item,) in enumerate(sub.task_matrix):
            table.upsert({"item": item, "code": item.upper()}, task_index=k)
        result = MapReduceResult(table=table, summary=RunSummary.of(table, sub, [], rounds=0, batches=2, timings={}),
                                 plan=job.plan, attempts=(), ending=RunEnding(RunStatus.COMPLETE))
        return ChunkRun(index=job.index, result=result, usage={"subagent": Usage(requests=2, input_tokens=10)},
                        events=[], web={})

    fake = _Steady(finish)
    monkeypatch.setitem(sys.modules, "ray", fake)
    settings = load_settings({}, max_batches=2, model="sim-model", ray_retries=2)
    meter, journal = UsageMeter(), _Sink()
    wide = run_wide(decision, plan_batches(decision, max_batches=None), settings, meter=meter, trace=NullTrace(),
                    role_models={"subagent": "sim-model"}, journal=journal)
    tries = [job for job in jobs if job.index == 1]
    assert len(tries) == 3 and len({job.tag for job in tries}) == 3  # the first attempt and two retries
    assert [len(job.saved) for job in tries] == [0, 1, 1]  # each retry goes on from what was settled
    assert isinstance(tries[1].saved[0], ExecutionStarted) and tries[1].saved[0].execution == 2
    assert wide.result.ending.status is RunStatus.FAILED
    assert "chunk 1 failed in Ray after 2 retries (WorkerCrashedError" in (wide.result.ending.reason or "")
    assert [r.task_index for r in wide.result.table.rows] == [0, 1, 4, 5]  # chunks 0 and 2 kept their rows
    assert wide.chunks == 3 and wide.finished == 2
    assert meter.total().requests == 2 + 2 + 3  # two chunks, and the three dead attempts' calls
    finished = [e.chunk for e in journal.entries if isinstance(e, ChunkFinished)]
    assert sorted(finished) == [0, 2]
    assert [e.execution for e in journal.entries if isinstance(e, ExecutionStarted)] == [2]


class _OneCpu(_Steady):
    """The fake Ray of a one-CPU cluster, recording how many chunks were in flight at each `wait`."""

    def __init__(self, finish: Any) -> None:
        super().__init__(finish)
        self.in_flight: list[int] = []

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": 1.0}

    def wait(self, refs: list[_Ref], num_returns: int = 1,
             timeout: float | None = None) -> tuple[list[_Ref], list[_Ref]]:
        self.in_flight.append(len(refs))
        return super().wait(refs, num_returns, timeout)


def test_the_driver_keeps_as_many_chunks_in_flight_as_the_cluster_has_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """No backlog of queued chunk tasks (Ray would start worker processes for it): on one CPU, each
    chunk is sent once the one before came back, and every chunk's rows reach the table."""
    from amapreduce.cluster.wide import run_wide
    from amapreduce.decision.model import Decision
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.mapreduce.batching import plan_batches
    from amapreduce.mapreduce.result import RunStatus
    from amapreduce.settings import load_settings
    from amapreduce.trace import NullTrace

    decision = Decision.parse({"task_matrix": [[f"item{i}"] for i in range(6)], "template": "code of __0__",
                               "json_schema": ["item", "code"], "batch_strategy": {"type": "per_atom"}})

    fake = _OneCpu(_every_code_found)
    monkeypatch.setitem(sys.modules, "ray", fake)
    settings = load_settings({}, max_batches=2, model="sim-model")
    meter = UsageMeter()
    wide = run_wide(decision, plan_batches(decision, max_batches=None), settings, meter=meter, trace=NullTrace(),
                    role_models={"subagent": "sim-model"})
    assert fake.in_flight == [1, 1, 1]  # three chunks, one at a time
    assert [job.job.index for job in fake.submitted] == [0, 1, 2]
    assert wide.chunks == 3 and wide.finished == 3 and wide.result.ending.status is RunStatus.COMPLETE
    assert [r.task_index for r in wide.result.table.rows] == list(range(6))
    assert meter.total().requests == 6


class _Sink:
    def __init__(self) -> None:
        self.entries: list[Any] = []

    def append(self, entry: Any) -> None:
        self.entries.append(entry)
