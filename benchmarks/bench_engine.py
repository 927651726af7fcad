"""Engine scaling benchmark: how close parallel fan-out gets to the ideal, and the engine's overhead.

A scripted sub-agent sleeps a fixed latency per call (20 ms) and answers every sub-question.
For N rows (per_atom, one task per batch) and `workers` in flight, the ideal wall time is
⌈batches / workers⌉ × latency; efficiency = ideal / actual. The overhead per batch is measured
with zero latency: everything the engine does per batch (prompt rendering, thread hand-off,
JSON parsing, projection, merge, reduce, summary) divided by the number of batches.

A bare `ThreadPoolExecutor` doing only the sleeps is measured in the same run as the baseline
(`pool_s`): it shows what this machine allows at that moment, and `vs_pool` = pool_s / wall_s
isolates the engine's own cost from machine load.

Run: `.venv/bin/python benchmarks/bench_engine.py` (add `--quick` for a smaller grid, `--smoke` for
the smallest run, which CI runs).
Targets (reported, not asserted): efficiency >= 0.9 at N=1000/workers=32; overhead <= 1 ms/batch.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from amapreduce.decision.model import Decision
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.solver import BatchRequest, SolverReply


class SleepySolver:
    """Answers each sub-question after sleeping `latency` seconds (a stand-in sub-agent)."""

    def __init__(self, latency: float) -> None:
        self.latency = latency

    def solve(self, request: BatchRequest) -> SolverReply:
        if self.latency:
            time.sleep(self.latency)
        rows = [
            {"task": k, "name": t.rsplit(" ", 1)[-1], "capital": f"cap-{t}", "population": "42", "source": "https://x"}
            for k, t in enumerate(request.tasks, 1)
        ]
        return SolverReply(output=json.dumps(rows), usage=Usage(requests=1, input_tokens=200, output_tokens=30))


def decision(n: int) -> Decision:
    return Decision.parse(
        {
            "task_matrix": [[f"entity{i:05d}"] for i in range(n)],
            "template": "Find the capital and population of __0__",
            "json_schema": {"type": "object", "properties": {"name": {}, "capital": {}, "population": {}}},
            "batch_strategy": {"type": "per_atom"},
        }
    )


def run_once(n: int, workers: int, latency: float) -> float:
    engine = MapReduceEngine(SleepySolver(latency), config=EngineConfig(workers=workers, max_batches=None))
    d = decision(n)
    start = time.perf_counter()
    result = engine.run(d)
    elapsed = time.perf_counter() - start
    if not result.summary.complete or result.summary.rows != n:
        raise SystemExit(f"benchmark run incomplete: {result.summary.to_json()}")
    return elapsed


def run_pool(n: int, workers: int, latency: float) -> float:
    """Baseline: the same sleeps on a bare thread pool, no engine."""
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda _: time.sleep(latency), range(n)))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N in {10, 100} only")
    parser.add_argument("--smoke", action="store_true", help="N=10 only, one overhead run: checks that it runs")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args()
    latency = args.latency_ms / 1000
    sizes = [10] if args.smoke else [10, 100] if args.quick else [10, 100, 1000]
    repeats = 1 if args.smoke else 5
    print(f"Scaling with a {args.latency_ms:g} ms scripted sub-agent (per_atom: batches = N)")
    print(f"{'N':>6} {'workers':>7} {'wall_s':>9} {'ideal_s':>9} {'efficiency':>10} {'pool_s':>9} {'vs_pool':>8}")
    for n in sizes:
        for workers in (1, 8, 32):
            wall = run_once(n, workers, latency)
            pool = run_pool(n, workers, latency)
            ideal = math.ceil(n / workers) * latency
            print(f"{n:>6} {workers:>7} {wall:>9.3f} {ideal:>9.3f} {ideal / wall:>10.3f} {pool:>9.3f} {pool / wall:>8.3f}")
    print(f"\nEngine overhead per batch with zero latency (median of {repeats} runs)")
    print(f"{'N':>6} {'workers':>7} {'wall_s':>9} {'ms/batch':>9}")
    for n in sizes:
        for workers in (1, 8, 32):
            walls = [run_once(n, workers, 0.0) for _ in range(repeats)]
            wall = statistics.median(walls)
            print(f"{n:>6} {workers:>7} {wall:>9.4f} {wall / n * 1000:>9.3f}")


if __name__ == "__main__":
    main()
