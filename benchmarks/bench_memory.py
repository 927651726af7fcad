"""Benchmark the experiential memory: insert throughput, retrieval latency, distillation.

    .venv/bin/python benchmarks/bench_memory.py                 # 1k, 10k, 100k records; distil at 10k
    .venv/bin/python benchmarks/bench_memory.py --sizes 1000 --distill-size 1000
    .venv/bin/python benchmarks/bench_memory.py --smoke               # the smallest run (CI's smoke run)

Vectors are synthetic (unit-norm, 384-d, clustered around 200 "topics"), inserted directly:
embedding 100k questions with MiniLM would take minutes on 2 cores and is not what is measured.
Retrieval latency is the whole plan-stage lookup *excluding the query's own embedding*: index
catch-up check, exact top-k⁺/top-k⁻ search, same-task exclusion, record fetch and hint scoring
by s = w + v over the provenance table. The baseline, measured in the same run, is a brute-force
numpy top-k over the same matrix (no SQLite, no hints). The distillation uses a simulated memory
model (instant replies), so it measures FINCH plus the store's bookkeeping, not an LLM.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from amapreduce.memory import ExperientialMemory, MemoryConfig
from amapreduce.memory.records import DecisionSummary, Record
from amapreduce.memory.retrieval import retrieve
from amapreduce.memory.store import insert_hint, insert_record
from amapreduce.testing.scripted import FunctionModel

DIM = 384
TOPICS = 200
PASS = {"score": 1, "f1_by_row": 1.0, "f1_by_item": 1.0}
FAIL = {"score": 0, "f1_by_row": 0.2, "f1_by_item": 0.4}
DECISION = DecisionSummary(rows=20, cols=3, strategy="per_atom", pattern="20x3 matrix; per_atom")
SMOKE = ["--sizes", "500", "--queries", "20", "--updates", "20", "--distill-size", "500"]
"""`--smoke`: the smallest size, to check that the script runs (CI runs it so)."""


def synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` unit vectors around TOPICS centres, and the topic of each."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((TOPICS, DIM)).astype(np.float32)
    topics = rng.integers(0, TOPICS, n)
    x = centres[topics] + 0.6 * rng.standard_normal((n, DIM)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32), topics


def build(folder: Path, n: int, seed: int = 0) -> tuple[ExperientialMemory, np.ndarray, float]:
    """A store of `n` records (30 % negative) and n/20 hints with 5 records of provenance each."""
    mem = ExperientialMemory(folder, encoder="hashing:384")
    vectors, topics = synthetic(n, seed)
    rng = random.Random(seed)
    t0 = time.perf_counter()
    for start in range(0, n, 1000):
        with mem.store.write() as conn:
            for i in range(start, min(n, start + 1000)):
                ok = rng.random() > 0.3
                rec = Record(id=f"r{i}", query=f"topic {topics[i]} question {i}", label=ok, decision=DECISION,
                             metrics=PASS if ok else FAIL, task_id=f"t{i // 4}")
                insert_record(conn, rec, vectors[i])
    insert_s = time.perf_counter() - t0
    with mem.store.write() as conn:
        for h in range(max(1, n // 20)):
            prov = [f"r{rng.randrange(n)}" for _ in range(5)]
            insert_hint(conn, f"hint {h}", rng.randint(1, 6), origin="bench", provenance=prov)
    return mem, vectors, insert_s


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def bench_size(n: int, queries: int, updates: int = 200) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        mem, vectors, insert_s = build(Path(tmp), n)
        qvecs, _ = synthetic(queries, seed=99)
        config = mem.config
        t0 = time.perf_counter()
        with mem.store.read() as conn:
            mem.index.sync(conn)
        sync_s = time.perf_counter() - t0

        # Online updates (one transaction each, with the embedding of a short query).
        t0 = time.perf_counter()
        for i in range(updates):
            mem.update(None, query=f"new question {i}", decision=DECISION, metrics=PASS, auto_distill=False)
        update_ms = (time.perf_counter() - t0) / updates * 1000

        for q in qvecs[:5]:  # warm-up: builds the float16 copy once
            retrieve(mem.store, mem.index, q, "q", config)
        lat: list[float] = []
        for i, q in enumerate(qvecs):
            t = time.perf_counter()
            retrieve(mem.store, mem.index, q, "q", config, task_id=f"t{i}")
            lat.append((time.perf_counter() - t) * 1000)
        base: list[float] = []
        matrix = vectors
        k = config.k_pos
        for q in qvecs:
            t = time.perf_counter()
            sims = matrix @ q
            top = np.argpartition(-sims, k)[:k]
            top[np.argsort(-sims[top])]
            base.append((time.perf_counter() - t) * 1000)

        t0 = time.perf_counter()
        with mem.store.read() as conn:
            mem.index.rebuild(conn)
        rebuild_s = time.perf_counter() - t0
        fresh = ExperientialMemory(Path(tmp))
        t0 = time.perf_counter()
        with fresh.store.read() as conn:
            fresh.index.sync(conn)
        load_s = time.perf_counter() - t0
        fresh.close()
        mem.close()
    return {"n": n, "insert_per_s": n / insert_s, "update_ms": update_ms, "first_sync_s": sync_s,
            "p50": statistics.median(lat), "p95": percentile(lat, 0.95), "base_p50": statistics.median(base),
            "base_p95": percentile(base, 0.95), "rebuild_s": rebuild_s, "cache_load_s": load_s}


def bench_distill(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-distill-") as tmp:
        mem, _, _ = build(Path(tmp), n)
        mem.model = FunctionModel(lambda m, i: "AGREE 1: x\nADD: Group rows sharing a source.\n1. merged hint")
        mem.config = MemoryConfig(pairs_per_cluster=1)
        t0 = time.perf_counter()
        report = mem.distill()
        total = time.perf_counter() - t0
        t0 = time.perf_counter()
        from amapreduce.memory.distill import cluster_records

        cluster_records(np.stack([np.frombuffer(r[0], dtype=np.float32) for r in mem.store.conn.execute(
            "SELECT embedding FROM records")]), mem.config)
        finch_s = time.perf_counter() - t0
        mem.close()
    return {"n": n, "total_s": total, "finch_s": finch_s, "clusters": len(report.clusters),
            "calls": len(report.calls), "applied": len(report.applied), "merged": len(report.merged)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--updates", type=int, default=200, help="online updates timed per size")
    parser.add_argument("--distill-size", type=int, default=10000, help="0 skips the distillation benchmark")
    parser.add_argument("--smoke", action="store_true", help="the smallest run: " + " ".join(SMOKE))
    args = parser.parse_args(argv)
    if args.smoke:
        args = parser.parse_args([*(argv if argv is not None else sys.argv[1:]), *SMOKE])
    print(f"load average before the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores "
          "(figures scale with it; the numpy baseline is measured in the same run)")
    print(f"{'records':>8} {'insert/s':>9} {'update ms':>9} {'p50 ms':>7} {'p95 ms':>7} {'numpy p50':>9} "
          f"{'numpy p95':>9} {'p95 ratio':>9} {'rebuild s':>9} {'cache load s':>12}")
    for n in (int(s) for s in args.sizes.split(",")):
        r = bench_size(n, args.queries, args.updates)
        print(f"{r['n']:>8} {r['insert_per_s']:>9.0f} {r['update_ms']:>9.2f} {r['p50']:>7.2f} {r['p95']:>7.2f} "
              f"{r['base_p50']:>9.2f} {r['base_p95']:>9.2f} {r['p95'] / r['base_p95']:>9.2f} "
              f"{r['rebuild_s']:>9.2f} {r['cache_load_s']:>12.2f}", flush=True)
    if args.distill_size:
        d = bench_distill(args.distill_size)
        print(f"distillation at {d['n']} records: {d['total_s']:.1f} s total (FINCH alone {d['finch_s']:.1f} s), "
              f"{d['clusters']} clusters, {d['calls']} model calls (simulated), {d['applied']} operations applied, "
              f"{d['merged']} merges")
    return 0


if __name__ == "__main__":
    sys.exit(main())
