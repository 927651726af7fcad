"""Does the experiential memory learn? The sandbox benchmark with memory on vs off, and the regret of what it learns.

    python benchmarks/bench_evolution.py [--trials 2] [--limit N] [--out DIR] [--encoder hashing]
    python benchmarks/bench_evolution.py --smoke     # the smallest run, which CI runs

1. Runs `amapreduce eval run --benchmark sandbox` (the library call behind it: `run_benchmark`) twice in
   this process, on the same tasks and seeds: with a fresh memory that learns, and with `--no-memory`.
   Prints per task (means over trials): sub-agents, model calls, prompt tokens, wall time, Item F1,
   for the first and the second half of the task order, and the on/off ratios.
2. For each question family, tries every batch size of a small grid as a *fixed* decision (the
   simulated manager is handed a forced batching hint instead of the memory's prior; it follows it
   through the real `mapreduce` tool) and finds the best fixed decision by mean utility u. The
   learned decisions' regret is the utility they lose against it, in %, both measured on the
   second half of the task order (memory-on trials; a negative regret means the learned decisions
   beat every fixed size of the grid on those tasks).

What this measures: the learning machinery (records → FINCH clusters → distillation → retrieval →
prior → decision) end to end over the real pipeline, with the SIMULATED model (deterministic code,
not an LLM): its sub-agents lose rows past an output capacity, its manager explores by sample and
follows applicable hints. It says nothing about an LLM's judgment. Everything runs in process
through smolagents' agent loop; no HTTP (the simulated model is called in process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amapreduce.bench.evaluate import run_benchmark
from amapreduce.bench.journal import EvalConfig, benchmark_defaults
from amapreduce.cli.eval_options import options_for
from amapreduce.demo.benchmark import sandbox_models
from amapreduce.demo.hints import HINT_HEADER, BatchingHint, format_hint
from amapreduce.demo.model import SimulatedAtlasModel
from amapreduce.demo.run import demo_settings
from amapreduce.evaluation.loaders import load_tasks
from amapreduce.llm.factory import new_meter
from amapreduce.mapreduce.prior import Prior, PriorRequest
from amapreduce.memory.labels import UtilityWeights, utility
from amapreduce.sandbox import sandbox_families, sandbox_world
from amapreduce.session import RunOptions, Session
from amapreduce.settings import load_settings
from amapreduce.testing.scripted import SIMULATED_PRICES

GRID = (1, 2, 3, 4, 5, 6, 8, 12)
FIELDS = ("subagents", "model_calls", "prompt_tokens", "wall_s", "f1_by_item")


class ForcedBatching:
    """A prior provider that hands the manager one fixed batching hint per row shape (grid probe only)."""

    def __init__(self, rows: int) -> None:
        hints = [format_hint(BatchingHint(attributes=a, rows=rows, matrix_columns=w))
                 for w in (1, 2) for a in range(1, 8)]
        self.text = HINT_HEADER + "\n" + "\n".join(f"- {h}" for h in hints)

    def prior(self, request: PriorRequest) -> Prior:
        return Prior(text=self.text)


def _evaluate(name: str, out: Path, ids: list[str], trials: int, memory: bool, encoder: str, settings: Any,
              tasks: dict[str, Any], world: Any, options: Any) -> dict[str, Any]:
    defaults = benchmark_defaults("sandbox")
    config = EvalConfig(benchmark="sandbox", tasks_file=str(world.tasks_file), gold_dir=str(world.gold_dir),
                        task_ids=ids, trials=trials, search=f"corpus:{world.index_dir}",
                        memory_store=str(out / name / "memory") if memory else None, learn=memory,
                        encoder=encoder if memory else None, memory_config=dict(defaults.memory),
                        cost_weight=defaults.cost_weight, delay_weight=defaults.delay_weight)
    print(f"[{name}] {len(ids)} tasks x {trials} trials ...", file=sys.stderr, flush=True)
    outcome = run_benchmark(config, out=out / name, tasks=tasks, settings=settings, options=options,
                            simulated=sandbox_models())
    return outcome.results


def _per_task(results: dict[str, Any], field: str) -> list[float]:
    return [statistics.fmean(float(r[field]) for r in results["per_task"][i]) for i in results["task_order"]]


def _halves(values: list[float]) -> tuple[float, float]:
    mid = len(values) // 2
    return statistics.fmean(values[:mid]), statistics.fmean(values[mid:])


def _grid(ids: list[str], families: dict[str, str], tasks: dict[str, Any], world: Any, settings: Any,
          out: Path, sizes: tuple[int, ...] = GRID) -> dict[str, dict[int, float]]:
    """Mean utility per family and fixed batch size."""
    from amapreduce.demo.run import score_answer

    weights = UtilityWeights(cost=benchmark_defaults("sandbox").cost_weight)
    by_family: dict[str, dict[int, list[float]]] = {}
    for rows in sizes:
        print(f"[grid] batch size {rows} ...", file=sys.stderr, flush=True)
        for iid in ids:
            model = SimulatedAtlasModel()
            run_settings = settings.model_copy(update={"runs_dir": out / "grid" / f"rows{rows}"})
            options = RunOptions(query=tasks[iid].query, inner=lambda role, m=model: m,
                                 meter=new_meter(run_settings, prices_by_prefix=SIMULATED_PRICES),
                                 prior_provider=ForcedBatching(rows), task_id=iid, show_progress=False)
            with Session(run_settings, options) as session:
                outcome = session.ask()
            score = score_answer(tasks[iid], world.gold_dir, outcome.markdown)
            usage = outcome.meter.total()
            u = utility(score, tokens=usage.total_tokens, delay_s=0.0, weights=weights)
            by_family.setdefault(families[iid], {}).setdefault(rows, []).append(u)
    return {f: {k: statistics.fmean(v) for k, v in sizes.items()} for f, sizes in by_family.items()}


def main(argv: list[str] | None = None, echo: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="only the first N sandbox tasks")
    parser.add_argument("--out", type=Path, default=None, help="keep the evaluation folders here")
    parser.add_argument("--encoder", default="hashing", help="encoder of the fresh memory store")
    parser.add_argument("--no-grid", action="store_true", help="skip the fixed-decision grid and the regret")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run (checks that it runs): 2 tasks, 1 trial, a grid of one batch size")
    args = parser.parse_args(argv)
    if args.smoke:
        args.trials, args.limit = 1, 2
    if args.limit is not None and args.limit < 2:
        parser.error("--limit must be at least 2: the figures compare the first and the second half of the tasks")
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-evolution-"))
    base = load_settings(cache_dir=out / "cache")
    world = sandbox_world(base.cache_dir)
    tasks = load_tasks(world.tasks_file, "widesearch")
    families = sandbox_families(world)
    ids = list(tasks)[: args.limit] if args.limit else list(tasks)
    settings = demo_settings(base.model_copy(update={"runs_dir": out / "runs"}), world.index_dir)
    options = options_for("widesearch", None, "identity", None, settings=settings, meter=new_meter(settings))
    on = _evaluate("memory-on", out, ids, args.trials, True, args.encoder, settings, tasks, world, options)
    off = _evaluate("memory-off", out, ids, args.trials, False, args.encoder, settings, tasks, world, options)

    echo("Sandbox benchmark, simulated model (deterministic code, not an LLM), in process (no HTTP): "
         f"{len(ids)} tasks in task order, {args.trials} trials, memory on vs off.")
    echo(f"{'per task (mean of trials)':<26}{'half':>6}{'memory on':>12}{'memory off':>12}{'on/off':>9}")
    table: dict[str, Any] = {}
    for field in FIELDS:
        h_on, h_off = _halves(_per_task(on, field)), _halves(_per_task(off, field))
        table[field] = {"first": [h_on[0], h_off[0]], "second": [h_on[1], h_off[1]]}
        for label, a, b in (("first", h_on[0], h_off[0]), ("second", h_on[1], h_off[1])):
            ratio = f"{a / b:.2f}" if b else "n/a"
            echo(f"{field:<26}{label:>6}{a:>12.3f}{b:>12.3f}{ratio:>9}")
    sub_on, sub_off = table["subagents"]["second"]
    f1_on, f1_off = table["f1_by_item"]["second"]
    echo(f"second half: {100 * (1 - sub_on / sub_off):.1f} % fewer sub-agents per task with memory "
         f"(target >= 40 %), mean Item F1 {f1_on:.3f} vs {f1_off:.3f} (target: equal or better)")
    echo(f"memory: records {on['memory']['records_before']} -> {on['memory']['records_after']}, "
         f"hints {on['memory']['hints_before']} -> {on['memory']['hints_after']}")
    document: dict[str, Any] = {"tasks": len(ids), "trials": args.trials, "halves": table,
                                "memory": on["memory"], "out": str(out)}
    if not args.no_grid:
        second_half = on["task_order"][len(on["task_order"]) // 2:]
        second = set(second_half)
        grid = _grid(second_half, families, tasks, world, settings, out, GRID[:1] if args.smoke else GRID)  # the same tasks the learned decisions ran
        echo(f"{'family':<10}{'best fixed':>11}{'u best':>9}{'u learned':>11}{'regret %':>10}")
        regrets = {}
        for family, sizes in sorted(grid.items()):
            best_rows, best_u = max(sizes.items(), key=lambda kv: (kv[1], -kv[0]))
            learned = [r["utility"] for iid in on["task_order"] if families[iid] == family and iid in second
                       for r in on["per_task"][iid]]
            u_learned = statistics.fmean(learned) if learned else float("nan")
            regret = 100 * (best_u - u_learned) / best_u if learned and best_u else float("nan")
            regrets[family] = {"best_rows": best_rows, "u_best": best_u, "u_learned": u_learned, "regret_pct": regret,
                               "grid": sizes}
            echo(f"{family:<10}{best_rows:>11}{best_u:>9.3f}{u_learned:>11.3f}{regret:>10.1f}")
        document["families"] = regrets
    (out / "bench_evolution.json").write_text(json.dumps(document, indent=2, default=float))
    echo(f"evaluation folders and bench_evolution.json in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
