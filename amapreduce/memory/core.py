"""`ExperientialMemory`: the memory M = {D, H, F_ψ} behind the plan-stage prior (paper §3.3).

It is the `PriorProvider` the mapreduce tool's plan stage calls (`prior(request)`), and after the
run is scored `update(prior, ...)` applies the online credit assignment and, when the schedule
says so, the distillation. `snapshot()` gives the frozen, read-only view one benchmark instance's
trials share (App. D.5; see `amapreduce.memory.protocol`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from amapreduce import telemetry
from amapreduce.decision.model import Decision
from amapreduce.llm.embed import Encoder
from amapreduce.mapreduce.prior import Prior, PriorRequest
from amapreduce.memory.advice import compute_advice, render_hint
from amapreduce.memory.config import MemoryConfig
from amapreduce.memory.distill import DistillReport, distill
from amapreduce.memory.index import VectorIndex
from amapreduce.memory.llm import ask
from amapreduce.memory.parsing import parse_list
from amapreduce.memory.records import DecisionSummary, TraceSummary
from amapreduce.memory.retrieval import Retrieval, render_prior, retrieve
from amapreduce.memory.schema import connect
from amapreduce.memory.store import MemoryStore
from amapreduce.memory.update import UpdateResult, distillation_done, finish_distillation, record_outcome
from amapreduce.prompts import render_prompt

__all__ = ["ExperientialMemory"]

log = logging.getLogger(__name__)

_CITED = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)\s*\]")
"""The hint numbers a projected bullet cites, `[2]` or `[1, 3]` (the projection prompt asks for them)."""


def _cited(bullets: list[str], count: int) -> set[int]:
    """0-based indexes of the listed hints the projection's bullets cite."""
    out: set[int] = set()
    for bullet in bullets:
        for found in _CITED.finditer(bullet):
            out |= {int(n) - 1 for n in found.group(1).split(",") if 1 <= int(n) <= count}
    return out


def _decision_text(decision: Decision) -> str:
    """The draft decision as the projection prompt shows it (the matrix cut to five rows)."""
    shown: dict[str, Any] = decision.model_dump(mode="json", exclude_none=True)
    matrix = decision.task_matrix
    if len(matrix) > 5:
        shown["task_matrix"] = [*matrix[:5], f"... ({len(matrix) - 5} more rows)"]
    return json.dumps(shown, ensure_ascii=False)[:4000]


class ExperientialMemory:
    """Records, hints, retrieval, online update and distillation over one store folder.

    Args:
        store: a store folder (created if missing) or an open `MemoryStore`.
        config: retrieval/update/distillation parameters.
        model: the memory model for Φ and F_ψ (any smolagents `Model`); None disables both.
        encoder: an encoder spec or object; must match the store's.
    """

    def __init__(self, store: str | Path | MemoryStore, *, config: MemoryConfig | None = None,
                 model: Any | None = None, encoder: Encoder | str | None = None, readonly: bool = False) -> None:
        self.store = store if isinstance(store, MemoryStore) else MemoryStore(store, encoder=encoder, readonly=readonly)
        self.config = config or MemoryConfig()
        self.model = model
        self.index = VectorIndex(self.store.folder, write_cache=not self.store.readonly)
        self._warned_no_model = False

    # -- read side -------------------------------------------------------------------------
    def retrieve(self, query: str, *, task_id: str | None = None) -> Retrieval:
        """I⁺, I⁻ and the ranked hints for `query` (no projection)."""
        vector = self.store.embed([query])[0]
        return retrieve(self.store, self.index, vector, query, self.config, task_id=task_id)

    def project(self, query: str, decision: Decision | None, retrieval: Retrieval
                ) -> tuple[list[str], str | None, tuple[str, ...]]:
        """h_s = Φ(q; H_q): the memory model's ≤ max_bullets bullets, or the raw hints.

        Returns the guidance, why Φ failed (None: it did not; the caller traces it), and the ids
        of the hints kept for this draft: those the bullets cite by number, or every hint when
        the raw hints are passed on. With `advice` on, the hints are shown with their typed payloads.
        """
        raw = [h.text for h in retrieval.hints]
        every = tuple(h.id for h in retrieval.hints)
        if not raw or not self.config.project or self.model is None:
            return raw, None, every
        shown = [render_hint(h.text, h.advice if self.config.advice else None) for h in retrieval.hints]
        system = render_prompt("memory", "project_system", max_bullets=self.config.max_bullets)
        user = render_prompt("memory", "project_user", query=query,
                             decision=_decision_text(decision) if decision is not None else "(none yet)",
                             hints="\n".join(f"{k}. {t}" for k, t in enumerate(shown, 1)),
                             max_bullets=self.config.max_bullets)
        try:
            bullets = parse_list(ask(self.model, system, user), limit=self.config.max_bullets)
        except Exception as exc:  # noqa: BLE001 - any model failure falls back, and is reported
            log.warning("projection Φ failed (%s: %s); using the raw hints", type(exc).__name__, exc)
            return raw, f"{type(exc).__name__}: {exc}", every
        if not bullets:
            log.warning("projection Φ returned no list items; using the raw hints")
            return raw, "reply had no list items", every
        cited = _cited(bullets, len(raw))
        return bullets, None, tuple(h.id for i, h in enumerate(retrieval.hints) if i in cited)

    def search(self, query: str, *, decision: Decision | None = None,
               task_id: str | None = None) -> tuple[Retrieval, Prior]:
        """What the plan stage would retrieve for `query`, and the prior it would get (with
        OpenTelemetry on, inside a retriever span whose documents are the ranked hints).

        With `advice` on and a draft `decision`, the prior's `details["advice"]` is the typed
        advice the records support (`memory.advice.compute_advice`)."""
        with telemetry.span("amapreduce.memory.retrieve", {telemetry.INPUT_VALUE: query, **telemetry.ours(task_id=task_id)},
                            kind=telemetry.RETRIEVER) as span:
            retrieval = self.retrieve(query, task_id=task_id)
            guidance, error, kept = self.project(query, decision, retrieval)
            span.set({**telemetry.retrieval_documents([(h.id, h.text, float(h.s)) for h in retrieval.hints]),
                      **telemetry.ours(records=len(retrieval.neighbourhood), candidates=retrieval.candidates,
                                       projection_error=error)})
        details: dict[str, Any] = {
            "positives": [n.to_json() for n in retrieval.positives],
            "negatives": [n.to_json() for n in retrieval.negatives],
            "hints": [h.to_json() for h in retrieval.hints],
            "candidates": retrieval.candidates,
            "excluded_same_task": retrieval.excluded,
            "query": query,
            "task_id": task_id,
            "projected": error is None and guidance != [h.text for h in retrieval.hints],
        }
        if error is not None:
            details["projection_error"] = error
        if self.config.advice and decision is not None:
            outcomes = [n.outcome for n in retrieval.positives + retrieval.negatives if n.outcome is not None]
            typed = [(h.id, h.advice) for h in retrieval.hints if h.advice is not None and h.id in kept]
            details["advice"] = compute_advice(decision, outcomes, self.config, typed).to_json()
        prior = Prior(text=render_prior(retrieval, guidance), hint_ids=tuple(h.id for h in retrieval.hints),
                      kept_hint_ids=kept, record_ids=retrieval.neighbourhood, details=details)
        return retrieval, prior

    def prior(self, request: PriorRequest) -> Prior:
        """The plan stage's experiential prior Δ_q (the `PriorProvider` protocol)."""
        return self.search(request.query, decision=request.decision, task_id=request.task_id)[1]

    # -- write side ------------------------------------------------------------------------
    def update(self, prior: Prior | None, *, query: str | None = None, decision: Decision | DecisionSummary,
               metrics: Mapping[str, Any] | None, trace: Mapping[str, Any] | TraceSummary | None = None,
               task_id: str | None = None, failure: str | None = None, record_id: str | None = None,
               auto_distill: bool = True) -> UpdateResult:
        """Write ε_new and credit the hints of `prior` (Eq. 13/22); distil when due.

        `failure` (or metrics missing a required value) marks an infrastructure failure: nothing
        is written and no hint is credited. A distillation that fails after the record was written
        is logged and reported in the result's `distill` field as `failed: ...`; the record stays.
        `query` and `task_id` default to the ones the prior was built for.
        """
        details = prior.details if prior is not None else {}
        query = query if query is not None else details.get("query")
        task_id = task_id if task_id is not None else details.get("task_id")
        if not query:
            from amapreduce.errors import UserError

            raise UserError("update needs the run's query: pass query=..., or the Prior returned by prior().")
        result = record_outcome(self.store, self.config, query=query, decision=decision, metrics=metrics,
                                prior=prior, trace=trace, task_id=task_id, failure=failure, record_id=record_id)
        if result.distill and auto_distill:
            if self.model is None:
                level = logging.DEBUG if self._warned_no_model else logging.WARNING
                log.log(level, "distillation due (%s) but no memory model is configured; skipped. Run "
                        "`amapreduce memory distill --model ...` later.", result.distill)
                self._warned_no_model = True
                return result
            if result.replayed and result.record_id and distillation_done(self.store, result.record_id) is not None:
                return result  # a commit replayed after a crash whose distillation had finished
            try:
                distill(self.store, self.config, self.model, refine="refine" in result.distill,
                        merge="merge" in result.distill, record_id=result.record_id)
            except Exception as exc:  # noqa: BLE001 - the run's record is already safe; report, don't lose it
                log.warning("scheduled distillation failed: %s: %s", type(exc).__name__, exc)
                from dataclasses import replace

                failed = f"failed: {type(exc).__name__}: {exc}"
                if result.record_id:
                    finish_distillation(self.store, result.record_id, {"what": result.distill, "failed": failed})
                return replace(result, distill=failed)
        return result

    def distill(self, *, refine: bool = True, merge: bool = True, dry_run: bool = False,
                record_id: str | None = None) -> DistillReport:
        """Run F_ψ now (whatever the schedule says); `record_id`: the commit that made it due,
        recorded done with it (`memory.distill.distill`)."""
        return distill(self.store, self.config, self.model, refine=refine, merge=merge, dry_run=dry_run,
                       record_id=record_id)

    def rebuild_index(self) -> int:
        """Rebuild the faiss cache from SQLite; return the number of vectors."""
        with self.store.read() as conn:
            return self.index.rebuild(conn)

    def snapshot(self) -> ExperientialMemory:
        """A frozen, read-only view: what one instance's trials share (App. D.5).

        No copy is made: a read-only connection opens one read transaction and keeps it, and
        SQLite's WAL guarantees that transaction keeps seeing the same state while other
        connections write. Close the snapshot (`close()`) when the instance is done, so the WAL
        can be checkpointed past it.
        """
        if self.store.readonly:
            return self
        with self.store.read() as conn:
            self.index.sync(conn)
        index = self.index.frozen_copy(self.store.folder)  # covers a prefix of what the snapshot sees
        frozen_conn = connect(self.store.folder, readonly=True)
        frozen_conn.execute("PRAGMA query_only = ON")
        frozen_conn.execute("BEGIN")
        frozen_conn.execute("SELECT count(*) FROM records").fetchone()  # the read snapshot starts here
        frozen = MemoryStore(self.store.folder, encoder=self.store.encoder, readonly=True, connection=frozen_conn)
        index.sync(frozen_conn)  # catch up to exactly the snapshot's records
        memory = ExperientialMemory(frozen, config=self.config, model=self.model)
        memory.index = index
        return memory

    def close(self) -> None:
        """Close the store."""
        self.store.close()

    def __enter__(self) -> ExperientialMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
