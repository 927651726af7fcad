"""Token counts of text: the provider's usage, else an offline tokenizer, else four characters a token.

Why: the adaptive tree reduce (issue 12, point 2) packs outputs into bins of at most a token
budget, so it needs counts good enough that a bin it thinks fits really fits. The design note
`mapreduce-ensemble-tree-reduce.txt` §8 gives the order this module follows (issue 12, point 4):

1. the provider's own count of a reply's tokens (`Usage.output_tokens`) when it reports one (§8.1);
2. a tokenizer that runs offline (§8.3): `tiktoken` with the BPE files LiteLLM ships in
   `litellm/litellm_core_utils/tokenizers/` (docs/dependencies.md §10), o200k_base for the
   gpt-4o / gpt-4.1 / gpt-4.5 / gpt-5 / o-series ids and cl100k_base otherwise. For other
   providers' models this is an approximation too, but a far closer one than characters;
3. `llm.messages.estimate_tokens` (about four characters a token, §8.2), with one logged warning
   per process so that a user knows the budget is approximate.

Never a network fetch: `tiktoken.get_encoding` downloads its file when it is not in its cache,
and an offline run would hang or fail there. The bundled file is therefore located without
importing LiteLLM (whose import is slow and fetches a price map), checked against tiktoken's
published SHA-256 before tiktoken sees it, and only then handed to tiktoken through
`TIKTOKEN_CACHE_DIR`, set for that one call under a lock and restored after. A file that is
missing or altered means the chars/4 fallback, never a download. `tiktoken` and `litellm` come
with the `litellm` extra, so both are imported lazily and their absence is the same fallback.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from amapreduce.llm.messages import estimate_tokens
from amapreduce.llm.meter import litellm_folder
from amapreduce.llm.usage import Usage

__all__ = ["TokenCounter", "encoding_for_model"]

logger = logging.getLogger(__name__)

TokenSource = Literal["tokenizer", "chars/4"]

_BLOB = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
"""Where tiktoken downloads an encoding from; its cache file is named by the SHA-1 of this URL."""

_SHA256 = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}
"""tiktoken's own expected hashes (`tiktoken_ext.openai_public`): a bundled file must match them,
or tiktoken would delete it and download a fresh one."""

_O200K_MODEL = re.compile(r"^(gpt-4o|chatgpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|o\d)", re.IGNORECASE)
"""Model ids tokenized with o200k_base (as tiktoken's own model table has them)."""


def encoding_for_model(model_id: str | None) -> str:
    """The tiktoken encoding name for `model_id`: o200k_base for gpt-4o/gpt-4.1/gpt-4.5/gpt-5 and
    the o-series, cl100k_base for everything else (a provider prefix such as `openai/` is ignored)."""
    name = (model_id or "").rsplit("/", 1)[-1].strip()
    return "o200k_base" if _O200K_MODEL.match(name) else "cl100k_base"


def _bundled_dir() -> Path | None:
    """LiteLLM's folder of tokenizer files, found without importing LiteLLM; None without the extra."""
    folder = litellm_folder()
    return None if folder is None else folder / "litellm_core_utils" / "tokenizers"


def _bundled_file(folder: Path, name: str) -> Path:
    """The file tiktoken's cache would hold for encoding `name` in `folder` (SHA-1 of its URL)."""
    return folder / hashlib.sha1(_BLOB.format(name=name).encode()).hexdigest()  # noqa: S324 - tiktoken's cache key, not security


@dataclass
class _State:
    """Process-wide: encodings loaded (or None when unavailable) and whether the fallback was warned."""

    encodings: dict[str, Any] = field(default_factory=dict)
    warned: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


_STATE = _State()

_ENV_LOCK = threading.Lock()


@contextmanager
def _tiktoken_cache_dir(folder: Path) -> Iterator[None]:
    """`TIKTOKEN_CACHE_DIR` set to `folder` for the duration of one load, then restored."""
    with _ENV_LOCK:
        before = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("TIKTOKEN_CACHE_DIR", None)
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = before


def _load_encoding(name: str) -> Any:
    """The tiktoken encoding `name` from LiteLLM's bundled files, or None (why is logged at debug)."""
    folder = _bundled_dir()
    if folder is None:
        logger.debug("no offline tokenizer: the litellm extra is not installed")
        return None
    path = _bundled_file(folder, name)
    try:
        data = path.read_bytes()
    except OSError as exc:
        logger.debug("no offline tokenizer: %s", exc)
        return None
    if hashlib.sha256(data).hexdigest() != _SHA256[name]:
        logger.debug("no offline tokenizer: %s does not match tiktoken's hash for %s", path, name)
        return None
    try:
        tiktoken = importlib.import_module("tiktoken")
        with _tiktoken_cache_dir(folder):
            return tiktoken.get_encoding(name)
    except Exception as exc:  # noqa: BLE001 - any failure of an optional tokenizer means the fallback
        logger.debug("no offline tokenizer: %s", exc)
        return None


def _encoding(name: str) -> Any:
    """The encoding `name`, loaded once per process (a failure is remembered too)."""
    with _STATE.lock:
        if name not in _STATE.encodings:
            _STATE.encodings[name] = _load_encoding(name)
            if _STATE.encodings[name] is None and not _STATE.warned:
                _STATE.warned = True
                logger.warning(
                    "no offline tokenizer for %s (tiktoken and LiteLLM's bundled BPE files, from the litellm extra, "
                    "could not be loaded; run with debug logging for why); token counts are estimated as "
                    "characters / 4, so token budgets are approximate",
                    name,
                )
        return _STATE.encodings[name]


class TokenCounter:
    """Counts the tokens of text for one model (see the module doc for the order of sources).

    The tokenizer is loaded at the first count, not at construction, so building a counter costs
    nothing when no count is ever asked for.
    """

    def __init__(self, model_id: str | None = None) -> None:
        self.model_id = model_id
        self.encoding_name = encoding_for_model(model_id)
        self._encoding: Any = None
        self._resolved = False

    def _tokenizer(self) -> Any:
        """The encoding (or None), asked of the process-wide cache once per counter: later counts
        take no lock."""
        if not self._resolved:
            self._encoding = _encoding(self.encoding_name)
            self._resolved = True
        return self._encoding

    @property
    def source(self) -> TokenSource:
        """`tokenizer` when the offline tokenizer is available, else `chars/4`."""
        return "tokenizer" if self._tokenizer() is not None else "chars/4"

    def count(self, text: str) -> int:
        """Tokens of `text`: the offline tokenizer's count, else chars/4 (one warning per process).

        Special-token spellings in the text (`<|endoftext|>`) are counted as ordinary text: the
        text is data from pages and models, not a prompt we build.
        """
        encoding = self._tokenizer()
        if encoding is None:
            return estimate_tokens(text)
        return len(encoding.encode(text, disallowed_special=()))

    def of_reply(self, text: str, usage: Usage | None) -> int:
        """Tokens of a model's reply: the provider's completion tokens when its usage has them (> 0),
        else `count(text)` (§8.1 before §8.2/§8.3)."""
        if usage is not None and usage.output_tokens > 0:
            return usage.output_tokens
        return self.count(text)
