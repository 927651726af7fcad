"""Pipeline benchmark: amapreduce (an `ask` session) against a plain smolagents agent, same run, same model.

Both systems answer the sandbox tasks with the same simulated model (deterministic code, not an
LLM) plus a fixed latency per model call standing in for a provider's response time, and the
same `web_search`/`crawl_page` tools over the sandbox corpus:

* **amapreduce**: the manager discovers the entities, the `mapreduce` tool fans the look-ups out
  to fresh sub-agents (`--workers` at once), the reducer builds the table in code;
* **baseline**: one smolagents `ToolCallingAgent` with the web tools and no mapreduce: the same
  discovery, then every look-up itself, one tool call per step in its own loop, and the table
  typed in its final answer.

Reported per task and in total: wall time, model calls, tokens (input + output, estimated the
same way for both) and Item F1 against the sandbox gold (exact judge), plus the ratios
baseline / amapreduce. Tokens grow with the agent's context, which is why a single agent that
carries every observation pays more per call than sub-agents that start fresh.

Run: `.venv/bin/python benchmarks/bench_pipeline.py` (`--latency-ms 20 --workers 8`, `--tasks
sbx_en_001,sbx_en_005` for a subset, `--json` for one JSON document, `--smoke` for the smallest run,
which CI runs).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from amapreduce.demo.model import SimulatedAtlasModel
from amapreduce.demo.run import demo_settings, load_sandbox_tasks, score_answer
from amapreduce.llm.factory import new_meter
from amapreduce.session import RunOptions, Session
from amapreduce.settings import Settings
from amapreduce.testing.scripted import SIMULATED_PRICES

SMOKE_TASK = "sbx_en_031"
"""The sandbox task with the fewest gold rows: `--smoke` runs it alone."""


def _measure(model: SimulatedAtlasModel, started: float) -> dict[str, Any]:
    return {
        "wall_s": time.perf_counter() - started,
        "calls": model.calls,
        "tokens": model.input_tokens + model.output_tokens,
    }


def run_amapreduce(task: Any, settings: Settings, latency_s: float) -> tuple[dict[str, Any], str]:
    """One task through an `ask` session with the simulated model."""
    model = SimulatedAtlasModel(latency_s=latency_s)
    started = time.perf_counter()
    meter = new_meter(settings, prices_by_prefix=SIMULATED_PRICES)  # the simulated model is priced at zero
    with Session(settings, RunOptions(query=task.query, inner=lambda role: model, task_id=task.instance_id,
                                      show_progress=False, meter=meter)) as session:
        outcome = session.ask()
    return _measure(model, started), outcome.markdown


def run_baseline(task: Any, settings: Settings, latency_s: float) -> tuple[dict[str, Any], str]:
    """One task through a plain `ToolCallingAgent` with the web tools and no mapreduce."""
    from smolagents import ToolCallingAgent

    from amapreduce.web.tools import build_web_tools

    model = SimulatedAtlasModel(latency_s=latency_s)
    agent = ToolCallingAgent(tools=build_web_tools(settings), model=model, max_steps=1000, verbosity_level=-1)
    started = time.perf_counter()
    answer = agent.run(task.query)
    return _measure(model, started), str(answer)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=20.0, help="fixed latency per model call")
    parser.add_argument("--workers", type=int, default=8, help="amapreduce sub-agents in flight")
    parser.add_argument("--tasks", default="", help="comma-separated sandbox task ids (default: all)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--smoke", action="store_true",
                        help=f"the smallest run: task {SMOKE_TASK}, no latency, no warm-up (checks that it runs)")
    args = parser.parse_args()
    if args.smoke:
        args.tasks, args.latency_ms = SMOKE_TASK, 0.0
    latency = args.latency_ms / 1000
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        base = Settings(cache_dir=Path(tmp) / "cache", runs_dir=Path(tmp) / "runs", workers=args.workers)
        tasks, world = load_sandbox_tasks(base)
        settings = demo_settings(base, world.index_dir)
        chosen = [t.strip() for t in args.tasks.split(",") if t.strip()] or sorted(tasks)
        rows: list[dict[str, Any]] = []
        for runner in () if args.smoke else (run_amapreduce, run_baseline):  # warm-up, not timed: imports,
            runner(tasks[chosen[0]], settings, 0.0)  # price map, caches
        for task_id in chosen:
            task = tasks[task_id]
            for system, runner in (("amapreduce", run_amapreduce), ("baseline", run_baseline)):
                figures, markdown = runner(task, settings, latency)
                figures["item_f1"] = score_answer(task, world.gold_dir, markdown)["f1_by_item"]
                rows.append({"task": task_id, "system": system, **figures})
    totals = {
        system: {k: sum(r[k] for r in rows if r["system"] == system) for k in ("wall_s", "calls", "tokens")}
        for system in ("amapreduce", "baseline")
    }
    ratios = {k: totals["baseline"][k] / max(totals["amapreduce"][k], 1e-9) for k in ("wall_s", "calls", "tokens")}
    if args.json:
        print(json.dumps({"latency_ms": args.latency_ms, "workers": args.workers, "rows": rows, "totals": totals,
                          "ratios_baseline_over_amapreduce": ratios}))
        return
    print(f"Simulated model (not an LLM), {args.latency_ms:g} ms per model call; amapreduce with {args.workers} workers")
    print(f"{'task':<11} {'system':<11} {'wall_s':>8} {'calls':>6} {'tokens':>10} {'item_f1':>8}")
    for r in rows:
        print(f"{r['task']:<11} {r['system']:<11} {r['wall_s']:>8.2f} {r['calls']:>6} {r['tokens']:>10} {r['item_f1']:>8.3f}")
    for system, t in totals.items():
        print(f"{'TOTAL':<11} {system:<11} {t['wall_s']:>8.2f} {t['calls']:>6} {t['tokens']:>10}")
    print(
        f"\nbaseline / amapreduce: wall time x{ratios['wall_s']:.2f}, model calls x{ratios['calls']:.2f}, "
        f"tokens x{ratios['tokens']:.2f}"
    )
    for task_id in dict.fromkeys(r["task"] for r in rows):
        a, b = (next(r for r in rows if r["task"] == task_id and r["system"] == s) for s in ("amapreduce", "baseline"))
        print(
            f"  {task_id}: wall x{b['wall_s'] / a['wall_s']:.2f}, calls x{b['calls'] / a['calls']:.2f}, "
            f"tokens x{b['tokens'] / a['tokens']:.2f}, item F1 {a['item_f1']:.3f} vs {b['item_f1']:.3f}"
        )


if __name__ == "__main__":
    main()
