"""The sandbox's enrichment tasks in the demo: the given list read and the columns asked, as a user
of `amapreduce enrich` gives them.

The simulated model (`demo.model`, deterministic code, not an LLM) answers them as any sandbox
batch: each sub-question quotes its row's key (`Country "Aruba"`), which it searches and reads
through the real tools; it never sees the gold.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amapreduce.errors import UserError

if TYPE_CHECKING:
    from amapreduce.enrichment.request import EnrichRequest
    from amapreduce.sandbox import SandboxWorld
    from amapreduce.settings import Settings

__all__ = ["enrich_command", "enrich_spec", "enrich_task_ids", "sandbox_request"]


def enrich_task_ids(world: SandboxWorld) -> list[str]:
    """The enrichment tasks' ids, in file order."""
    lines = world.enrich_tasks_file.read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["instance_id"] for line in lines if line.strip()]


def enrich_spec(task_id: str, world: SandboxWorld) -> dict[str, Any]:
    """The `enrich` field of task `task_id`: `input` (relative to the world), `columns`, `key_columns`.

    Raises:
        UserError: `task_id` is not an enrichment task, or its line is damaged.
    """
    for line in world.enrich_tasks_file.read_text(encoding="utf-8").splitlines():
        item = json.loads(line) if line.strip() else {}
        if item.get("instance_id") == task_id:
            spec = item.get("enrich")
            if not isinstance(spec, dict) or not {"input", "columns", "key_columns"} <= spec.keys():
                raise UserError(f"the enrichment task {task_id!r} is damaged; rebuild the sandbox world.")
            return spec
    raise UserError(f"{task_id!r} is not a sandbox enrichment task; they are {', '.join(enrich_task_ids(world))}.")


def enrich_command(task_id: str, world: SandboxWorld, base_url: str) -> str:
    """The `amapreduce enrich` command line that runs task `task_id` against the endpoint at `base_url`
    (`demo --serve`)."""
    from amapreduce.demo.serve import SERVED_MODEL_NAME

    spec = enrich_spec(task_id, world)
    listed = (world.enrich_tasks_file.parent / spec["input"]).resolve()
    return ("AMAPREDUCE_EXTRACTION_MODEL=none amapreduce enrich " + shlex.quote(str(listed))
            + " --columns " + shlex.quote(", ".join(spec["columns"]))
            + "".join(f" --key {shlex.quote(k)}" for k in spec["key_columns"])
            + f" --model {SERVED_MODEL_NAME} --api-base {base_url} --search corpus:{Path(world.index_dir).resolve()}")


def sandbox_request(task_id: str, world: SandboxWorld, settings: Settings) -> EnrichRequest:
    """The request of enrichment task `task_id`: its input list, columns and key (its `enrich` field).

    Raises:
        UserError: `task_id` is not an enrichment task, or its line or list is damaged.
    """
    from amapreduce.enrichment import EnrichRequest, read_list

    spec = enrich_spec(task_id, world)
    frame = read_list(world.enrich_tasks_file.parent / spec["input"], max_mb=settings.enrich_max_file_mb)
    return EnrichRequest.of(frame, list(spec["columns"]), key_columns=list(spec["key_columns"]), label=task_id)
