"""amapreduce.memory: the experiential memory (paper §3.3, App. D.5–D.8).

Records ε = (q, Θ, τ, u) and hints (text, score w_h, provenance S(h)) live in one SQLite store per
namespace folder, with a faiss cache of the query vectors. `ExperientialMemory` is the plan-stage
`PriorProvider`; `update(...)` learns from scored runs; `InstanceSession` implements the
snapshot/commit protocol. Importing this package is cheap: torch, sentence-transformers, faiss
and finch load only when first needed.
"""

from __future__ import annotations

from amapreduce.memory.config import MemoryConfig
from amapreduce.memory.core import ExperientialMemory
from amapreduce.memory.distill import DistillReport
from amapreduce.memory.protocol import InstanceSession, TrialOutcome, canonical_trial
from amapreduce.memory.records import DecisionSummary, Record, TraceSummary
from amapreduce.memory.retrieval import Neighbour, Retrieval, ScoredHint
from amapreduce.memory.schema import (
    NoMemoryStore,
    NotAMemoryStore,
    StoreCorrupted,
    StoreError,
    StoreVersionError,
)
from amapreduce.memory.store import MemoryStore
from amapreduce.memory.update import UpdateResult

__all__ = [
    "DecisionSummary",
    "DistillReport",
    "ExperientialMemory",
    "InstanceSession",
    "MemoryConfig",
    "MemoryStore",
    "Neighbour",
    "NoMemoryStore",
    "NotAMemoryStore",
    "Record",
    "Retrieval",
    "ScoredHint",
    "StoreCorrupted",
    "StoreError",
    "StoreVersionError",
    "TraceSummary",
    "TrialOutcome",
    "UpdateResult",
    "canonical_trial",
]
