"""Scripted batch solvers for engine tests: a small deterministic 'world' with fault injection.

Randomness is seeded per (batch id, attempt), so outcomes do not depend on thread scheduling.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from amapreduce.errors import SolverError
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.solver import BatchRequest, SolverReply

ENTITY = re.compile(r"\[\[(.+?)\]\]")


def rng_for(*parts: object) -> random.Random:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


class WorldSolver:
    """Answers sub-questions whose text names an entity as `[[name]]` from `truth`.

    Args:
        truth: entity → column → value.
        fail_rate: chance an attempt crashes or returns unreadable text.
        drop_rate: chance each cell is returned empty.
        sleep: (min, max) seconds to sleep per attempt (random completion order).
        seed: mixes into every random draw.
        hook: called with each request before answering (for tests that cancel or inspect).
    """

    def __init__(
        self,
        truth: Mapping[str, Mapping[str, str]],
        *,
        fail_rate: float = 0.0,
        drop_rate: float = 0.0,
        sleep: tuple[float, float] = (0.0, 0.0),
        seed: int = 0,
        hook: Callable[[BatchRequest], None] | None = None,
    ) -> None:
        self.truth = truth
        self.fail_rate = fail_rate
        self.drop_rate = drop_rate
        self.sleep = sleep
        self.seed = seed
        self.hook = hook
        self.requests: list[BatchRequest] = []
        self._lock = threading.Lock()

    def solve(self, request: BatchRequest) -> SolverReply:
        with self._lock:
            self.requests.append(request)
        if self.hook is not None:
            self.hook(request)
        rng = rng_for(self.seed, request.batch_id, request.attempt)
        if self.sleep[1] > 0:
            time.sleep(rng.uniform(*self.sleep))
        roll = rng.random()
        if roll < self.fail_rate / 2:
            raise SolverError("simulated sub-agent crash")
        if roll < self.fail_rate:
            return SolverReply(output="I am sorry, the search failed.", usage=Usage(requests=1, input_tokens=50))
        rows = []
        wanted = [c.name for c in request.column_specs]
        for number, task in enumerate(request.tasks, 1):
            name = ENTITY.search(task).group(1)  # type: ignore[union-attr]
            facts = self.truth.get(name, {})
            row: dict[str, Any] = {"task": number, "source": f"https://world.example/{name}"}
            for col in wanted:
                row[col] = "" if rng.random() < self.drop_rate else facts.get(col, "")
            rows.append(row)
        return SolverReply(output=json.dumps(rows), usage=Usage(requests=1, input_tokens=100, output_tokens=20 * len(rows)))


def world(n: int) -> dict[str, dict[str, str]]:
    return {f"E{i:03d}": {"name": f"E{i:03d}", "capital": f"City{i}", "population": str(1000 + i)} for i in range(n)}


def world_decision(truth: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "task_matrix": [[name] for name in truth],
        "template": "Find the capital and population of [[__0__]].",
        "json_schema": {"type": "object", "properties": {"name": {}, "capital": {}, "population": {}}},
        **extra,
    }
