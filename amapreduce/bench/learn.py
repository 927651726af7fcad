"""`amapreduce memory learn RUN`: commit a finished `ask` run to the experiential memory, once.

`ask` only reads the memory (its plan stage gets the prior Δ_q); learning needs a verdict on the
answer, which `ask` does not have. This module takes that verdict afterwards and applies the same
update an evaluation applies (paper Eq. 13/22): write the record ε = (q, Θ, τ, u), credit the
hints of the prior the run was shown (+2 when it passed, −1 when it failed or, for a hint it
followed, did worse than the family's records; a hint refuted by the runs that followed it falls to
w = 0: `memory.update`), prune hints at w ≤ 0, and run the distillation when the schedule makes one due.

The verdict is either

* the user's utility U in [0, 1] (`utility=`): the record's metrics are `{"utility": U}` and its
  label comes from the `utility` pass rule (U ≥ `MemoryConfig.utility_threshold`); or
* the project's scorer (`gold=` / `tasks=`, or the bundled `sandbox` benchmark): the run's table is
  scored against the task's gold table by the very code `amapreduce eval score` runs (exact
  judge, identity alignment), and the benchmark's pass rule labels it, as `eval run` does; the
  metrics also carry the evaluation utility u = Q − λ_c·C − λ_t·D (`memory.labels.utility`).

**Once per run.** The record id is derived from the run (`run_record_id`): its folder name and
the time of its first trace event, so it survives moving the folder and tells apart two runs of
one question started in the same second (an evaluation's trials). Learning a run a second time
changes nothing and says so (`LearnOutcome.already_committed`); two learners racing on one run
are settled by the store, which never writes a record id twice (`memory.update.record_outcome`).

Only runs whose outcome is final are learned from: an `ask` run that ended `complete` or
`incomplete` and executed at least one decision. A run still going, interrupted, stopped (a
budget stop, a provider outage: resumable with `runs resume`) or failed says nothing final about
its decision, and is refused before anything is written.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from amapreduce.bench.commit import complete_distillation, hint_credits
from amapreduce.errors import RunError, UserError
from amapreduce.memory.labels import UTILITY_RULE, UtilityWeights
from amapreduce.memory.labels import utility as utility_of
from amapreduce.memory.records import Record, TraceSummary, normalise_query
from amapreduce.session.journal import RunKind
from amapreduce.session.record import RunRecord
from amapreduce.session.rundir import read_run
from amapreduce.trace import read_trace

if TYPE_CHECKING:
    from amapreduce.decision.model import Decision
    from amapreduce.mapreduce.prior import Prior
    from amapreduce.memory import MemoryConfig, MemoryStore

__all__ = ["LEARNABLE_STATES", "HintCredit", "LearnOutcome", "learn_from_run", "run_record_id"]

LEARNABLE_STATES = ("complete", "incomplete")
"""The run states whose outcome is final, so the memory may learn from it."""
_ASK_KINDS = frozenset(kind.value for kind in RunKind if kind.is_ask)
"""The run kinds with a prior and a decision to credit: `ask`, and the demo's and evaluations' runs."""


@dataclass(frozen=True, kw_only=True)
class HintCredit:
    """One hint of the run's prior and what the update did to its score w."""

    id: str
    w_before: int
    w_after: int
    """w after the credit; a hint at w ≤ 0 is then pruned (`LearnOutcome.pruned`)."""
    refuted: bool = False
    """The update refuted the hint (`MemoryConfig.refute_after`): w fell to the prune threshold."""

    def to_json(self) -> dict[str, Any]:
        """`{"id", "w_before", "w_after", "refuted"}`."""
        return {"id": self.id, "w_before": self.w_before, "w_after": self.w_after, "refuted": self.refuted}


@dataclass(frozen=True, kw_only=True)
class LearnOutcome:
    """What `learn_from_run` did to the memory."""

    run_dir: Path
    record_id: str
    already_committed: bool
    """True when the store held this run's record before: nothing was changed."""
    label: bool
    """ℓ(u) of the record (for an earlier commit: the label it was stored with)."""
    metrics: dict[str, Any]
    """The record's metrics (for an earlier commit: the stored ones)."""
    verdict: Literal["utility", "gold"]
    """How the run was judged: the user's utility, or the scorer against a gold table."""
    label_rule: str
    task_id: str | None
    query: str
    credited: tuple[HintCredit, ...] = ()
    """The prior's hints that still existed, with w before and after the credit."""
    missing_hints: tuple[str, ...] = ()
    """Hints of the prior that no longer exist (pruned or merged since the run)."""
    pruned: tuple[str, ...] = ()
    """Hints removed after the update because w ≤ 0 (the prune threshold)."""
    distillation_due: str | None = None
    """`refine`, `merge` or `refine+merge` when this record made a distillation due."""
    distillation: dict[str, Any] | None = None
    """What the due distillation did (`bench.commit.run_due_distillation`), or why it did not run
    (`{"skipped": ...}` / `{"failed": ...}`); None when none was due."""
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The `memory learn --json` object."""
        return {
            "run_dir": str(self.run_dir), "record_id": self.record_id, "already_committed": self.already_committed,
            "label": self.label, "verdict": self.verdict, "label_rule": self.label_rule, "task_id": self.task_id,
            "query": self.query, "metrics": self.metrics, "credited": [c.to_json() for c in self.credited],
            "missing_hints": list(self.missing_hints), "pruned": list(self.pruned),
            "distillation_due": self.distillation_due, "distillation": self.distillation,
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True, kw_only=True)
class _AskRun:
    """The facts of a finished `ask` run that the memory needs."""

    path: Path
    query: str
    decision: Decision
    prior: Prior | None
    task_id: str | None
    """The benchmark instance id the run recorded, if any."""
    trace: TraceSummary
    tokens: int
    delay_s: float
    record: RunRecord = field(repr=False)


def run_record_id(run_dir: Path) -> str:
    """The record id of the run in `run_dir`: `r-` + 12 hex digits of a hash of what identifies it.

    The folder name alone (a second-resolution timestamp and the question's slug) is shared by two
    runs of one question started in the same second under different runs folders, as an
    evaluation's trials are; the time of the run's first trace event (microseconds, never
    rewritten, not even by `runs resume`) tells them apart. Both move with the folder.
    """
    key = run_dir.resolve().name
    first = next(read_trace(run_dir / "trace.jsonl"), None)
    ts = first.get("ts") if first is not None else None
    if isinstance(ts, int | float):
        key += f"|{float(ts)!r}"
    return "r-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


def _refuse(run_dir: Path, why: str) -> UserError:
    return UserError(f"cannot learn from the run in {str(run_dir)!r}: {why}")


def _read_ask_run(run_dir: Path) -> _AskRun:
    """The run in `run_dir`, checked to be a finished `ask` run with an executed decision.

    Raises:
        UserError: no run there, an unreadable `result.json`, another kind of run, a run not
            finished (running, interrupted, stopped, failed) or one that executed no decision.
    """
    from amapreduce.decision.model import Decision
    from amapreduce.mapreduce.prior import Prior

    stored = read_run(run_dir.parent, str(run_dir))
    if stored.kind not in _ASK_KINDS:
        raise _refuse(run_dir, f"it is a `{stored.kind}` run; the memory learns from `ask` runs only (also those of "
                               "`demo` and `eval run`: their prior and decision are what it credits).")
    state, data = stored.state, stored.record
    if state == "running":
        raise _refuse(run_dir, "it is still running. Learn from it once it has finished.")
    if state in ("interrupted", "stopped") or data is None:
        raise _refuse(run_dir, f"it did not finish ({stored.status or state}). Finish it with "
                               f"`amapreduce runs resume {run_dir.name}`, then learn from it.")
    if state == "failed":
        raise _refuse(run_dir, f"it failed ({data.error or 'no error recorded'}); a failed run says nothing "
                               "about its decision.")
    if not data.decisions:
        raise _refuse(run_dir, "the manager executed no decision, so there is nothing to credit or record.")
    if state not in LEARNABLE_STATES:
        raise _refuse(run_dir, f"its status {data.status!r} is not a finished run's.")
    if not data.query.strip():
        raise _refuse(run_dir, "its result.json records no question (`query`).")
    try:
        decision = Decision.parse(data.decisions[0])
    except UserError as exc:
        raise _refuse(run_dir, f"its result.json holds an invalid decision: {exc}") from None
    prior: Prior | None = None
    if data.prior is not None:
        try:
            prior = Prior.from_json(data.prior.model_dump(mode="json"), query=data.query, task_id=data.task_id)
        except ValueError as exc:
            raise _refuse(run_dir, f"its result.json's prior has {exc}.") from None
    total = data.usage.total
    delay = data.timings.wall_s
    tokens = total.prompt_tokens + total.completion_tokens
    trace = TraceSummary.of(data.completeness.model_dump(), cost_usd=total.cost_usd, delay_s=delay, tokens=tokens,
                            advice=prior.advice_used if prior is not None else None)
    return _AskRun(path=run_dir, query=data.query, decision=decision, prior=prior, task_id=data.task_id, trace=trace,
                   tokens=tokens, delay_s=delay, record=data)


def _run_markdown(run: _AskRun) -> str:
    """The run's answer as `ask` gave it: `table.md`, else the table recorded in `result.json`."""
    table_md = run.path / "table.md"
    if table_md.is_file():
        try:
            return table_md.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise _refuse(run.path, f"its table.md cannot be read ({exc}).") from None
    from amapreduce.table.render import to_markdown

    recorded = run.record.table
    if recorded is None:
        raise _refuse(run.path, "it has no table.md and its result.json holds no table.")
    try:
        table = recorded.to_table()
    except ValueError:  # a key column the columns lack, an unknown status: a hand-edited file
        raise _refuse(run.path, "it has no table.md and its result.json holds no readable table.") from None
    return to_markdown(table)


def _score_against_gold(run: _AskRun, *, benchmark: str, gold: Path | None, tasks: Path | None,
                        task_id: str | None, cache_dir: Path | None) -> tuple[str, dict[str, Any], list[str]]:
    """The run's table scored by `eval score`'s code; returns (task id, metrics, warnings).

    Raises:
        UserError: missing or unreadable tasks or gold files, no way to tell the task, an unknown id.
    """
    from amapreduce.evaluation.loaders import load_tasks
    from amapreduce.evaluation.runner import EvalOptions, Trial, run_evaluation

    if benchmark == "sandbox":
        from amapreduce.sandbox import sandbox_world

        world = sandbox_world(cache_dir)
        tasks, gold = tasks or world.tasks_file, gold or world.gold_dir
    if tasks is None or gold is None:
        raise UserError(f"scoring against a gold table needs --gold FILE (the task's gold CSV, or the benchmark's "
                        f"folder of <instance_id>.csv) and --tasks FILE (the {benchmark} tasks jsonl that holds the "
                        "task's evaluation spec).")
    scorer: Literal["widesearch", "deepwidesearch"] = "deepwidesearch" if benchmark == "deepwidesearch" else "widesearch"
    specs = load_tasks(tasks, scorer)
    chosen = task_id or run.task_id
    if chosen is None and gold.is_file() and gold.stem in specs:
        chosen = gold.stem
    if chosen is None:
        if len(specs) != 1:
            raise UserError(f"{tasks} holds {len(specs)} tasks and the run records none; pass --task-id ID.")
        chosen = next(iter(specs))
    if chosen not in specs:
        raise UserError(f"task {chosen!r} is not in {tasks}. Pass the --task-id of a task in that file.")
    warnings: list[str] = []
    if specs[chosen].query and normalise_query(specs[chosen].query) != normalise_query(run.query):
        warnings.append(f"the run's question differs from task {chosen}'s query; scored against that task's gold "
                        "all the same.")
    markdown = _run_markdown(run)
    options = EvalOptions(benchmark=scorer, date_cache_dir=None if cache_dir is None else cache_dir / "dates")
    with tempfile.TemporaryDirectory(prefix="amapreduce-gold-") as scratch:
        gold_dir = _gold_dir(gold, chosen, Path(scratch))
        report = run_evaluation({chosen: specs[chosen]}, [chosen], [Trial(str(run.path), {chosen: markdown})],
                                gold_dir, options)
    return chosen, dict(report.per_task[chosen][0]), warnings


def _gold_dir(gold: Path, task_id: str, scratch: Path) -> Path:
    """A folder holding `<task_id>.csv`: `gold` itself when it is a folder; for a CSV file, its own
    folder when it is so named, else a copy under that name in `scratch`."""
    if gold.is_dir():
        return gold
    if not gold.is_file():
        raise UserError(f"--gold {gold} does not exist. Pass the task's gold CSV, or a folder of <instance_id>.csv.")
    if gold.name == f"{task_id}.csv":
        return gold.parent
    shutil.copyfile(gold, scratch / f"{task_id}.csv")
    return scratch


def learn_from_run(
    run_dir: Path,
    *,
    store: Path | MemoryStore,
    utility: float | None = None,
    gold: Path | None = None,
    tasks: Path | None = None,
    task_id: str | None = None,
    benchmark: str | None = None,
    label_rule: str | None = None,
    threshold: float | None = None,
    cost_weight: float | None = None,
    delay_weight: float | None = None,
    encoder: str | None = None,
    model: Any | None = None,
    distill: bool = True,
    cache_dir: Path | None = None,
) -> LearnOutcome:
    """Commit the finished `ask` run in `run_dir` to the memory in `store`, once; see the module docstring.

    Args:
        run_dir: the run's folder.
        store: a store folder (created when missing, with `encoder`) or an open `MemoryStore`
            (left open).
        utility: the user's utility of the run, in [0, 1]; labelled by the `utility` rule.
        gold: instead of `utility`: the task's gold CSV, or a folder of `<instance_id>.csv`
            (default for `benchmark="sandbox"`: the bundled gold).
        tasks: the tasks jsonl holding the task's evaluation spec (needed with `gold`, except
            for the sandbox).
        task_id: the task to score against; default: the id the run recorded, else the gold
            file's name when it is a task id, else the only task of `tasks`.
        benchmark: `widesearch` (default), `deepwidesearch` or `sandbox` (its tasks and gold bundled);
            asks for a scored run, like `gold`.
        label_rule: the pass rule of a scored run (default: the benchmark's, as `eval run`);
            with `utility` only `utility` is accepted.
        threshold: the pass level of the `utility` rule (default 0.5).
        cost_weight: λ_c (per million tokens) of the utility u stored with a scored run
            (default: the benchmark's, as `eval run`).
        delay_weight: λ_t (per second) of that utility (default: the benchmark's).
        encoder: the encoder of a store created here (default: the memory's default).
        model: the memory model of a distillation that falls due (None: it is reported, not run).
        distill: False skips a due distillation (reported).
        cache_dir: where the sandbox index and the scorer's date cache live.

    Raises:
        UserError: the run cannot be learned from (see `LEARNABLE_STATES`), or the verdict is
            missing, doubled or invalid; nothing is written.
        RunError: the store refused the record (its metrics lack what the pass rule reads).
    """
    from amapreduce.bench.journal import BENCHMARKS, benchmark_defaults
    from amapreduce.memory import ExperientialMemory, MemoryConfig, MemoryStore

    scored = gold is not None or tasks is not None or benchmark is not None
    if utility is not None and scored:
        raise UserError("give either --utility U or --gold FILE (with --tasks/--benchmark), not both.")
    if utility is None and not scored:
        raise UserError("say how good the run was: --utility U (0 to 1), or --gold FILE --tasks TASKS.jsonl to score "
                        "its table against the task's gold table.")
    if utility is not None and (isinstance(utility, bool) or not math.isfinite(utility) or not 0.0 <= utility <= 1.0):
        raise UserError(f"--utility must be a number from 0 to 1, got {utility!r}.")
    if utility is not None and label_rule not in (None, UTILITY_RULE):
        raise UserError(f"--label-rule {label_rule} applies to scored runs; a --utility verdict is labelled by the "
                        f"`{UTILITY_RULE}` rule (set its pass level with --threshold).")
    bench = benchmark or "widesearch"
    if bench not in BENCHMARKS:
        raise UserError(f"--benchmark must be one of {', '.join(BENCHMARKS)}, got {bench!r}.")
    run = _read_ask_run(run_dir)
    record_id = run_record_id(run_dir)
    defaults = benchmark_defaults(bench)
    fields: dict[str, Any] = {} if utility is not None else dict(defaults.memory)
    fields["label_rule"] = UTILITY_RULE if utility is not None else (label_rule or fields.get("label_rule"))
    if threshold is not None:
        fields["utility_threshold"] = threshold
    try:
        config = MemoryConfig(**fields)
    except ValueError as exc:
        raise UserError(f"invalid memory option: {exc.errors()[0]['msg']}. Check --label-rule and "  # type: ignore[attr-defined]
                        "--threshold.") from None
    existing = _existing(store, record_id)
    if existing is not None:
        return _already(run, record_id, existing, config, utility is not None)
    warnings: list[str] = []
    chosen_task = task_id or run.task_id
    if utility is not None:
        metrics: dict[str, Any] = {"utility": float(utility)}
    else:
        chosen_task, metrics, warnings = _score_against_gold(run, benchmark=bench, gold=gold, tasks=tasks,
                                                             task_id=task_id, cache_dir=cache_dir)
        lambdas = UtilityWeights(cost=defaults.cost_weight if cost_weight is None else cost_weight,
                                 delay=defaults.delay_weight if delay_weight is None else delay_weight)
        metrics["utility"] = round(utility_of(metrics, tokens=run.tokens, delay_s=run.delay_s, weights=lambdas), 6)
    owned = not isinstance(store, MemoryStore)
    opened = store if isinstance(store, MemoryStore) else MemoryStore(store, encoder=encoder, create=True)
    try:
        memory = ExperientialMemory(opened, config=config, model=model)
        hint_ids = run.prior.hint_ids if run.prior is not None else ()
        result = memory.update(run.prior, query=run.query, decision=run.decision, metrics=metrics, trace=run.trace,
                               task_id=chosen_task, record_id=record_id, auto_distill=False)
        if result.replayed or result.skipped == "already committed":  # another learner committed it since the check above
            record = opened.record(record_id)
            if record is not None:
                return _already(run, record_id, record, config, utility is not None)
        if result.skipped or result.label is None:
            raise RunError(f"the memory did not record the run: {result.skipped}.")
        credited = tuple(HintCredit(id=c["id"], w_before=c["w_before"], w_after=c["w_after"],
                                    refuted=bool(c.get("refuted")))
                         for c in hint_credits(result, hint_ids, config) if c["w_after"] is not None)
        distillation = (complete_distillation(memory, result.record_id, result.distill, enabled=distill)
                        if result.distill and result.record_id else None)
    finally:
        if owned:
            opened.close()
    return LearnOutcome(
        run_dir=run_dir, record_id=record_id, already_committed=False, label=result.label, metrics=metrics,
        verdict="utility" if utility is not None else "gold", label_rule=config.label_rule, task_id=chosen_task,
        query=run.query, credited=credited, missing_hints=result.missing_hints, pruned=result.pruned,
        distillation_due=result.distill, distillation=distillation, warnings=tuple(warnings),
    )


def _existing(store: Path | MemoryStore, record_id: str) -> Record | None:
    """The store's record `record_id`, or None; a store folder that does not exist yet holds none
    (and is not created by looking: the look is read-only)."""
    from amapreduce.memory import MemoryStore
    from amapreduce.memory.schema import DB_NAME

    if isinstance(store, MemoryStore):
        return store.record(record_id)
    if not (store / DB_NAME).is_file():
        return None
    with MemoryStore(store, readonly=True) as look:
        return look.record(record_id)


def _already(run: _AskRun, record_id: str, record: Record, config: MemoryConfig, by_utility: bool) -> LearnOutcome:
    """The outcome of learning a run the store already holds: its record as stored, nothing changed."""
    return LearnOutcome(
        run_dir=run.path, record_id=record_id, already_committed=True, label=record.label,
        metrics=dict(record.metrics), verdict="utility" if by_utility else "gold", label_rule=config.label_rule,
        task_id=record.task_id, query=record.query,
    )
