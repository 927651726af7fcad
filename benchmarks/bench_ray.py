"""Ray benchmark: local threads vs `--executor ray` on a wide oracle run and on the sandbox evaluation.

Wide run: a user's `per_atom` decision of N rows (default 1,000: N batches), each row asking the
code of an item; the sub-agent is a simulated model (deterministic code, not an LLM) that answers
every question at once from the question's text, served on a loopback OpenAI-compatible endpoint
(`amapreduce.testing.openai_server`), so the run goes through the CLI, smolagents, the HTTP client
and the endpoint, and the only cost measured is the framework's own. Each configuration runs
`amapreduce mapreduce run DECISION --json` in a subprocess: `local` with `--workers W`, `ray` with
`--executor ray` in a process that started a local Ray with `--cpus` CPUs (chunks of 4 × W
batches, `cluster.wide`). Sandbox evaluation: `amapreduce eval run --benchmark sandbox --trials T`
offline, local and `--executor ray` (each trial one Ray task, `cluster.trials`).

Per configuration it prints the subprocess's wall time (Ray's start included), the run's own wall
time where `result.json` has it, the overhead per batch (run wall / batches, with the simulated
model answering instantly this is all framework; below the table, each Ray mode's against the
local run's of the same invocation, `per-batch overhead ray/local`), the driver's peak RSS (the subprocess; Ray's
worker processes are not its children and are not counted), and whether the table (or the
scores) equal the local run's.

Wide modes (`--wide-modes local,tasks,actors`, default all three; local always runs, as the
reference): `tasks` (alias `ray`, shown as `ray`) is the product path above; `actors` (shown as
`ray-actors (prototype)`) is a PROTOTYPE INSIDE THIS BENCHMARK, not the product path, measured to
choose between the two designs of issue 14 point 3: one threaded Ray actor per CPU
(`max_concurrency` = W), each building the engine once from plain settings under the cluster's
limiter and meter (`cluster.limits`, as a chunk does); the driver cuts the same plan into single
batches (`chunk_plan(..., 1)`: a batch's rows as a sub-decision plus its plan, plain data), keeps
W × actors batches in flight (each new one to the actor with the fewest), and merges the rows in
matrix order with `Table.merge_row`, the rule of `cluster.wide`. It writes no run folder, no
journal and no `result.json` (workers' trace events are shipped back with each batch and written
to one file), and its driver does not load the CLI, so its RSS is not the product's. Its table is
checked against the local run's.

Ray calls: `ray_calls` counts the driver's (remote task and actor submissions, actor method
calls, `ray.get`/`ray.wait`/`ray.cancel`/`ray.kill`, by patching Ray's entry points in the driver
process); `limiter_calls` counts the calls the cluster's limiter actor served (each model call's
gates and spend, from the workers; a counting subclass of `LimiterActor`). Workers' `get_actor`
look-ups are not counted. A Ray driver is this file run as `--as-driver MODE CPUS ARGS...`.

Run: `.venv/bin/python benchmarks/bench_ray.py` (N=1000, W=8, 2 CPUs, trials 2); options: `--rows
200 --workers 4 --cpus 4 --trials 1 --skip-eval --wide-modes local,actors`. Nothing leaves
loopback; run folders go to a temporary folder removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
COUNTS_ENV = "BENCH_RAY_COUNTS"
"""Where a Ray driver subprocess writes the Ray calls it counted (JSON)."""


def _sub_agent(messages: list[Any], info: Any) -> Any:
    from amapreduce.llm.messages import message_text
    from amapreduce.testing.scripted import final_answer

    asked = re.findall(r"code of (item\d+)\?", "\n".join(message_text(m) for m in messages).rsplit("Sub-questions:", 1)[-1])
    return final_answer(json.dumps([{"task": k + 1, "item": item, "code": item.upper()} for k, item in enumerate(asked)]))


LOCAL_DRIVER = "import sys\nfrom amapreduce.cli.app import main\nsys.exit(main(sys.argv[1:]))\n"


# -- Ray driver subprocesses (this file run with `--as-driver`) -----------------------------------

def _count_ray_calls() -> dict[str, int]:
    """Patch Ray's entry points in this (driver) process and the limiter actor's class so every
    Ray call is counted; the counts are filled in as the run goes."""
    import ray
    from ray.actor import ActorClass, ActorMethod
    from ray.remote_function import RemoteFunction

    from amapreduce.cluster import limits as ray_limits

    counts: dict[str, int] = {}
    lock = threading.Lock()

    def wrap(owner: Any, name: str, key: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            with lock:
                counts[key] = counts.get(key, 0) + 1
            return original(*args, **kwargs)
        setattr(owner, name, counted)

    wrap(RemoteFunction, "_remote", "task_submits")
    wrap(ActorClass, "_remote", "actor_starts")
    wrap(ActorMethod, "_remote", "actor_method_calls")
    for name in ("get", "wait", "cancel", "kill"):
        wrap(ray, name, name)
    base = ray_limits.LimiterActor

    class CountingLimiter(ray_limits.LimiterActor):
        """The cluster's limiter, counting the calls it serves (defined here: shipped by value)."""

        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self._served = 0
            self._served_lock = threading.Lock()

        def served(self) -> int:
            return self._served

    for method in ("acquire", "settle", "defer", "admit", "record", "release", "spend", "spent", "state", "budget",
                   "grants", "keep", "left", "forget", "halt", "halted", "begin", "end", "deliver"):
        def serve(self: Any, *args: Any, _method: str = method, **kwargs: Any) -> Any:
            with self._served_lock:
                self._served += 1
            return getattr(base, _method)(self, *args, **kwargs)
        setattr(CountingLimiter, method, serve)
    ray_limits.LimiterActor = CountingLimiter  # type: ignore[assignment,misc]  # the class `ClusterLimiter.start` makes remote
    stop = ray_limits.ClusterLimiter.stop

    def counted_stop(self: Any) -> None:
        counts["limiter_calls"] = counts.get("limiter_calls", 0) + int(ray.get(self._actor.served.remote()))
        stop(self)
    ray_limits.ClusterLimiter.stop = counted_stop  # type: ignore[method-assign]
    return counts


def _driver(argv: list[str]) -> int:
    """`--as-driver MODE CPUS ARGS...`: start a local Ray with CPUS CPUs, count Ray calls, then run
    the CLI with ARGS (`cli`) or the actor-pool prototype (`actors`, ARGS: its JSON settings)."""
    import ray

    mode, cpus, rest = argv[0], int(argv[1]), argv[2:]
    started = time.perf_counter()
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    print(f"ray_init_s={time.perf_counter() - started:.2f}", file=sys.stderr)
    counts = _count_ray_calls()
    if mode == "actors":
        _actor_pool(cpus=cpus, **json.loads(rest[0]))
        code = 0
    else:
        from amapreduce.cli.app import main as cli

        code = cli(rest)
    ray.shutdown()
    Path(os.environ[COUNTS_ENV]).write_text(json.dumps(counts), encoding="utf-8")
    return code


class BatchActor:
    """PROTOTYPE (benchmark only): a threaded Ray actor that builds the engine once from plain
    settings, under the cluster's limiter and meter, and runs single batches sent to it."""

    def __init__(self, settings: Any, limits: Any) -> None:
        from amapreduce.cluster.limits import cluster_worker
        from amapreduce.session.parts import build_models, build_parts
        from amapreduce.trace import Trace

        events: list[tuple[str, dict[str, Any]]] = []
        lock = threading.Lock()

        class Kept(Trace):
            def write(self, event: str, **data: Any) -> None:
                with lock:
                    events.append((event, data))

        self._events, self._lock = events, lock
        self._stack = contextlib.ExitStack()
        self._meter, kept = self._stack.enter_context(cluster_worker(limits, settings)), Kept()
        models = build_models(settings, ("subagent", "extraction"), meter=self._meter, trace=kept)
        self._parts = self._stack.enter_context(build_parts(settings, models=models, trace=kept, decisions_by="user"))

    def run_batch(self, index: int, decision: dict[str, Any], plan: Any) -> tuple[int, list[Any], str, list[Any]]:
        """(index, the batch's merged rows, its ending, the trace events written since the last batch)."""
        from amapreduce.decision.model import Decision

        result = self._parts.engine.run(Decision.parse(decision), plan=plan)  # a stop is a result too
        with self._lock:
            events, self._events[:] = list(self._events), []
        return index, list(result.table.rows), result.ending.label, events

    def usage(self) -> dict[str, Any]:
        return dict(self._meter.by_role())


def _actor_pool(*, cpus: int, decision: str, model: str, api_base: str, workers: int, out: str) -> None:
    """PROTOTYPE: run `decision` as single batches on `cpus` threaded actors; write its table to `out`."""
    ray: Any = importlib.import_module("ray")

    from amapreduce.cluster.limits import ClusterLimiter
    from amapreduce.cluster.wide import chunk_plan
    from amapreduce.decision.model import load_decision
    from amapreduce.llm.factory import new_meter
    from amapreduce.mapreduce.batching import plan_batches
    from amapreduce.mapreduce.engine import EngineConfig
    from amapreduce.settings import load_settings
    from amapreduce.table.table import Row, Table

    settings = load_settings(model=model, api_base=api_base, workers=workers)
    whole = load_decision(decision)
    started = time.perf_counter()
    plan = plan_batches(whole, max_batches=None)
    batches = chunk_plan(whole, plan, 1)
    limiter = ClusterLimiter.start(budget=new_meter(settings).budget)
    options: dict[str, Any] = {"num_cpus": 1, "max_concurrency": workers, "max_restarts": 0}
    pool = ray.remote(**options)(BatchActor)
    actors = [pool.remote(settings, limiter.limits) for _ in range(cpus)]
    load = [0] * len(actors)
    pending: dict[Any, int] = {}
    done: dict[int, list[Any]] = {}
    endings: dict[str, int] = {}
    next_batch = 0
    with open(Path(out).with_suffix(".trace.jsonl"), "w", encoding="utf-8") as trace:
        while next_batch < len(batches) or pending:
            while next_batch < len(batches) and len(pending) < workers * len(actors):
                a = load.index(min(load))
                rows, sub_plan = batches[next_batch]
                sub = whole.with_matrix([whole.task_matrix[i] for i in rows]).model_dump(mode="json")
                pending[actors[a].run_batch.remote(next_batch, sub, sub_plan)] = a
                load[a] += 1
                next_batch += 1
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0.002)  # all done by now
            if not ready:
                ready, _ = ray.wait(list(pending), num_returns=1)
            for ref, (k, got, ending, events) in zip(ready, ray.get(ready), strict=True):  # one get per round
                load[pending.pop(ref)] -= 1
                done[k], endings[ending] = got, endings.get(ending, 0) + 1
                for event, data in events:
                    trace.write(json.dumps({"event": event, "batch": k, **data}, default=str) + "\n")
    usage = ray.get([a.usage.remote() for a in actors])
    for actor in actors:
        ray.kill(actor)
    limiter.stop()
    cfg = EngineConfig.from_settings(settings, decisions_by="user")
    table = Table(whole.columns, whole.resolved_key_columns, missing_markers=cfg.missing_markers,
                  strict_evidence=cfg.verify == "strict")
    merged = [Row(cells=row.cells, task_index=batches[k][0][row.task_index], strict_evidence=row.strict_evidence,
                  origin=row.origin) for k in sorted(done) for row in done[k]]
    for row in sorted(merged, key=lambda r: r.task_index):
        table.merge_row(row)
    table.sort_by_task()
    record = {"table": table.to_json(), "batches": len(batches), "wall_s": time.perf_counter() - started,
              "rows": len(table.rows), "endings": endings, "actors": len(actors),
              "requests_per_actor": [sum(u.requests for u in by_role.values()) for by_role in usage]}
    Path(out).write_text(json.dumps(record), encoding="utf-8")


# -- the benchmark --------------------------------------------------------------------------------

def _run(argv: list[str], env: dict[str, str], *, cpus: int | None, folder: Path,
         mode: str = "cli") -> tuple[int, float, float, dict[str, int]]:
    """Run the CLI (`cpus`: in a process that starts a local Ray first, `mode` `actors`: the
    actor-pool prototype there instead); (exit code, wall s, peak RSS MB, Ray calls counted)."""
    counts_file = folder / "ray-counts.json"
    counts_file.unlink(missing_ok=True)
    cmd = ([sys.executable, str(Path(__file__).resolve()), "--as-driver", mode, str(cpus), *argv] if cpus is not None
           else [sys.executable, "-c", LOCAL_DRIVER, *argv])
    started = time.perf_counter()
    with open(folder / "stdout.txt", "w") as out, open(folder / "stderr.txt", "w") as err:
        proc = subprocess.Popen(cmd, env={**env, COUNTS_ENV: str(counts_file)}, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    if code not in (0, 3):
        sys.stderr.write((folder / "stderr.txt").read_text()[-3000:])
    counts = json.loads(counts_file.read_text(encoding="utf-8")) if counts_file.exists() else {}
    return code, wall, usage.ru_maxrss / 1024, counts


def _calls(counts: dict[str, int]) -> tuple[int, int]:
    """(Ray calls made by the driver, calls the limiter actor served)."""
    return sum(v for k, v in counts.items() if k != "limiter_calls"), counts.get("limiter_calls", 0)


WIDE_MODES = {"local": "local", "tasks": "ray", "ray": "ray", "actors": "ray-actors (prototype)"}
"""`--wide-modes` names and the mode shown (`ray` is `tasks`, the product path)."""


def bench_wide(rows: int, workers: int, cpus: int, folder: Path,
               modes: tuple[str, ...] = ("local", "tasks", "actors")) -> list[dict[str, Any]]:
    """Local vs Ray on an N-row per_atom decision; one row of results per mode."""
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.testing.openai_server import OpenAICompatibleServer
    from amapreduce.testing.scripted import FunctionModel

    decision = folder / "wide.json"
    decision.write_text(json.dumps({
        "task_matrix": [[f"item{i:05d}"] for i in range(rows)], "template": "What is the code of __0__?",
        "json_schema": ["item", "code"], "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
    }), encoding="utf-8")
    results = []
    tables: dict[str, Any] = {}
    with OpenAICompatibleServer(FunctionModel(_sub_agent, model_id="sim-model"), keep_requests=False) as server, \
            allow_model_requests():
        for name in dict.fromkeys(("local", *("tasks" if m == "ray" else m for m in modes))):  # local: the reference
            mode = WIDE_MODES[name]
            runs = folder / f"wide-{name}"
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")},
                   "AMAPREDUCE_ENV_FILE": os.devnull, "AMAPREDUCE_RUNS_DIR": str(runs), "RAY_USAGE_STATS_ENABLED": "0"}
            if name == "actors":
                runs.mkdir()
                out = runs / "actors.json"
                argv = [json.dumps({"decision": str(decision), "model": "sim-model", "api_base": server.base_url,
                                    "workers": workers, "out": str(out)})]
                code, wall, rss, counts = _run(argv, env, cpus=cpus, folder=folder, mode="actors")
                record = json.loads(out.read_text(encoding="utf-8"))
                tables[mode], run_wall, batches = record["table"], float(record["wall_s"]), record["batches"]
                row_count, chunks = len(record["table"]["rows"]), f"{record['actors']} actors x {workers}"
            else:
                argv = ["mapreduce", "run", str(decision), "--model", "sim-model", "--api-base", server.base_url,
                        "--workers", str(workers), "--json", *(["--executor", "ray"] if mode == "ray" else [])]
                code, wall, rss, counts = _run(argv, env, cpus=cpus if mode == "ray" else None, folder=folder)
                (run_dir,) = runs.iterdir()
                record = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
                tables[mode], run_wall = record["table"], float(record["timings"]["wall_s"])
                batches, row_count = record["completeness"]["batches"], record["completeness"]["rows"]
                chunks = record.get("executor", {}).get("chunks", "-")
            driver_calls, limiter_calls = _calls(counts)
            results.append({"what": f"wide N={rows}", "mode": mode, "exit": code, "wall_s": round(wall, 2),
                            "run_wall_s": round(run_wall, 2), "batches": batches,
                            "ms_per_batch": round(1000 * run_wall / max(1, batches), 2),
                            "rss_mb": round(rss, 1), "rows": row_count, "chunks": chunks,
                            "ray_calls": driver_calls, "limiter_calls": limiter_calls})
            if "local" in tables and mode != "local":
                results[-1]["same_as_local"] = tables[mode] == tables["local"]
    return results


def bench_eval(trials: int, cpus: int, folder: Path) -> list[dict[str, Any]]:
    """Local vs Ray on the offline sandbox evaluation."""
    results, scores = [], {}
    for mode in ("local", "ray"):
        out = folder / f"eval-{mode}"
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")},
               "AMAPREDUCE_ENV_FILE": os.devnull, "RAY_USAGE_STATS_ENABLED": "0"}
        argv = ["eval", "run", "--benchmark", "sandbox", "--trials", str(trials), "--encoder", "hashing",
                "--out", str(out), "--json", *(["--executor", "ray"] if mode == "ray" else [])]
        code, wall, rss, counts = _run(argv, env, cpus=cpus if mode == "ray" else None, folder=folder)
        record = json.loads((out / "results.json").read_text(encoding="utf-8"))
        scores[mode] = {k: v for k, v in record["summary"].items() if isinstance(v, dict)}
        tasks = sum(len(v) for v in record["per_task"].values())
        driver_calls, limiter_calls = _calls(counts)
        results.append({"what": f"sandbox eval x{trials}", "mode": mode, "exit": code, "wall_s": round(wall, 2),
                        "run_wall_s": "-", "batches": f"{tasks} trials", "ms_per_batch": round(1000 * wall / max(1, tasks), 1),
                        "rss_mb": round(rss, 1), "rows": "-", "chunks": "-", "ray_calls": driver_calls,
                        "limiter_calls": limiter_calls})
    results[-1]["same_as_local"] = scores["ray"] == scores["local"]
    return results


SMOKE = ["--rows", "20", "--workers", "2", "--cpus", "1", "--skip-eval", "--wide-modes", "local,tasks"]
"""`--smoke`: 20 rows, the product path only, no evaluation (CI runs it so)."""


def main() -> None:
    if sys.argv[1:2] == ["--as-driver"]:
        sys.exit(_driver(sys.argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--skip-eval", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (checks that it runs): " + " ".join(SMOKE))
    parser.add_argument("--wide-modes", default="local,tasks,actors",
                        help="wide-run modes, comma-separated: local, tasks (alias ray: the product path), "
                             "actors (an actor-pool prototype in this benchmark); local always runs first")
    args = parser.parse_args()
    if args.smoke:
        args = parser.parse_args([*sys.argv[1:], *SMOKE])
    modes = tuple(m.strip() for m in args.wide_modes.split(",") if m.strip())
    unknown = [m for m in modes if m not in WIDE_MODES]
    if unknown:
        parser.error(f"unknown --wide-modes {unknown}; choose from local, tasks, actors")
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        rows = bench_wide(args.rows, args.workers, args.cpus, Path(tmp), modes)
        if not args.skip_eval:
            rows += bench_eval(args.trials, args.cpus, Path(tmp))
    columns = ["what", "mode", "exit", "wall_s", "run_wall_s", "batches", "ms_per_batch", "rss_mb", "rows", "chunks",
               "same_as_local", "ray_calls", "limiter_calls"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    local = next((r for r in rows if r["what"].startswith("wide") and r["mode"] == "local"), None)
    for row in rows:  # measured side by side, in this invocation
        if local is not None and row["what"] == local["what"] and row["mode"] != "local":
            print(f"\nper-batch overhead {row['mode']}/local: "
                  f"{row['ms_per_batch'] / max(local['ms_per_batch'], 1e-9):.2f}")
    if any(r["mode"].startswith("ray-actors") for r in rows):
        print("\nray-actors (prototype): a pool of threaded Ray actors defined inside this benchmark, NOT the product "
              "path (`--executor ray` runs chunks as Ray tasks, the `ray` rows); it writes no run folder or journal.")


if __name__ == "__main__":
    main()
