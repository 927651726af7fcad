"""Learning from one scored run (paper Eq. 13 and 22): write ε_new, credit the hints of its Δ_q.

All of it happens in one write transaction: insert the record (label from the pass rule), add
w_h += g(u) and S(h) ∪= {ε_new} for every hint of the prior that still exists and that the credit
rule picks (`credited_hints`: under `credit_rule: used`, the hints the run used), prune hints
with w_h <= threshold, and claim a distillation slot when the schedule says one is due. Runs whose
metrics say the infrastructure failed are not written at all.

Two changes to the paper's g(u) let the memory unlearn a bad hint (both in `MemoryConfig`; off,
the rule is the paper's). **Relative credit**: for a hint whose typed advice the run followed, g
is `reward_fail` when the run failed *or* did worse than the family's records
(`memory.advice.worse_than_records`): a hint that makes runs pass expensively is debited, where
the paper credits +2 every time. **Refutation**: a followed hint that did worse at least
`refute_after` times, and in at least half of the runs of its provenance that followed its advice
(`track_record`), drops to the prune threshold and is pruned: with −1 per failure a hint imported
at w = 20 would mislead twenty runs first (`bench_evolution.py --scenario misleading`).

A commit is one unit of work, resumable at any instant. The same transaction logs what it did (a
`record_committed` event: label, credits, pruned hints, the distillation it made due), so a
process killed after it and committing the same record id again gets that very result back
(`UpdateResult.replayed`) instead of a bare "already committed", and can finish the rest: the
distillation the commit made due stays *pending* (`distill_due` logged, no `distill_done` for that
record) until `finish_distillation` records how it ended; a resume runs a pending one then.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from amapreduce.decision.model import Decision
from amapreduce.mapreduce.prior import Prior
from amapreduce.memory.advice import HintAdvice, worse_than_records
from amapreduce.memory.config import MemoryConfig
from amapreduce.memory.labels import infrastructure_failure_reason, label
from amapreduce.memory.records import DecisionSummary, Record, TraceSummary, new_id
from amapreduce.memory.store import (
    MemoryStore,
    add_provenance,
    get_hint,
    get_meta,
    insert_record,
    log_event,
    prune_hints,
    record_count,
    set_meta,
    update_hint,
)

__all__ = ["UpdateResult", "credited_hints", "distillation_done", "due_distillation", "finish_distillation",
           "record_outcome", "track_record"]


@dataclass(frozen=True, kw_only=True)
class UpdateResult:
    """What one update did."""

    record_id: str | None = None
    label: bool | None = None
    skipped: str | None = None
    """Why nothing was written (an infrastructure failure), or None."""
    credited: dict[str, int] = field(default_factory=dict)
    """Hint id → w_h after the update."""
    missing_hints: tuple[str, ...] = ()
    """Hints of the prior that no longer exist (pruned or merged since)."""
    before: dict[str, int] = field(default_factory=dict)
    """Hint id → w_h before the update (of the hints in `credited`)."""
    refuted: tuple[str, ...] = ()
    """Hints refuted by this update (`MemoryConfig.refute_after`), so pruned."""
    pruned: tuple[str, ...] = ()
    distill: str | None = None
    """`refine`, `refine+merge` or None: the distillation claimed by this update."""
    replayed: bool = False
    """The record was committed before (by a process that died before it finished): this is the
    result that commit logged; its distillation may still be pending (`distillation_done`)."""


def credited_hints(conn: Any, prior: Prior | None, decision: DecisionSummary, config: MemoryConfig
                   ) -> tuple[list[str], list[str], list[str]]:
    """Which hints of `prior` get the run's credit: (credited, followed, missing).

    `credit_rule: all` (the paper) credits every hint of the prior. `used` (the default) credits a
    hint with typed advice only when the executed `decision` followed it (same strategy and rows
    per batch, on a shape the advice applies to), never when it contradicted it; a hint without
    typed advice only when the projection kept it for this draft (`Prior.kept_hint_ids`).
    `followed` lists the hints whose advice was followed (recorded with the record).
    """
    from amapreduce.memory.advice import HintAdvice

    credited: list[str] = []
    followed: list[str] = []
    missing: list[str] = []
    kept = set(prior.kept_hint_ids) if prior is not None else set()
    for hint_id in dict.fromkeys(prior.hint_ids if prior else ()):
        hint = get_hint(conn, hint_id)
        if hint is None:
            missing.append(hint_id)
            continue
        advice = HintAdvice.model_validate(hint["advice"]) if hint["advice"] else None
        verdict = advice.verdict(decision) if advice is not None else None
        if verdict == "followed":
            followed.append(hint_id)
        if config.credit_rule == "all" or verdict == "followed" or (advice is None and hint_id in kept):
            credited.append(hint_id)
    return credited, followed, missing


def track_record(conn: Any, hint_id: str, *, relative: bool = True) -> tuple[int, int]:
    """(worse, better): how the runs of S(h) (`hint_id`'s provenance) whose decision followed its
    typed advice did: worse when the record failed or did worse than its family's records
    (`TraceSummary.worse`; with `relative` False, failed only). Provenance survives a merge and the
    payload is the rule, so a merged or edited hint keeps the evidence about the choice it advises;
    (0, 0) for a hint without a payload."""
    hint = get_hint(conn, hint_id)
    if hint is None or not hint["advice"]:
        return 0, 0
    advice = HintAdvice.model_validate(hint["advice"])
    worse = better = 0
    for label_, decision, trace in conn.execute(
            "SELECT r.label, r.decision, r.trace FROM provenance p JOIN records r ON r.id = p.record_id "
            "WHERE p.hint_id = ?", (hint_id,)):
        if advice.verdict(DecisionSummary.model_validate_json(decision)) != "followed":
            continue
        if not label_ or (relative and TraceSummary.model_validate_json(trace).worse is not None):
            worse += 1
        else:
            better += 1
    return worse, better


def _credit(conn: Any, hint_id: str, *, followed: bool, passed: bool, worse: str | None, record_id: str,
            config: MemoryConfig) -> tuple[int, int, bool]:
    """Credit one hint for the run (Eq. 13 with the relative g and refutation of the module
    docstring); returns (w before, w after, refuted)."""
    relative = followed and config.relative_credit
    did_worse = not passed or (relative and worse is not None)
    reward = config.reward_fail if did_worse else config.reward_pass
    detail: dict[str, Any] = {"record_id": record_id, "label": passed, "rule": config.credit_rule, "followed": followed,
                              "verdict": "worse" if did_worse else "better"}
    if relative and worse is not None:  # `worse` is set for a passing run only
        detail["why"] = worse
    hint = update_hint(conn, hint_id, kind="credited", delta=reward, **detail)
    add_provenance(conn, hint_id, [record_id])
    before = int(hint["w"]) - reward
    refuted = False
    if followed and did_worse and config.refute_after and config.reward_fail < 0 and int(hint["w"]) > config.prune_threshold:
        bad, good = track_record(conn, hint_id, relative=config.relative_credit)
        if bad >= config.refute_after and bad >= good:
            hint = update_hint(conn, hint_id, kind="refuted", score=config.prune_threshold, record_id=record_id,
                               worse=bad, better=good, refute_after=config.refute_after)
            refuted = True
    return before, int(hint["w"]), refuted


def due_distillation(conn: Any, total: int, config: MemoryConfig) -> str | None:
    """Claim the distillation slot the schedule makes due at `total` records (inside a write txn).

    Counters instead of `total % every == 0`: with concurrent writers a multiple can be skipped,
    and a re-run must not fire twice. Claiming inside the write transaction means only one
    process distils per slot.
    """
    if total < config.distill_start:
        return None
    last_refine = get_meta(conn, "last_refine_at")
    last_merge = get_meta(conn, "last_merge_at")
    refine = last_refine is None or total - int(last_refine) >= config.distill_every
    merge = last_merge is None or total - int(last_merge) >= config.merge_every
    if not (refine or merge):
        return None
    if refine:
        set_meta(conn, "last_refine_at", str(total))
    if merge:
        set_meta(conn, "last_merge_at", str(total))
    return "refine+merge" if refine and merge else ("merge" if merge else "refine")


def record_outcome(
    store: MemoryStore,
    config: MemoryConfig,
    *,
    query: str,
    decision: Decision | DecisionSummary,
    metrics: Mapping[str, Any] | None,
    prior: Prior | None = None,
    trace: Mapping[str, Any] | TraceSummary | None = None,
    task_id: str | None = None,
    failure: str | None = None,
    record_id: str | None = None,
) -> UpdateResult:
    """Apply Eq. 13/22 for one scored run; see the module docstring.

    A `record_id` that the store already holds is not written again (result `skipped` =
    "already committed"): callers that derive the id from what they commit (an evaluation's
    instance, an `ask` run) get exactly-once commits across crashes and retries.
    """
    reason = f"run failed: {failure}" if failure else infrastructure_failure_reason(metrics, config.label_rule)
    if reason is not None or metrics is None:
        with store.write() as conn:
            log_event(conn, "record_skipped", reason=reason, task_id=task_id, query=query[:200])
        return UpdateResult(skipped=reason)
    trace_summary = trace if isinstance(trace, TraceSummary) else TraceSummary.model_validate(dict(trace or {}))
    summary = DecisionSummary.of(decision, batches=trace_summary.batches)
    passed = label(metrics, config.label_rule, utility_threshold=config.utility_threshold)
    vector = store.embed([query])[0]
    credited: dict[str, int] = {}
    before: dict[str, int] = {}
    refuted: list[str] = []
    with store.write() as conn:
        if record_id is not None and conn.execute("SELECT 1 FROM records WHERE id = ?", (record_id,)).fetchone():
            # Idempotent per record id: an evaluation resumed after it crashed between its commit
            # and its journal line commits the same instance again; nothing is written twice, and
            # the first commit's own result comes back so the caller can finish what it began.
            earlier = _committed(conn, record_id)
            if earlier is not None:
                return earlier
            log_event(conn, "record_skipped", reason="already committed", task_id=task_id, record_id=record_id)
            return UpdateResult(record_id=record_id, skipped="already committed")
        chosen, followed, missing = credited_hints(conn, prior, summary, config)
        worse = (worse_than_records(summary, trace_summary, prior.advice if prior is not None else None, config)
                 if passed else None)
        record = Record(id=record_id or new_id("r"), query=query, label=passed, decision=summary,
                        trace=trace_summary.model_copy(update={"followed_hints": tuple(followed), "worse": worse}),
                        metrics=dict(metrics), task_id=task_id)
        insert_record(conn, record, vector)
        for hint_id in chosen:
            before[hint_id], credited[hint_id], was_refuted = _credit(
                conn, hint_id, followed=hint_id in followed, passed=passed, worse=worse, record_id=record.id,
                config=config)
            if was_refuted:
                refuted.append(hint_id)
        pruned = prune_hints(conn, config.prune_threshold)
        total = record_count(conn)
        distill = due_distillation(conn, total, config)
        if distill:
            log_event(conn, "distill_due", record_id=record.id, records=total, what=distill)
        result = UpdateResult(record_id=record.id, label=passed, credited=credited, before=before,
                              refuted=tuple(refuted), missing_hints=tuple(missing),
                              pruned=tuple(h["id"] for h in pruned), distill=distill)
        log_event(conn, "record_committed", record_id=record.id, label=passed, credited=credited, before=before,
                  refuted=refuted, missing_hints=missing, pruned=list(result.pruned), distill=distill)
    return result


def _committed(conn: Any, record_id: str) -> UpdateResult | None:
    """What the commit of `record_id` did, from its `record_committed` event (None: a record
    committed before commits were logged, or written another way: an import, `memory add`)."""
    row = conn.execute("SELECT detail FROM events WHERE kind = 'record_committed' AND record_id = ? "
                       "ORDER BY seq DESC LIMIT 1", (record_id,)).fetchone()
    if row is None:
        return None
    done = json.loads(row[0])
    return UpdateResult(record_id=record_id, label=bool(done["label"]), credited=dict(done["credited"]),
                        before=dict(done.get("before") or {}), refuted=tuple(done.get("refuted") or ()),
                        missing_hints=tuple(done["missing_hints"]), pruned=tuple(done["pruned"]),
                        distill=done["distill"], replayed=True)


def distillation_done(store: MemoryStore, record_id: str) -> dict[str, Any] | None:
    """How the distillation that the commit of `record_id` made due ended (what
    `finish_distillation` recorded), or None while it is pending."""
    with store.read() as conn:
        row = conn.execute("SELECT detail FROM events WHERE kind = 'distill_done' AND record_id = ? "
                           "ORDER BY seq DESC LIMIT 1", (record_id,)).fetchone()
    return None if row is None else dict(json.loads(row[0])["outcome"])


def finish_distillation(store: MemoryStore, record_id: str, outcome: Mapping[str, Any]) -> None:
    """Record how the distillation the commit of `record_id` made due ended (ran, skipped, failed):
    it is no longer pending, and a resumed commit reports `outcome` instead of running it again."""
    with store.write() as conn:
        log_event(conn, "distill_done", record_id=record_id, outcome=dict(outcome))
