"""Does the experiential memory learn, and which part of it does the work? The sandbox benchmark's ablations.

    python benchmarks/bench_evolution.py [--trials 2] [--limit N] [--arms off,full] [--out DIR] [--encoder hashing]
    python benchmarks/bench_evolution.py --json     # exactly one JSON object on stdout (progress on stderr)
    python benchmarks/bench_evolution.py --smoke    # the smallest run, which CI runs
    python benchmarks/bench_evolution.py --scenario misleading   # every memory arm starts from harmful imported hints

1. Runs `amapreduce eval run --benchmark sandbox` (the library call behind it: `run_benchmark`) once per
   arm in this process, on the same tasks, in the same order (`amapreduce.sandbox.benchmark_order`:
   round-robin across the question families) with the same trials (trial k is the simulated
   model's sample k-1), each arm with a fresh memory store:
   `off` (no memory), `full` (the sandbox defaults), `random_retrieval` (random neighbours and
   hints), `no_credit` (g(u) = 0), `no_distillation` (the hint pool is never distilled),
   `credit_all` (every hint of the prior is credited, the paper's rule), `paper_credit` (the paper's
   g(u): +2 / −1 from the label alone, no relative credit, no refutation) and `prose_only` (no
   computed or typed advice: the prior is prose only). Per arm it prints the means per task over
   the **second half** of the task order: sub-agents, model calls, prompt tokens, Item F1, utility
   u, the largest regret over the families, and the final hint pool (w, support = provenance size,
   the typed advice payload).
2. For each question family, tries every batching of a grid as a *fixed* decision on the second
   half's tasks (per_atom with 1-12 rows per sub-agent; for two-column matrices also by_attr, whole
   groups or groups of 2-4): the simulated manager writes its own decision and the probe replaces
   its batching (`ForcedModel`) before the real `mapreduce` tool runs it. The best fixed choice of a
   family is the one with the highest mean utility; an arm's regret in a family is the utility its
   decisions lose against it, in % (negative: it beat every fixed choice of the grid).

`--scenario misleading` starts every memory arm from the same store holding `MISLEADING` hints,
imported the way a user imports an export (`memory import`, `amapreduce.memory.io.import_file`;
the file is kept as `OUT/misleading_hints.jsonl`): a plausible batching rule, typed like the memory's
own, with a score w it earned elsewhere and question-level provenance naming the tasks (so retrieval
offers it at once), that is wrong for this model: it puts more rows in a batch than its sub-agents
can answer. The simulated manager follows it as it follows any typed advice; only credit and pruning
can take it back soon. The table then adds `full`/`no_credit` and how many misleading payloads are left.

What this measures: the learning machinery (records → FINCH clusters → distillation → retrieval →
prior → advice → decision) end to end over the real pipeline, with the SIMULATED model
(deterministic code, not an LLM): its sub-agents lose rows past an output capacity, and with the
sandbox's trial settings (one retry, no patch round) an oversized batch ends with rows missing.
It says nothing about an LLM's judgment. Everything runs in process; no HTTP.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amapreduce._atomic import write_json, write_json_lines
from amapreduce.bench.evaluate import run_benchmark
from amapreduce.bench.journal import EvalConfig, benchmark_defaults
from amapreduce.cli.eval_options import options_for
from amapreduce.demo.benchmark import BENCHMARK_CAPACITY_CELLS, sandbox_models
from amapreduce.demo.model import SimulatedAtlasModel
from amapreduce.demo.plan import Batching, default_batching, plan_cap, with_batching
from amapreduce.demo.run import demo_settings, score_answer
from amapreduce.evaluation.loaders import load_tasks
from amapreduce.llm.factory import new_meter
from amapreduce.memory.advice import AppliesWhen, HintAdvice
from amapreduce.memory.labels import UtilityWeights, utility
from amapreduce.sandbox import benchmark_order, sandbox_families, sandbox_world
from amapreduce.session import RunOptions, Session
from amapreduce.settings import load_settings
from amapreduce.testing.scripted import SIMULATED_PRICES, Reply

ARMS: dict[str, dict[str, Any] | None] = {
    "off": None,
    "full": {},
    "random_retrieval": {"retrieval": "random"},
    "no_credit": {"reward_pass": 0, "reward_fail": 0},
    "no_distillation": {"distill_start": 10**9},
    "credit_all": {"credit_rule": "all"},
    "paper_credit": {"relative_credit": False, "refute_after": 0},
    "prose_only": {"advice": False},
}
"""Each arm's `MemoryConfig` fields over the sandbox defaults (None: no memory)."""
FIELDS = ("subagents", "model_calls", "prompt_tokens", "item_f1", "utility")
"""Per-task figures of an arm, as (JSON key); read from `results.json` (`f1_by_item` is the Item F1)."""
_SOURCE = {"item_f1": "f1_by_item"}
SCENARIOS = ("default", "misleading")

@dataclass(frozen=True)
class Misleading:
    """One hint of the misleading scenario: its text, typed advice, and the families whose task
    questions are its provenance."""

    text: str
    advice: HintAdvice
    families: tuple[str, ...]


ONE_COLUMN = ("domains", "codes", "euro", "profile", "dossier", "sizes")
TWO_COLUMN = ("cities", "ranked", "zones", "leaders", "podium")
"""The sandbox's question families by task-matrix columns (entities; entities within groups)."""
MISLEADING = (
    Misleading("When the rows ask for 3 to 6 attributes, put 8 rows in each sub-agent batch (per_atom, batch_size 8), "
               "for entities and for entities within groups alike: eight short rows fit one answer, and fewer "
               "sub-agents finish sooner.",
               HintAdvice(strategy="per_atom", batch_size=8, applies_when=AppliesWhen(cols=(4, 7), matrix_cols=(1, 2))),
               ONE_COLUMN + TWO_COLUMN),
)
"""The misleading scenario's imported hint: plausible, typed like the memory's own, and wrong for this
model on every shape it covers: its sub-agents answer 24 cells (`BENCHMARK_CAPACITY_CELLS`), and 8
rows of 4 to 7 cells are 32 to 56, so such a batch loses rows, is retried and still ends short (the
sandbox's trials have no patch round): a failed run that cost sub-agents too. It covers a range of
shapes, as a hand-written or imported rule often does, and its provenance names the tasks of every
family (the exporter saw those questions), so retrieval offers it from the first task on. The
simulated memory model rewrites rules about one row shape only, so a refinement leaves it alone, and
while its imported score outranks the memory's own hints a merge keeps it and drops theirs (a merge
batch keeps a third of its hints): credit and pruning take it back (docs/guides/benchmarks.md)."""
MISLEADING_SCORE = 20
"""Their imported score w, as a store that credited them for ten good runs elsewhere would export them."""
PER_ATOM = (1, 2, 3, 4, 5, 6, 8, 12)
BY_ATTR: tuple[int | None, ...] = (None, 2, 3, 4)
"""Group sizes of by_attr in the grid (None: whole groups), tried on two-column matrices only."""


def _label(batching: Batching) -> str:
    """`per_atom:4`, `by_attr:all`, `by_attr:2`."""
    return f"{batching.strategy}:{batching.rows if batching.rows else 'all'}"


def grid_choices(matrix_columns: int, smoke: bool = False) -> list[Batching]:
    """The fixed batchings the grid tries on a family whose matrix has `matrix_columns` columns."""
    choices = [Batching(rows=k, rationale=f"grid: {k} rows per batch") for k in PER_ATOM]
    if matrix_columns >= 2:
        choices += [Batching(strategy="by_attr", rows=k, rationale="grid: by_attr") for k in BY_ATTR]
    return choices[:1] if smoke else choices


class ForcedModel(SimulatedAtlasModel):
    """The simulated model whose manager sends its matrix decisions with one fixed batching (grid probe only).

    Per_atom rows are raised as far as the plan cap requires, as the manager's own batching is.
    """

    def __init__(self, batching: Batching) -> None:
        super().__init__(capacity_cells=BENCHMARK_CAPACITY_CELLS)  # as the benchmark's trials
        self.batching = batching

    def _drive(self, decision: dict[str, Any], texts: list[str]) -> Reply:
        if "task_matrix" not in decision or "discover" in decision:
            return super()._drive(decision, texts)
        chosen = self.batching
        if chosen.strategy == "per_atom":
            floor = default_batching(decision["task_matrix"], plan_cap(texts)).rows or 1
            chosen = Batching(rows=max(chosen.rows or 1, floor), rationale=chosen.rationale)
        return super()._drive(with_batching(decision, chosen), texts)


def _inner(model: SimulatedAtlasModel) -> Callable[[str], Any]:
    """The one simulated model for every role of a run."""
    return lambda role: model


def _commits(log: Path) -> dict[str, int]:
    """From the evaluation's memory log: committed records labelled failed, hints debited, hints pruned."""
    entries = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.is_file() else []
    debited = sum(1 for e in entries for h in e.get("prior_hints") or []
                  if h.get("w_before") is not None and h.get("w_after") is not None and h["w_after"] < h["w_before"])
    return {"negative_records": sum(1 for e in entries if e.get("label") is False), "hints_debited": debited,
            "hints_pruned": sum(len(e.get("pruned") or []) for e in entries)}


def _hint_pool(store: Path) -> list[dict[str, Any]]:
    """The store's hints, best first: text, w, support (provenance size), typed advice (None: none)."""
    from amapreduce.memory.store import MemoryStore, list_hints

    if not store.is_dir():
        return []
    memory = MemoryStore(store, readonly=True, create=False)
    try:
        with memory.read() as conn:
            hints = [dict(h) for h in list_hints(conn)]
    finally:
        memory.close()
    hints.sort(key=lambda h: (-int(h["w"]), h["seq"]))
    return [{"id": h["id"], "w": int(h["w"]), "support": int(h["support"]), "advice": h.get("advice"), "text": h["text"]}
            for h in hints]


def misleading_lines(queries_by_family: Mapping[str, list[str]]) -> list[dict[str, Any]]:
    """The misleading scenario's import file, as JSONL objects (`amapreduce.memory.io` format): a
    header, then each `MISLEADING` hint with its score, typed advice and, as provenance, the
    questions of its families' tasks."""
    lines: list[dict[str, Any]] = [{"type": "header", "format": "amapreduce-memory", "version": 1}]
    for n, hint in enumerate(MISLEADING, 1):
        lines.append({"type": "hint", "id": f"h-imported-{n}", "text": hint.text, "score": MISLEADING_SCORE,
                      "advice": hint.advice.to_json(),
                      "provenance_questions": [q for f in hint.families for q in queries_by_family.get(f, [])]})
    return lines


def seed_store(store: Path, source: Path, encoder: str) -> dict[str, int]:
    """Create the store `store` and import `source` into it, as `amapreduce memory import` does."""
    from amapreduce.memory.io import import_file
    from amapreduce.memory.store import MemoryStore

    with MemoryStore(store, encoder=encoder, create=True) as memory:
        return import_file(memory, source)


class Bench:
    """One benchmark run's shared inputs: the world, the tasks in benchmark order, the settings."""

    def __init__(self, out: Path, limit: int | None, trials: int, encoder: str, scenario: str = "default") -> None:
        base = load_settings(cache_dir=out / "cache")
        self.out, self.trials, self.encoder, self.scenario = out, trials, encoder, scenario
        self.world = sandbox_world(base.cache_dir)
        self.tasks = load_tasks(self.world.tasks_file, "widesearch")
        self.families = sandbox_families(self.world)
        order = benchmark_order(self.families)
        self.ids = order[:limit] if limit else order
        self.second = self.ids[len(self.ids) // 2:]
        self.defaults = benchmark_defaults("sandbox")
        trial_settings = base.model_copy(update={"runs_dir": out / "runs", **self.defaults.settings})
        self.settings = demo_settings(trial_settings, self.world.index_dir)
        self.weights = UtilityWeights(cost=self.defaults.cost_weight, delay=self.defaults.delay_weight)
        self.seed: Path | None = None
        if scenario == "misleading":
            queries: dict[str, list[str]] = {}
            for iid, family in self.families.items():
                queries.setdefault(family, []).append(self.tasks[iid].query)
            self.seed = out / "misleading_hints.jsonl"
            out.mkdir(parents=True, exist_ok=True)
            write_json_lines(self.seed, misleading_lines(queries))

    def arm(self, name: str, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
        """Run one arm; its second-half means per task, per-family utilities and final hint pool."""
        memory = overrides is not None
        store = self.out / name / "memory"
        seeded = seed_store(store, self.seed, self.encoder) if memory and self.seed is not None else None
        options = options_for("widesearch", None, "identity", None, settings=self.settings,
                              meter=new_meter(self.settings))
        config = EvalConfig(benchmark="sandbox", tasks_file=str(self.world.tasks_file),
                            gold_dir=str(self.world.gold_dir), task_ids=self.ids, trials=self.trials,
                            search=f"corpus:{self.world.index_dir}", memory_store=str(store) if memory else None,
                            learn=memory, encoder=self.encoder if memory else None,
                            memory_config={**self.defaults.memory, **(overrides or {})},
                            cost_weight=self.defaults.cost_weight, delay_weight=self.defaults.delay_weight)
        started = time.monotonic()
        print(f"[{name}] {len(self.ids)} tasks x {self.trials} trials ...", file=sys.stderr, flush=True)
        results = run_benchmark(config, out=self.out / name, tasks=self.tasks, settings=self.settings,
                                options=options, simulated=sandbox_models()).results
        per_task = results["per_task"]

        def mean(iid: str, field: str) -> float:
            return statistics.fmean(float(r[_SOURCE.get(field, field)]) for r in per_task[iid])

        figures: dict[str, Any] = {f: statistics.fmean(mean(i, f) for i in self.second) for f in FIELDS}
        figures["first_half"] = {f: statistics.fmean(mean(i, f) for i in self.ids[: len(self.ids) // 2])
                                 for f in FIELDS}
        by_family: dict[str, list[float]] = {}
        for iid in self.second:
            by_family.setdefault(self.families[iid], []).extend(float(r["utility"]) for r in per_task[iid])
        figures["family_utility"] = {f: statistics.fmean(v) for f, v in sorted(by_family.items())}
        figures["memory"] = {k: results["memory"][k] for k in ("records_before", "records_after", "hints_before",
                                                               "hints_after")}
        figures["failed_trials"] = sum(1 for rows in per_task.values() for r in rows if float(r.get("score", 1.0)) < 1.0)
        figures.update(_commits(self.out / name / "memory_log.jsonl"))
        figures["hints"] = _hint_pool(store) if memory else []
        if seeded is not None:  # `left`: hints whose payload is still a misleading one (a merge re-ids a hint)
            payloads = [json.loads(json.dumps(m.advice.to_json())) for m in MISLEADING]
            figures["imported_hints"] = {"imported": seeded["hints"],
                                         "left": sum(1 for h in figures["hints"] if h["advice"] in payloads)}
        figures["wall_s"] = round(time.monotonic() - started, 1)
        return figures

    def grid(self, smoke: bool) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
        """Mean utility per family and fixed batching, on the second half's tasks (sample 0, one run each);
        and the sub-agents per task of each family's best fixed batching (the grid's oracle)."""
        from amapreduce.demo.plan import parse_intent

        runs: dict[str, dict[str, list[tuple[float, int]]]] = {}
        for iid in self.second:
            intent = parse_intent(self.tasks[iid].query)
            width = 2 if intent is not None and intent.kind in ("ranked", "top_cities") else 1
            for batching in grid_choices(width, smoke):
                model = ForcedModel(batching)
                settings = self.settings.model_copy(update={"runs_dir": self.out / "grid" / _label(batching).replace(":", "-")})
                options = RunOptions(query=self.tasks[iid].query, inner=_inner(model),
                                     meter=new_meter(settings, prices_by_prefix=SIMULATED_PRICES), task_id=iid,
                                     show_progress=False)
                with Session(settings, options) as session:
                    outcome = session.ask()
                score = score_answer(self.tasks[iid], self.world.gold_dir, outcome.markdown)
                u = utility(score, tokens=outcome.meter.total().total_tokens, delay_s=0.0, weights=self.weights)
                subagents = outcome.record.completeness.attempts
                runs.setdefault(self.families[iid], {}).setdefault(_label(batching), []).append((u, subagents))
            print(f"[grid] {iid} done", file=sys.stderr, flush=True)
        grid = {f: {k: statistics.fmean(u for u, _ in v) for k, v in choices.items()} for f, choices in sorted(runs.items())}
        oracle = {f: statistics.fmean(n for _, n in runs[f][max(choices, key=lambda k: choices[k])])
                  for f, choices in grid.items()}
        return grid, oracle


def regrets(grid: dict[str, dict[str, float]], family_utility: dict[str, float]) -> dict[str, float]:
    """Regret in % per family: (u of the best fixed choice − the arm's mean u) / u of the best."""
    out = {}
    for family, choices in grid.items():
        best = max(choices.values())
        if family in family_utility and best:
            out[family] = 100 * (best - family_utility[family]) / abs(best)
    return out


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _num(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _table(arms: dict[str, dict[str, Any]], echo: Callable[[str], None]) -> None:
    names = list(arms)
    echo(f"{'second half, per task':<22}" + "".join(f"{n:>17}" for n in names))
    for field in (*FIELDS, "regret_max"):
        echo(f"{field:<22}" + "".join(f"{_num(arms[n].get(field)):>17.3f}" for n in names))
    for field in ("failed_trials", "negative_records", "hints_debited", "hints_pruned"):  # all tasks, all trials
        echo(f"{field + ' (all)':<22}" + "".join(f"{arms[n].get(field, 0):>17}" for n in names))
    if "off" in arms and "full" in arms:
        off, full = arms["off"], arms["full"]
        echo(f"full/off sub-agents: {full['subagents'] / off['subagents']:.2f} (target <= 0.5), "
             f"Item F1 {full['item_f1']:.3f} vs off {off['item_f1']:.3f} (target: equal or better)")
        for name in names:
            if name not in ("off", "full"):
                a = arms[name]
                echo(f"{name} vs full: sub-agents {100 * (a['subagents'] / full['subagents'] - 1):+.1f} %, "
                     f"utility {100 * (a['utility'] / full['utility'] - 1):+.1f} %, Item F1 {a['item_f1'] - full['item_f1']:+.3f}")
    if "full" in arms and "no_credit" in arms and "imported_hints" in arms["full"]:
        full, still = arms["full"], arms["no_credit"]
        echo(f"full/no_credit sub-agents: {full['subagents'] / still['subagents']:.2f} (target <= 0.8), Item F1 "
             f"{full['item_f1']:.3f} vs no_credit {still['item_f1']:.3f} (target: equal or better); full debited "
             f"{full['hints_debited']} and pruned {full['hints_pruned']} hints (target: >= 1 each)")
    for name in names:
        if "imported_hints" in arms[name]:
            seeded = arms[name]["imported_hints"]
            echo(f"{name}: {seeded['left']} of the {seeded['imported']} misleading payloads left in the final pool")
    for name in names:
        pool = arms[name].get("hints") or []
        if pool:
            echo(f"hint pool of {name} ({len(pool)} hints; w, support, advice):")
            for hint in pool:
                echo(f"  w={hint['w']:>3} support={hint['support']:>3} advice={json.dumps(hint['advice'])} "
                     f"| {hint['text'][:110]}")


def main(argv: list[str] | None = None, echo: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--scenario", choices=SCENARIOS, default="default",
                        help="misleading: every memory arm starts from imported harmful hints (see the docstring)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks of the benchmark order")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms (default: all of {', '.join(ARMS)})")
    parser.add_argument("--out", type=Path, default=None, help="keep the evaluation folders here")
    parser.add_argument("--encoder", default="hashing", help="encoder of the fresh memory stores")
    parser.add_argument("--no-grid", action="store_true", help="skip the fixed-decision grid and the regret")
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout (the table on stderr)")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run (checks that it runs): 2 tasks, 1 trial, a grid of one batching")
    args = parser.parse_args(argv)
    if args.smoke:
        args.trials, args.limit = 1, 2
    if args.limit is not None and args.limit < 2:
        parser.error("--limit must be at least 2: the figures are the second half of the task order")
    chosen = [a.strip() for a in args.arms.split(",") if a.strip()]
    if unknown := [a for a in chosen if a not in ARMS]:
        parser.error(f"unknown arms {unknown}; choose from {', '.join(ARMS)}")
    if args.json:
        echo = _stderr  # the table goes to stderr, stdout holds the one JSON object
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-evolution-"))
    started = time.monotonic()
    bench = Bench(out, args.limit, args.trials, args.encoder, args.scenario)
    arms = {name: bench.arm(name, ARMS[name]) for name in chosen}
    grid, oracle = ({}, {}) if args.no_grid else bench.grid(args.smoke)
    for figures in arms.values():
        figures["regret"] = regrets(grid, figures["family_utility"])
        figures["regret_max"] = max(figures["regret"].values(), default=None)  # None: no grid
    echo(f"Sandbox benchmark, {args.scenario} scenario, simulated model (deterministic code, not an LLM), in process "
         f"(no HTTP): {len(bench.ids)} tasks in benchmark order, {args.trials} trials, second half = {len(bench.second)} tasks.")
    _table(arms, echo)
    if grid:
        echo(f"{'family':<10}{'best fixed':>14}{'u best':>9}" + "".join(f"{n[:12]:>13}" for n in arms))
        for family, choices in grid.items():
            best = max(choices, key=lambda k: choices[k])
            echo(f"{family:<10}{best:>14}{choices[best]:>9.3f}"
                 + "".join(f"{arms[n]['regret'].get(family, float('nan')):>12.1f}%" for n in arms))
    if oracle:
        counts = [bench.families[i] for i in bench.second]
        fewest = statistics.fmean(oracle[f] for f in counts)
        off = f" = {fewest / arms['off']['subagents']:.2f} x off" if "off" in arms else ""
        echo(f"the best fixed choice of every family (the grid's oracle): {fewest:.3f} sub-agents per task{off}")
    wall = round(time.monotonic() - started, 1)
    document = {"scenario": args.scenario, "arms": arms, "grid": grid, "oracle_subagents": oracle, "tasks": len(bench.ids), "second_half": bench.second,
                "trials": args.trials, "wall_s": wall, "out": str(out)}
    write_json(out / "bench_evolution.json", document, indent=2)
    echo(f"{wall:.0f} s; evaluation folders and bench_evolution.json in {out}")
    if args.json:  # the one object checks read; the grid and the rest are in bench_evolution.json
        print(json.dumps({"arms": arms}, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
