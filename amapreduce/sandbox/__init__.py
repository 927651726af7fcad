"""The bundled sandbox world: an offline mini-web with wide-search tasks and gold tables.

`sandbox_world()` returns the paths of everything a test, the offline demo or `amapreduce eval`
needs. The pages, tasks and gold CSVs are committed (built by `python -m amapreduce.sandbox.build`
from a pinned GeoNames package); only the search index is built here, on first use, because a
binary index does not belong in git. Building it takes well under a second.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict

__all__ = ["INDEX_NAME", "WORLD_DIR", "SandboxWorld", "sandbox_world"]

INDEX_NAME = "sandbox"
WORLD_DIR = Path(__file__).resolve().parent / "world"
_LOCK = threading.Lock()


class SandboxWorld(BaseModel):
    """Paths of the sandbox world."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pages_dir: Path
    """The HTML pages (indexed as `corpus://sandbox/<path>`)."""
    index_dir: Path
    """The corpus index: use it as `--backend corpus:<index_dir>`."""
    tasks_file: Path
    """WideSearch-format task lines (`instance_id`, `query`, `evaluation`, `language`)."""
    gold_dir: Path
    """Gold tables, `<instance_id>.csv`."""
    lookups_file: Path
    """(query, expected entity URL) pairs used by the retrieval-quality tests."""


def _pages_digest(pages: Path) -> str:
    from amapreduce.web.corpus import FORMAT
    from amapreduce.web.main_text import EXTRACTOR_VERSION

    digest = hashlib.sha256(f"{FORMAT}|{EXTRACTOR_VERSION}|".encode())
    for file in sorted(pages.rglob("*.html")):
        digest.update(file.relative_to(pages).as_posix().encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def sandbox_world(cache_dir: Path | None = None) -> SandboxWorld:
    """The sandbox world's paths, building its corpus index under `cache_dir` if needed.

    Args:
        cache_dir: where the index lives (default `.amapreduce-cache`, the settings default).
            The index folder name carries a digest of the pages, the index format and the
            extractor version, so a changed world or extractor gets a fresh index.
    """
    from amapreduce.web.corpus import build_corpus_index

    pages = WORLD_DIR / "pages"
    base = Path(cache_dir) if cache_dir is not None else Path(".amapreduce-cache")
    index_dir = base / f"sandbox-index-{_pages_digest(pages)}" / INDEX_NAME
    with _LOCK:
        if not (index_dir / "manifest.json").is_file():
            build_corpus_index([pages], index_dir, name=INDEX_NAME)
    return SandboxWorld(
        pages_dir=pages, index_dir=index_dir, tasks_file=WORLD_DIR / "tasks.jsonl",
        gold_dir=WORLD_DIR / "gold", lookups_file=WORLD_DIR / "lookups.jsonl",
    )
