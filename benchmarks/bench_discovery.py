"""Discovery benchmark: sequential manager scouting vs discovery as MapReduce, on the path users run.

The task is the sandbox's discovery-heavy `sbx_disc_001` (every city of at least 1.5 million
inhabitants with its country and population: 321 cities named under three spellings on 58 list
pages; `amapreduce.sandbox.discovery`). The model is the demo's simulated model (deterministic
code, not an LLM) served on a loopback OpenAI-compatible endpoint, as `amapreduce demo --serve`
serves it; each configuration runs `python -m amapreduce ask QUERY --model simulated --api-base
URL --search corpus:INDEX --json` as a subprocess, so the run goes through the CLI, smolagents,
the HTTP client and the endpoint. Two manager behaviours are compared:

* `sequential`: the manager reads every list page itself, in its own context, dedups the names
  itself and hands the entities to `mapreduce` as a task matrix (how today's manager scouts a
  list question);
* `mapreduce`: the manager reads only the hub page and writes a decision with `discover`: one
  sub-agent per two list pages lists the candidates with quotes, code dedups them by normalised
  key, a token-budget tree reduce of merge calls merges the spelling variants, and the fill stage
  asks each city's population.

Per configuration it prints: entities found / expected (rows whose City and Country are a gold
entity in the gold spelling), duplicates left (further rows naming an entity already found, by the
benchmark's own folding of names), the WideSearch item F1 against the gold, model calls by role
(manager, sub-agent, merge), the peak prompt tokens of any single call and of the manager's calls
(counted here on the text the endpoint received, with the offline tokenizer of
`amapreduce.llm.tokens`, else chars/4: the same counter for both modes), the merge token budget
and merge calls of the discovery, and the wall time of the subprocess. What it measures: whether
discovering the entity set as a MapReduce keeps every single prompt small (the manager's context
no longer holds the lists) at equal completeness, and what that costs in calls and time. The
simulated model answers instantly, so wall times are the framework's own overhead, not a
provider's latency.

Run: `.venv/bin/python benchmarks/bench_discovery.py` (both modes, 8 workers); options:
`--modes sequential,mapreduce --workers 16 --max-batches 100`; `--smoke` for the smallest run (CI runs it). Nothing leaves loopback; run
directories are written to a temporary folder that is removed at the end (`--keep` keeps it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _cli import REPO, amapreduce_command, checkout_environment

TASK = "sbx_disc_001"


@dataclass
class Calls:
    """Prompt tokens of every call the endpoint answered, by role."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, role: str, n: int) -> None:
        with self.lock:
            self.tokens.setdefault(role, []).append(n)

    def count(self, role: str | None = None) -> int:
        return sum(len(v) for k, v in self.tokens.items() if role in (None, k))

    def peak(self, role: str | None = None) -> int:
        return max((n for k, v in self.tokens.items() if role in (None, k) for n in v), default=0)


def recording_model(scouting: str, calls: Calls) -> Any:
    """The served simulated model, with each call's role and prompt tokens recorded."""
    from amapreduce.demo.discovery import MERGE_FIRST_LINE
    from amapreduce.demo.serve import serving_model
    from amapreduce.llm.messages import message_text
    from amapreduce.llm.tokens import TokenCounter
    from amapreduce.testing.scripted import FunctionModel

    inner, counter = serving_model("sequential" if scouting == "sequential" else "mapreduce"), TokenCounter()

    def reply(messages: list[Any], info: Any) -> Any:
        texts = [message_text(m) for m in messages]
        if texts and texts[0].lstrip().startswith(MERGE_FIRST_LINE):
            role = "merge"
        elif "mapreduce" in info.tools:
            role = "manager"
        else:
            role = "subagent"
        calls.add(role, counter.count("\n".join(texts)))
        return inner.function(messages, info)

    return FunctionModel(reply, model_id=inner.model_id)


def score(table_md: str, run_dir: Path, world: Any, task: Any) -> dict[str, Any]:
    """Entities found, duplicates left and item F1 of the run's table against the gold."""
    import pandas as pd

    from amapreduce.demo.discovery import fold
    from amapreduce.demo.run import score_answer

    gold = pd.read_csv(world.discovery_gold_dir / f"{TASK}.csv", dtype=str, keep_default_na=False)
    exact = {(r.City, r.Country) for r in gold.itertuples(index=False)}
    folded = {(fold(c), fold(k)): (c, k) for c, k in exact}
    table = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))["table"]
    seen: set[tuple[str, str]] = set()
    found = duplicates = unknown = 0
    for row in table["rows"]:
        key = (row["cells"]["City"]["value"], row["cells"]["Country"]["value"])
        entity = key if key in exact else folded.get((fold(key[0]), fold(key[1])))
        if entity is None:
            unknown += 1
        elif entity in seen:
            duplicates += 1
        else:
            seen.add(entity)
            found += key in exact
    metrics = score_answer(task, world.discovery_gold_dir, table_md)
    return {"found": found, "expected": len(exact), "duplicates": duplicates, "unknown": unknown,
            "item_f1": metrics["f1_by_item"], "rows": len(table["rows"])}


def run_mode(mode: str, args: argparse.Namespace, work: Path, world: Any, task: Any) -> dict[str, Any]:
    """One configuration: serve, run `ask` as a subprocess, read its run directory."""
    from amapreduce.testing.openai_server import OpenAICompatibleServer

    calls = Calls()
    env = checkout_environment(
        {k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_") and "proxy" not in k.lower()})
    env.update({"AMAPREDUCE_EXTRACTION_MODEL": "none", "AMAPREDUCE_RUNS_DIR": str(work / f"runs-{mode}"),
                "AMAPREDUCE_CACHE_DIR": str(work / "cache"), "AMAPREDUCE_MAX_BATCHES": str(args.max_batches),
                "OPENAI_API_KEY": "sk-local"})
    with OpenAICompatibleServer(recording_model(mode, calls), keep_requests=False) as server:
        command = [*amapreduce_command(), "ask", task.query, "--model", "simulated",
                   "--api-base", server.base_url, "--search", f"corpus:{world.index_dir}", "--no-memory",
                   "--workers", str(args.workers), "--json"]
        start = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, timeout=args.timeout)
        wall = time.perf_counter() - start
    if not done.stdout.strip():
        raise SystemExit(f"{mode}: ask printed nothing (exit {done.returncode}): {done.stderr[-800:]}")
    out = json.loads(done.stdout)
    run_dir = Path(out["run_dir"])
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    discovery = (result.get("discoveries") or [{}])[0]
    return {"mode": mode, "status": out["status"], "wall_s": wall, "calls": calls,
            "merge_budget": discovery.get("token_budget"), "merge_calls": discovery.get("merge_calls", 0),
            "nodes": discovery.get("nodes", []), **score(out["table_markdown"], run_dir, world, task)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default="sequential,mapreduce", help="comma-separated: sequential, mapreduce")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--max-batches", type=int, default=100, help="the plan cap (fill: 5 cities per sub-agent)")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds one run may take")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run (checks that it runs): the mapreduce mode alone, 16 workers")
    args = parser.parse_args(argv)
    if args.smoke:
        args.modes, args.workers = "mapreduce", 16
    sys.path.insert(0, str(REPO))
    from amapreduce.demo.run import load_sandbox_tasks
    from amapreduce.settings import Settings

    work = Path(tempfile.mkdtemp(prefix="bench-discovery-"))
    try:
        tasks, world = load_sandbox_tasks(Settings(cache_dir=work / "cache"))
        rows = [run_mode(mode.strip(), args, work, world, tasks[TASK]) for mode in args.modes.split(",") if mode.strip()]
    finally:
        if args.keep:
            print(f"run directories kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"Task {TASK}: {rows[0]['expected']} cities on 58 list pages (three spellings each); simulated model "
          f"(deterministic code, not an LLM) over loopback HTTP; {args.workers} workers, plan cap {args.max_batches}.")
    header = ("mode", "status", "found/expected", "dups left", "item F1", "calls (mgr/sub/merge)", "peak prompt",
              "peak manager", "merge budget", "merge nodes", "wall s")
    lines = [header]
    for r in rows:
        c: Calls = r["calls"]
        reduce_nodes = [n for n in r["nodes"] if n != "map"]
        lines.append((r["mode"], r["status"], f"{r['found']}/{r['expected']}", str(r["duplicates"] + r["unknown"]),
                      f"{r['item_f1']:.3f}", f"{c.count()} ({c.count('manager')}/{c.count('subagent')}/{c.count('merge')})",
                      str(c.peak()), str(c.peak("manager")), str(r["merge_budget"] or "-"),
                      " ".join(reduce_nodes) or "-", f"{r['wall_s']:.1f}"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))
    print("peak prompt: the largest prompt (tokens) of any single model call; peak manager: of the manager's calls. "
          "dups left: rows naming an entity another row already names, plus rows naming no gold entity.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
