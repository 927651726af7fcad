"""Committing what a scored run taught: the one commit path of `eval run`, the demo and `memory learn`.

`commit_instance` applies the memory protocol's commit (`memory.protocol.InstanceSession.commit`:
the canonical trial's record, +2/−1 credit, pruning; idempotent per record id), runs the
distillation the commit made due, and reports what changed in the shape of `memory_log.jsonl`.

The driver's side of an evaluation lives here too: `bench.evaluate` turns every finished trial,
wherever it ran, into its journal entry (`trial_done`: the answer file written and scored by the
very code `eval score` runs), and calls `commit_trials` once per instance, in task order, in the
evaluation's own process, whatever ran the trials (threads here or Ray workers): the journaled
trials are turned back into the memory protocol's outcomes, the canonical one is committed
(`commit_instance`), and `memory_log.jsonl` is rewritten from the journal's commits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amapreduce._atomic import atomic_open, write_json_lines
from amapreduce.bench.journal import MEMORY_LOG, EvalConfig, InstanceCommitted, TrialDone

if TYPE_CHECKING:
    from amapreduce.bench.trial import TrialRun
    from amapreduce.evaluation.loaders import TaskSpec
    from amapreduce.evaluation.runner import EvalOptions
    from amapreduce.memory import DistillReport, ExperientialMemory, MemoryConfig
    from amapreduce.memory.protocol import InstanceSession, TrialOutcome
    from amapreduce.memory.update import UpdateResult

__all__ = ["commit_instance", "commit_trials", "complete_distillation", "hint_credits", "memory_size", "open_memory", "pool_counts",
           "record_id_for", "run_due_distillation", "summarize_distillation", "trial_done", "trial_outcome",
           "write_memory_log"]



def pool_counts(memory: ExperientialMemory) -> dict[str, Any]:
    """The pool's size now, as `memory_log.jsonl` reports it: records, hints and their mean w."""
    with memory.store.read() as conn:
        records = int(conn.execute("SELECT count(*) FROM records").fetchone()[0])
        row = conn.execute("SELECT count(*), avg(w) FROM hints").fetchone()
    return {"records": records, "hints": int(row[0]), "mean_w": round(float(row[1]), 3) if row[1] is not None else None}


def hint_credits(result: UpdateResult, hint_ids: Iterable[str], config: MemoryConfig) -> list[dict[str, Any]]:
    """Each hint of the prior with its w before and after the update (None: it no longer exists, or
    the update did not credit it), and `refuted` when the update refuted it (then it was pruned).

    Derived from the update itself (`UpdateResult.before` and `.credited`), so no read before the
    commit is needed; a commit logged before `before` was recorded falls back to the label's reward.
    """
    reward = config.reward_pass if result.label else config.reward_fail
    out = []
    for h in dict.fromkeys(hint_ids):
        after = result.credited.get(h)
        before = result.before.get(h, None if after is None else after - reward)
        out.append({"id": h, "w_before": before, "w_after": after, **({"refuted": True} if h in result.refuted else {})})
    return out


def commit_instance(memory: ExperientialMemory, session: InstanceSession, outcomes: list[TrialOutcome], *,
                    record_id: str) -> dict[str, Any]:
    """Commit an instance's canonical trial, run the distillation it makes due, and say what changed.

    The one commit path of `eval run` and of the demo: `session.commit` (record, +2/−1 credit,
    pruning; idempotent per `record_id`), then F_ψ when the schedule says so. Resumable at any
    instant: a commit replayed after a crash reports what the first one did (`UpdateResult.replayed`)
    and completes its pending distillation (`complete_distillation`), so the log line is the same. Returns the
    `memory_log.jsonl` fields: committed, label, record_id, prior_hints (w before → after),
    pruned, distillation (created / edited / removed / merged) and the pool's size afterwards.
    """
    from amapreduce.memory.protocol import canonical_trial

    chosen = canonical_trial(outcomes)
    log: dict[str, Any] = {"committed": False}
    result = session.commit(outcomes, record_id=record_id, auto_distill=False)
    if result is None:
        log["reason"] = "every trial failed"
    elif result.skipped:
        log["reason"] = result.skipped
        log["record_id"] = result.record_id
    else:
        hint_ids = chosen.prior.hint_ids if chosen is not None and chosen.prior is not None else ()
        log.update(committed=True, label=result.label, record_id=result.record_id, pruned=list(result.pruned),
                   prior_hints=hint_credits(result, hint_ids, memory.config))
        if result.distill and result.record_id:
            log["distillation"] = complete_distillation(memory, result.record_id, result.distill,
                                                        replayed=result.replayed)
    log.update(pool_counts(memory))
    return log


def complete_distillation(memory: ExperientialMemory, record_id: str, due: str, *, replayed: bool = False,
                          enabled: bool = True) -> dict[str, Any]:
    """Run the distillation the commit of `record_id` made due, once: it is pending in the store
    until it has run (`memory.update.finish_distillation`), and a commit replayed after a crash gets
    the recorded outcome back, or runs it now when the crash came first.

    Why: the commit and its distillation are one unit of work. Killed between the two, a resumed
    evaluation used to find the record "already committed" and never distilled: its memory learned
    fewer hints than an uninterrupted run's, and every later task planned with a different prior.
    """
    from amapreduce.memory.update import distillation_done, finish_distillation

    if replayed:
        done = distillation_done(memory.store, record_id)
        if done is not None:
            return done
    outcome = run_due_distillation(memory, due, enabled=enabled, record_id=record_id)
    if "failed" in outcome or "skipped" in outcome:  # a distillation that ran recorded itself done
        finish_distillation(memory.store, record_id, outcome)
    return outcome


def summarize_distillation(report: DistillReport) -> dict[str, int]:
    """What one distillation changed, counted: hints created, edited, agreed with, removed,
    merge batches, hints pruned, model calls made and operations rejected."""
    return report.counts()


def run_due_distillation(memory: ExperientialMemory, due: str, *, enabled: bool = True,
                         record_id: str | None = None) -> dict[str, Any]:
    """Run the distillation a commit made due (`refine`, `merge` or both) and count what it changed.

    The record is already committed whatever happens here: a missing model, `enabled=False`
    (`memory learn --no-distill`) or a failing model is reported in the result, never raised.
    `record_id` (the commit's) makes a distillation that runs to its end record itself done in its
    last transaction (`memory.distill.distill`).
    """
    later = "run `amapreduce memory distill` (with a memory model) to catch up"
    if not enabled:
        return {"what": due, "skipped": f"--no-distill; {later}"}
    if memory.model is None:
        return {"what": due, "skipped": f"no memory model is configured; {later}"}
    try:
        report = memory.distill(refine="refine" in due, merge="merge" in due, record_id=record_id)
    except Exception as exc:  # noqa: BLE001 - the commit is safe; the failure is reported, not raised
        return {"what": due, "failed": f"{type(exc).__name__}: {exc}"}
    return {"what": due, **summarize_distillation(report)}


def record_id_for(config: EvalConfig, iid: str) -> str:
    """The instance's record id: the same on every resume of this evaluation, unique across evaluations."""
    return "r-" + hashlib.sha256(f"{config.eval_id}|{iid}".encode()).hexdigest()[:12]


def trial_outcome(done: TrialDone, query: str, iid: str) -> TrialOutcome:
    from amapreduce.decision.model import Decision
    from amapreduce.mapreduce.prior import Prior
    from amapreduce.memory.protocol import TrialOutcome
    from amapreduce.memory.records import DecisionSummary, TraceSummary

    prior: Prior | None = None
    if done.prior is not None:
        prior = Prior.from_json(done.prior.model_dump(), query=query, task_id=iid)
    decision = Decision.parse(done.decision) if done.decision is not None else DecisionSummary()
    failure = done.failure or (None if done.decision is not None else "no decision was executed")
    return TrialOutcome(trial=done.trial, prior=prior, decision=decision,
                        metrics={**done.metrics, "utility": done.utility},
                        trace=TraceSummary.model_validate(done.trace),
                        failure=failure, utility=done.utility)


def commit_trials(config: EvalConfig, iid: str, order: int, done: list[TrialDone], session: InstanceSession | None,
            memory: ExperientialMemory | None, query: str) -> InstanceCommitted:
    """Commit the instance's canonical trial (when learning) and describe it for `memory_log.jsonl`."""
    from amapreduce.memory.protocol import canonical_trial

    outcomes = [trial_outcome(d, query, iid) for d in done]
    chosen = canonical_trial(outcomes)
    log: dict[str, Any] = {"task_id": iid, "order": order, "chosen_trial": chosen.trial if chosen else None,
                           "utility": chosen.utility if chosen else None, "label": None, "record_id": None,
                           "prior_hints": [], "pruned": [], "distillation": None, "committed": False}
    if memory is None or session is None:
        log["reason"] = "no memory"
        return InstanceCommitted(task_id=iid, log=log)
    if not config.learn:
        session.snapshot.close()
        log["reason"] = "--no-learn"
        log.update(pool_counts(memory))
        return InstanceCommitted(task_id=iid, log=log)
    log.update(commit_instance(memory, session, outcomes, record_id=record_id_for(config, iid)))
    return InstanceCommitted(task_id=iid, log=log)


def write_memory_log(out: Path, config: EvalConfig, committed: Mapping[str, InstanceCommitted]) -> None:
    """`memory_log.jsonl`, rewritten whole from the journal's commits (so a resume never duplicates a line)."""
    order = {iid: n for n, iid in enumerate(config.task_ids)}
    lines = sorted(committed.values(), key=lambda e: order[e.task_id])
    # without a memory there is nothing to log
    write_json_lines(out / MEMORY_LOG, [entry.log for entry in lines if entry.log.get("reason") != "no memory"])


def trial_done(config: EvalConfig, out: Path, tasks: Mapping[str, TaskSpec], options: EvalOptions, iid: str,
               trial: int, run: TrialRun) -> TrialDone:
    """Write a finished trial's answer file (`out/trial{k}/<iid>.md`), score it and describe it for the journal."""
    from amapreduce.memory.labels import UtilityWeights, utility
    from amapreduce.memory.records import TraceSummary

    with atomic_open(out / f"trial{trial}" / f"{iid}.md") as handle:
        handle.write(run.answer if run.answer is not None else "")
    metrics = _score(config, out, tasks, options, iid, trial)
    spent = run.usage
    tokens = spent.total_tokens if spent is not None else 0
    weights = UtilityWeights(cost=config.cost_weight, delay=config.delay_weight)
    trace = TraceSummary.of(run.completeness, cost_usd=spent.cost_usd if spent is not None else None,
                            delay_s=round(run.wall_s, 3), tokens=tokens,
                            advice=run.prior.advice_used if run.prior is not None else None)
    return TrialDone(
        task_id=iid, trial=trial, status=run.status, failure=run.failure, metrics=metrics,
        utility=round(utility(metrics, tokens=tokens, delay_s=run.wall_s, weights=weights), 6),
        cost_usd=spent.cost_usd if spent is not None else 0.0,
        prompt_tokens=spent.input_tokens if spent is not None else 0,
        completion_tokens=spent.output_tokens if spent is not None else 0,
        model_calls=spent.requests if spent is not None else 0,
        subagents=run.subagents, wall_s=round(run.wall_s, 3),
        run_dir=_relative(run.run_dir, out), prior=run.prior,
        decision=run.decision, trace=trace.model_dump(),
    )


def _score(config: EvalConfig, out: Path, tasks: Mapping[str, TaskSpec], options: EvalOptions, iid: str,
           trial: int) -> dict[str, Any]:
    """The trial's metrics, by the very code `eval score` runs on the answer file."""
    from amapreduce.evaluation.loaders import load_predictions_dir
    from amapreduce.evaluation.runner import Trial, run_evaluation

    folder = out / f"trial{trial}"
    answers = load_predictions_dir(folder, [iid])
    report = run_evaluation(dict(tasks), [iid], [Trial(str(folder), answers)], Path(config.gold_dir), options)
    return dict(report.per_task[iid][0])


def _relative(path: str | None, out: Path) -> str | None:
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(out.resolve()))
    except ValueError:
        return path


def open_memory(config: EvalConfig, model: Any | None) -> tuple[ExperientialMemory | None, dict[str, int]]:
    """The evaluation's memory (None without one) and its size before the evaluation (`memory_size`)."""
    if config.memory_store is None:
        return None, {"records": 0, "hints": 0}
    from amapreduce.memory import ExperientialMemory, MemoryConfig

    memory = ExperientialMemory(Path(config.memory_store), config=MemoryConfig(**config.memory_config),
                                model=model, encoder=config.encoder)
    return memory, memory_size(memory)


def memory_size(memory: ExperientialMemory) -> dict[str, int]:
    """Records and hints, as `results.json`'s memory block counts them before and after."""
    counts = pool_counts(memory)
    return {"records": counts["records"], "hints": counts["hints"]}
