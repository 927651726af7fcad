"""Committing what a scored run taught: the one commit path of `eval run` and of the demo.

`commit_instance` applies the memory protocol's commit (`memory.protocol.InstanceSession.commit`:
the canonical trial's record, +2/−1 credit, pruning; idempotent per record id), runs the
distillation the commit made due, and reports what changed in the shape of `memory_log.jsonl`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amapreduce.memory import DistillReport, ExperientialMemory
    from amapreduce.memory.protocol import InstanceSession, TrialOutcome

__all__ = ["commit_instance", "pool_counts", "pool_counts_log", "summarize_distillation"]


def pool_counts(memory: ExperientialMemory) -> dict[str, int]:
    """Records and hints in the memory now."""
    with memory.store.read() as conn:
        records = int(conn.execute("SELECT count(*) FROM records").fetchone()[0])
        hints = int(conn.execute("SELECT count(*) FROM hints").fetchone()[0])
    return {"records": records, "hints": hints}


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
    hint_ids = list(chosen.prior.hint_ids) if chosen is not None and chosen.prior is not None else []
    before = _hint_scores(memory, hint_ids)
    result = session.commit(outcomes, record_id=record_id, auto_distill=False)
    if result is None:
        log["reason"] = "every trial failed"
    elif result.skipped:
        log["reason"] = result.skipped
        log["record_id"] = result.record_id
    else:
        log.update(committed=True, label=result.label, record_id=result.record_id, pruned=list(result.pruned))
        after = _hint_scores(memory, hint_ids)
        log["prior_hints"] = [{"id": h, "w_before": before.get(h), "w_after": after.get(h)} for h in hint_ids]
        if result.distill:
            log["distillation"] = _distill(memory, result.distill)
    log.update(pool_counts_log(memory))
    return log


def _hint_scores(memory: ExperientialMemory, ids: list[str]) -> dict[str, int]:
    if not ids:
        return {}
    with memory.store.read() as conn:
        marks = ",".join("?" * len(ids))
        return {r[0]: int(r[1]) for r in conn.execute(f"SELECT id, w FROM hints WHERE id IN ({marks})", ids)}  # noqa: S608


def pool_counts_log(memory: ExperientialMemory) -> dict[str, Any]:
    """The pool's size after a commit, as `memory_log.jsonl` reports it: records, hints and mean w."""
    with memory.store.read() as conn:
        records = int(conn.execute("SELECT count(*) FROM records").fetchone()[0])
        row = conn.execute("SELECT count(*), avg(w) FROM hints").fetchone()
    return {"records": records, "hints": int(row[0]), "mean_w": round(float(row[1]), 3) if row[1] is not None else None}


def summarize_distillation(report: DistillReport) -> dict[str, int]:
    """What one distillation changed, counted: hints created, edited, agreed with, removed,
    merge batches, hints pruned, model calls made and operations rejected."""
    ops = [a["op"] for a in report.applied]
    return {"created": ops.count("ADD"), "edited": ops.count("EDIT"), "agreed": ops.count("AGREE"),
            "removed": ops.count("REMOVE"), "merged": len(report.merged), "pruned": len(report.pruned),
            "calls": len(report.calls), "rejected": len(report.rejected)}


def _distill(memory: ExperientialMemory, what: str) -> dict[str, Any]:
    """Run the distillation the commit made due, and count what it changed."""
    if memory.model is None:
        return {"what": what, "skipped": "no memory model configured"}
    try:
        report = memory.distill(refine="refine" in what, merge="merge" in what)
    except Exception as exc:  # noqa: BLE001 - the commit is safe; the failure is logged in memory_log.jsonl
        return {"what": what, "failed": f"{type(exc).__name__}: {exc}"}
    return {"what": what, **summarize_distillation(report)}
