"""The sandbox's enrichment tasks in the demo: the given list read and the columns asked, as a user
of `amapreduce enrich` gives them.

The simulated model (`demo.model`, deterministic code, not an LLM) answers them as any sandbox
batch: each sub-question quotes its row's key (`Country "Aruba"`), which it searches and reads
through the real tools; it never sees the gold.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from amapreduce.errors import UserError

if TYPE_CHECKING:
    from amapreduce.enrichment.request import EnrichRequest
    from amapreduce.sandbox import SandboxWorld
    from amapreduce.settings import Settings

__all__ = ["enrich_task_ids", "sandbox_request"]


def enrich_task_ids(world: SandboxWorld) -> list[str]:
    """The enrichment tasks' ids, in file order."""
    lines = world.enrich_tasks_file.read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["instance_id"] for line in lines if line.strip()]


def sandbox_request(task_id: str, world: SandboxWorld, settings: Settings) -> EnrichRequest:
    """The request of enrichment task `task_id`: its input list, columns and key (its `enrich` field).

    Raises:
        UserError: `task_id` is not an enrichment task, or its line or list is damaged.
    """
    from amapreduce.enrichment import EnrichRequest, read_list

    for line in world.enrich_tasks_file.read_text(encoding="utf-8").splitlines():
        item = json.loads(line) if line.strip() else {}
        if item.get("instance_id") != task_id:
            continue
        try:
            spec = item["enrich"]
            frame = read_list(world.enrich_tasks_file.parent / spec["input"], max_mb=settings.enrich_max_file_mb)
            return EnrichRequest.of(frame, list(spec["columns"]), key_columns=list(spec["key_columns"]), label=task_id)
        except (KeyError, TypeError) as exc:
            raise UserError(f"the enrichment task {task_id!r} is damaged ({exc}); rebuild the sandbox world.") from None
    raise UserError(f"{task_id!r} is not a sandbox enrichment task; they are {', '.join(enrich_task_ids(world))}.")
