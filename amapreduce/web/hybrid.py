"""Optional dense side of a corpus index: sentence embeddings fused with BM25 by reciprocal rank.

Why: keyword search misses paraphrases ("kitten" vs "feline"); embeddings catch them but blur
exact names and numbers. Reciprocal-rank fusion (RRF, k = 60) keeps both without tuning score
scales. Vectors come from the model layer's encoders (`amapreduce.llm.embed`; `minilm` by
default: all-MiniLM-L6-v2 bundled offline) and are stored as a plain `.npy` array (never pickle)
next to the keyword index.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["VECTORS_FILE", "dense_rank", "embed_documents", "load_vectors", "rrf_fuse", "save_vectors"]

VECTORS_FILE = "vectors.npy"
RRF_K = 60


def embed_documents(encoder_spec: str, texts: Sequence[str], max_chars: int = 2000) -> np.ndarray:
    """Unit-norm vectors of each text's first `max_chars` characters (title plus lead matter)."""
    from amapreduce.llm.embed import get_encoder

    return get_encoder(encoder_spec).encode([t[:max_chars] for t in texts])


def save_vectors(folder: Path, vectors: np.ndarray) -> None:
    import numpy as np

    np.save(folder / VECTORS_FILE, vectors, allow_pickle=False)


def load_vectors(folder: Path) -> np.ndarray:
    import numpy as np

    vectors: np.ndarray = np.load(folder / VECTORS_FILE, allow_pickle=False)
    return vectors


def dense_rank(encoder_spec: str, vectors: np.ndarray, query: str, k: int) -> list[int]:
    """Row numbers of the `k` documents most similar to `query` (cosine), best first."""
    import numpy as np

    if len(vectors) == 0 or k < 1:
        return []
    qvec = embed_documents(encoder_spec, [query])[0]
    scores = vectors @ qvec
    k = min(k, len(scores))
    top = np.argpartition(-scores, k - 1)[:k]
    return [int(i) for i in top[np.argsort(-scores[top], kind="stable")]]


def rrf_fuse(rankings: Sequence[Sequence[str]], n: int, k: int = RRF_K) -> list[str]:
    """Reciprocal-rank fusion: score(d) = Σ 1 / (k + rank_i(d)); ties keep first-seen order."""
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking, 1):
            scores[key] = scores.get(key, 0.0) + 1.0 / (k + rank)
    return sorted(scores, key=lambda key: -scores[key])[:n]
