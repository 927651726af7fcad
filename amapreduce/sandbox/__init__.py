"""The bundled sandbox world: an offline mini-web with wide-search tasks and gold tables.

`sandbox_world()` returns the paths of everything a test, the offline demo or `amapreduce eval`
needs; `sandbox_families()` says which question family each task belongs to (the families differ
in how many attributes a row asks, so a learning curve or a batch-size study groups by them).
The pages, tasks and gold CSVs are committed (built by `python -m amapreduce.sandbox.build` from a
pinned GeoNames package); only the search index is built here, on first use, because a binary
index does not belong in git. Building it takes well under a second.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from amapreduce.errors import UserError

__all__ = ["INDEX_NAME", "WORLD_DIR", "SandboxWorld", "benchmark_order", "sandbox_families", "sandbox_world"]

INDEX_NAME = "sandbox"
WORLD_DIR = Path(__file__).resolve().parent / "world"
_LOCK = threading.Lock()


class SandboxWorld(BaseModel):
    """Paths of the sandbox world."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pages_dir: Path
    """The HTML pages (indexed as `corpus://sandbox/<path>`)."""
    index_dir: Path
    """The corpus index: use it as `--search corpus:<index_dir>`."""
    tasks_file: Path
    """WideSearch-format task lines (`instance_id`, `query`, `evaluation`, `language`)."""
    gold_dir: Path
    """Gold tables, `<instance_id>.csv`."""
    lookups_file: Path
    """(query, expected entity URL) pairs used by the retrieval-quality tests."""
    families_file: Path
    """`{"<instance_id>": "<family>"}` for every task, in task order (kept out of `tasks_file`,
    which stays strictly in the WideSearch format)."""
    discovery_tasks_file: Path = WORLD_DIR / "discovery_tasks.jsonl"
    """The discovery-heavy tasks (`sbx_disc_*`, WideSearch format; `amapreduce.sandbox.discovery`),
    kept out of `tasks_file` so the sandbox benchmark does not run them by default."""
    discovery_gold_dir: Path = WORLD_DIR / "discovery_gold"
    """Gold tables of the discovery tasks, `<instance_id>.csv`."""
    enrich_tasks_file: Path = WORLD_DIR / "enrich_tasks.jsonl"
    """The enrichment tasks (`sbx_enrich_*`, WideSearch format plus an `enrich` field: the input
    list, the columns to add, the key; `amapreduce.sandbox.enrichment`)."""
    enrich_dir: Path = WORLD_DIR / "enrich"
    """The enrichment tasks' input lists, `<instance_id>.csv`."""
    enrich_gold_dir: Path = WORLD_DIR / "enrich_gold"
    """Gold tables of the enrichment tasks, `<instance_id>.csv`."""


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
        families_file=WORLD_DIR / "families.json",
    )


_FAMILIES = TypeAdapter(dict[str, str])


def sandbox_families(world: SandboxWorld) -> dict[str, str]:
    """The question family of each sandbox task (`{"sbx_en_001": "profile", ...}`), in task order.

    Raises:
        UserError: the families file is unreadable, malformed, or does not name exactly the tasks
            of `world.tasks_file` (a hand-edited or half-built world: rebuild it).
    """
    rebuild = "rebuild the world with `python -m amapreduce.sandbox.build`"
    try:
        families = _FAMILIES.validate_json(world.families_file.read_bytes())
        lines = world.tasks_file.read_text(encoding="utf-8").splitlines()
        task_ids = [json.loads(line)["instance_id"] for line in lines if line.strip()]
    except (OSError, ValidationError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"cannot read the sandbox task families ({world.families_file}): {exc}; {rebuild}.") from exc
    if list(families) != task_ids:
        missing, extra = sorted(set(task_ids) - set(families)), sorted(set(families) - set(task_ids))
        raise UserError(f"{world.families_file} does not list the tasks of {world.tasks_file} in order "
                        f"(missing {missing}, unknown {extra}); {rebuild}.")
    return families


def benchmark_order(families: dict[str, str]) -> list[str]:
    """The task ids of `families` (as `sandbox_families` returns them) round-robin across families:
    one task of each family per round, families in order of their first task, each family's tasks
    in file order. The ids after `sbx_en_042` are a second generation of families appended to the
    file, so file order would put them all in the second half of a learning curve; in this order
    every family has tasks in both halves."""
    queues: dict[str, list[str]] = {}
    for iid, family in families.items():
        queues.setdefault(family, []).append(iid)
    out: list[str] = []
    while any(queues.values()):
        out += [queue.pop(0) for queue in queues.values() if queue]
    return out
