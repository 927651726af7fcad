"""Committing what a scored run taught: the one commit path of `eval run` and of the demo.

`commit_instance` applies the memory protocol's commit (`memory.protocol.InstanceSession.commit`:
the canonical trial's record, +2/−1 credit, pruning; idempotent per record id), runs the
distillation the commit made due, and reports what changed in the shape of `memory_log.jsonl`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amapreduce.memory import DistillReport, ExperientialMemory, MemoryConfig
    from amapreduce.memory.protocol import InstanceSession, TrialOutcome
    from amapreduce.memory.update import UpdateResult

__all__ = ["commit_instance", "hint_credits", "pool_counts", "run_due_distillation", "summarize_distillation"]


def pool_counts(memory: ExperientialMemory) -> dict[str, Any]:
    """The pool's size now, as `memory_log.jsonl` reports it: records, hints and their mean w."""
    with memory.store.read() as conn:
        records = int(conn.execute("SELECT count(*) FROM records").fetchone()[0])
        row = conn.execute("SELECT count(*), avg(w) FROM hints").fetchone()
    return {"records": records, "hints": int(row[0]), "mean_w": round(float(row[1]), 3) if row[1] is not None else None}


def hint_credits(result: UpdateResult, hint_ids: Iterable[str], config: MemoryConfig) -> list[dict[str, Any]]:
    """Each hint of the prior with its w before and after the update (None: it no longer exists).

    Derived from the update itself (`UpdateResult.credited` is w after; the reward is the
    config's), so no read before the commit is needed.
    """
    reward = config.reward_pass if result.label else config.reward_fail
    out = []
    for h in dict.fromkeys(hint_ids):
        after = result.credited.get(h)
        out.append({"id": h, "w_before": None if after is None else after - reward, "w_after": after})
    return out


def commit_instance(memory: ExperientialMemory, session: InstanceSession, outcomes: list[TrialOutcome], *,
                    record_id: str) -> dict[str, Any]:
    """Commit an instance's canonical trial, run the distillation it makes due, and say what changed.

    The one commit path of `eval run` and of the demo: `session.commit` (record, +2/−1 credit,
    pruning; idempotent per `record_id`), then F_ψ when the schedule says so. Returns the
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
        if result.distill:
            log["distillation"] = run_due_distillation(memory, result.distill)
    log.update(pool_counts(memory))
    return log


def summarize_distillation(report: DistillReport) -> dict[str, int]:
    """What one distillation changed, counted: hints created, edited, agreed with, removed,
    merge batches, hints pruned, model calls made and operations rejected."""
    ops = [a["op"] for a in report.applied]
    return {"created": ops.count("ADD"), "edited": ops.count("EDIT"), "agreed": ops.count("AGREE"),
            "removed": ops.count("REMOVE"), "merged": len(report.merged), "pruned": len(report.pruned),
            "calls": len(report.calls), "rejected": len(report.rejected)}


def run_due_distillation(memory: ExperientialMemory, due: str, *, enabled: bool = True) -> dict[str, Any]:
    """Run the distillation a commit made due (`refine`, `merge` or both) and count what it changed.

    The record is already committed whatever happens here: a missing model, `enabled=False`
    (`memory learn --no-distill`) or a failing model is reported in the result, never raised.
    """
    later = "run `amapreduce memory distill` (with a memory model) to catch up"
    if not enabled:
        return {"what": due, "skipped": f"--no-distill; {later}"}
    if memory.model is None:
        return {"what": due, "skipped": f"no memory model is configured; {later}"}
    try:
        report = memory.distill(refine="refine" in due, merge="merge" in due)
    except Exception as exc:  # noqa: BLE001 - the commit is safe; the failure is reported, not raised
        return {"what": due, "failed": f"{type(exc).__name__}: {exc}"}
    return {"what": due, **summarize_distillation(report)}
