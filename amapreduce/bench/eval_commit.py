"""The driver's side of an evaluation: a finished trial scored and journaled, the canonical trial of an
instance committed.

`bench.evaluate` turns every finished trial, wherever it ran, into its journal entry here
(`trial_done`: the answer file written and scored by the very code `eval score` runs), and calls
`commit_trials` once per instance, in task order, in the evaluation's own
process, whatever ran the trials (threads here or Ray workers): the journaled trials are turned
back into the memory protocol's outcomes, the canonical one is committed (`bench.commit`), and
`memory_log.jsonl` is rewritten from the journal's commits.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amapreduce._atomic import atomic_open
from amapreduce.bench.commit import commit_instance, pool_counts
from amapreduce.bench.journal import MEMORY_LOG, EvalConfig, InstanceCommitted, TrialDone

if TYPE_CHECKING:
    from amapreduce.bench.trial import TrialRun
    from amapreduce.evaluation.loaders import TaskSpec
    from amapreduce.evaluation.runner import EvalOptions
    from amapreduce.memory import ExperientialMemory
    from amapreduce.memory.protocol import InstanceSession, TrialOutcome

__all__ = ["commit_trials", "memory_size", "open_memory", "record_id_for", "trial_done", "trial_outcome",
           "write_memory_log"]


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
        prior = Prior(text=done.prior.text, hint_ids=tuple(done.prior.hint_ids),
                      record_ids=tuple(done.prior.record_ids), details={"query": query, "task_id": iid})
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
    with atomic_open(out / MEMORY_LOG) as handle:
        for entry in lines:
            if entry.log.get("reason") != "no memory":  # without a memory there is nothing to log
                handle.write(json.dumps(entry.log, ensure_ascii=False) + "\n")


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
                            delay_s=round(run.wall_s, 3))
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
