"""Estimate before spending: what a decision's fan-out will cost, from its batch plan and the
per-call figures of the user's own past runs.

For a batch plan of B batches over R rows, run with W workers:

* model calls = B × c, with c the sub-agent calls per batch (retries and patch rounds included);
* prompt tokens = B × p(s), with s the plan's rows per batch and p(s) the median over past runs of
  their prompt tokens per batch, each scaled from its own batch size to s with half the tokens
  taken to grow with the rows (`ROW_SHARE`);
* completion tokens = R × o, with o the completion tokens per row (R: the task-matrix rows, the
  sub-questions; the rows an answer holds are not known beforehand);
* cost = the price map's price of the sub-agent model for those tokens ("unpriced" when unknown);
* wall time = ⌈B / W⌉ waves × c calls × the seconds per call: the median call for the low end,
  the 90th percentile for the high end. Under `--workers auto` (the default for an `--api-base`
  endpoint) W is the server's slots where it reports them; where it does not, the run adapts W between
  its start (`AUTO_START_WORKERS`) and its most (`AUTO_MAX_WORKERS`), so the low end takes the most
  and the high end the start.

Calls and tokens get a range too: the point estimate ∓ the run-to-run spread of the figures (half
their interquartile range over the median, at least `MIN_SPREAD`). The past runs are the newest
`MAX_RUNS` run folders in the runs directory whose sub-agents made calls, preferring those of the
same sub-agent model and, of those, the runs whose sub-questions were worded like the plan's
(`similar_templates`); with none, documented defaults (`DEFAULTS`), and the estimate says so.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amapreduce.errors import EstimateOverBudget, UserError
from amapreduce.llm.meter import PriceTable
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.batching import BatchPlan
from amapreduce.session.record import RunRecord
from amapreduce.trace import read_trace

if TYPE_CHECKING:
    from amapreduce.decision.model import Decision
    from amapreduce.llm.factory import RoleModels
    from amapreduce.mapreduce.engine import EngineConfig
    from amapreduce.settings import Settings

__all__ = ["DEFAULTS", "DecisionPlan", "Estimate", "PastRun", "Profile", "check_budget", "estimate_for", "estimate_plan",
           "past_runs", "plan_decision", "profile_of", "read_past_run", "similar_templates"]

MAX_RUNS = 50
"""Past runs read for an estimate, newest first."""
MIN_SPREAD = 0.2
"""The least relative spread of an estimated figure (±20 %)."""
SIMILAR = 0.5
"""Template similarity (Jaccard of words) at which a past run counts as of a similar shape."""
MIN_SIMILAR = 3
"""Past runs of a similar shape needed to estimate from them alone."""
ROW_SHARE = 0.5
"""The share of a batch's prompt tokens taken to grow with its rows (the rest: system prompt, instructions)."""


@dataclass(frozen=True)
class PastRun:
    """What one past run's fan-out cost: batches, rows, sub-agent calls and tokens, call times."""

    model_id: str | None
    batches: int
    """Batches run, retries' and patch rounds' included."""
    rows: int
    """Task-matrix rows of the decisions run (the sub-questions)."""
    calls: int
    prompt_tokens: int
    completion_tokens: int
    call_seconds: tuple[float, ...]
    template: str = ""
    """The template of the run's (first) decision: what its sub-questions asked, to find runs of a similar shape."""
    cached_tokens: int = 0
    """Prompt tokens the provider served from its prefix cache (priced at its cached rate)."""


@dataclass(frozen=True)
class Profile:
    """Per-batch figures an estimate multiplies out (see the module docstring)."""

    calls_per_batch: float
    prompt_per_batch: tuple[tuple[float, float], ...]
    """(prompt tokens per batch, rows per batch) of each past run: scaled to a plan's batch size, their median."""
    completion_per_row: float
    call_s_median: float
    call_s_p90: float
    spread: float
    """Relative spread of calls and tokens (± this share)."""
    source: str
    """Where the figures come from: `N past runs (...)` or `defaults`."""
    cached_share: float = 0.0
    """The share of prompt tokens the provider served from its prefix cache in those runs (median)."""

    def prompt_tokens_per_batch(self, rows_per_batch: float) -> float:
        """Prompt tokens of a batch of `rows_per_batch` rows: each past run's figure with its
        `ROW_SHARE` scaled from its batch size to this one, then the median (an odd run, a nested
        decision or a huge page, moves it little)."""
        return statistics.median(tokens * ((1 - ROW_SHARE) + ROW_SHARE * rows_per_batch / size)
                                 for tokens, size in self.prompt_per_batch)


DEFAULTS = Profile(calls_per_batch=3.0, prompt_per_batch=((4500.0, 1.0),), completion_per_row=60.0,
                   call_s_median=3.0, call_s_p90=10.0, spread=0.5, source="defaults (no past run with sub-agent calls)")
"""Without past runs: a sub-agent searches, reads a page and answers (3 calls a batch); 4,500 prompt
tokens for a batch of one row (a system prompt and instructions of about 3,000, the pages read), half
of it growing with the rows; 60 completion tokens per row; a hosted model's 3 s median and 10 s slow call."""


@dataclass(frozen=True)
class Estimate:
    """What a batch plan is expected to cost, low to high."""

    batches: int
    rows: int
    workers: int
    """Sub-agents in flight (under an adapted `--workers auto`, the most: the low end's)."""
    calls: tuple[int, int]
    prompt_tokens: tuple[int, int]
    completion_tokens: tuple[int, int]
    cost_usd: tuple[float, float] | None
    """None: the sub-agent model has no known price ("unpriced")."""
    wall_s: tuple[float, float]
    model_id: str | None
    source: str
    cached_tokens: tuple[int, int] = (0, 0)
    """Of `prompt_tokens`, those expected from the provider's prefix cache (the past runs' share),
    priced at the model's cached-input rate in `cost_usd`."""
    workers_start: int | None = None
    """Under `--workers auto` on a server that reports no slots, where the adapted number starts (the
    high end's); None: `workers` throughout (a fixed number, or the server's slots)."""

    def to_json(self) -> dict[str, Any]:
        """The `--estimate --json` object."""
        def span(pair: tuple[float, float] | tuple[int, int] | None) -> dict[str, float] | None:
            return None if pair is None else {"low": pair[0], "high": pair[1]}

        return {"batches": self.batches, "rows": self.rows, "workers": self.workers,
                "workers_start": self.workers_start, "model": self.model_id,
                "calls": span(self.calls), "prompt_tokens": span(self.prompt_tokens),
                "completion_tokens": span(self.completion_tokens), "cached_tokens": span(self.cached_tokens),
                "cost_usd": span(self.cost_usd),
                "wall_s": span(self.wall_s), "source": self.source}

    def lines(self) -> list[str]:
        """The estimate as a few lines for people."""
        cost = ("unpriced (no price for this model)" if self.cost_usd is None
                else f"${self.cost_usd[0]:.4f} - ${self.cost_usd[1]:.4f}")
        workers = (f"{self.workers} worker{'s' if self.workers != 1 else ''}" if self.workers_start is None
                   else f"auto workers ({self.workers_start} - {self.workers})")
        return [
            f"estimate for {self.batches} batches over {self.rows} rows with {workers} "
            f"(from {self.source}):",
            f"  model calls {self.calls[0]:,} - {self.calls[1]:,}; prompt tokens {self.prompt_tokens[0]:,} - "
            f"{self.prompt_tokens[1]:,}" + (f" (cached {self.cached_tokens[0]:,} - {self.cached_tokens[1]:,})"
                                            if self.cached_tokens[1] else "")
            + f"; completion tokens {self.completion_tokens[0]:,} - {self.completion_tokens[1]:,}",
            f"  cost {cost}; wall time {self.wall_s[0]:.0f} - {self.wall_s[1]:.0f} s",
        ]


def read_past_run(folder: Path) -> PastRun | None:
    """The fan-out figures of one run folder; None when it made no sub-agent call or cannot be read."""
    try:
        record = RunRecord.read(folder)
    except UserError:  # an unfinished or unreadable folder is no past run to learn from (`runs list` reports it)
        return None
    decisions = record.executed
    batches, rows = record.completeness.batches, _matrix_rows(decisions)
    seconds: list[float] = []
    usage, model_ids = Usage(), set()
    for event in read_trace(folder / "trace.jsonl", event="model_call"):
        if event.get("role") != "subagent" or event.get("error"):
            continue
        usage = usage + Usage.from_json(event.get("usage") or {})
        if isinstance(event.get("latency_s"), int | float):
            seconds.append(float(event["latency_s"]))
        if event.get("model_id"):
            model_ids.add(str(event["model_id"]))
    if batches <= 0 or rows <= 0 or usage.requests <= 0:
        return None
    first = decisions[0] if decisions else {}
    return PastRun(model_id=next(iter(model_ids)) if len(model_ids) == 1 else None, batches=batches, rows=rows,
                   calls=usage.requests, prompt_tokens=usage.input_tokens, completion_tokens=usage.output_tokens,
                   call_seconds=tuple(seconds), template=str(first.get("template") or ""),
                   cached_tokens=min(usage.cached_tokens, usage.input_tokens))


def _matrix_rows(decisions: list[dict[str, Any]]) -> int:
    """The sub-questions the run's recorded decisions asked (their task-matrix rows): what an
    estimate knows of a plan beforehand, unlike the rows the answers held."""
    return sum(len(d.get("task_matrix") or []) for d in decisions)


def past_runs(runs_dir: Path, *, limit: int = MAX_RUNS, excluding: Iterable[str] = ()) -> list[PastRun]:
    """The newest `limit` runs under `runs_dir` whose sub-agents made calls (folders named in
    `excluding` left out: a run estimated against the others)."""
    if not runs_dir.is_dir():
        return []
    skip = set(excluding)
    found: list[PastRun] = []
    for folder in sorted((p for p in runs_dir.iterdir() if p.is_dir() and p.name not in skip), reverse=True):
        run = read_past_run(folder)
        if run is not None:
            found.append(run)
            if len(found) >= limit:
                break
    return found


def _spread(values: Sequence[float]) -> float:
    """Half the interquartile range relative to the median, at least `MIN_SPREAD`."""
    if len(values) < 4 or statistics.median(values) <= 0:
        return MIN_SPREAD
    q1, _, q3 = statistics.quantiles(values, n=4)
    return max(MIN_SPREAD, (q3 - q1) / 2 / statistics.median(values))


def _words(template: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z]+", re.sub(r"__\d+__", " ", template.casefold())))


def similar_templates(runs: Sequence[PastRun], template: str) -> list[PastRun]:
    """The runs whose sub-questions were worded like `template` (the Jaccard similarity of their
    words, placeholders aside, at least `SIMILAR`), when there are `MIN_SIMILAR` of them; else all
    of `runs`. A sub-question that ranks or lists reads far more than one that looks a value up."""
    words = _words(template)
    close = [r for r in runs if words and len(words & (w := _words(r.template))) / len(words | w) >= SIMILAR]
    return close if len(close) >= MIN_SIMILAR else list(runs)


def profile_of(runs: Sequence[PastRun], *, model_id: str | None = None, template: str | None = None) -> Profile:
    """The per-batch figures of `runs` (those of `model_id` when any are; of those, the ones worded
    like `template` when there are enough: `similar_templates`), or `DEFAULTS` without runs: medians,
    so that one odd run moves them little."""
    same = [r for r in runs if model_id is not None and r.model_id == model_id]
    chosen = same or list(runs)
    if not chosen:
        return DEFAULTS
    alike = similar_templates(chosen, template) if template else chosen
    shaped = len(alike) < len(chosen)
    chosen = alike
    seconds = sorted(s for r in chosen for s in r.call_seconds)
    median = statistics.median(seconds) if seconds else DEFAULTS.call_s_median
    p90 = seconds[min(len(seconds) - 1, math.ceil(0.9 * len(seconds)) - 1)] if seconds else DEFAULTS.call_s_p90
    calls = [r.calls / r.batches for r in chosen]
    per_row = [r.prompt_tokens / r.rows for r in chosen]
    which = (f"model {model_id}" if same else "all models") + (", sub-questions worded alike" if shaped else "")
    return Profile(
        calls_per_batch=statistics.median(calls),
        prompt_per_batch=tuple((r.prompt_tokens / r.batches, r.rows / r.batches) for r in chosen),
        completion_per_row=statistics.median(r.completion_tokens / r.rows for r in chosen),
        call_s_median=median, call_s_p90=max(p90, median), spread=max(_spread(calls), _spread(per_row)),
        source=f"{len(chosen)} past run{'s' if len(chosen) != 1 else ''} ({which})",
        cached_share=statistics.median(r.cached_tokens / r.prompt_tokens if r.prompt_tokens else 0.0 for r in chosen),
    )


def estimate_plan(plan: BatchPlan, *, workers: int, profile: Profile, model_id: str | None = None,
                  prices: PriceTable | None = None, workers_start: int | None = None) -> Estimate:
    """What `plan` is expected to cost with `workers` sub-agents in flight (see the module docstring);
    `workers_start`: an adapted number's start, below `workers` (the high end's wall time)."""
    if workers_start is not None and not 1 <= workers_start <= workers:
        raise ValueError(f"workers_start must be between 1 and workers ({workers}), got {workers_start}")
    batches = len(plan.batches)
    rows = sum(b.size for b in plan.batches)
    size = rows / batches if batches else 0.0
    calls = batches * profile.calls_per_batch
    prompt = batches * profile.prompt_tokens_per_batch(size) if batches else 0.0
    completion = rows * profile.completion_per_row
    low, high = 1 - profile.spread, 1 + profile.spread

    def span(value: float) -> tuple[int, int]:
        return max(0, math.floor(value * low)), math.ceil(value * high)

    cost: tuple[float, float] | None = None
    price = prices.price(model_id) if prices is not None and model_id else None
    share = min(max(profile.cached_share, 0.0), 1.0)
    if price is not None:
        (prompt_low, prompt_high), (completion_low, completion_high) = span(prompt), span(completion)
        cached_rate = price.cached_input if price.cached_input is not None else price.input
        per_prompt = price.input * (1 - share) + cached_rate * share  # a cached prompt token at the cached rate
        cost = (per_prompt * prompt_low + price.output * completion_low,
                per_prompt * prompt_high + price.output * completion_high)
    waves = math.ceil(batches / max(workers, 1))
    slow_waves = math.ceil(batches / workers_start) if workers_start is not None else waves
    return Estimate(batches=batches, rows=rows, workers=workers, calls=span(calls), prompt_tokens=span(prompt),
                    completion_tokens=span(completion), cost_usd=cost,
                    wall_s=(waves * profile.calls_per_batch * profile.call_s_median,
                            slow_waves * profile.calls_per_batch * profile.call_s_p90),
                    model_id=model_id, source=profile.source,
                    cached_tokens=(math.floor(span(prompt)[0] * share), math.ceil(span(prompt)[1] * share)),
                    workers_start=workers_start)


def estimate_for(settings: Settings, plan: BatchPlan, template: str, *, prices: PriceTable | None = None,
                 roles: RoleModels | None = None, engine: EngineConfig | None = None) -> Estimate:
    """What running `plan` (of a decision whose sub-questions read `template`) would cost with the
    settings' sub-agent model and workers, from the past runs in `settings.runs_dir` (`prices`:
    the run's price map, default the settings'; `roles`: the run's role models, resolved once by its
    `ModelFactory`, default read from the settings; `engine`: the run's engine limits, its workers
    fitted to the server's reported slots, default the settings' with no slots known)."""
    from amapreduce.llm.factory import RoleModels, new_meter
    from amapreduce.mapreduce.concurrency import AUTO_START_WORKERS
    from amapreduce.mapreduce.engine import EngineConfig

    model_id = (roles if roles is not None else RoleModels.of(settings)).get("subagent")
    profile = profile_of(past_runs(settings.runs_dir), model_id=model_id, template=template)
    config = engine if engine is not None else EngineConfig.from_settings(settings, decisions_by="user")
    return estimate_plan(plan, workers=config.workers, profile=profile, model_id=model_id,
                         prices=prices if prices is not None else new_meter(settings).prices,
                         workers_start=min(AUTO_START_WORKERS, config.workers) if config.adaptive else None)


def check_budget(estimate: Estimate, max_cost_usd: float | None, *, spent_usd: float = 0.0) -> None:
    """Refuse a fan-out whose estimate's low end (plus `spent_usd`, what the run spent already)
    costs more than `max_cost_usd`. An unpriced model, or no budget, is never refused: its cost is unknown.

    Raises:
        EstimateOverBudget: with the estimate's range, the spend so far and the budget in its message.
    """
    if estimate.cost_usd is None or max_cost_usd is None or spent_usd + estimate.cost_usd[0] <= max_cost_usd:
        return
    low, high = estimate.cost_usd
    before = f" on top of the ${spent_usd:.4f} the run has spent" if spent_usd > 0 else ""
    raise EstimateOverBudget(
        f"the fan-out would cost ${low:.4f} - ${high:.4f}{before} ({estimate.batches:,} batches, "
        f"{estimate.calls[0]:,} - {estimate.calls[1]:,} model calls, from {estimate.source}), over the budget of "
        f"${max_cost_usd:.4f}: nothing was run. Raise --max-cost (AMAPREDUCE_MAX_COST_USD), or see the estimate "
        "with --estimate.", low_usd=low, high_usd=high, spent_usd=spent_usd, max_cost_usd=max_cost_usd)


@dataclass(frozen=True)
class DecisionPlan:
    """What `mapreduce plan` shows of a decision: its batch plan (for a discovery, its map's), the
    first sub-question, and, when asked, the estimate."""

    stage: str
    """`fill`, or `discover` (the fill is planned once discovery has found its entities)."""
    plan: BatchPlan
    first: str
    columns: list[str]
    keys: list[str]
    note: str
    estimate: Estimate | None

    def to_json(self) -> dict[str, Any]:
        """The `mapreduce plan --json` object: the batch plan, `stage`, and `note`, `estimate` when there are."""
        return {**self.plan.to_json(), "stage": self.stage, **({"note": self.note} if self.note else {}),
                **({"estimate": self.estimate.to_json()} if self.estimate is not None else {})}


def plan_decision(decision: Decision, settings: Settings, *, estimate: bool = False) -> DecisionPlan:
    """`decision`'s batch plan under the user's cap (`Settings.batch_cap`), with its estimate when asked.

    Raises:
        DecisionError: the plan is larger than the cap.
    """
    from amapreduce.mapreduce.batching import plan_batches

    cap = settings.batch_cap("user")
    if decision.discover is not None:
        from amapreduce.mapreduce.discover import discovery_decision

        mapped = discovery_decision(decision.discover)
        stage, batch_plan = "discover", plan_batches(mapped, max_batches=cap)
        first, columns, keys = mapped.task_text(0), mapped.columns, mapped.resolved_key_columns
        note = "The fill stage is planned once discovery has found its entities."
    else:
        stage, batch_plan = "fill", plan_batches(decision, max_batches=cap)
        first, columns, keys = decision.task_text(0), decision.columns, decision.resolved_key_columns
        child = decision.child
        note = (f"Each task runs the child decision {repr(child) if isinstance(child, str) else '(inline)'}."
                if child is not None else "")
    forecast = estimate_for(settings, batch_plan, decision.template) if estimate else None
    if forecast is not None and decision.child is not None:
        note = (note + " " if note else "") + "The estimate covers this decision's own batches, not its children's."
    return DecisionPlan(stage=stage, plan=batch_plan, first=first, columns=list(columns), keys=list(keys), note=note,
                        estimate=forecast)
