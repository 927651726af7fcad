"""Seeded fault injection for the simulated model: the failures a real provider and model produce.

Kinds: `error` (the call fails for good, so the sub-agent attempt fails and the engine retries
the batch), `rate_limit` (an HTTP 429 with `Retry-After`, retried by the model layer), `slow`
(the call takes longer), `malformed` (the final answer is not clean JSON) and `drop` (the final
answer leaves some cells empty, which delta-patch rounds fill). Apart from them, `wrong_values`
makes a share of a sub-agent's cells plausible but wrong, each with a made-up quote, and keeps the
record of every cell it corrupted (`wrong_cells`), so the catch rate of the quote check
(`table.evidence`) is measured offline from the record, never from the gold.

Why draws are keyed by the conversation and not by a global counter: which thread runs which
batch first changes between runs, so a counter would move faults around; a draw keyed by (seed,
conversation, step, try) puts the same faults on the same calls every time.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from amapreduce.errors import RunError

__all__ = ["FAULT_KINDS", "FaultPlan", "SimulatedFailure", "WrongCell", "rate_limit_error"]

FAULT_KINDS = ("error", "rate_limit", "slow", "malformed", "drop")


class SimulatedFailure(RunError):
    """A call the fault plan made fail (not transient: the model layer does not retry it)."""


def rate_limit_error(retry_after_s: float) -> Exception:
    """A `RateLimitError` (HTTP 429) carrying a `Retry-After` header, as an `--api-base` provider's
    client raises it (`amapreduce.llm.chat_client`)."""
    import httpx

    from amapreduce.llm.chat_client import RateLimitError

    response = httpx.Response(
        429, headers={"retry-after": f"{retry_after_s:g}"}, json={"error": {"message": "rate limited (simulated fault)"}},
        request=httpx.Request("POST", "http://127.0.0.1/v1/chat/completions"),
    )
    return RateLimitError(response)


@dataclass(frozen=True)
class WrongCell:
    """A cell the simulated sub-agent answered wrong on purpose: the page it claimed, the column,
    and the wrong value."""

    source: str
    column: str
    value: str


@dataclass
class FaultPlan:
    """Which calls fail and how, decided by seeded draws.

    Args:
        rate: chance that a call gets a fault (0 disables injection).
        seed: mixes into every draw.
        retry_after_s: the `Retry-After` of simulated 429s.
        slow_s: extra seconds of a slow call.
        wrong_values: chance that a sub-agent's answered cell is made wrong, with a made-up quote.
    """

    rate: float = 0.0
    seed: int = 0
    retry_after_s: float = 0.05
    slow_s: float = 0.05
    wrong_values: float = 0.0
    wrong_cells: set[WrongCell] = field(default_factory=set)
    """Every cell made wrong (a retried answer repeats its draws, so a set)."""
    injected: Counter[str] = field(default_factory=Counter)
    _tries: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        for name, share in (("fault rate", self.rate), ("wrong-value rate", self.wrong_values)):
            if not 0.0 <= share <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {share}")

    def draw(self, key: str, kinds: tuple[str, ...]) -> str | None:
        """The fault of this call (None: none). Each retry of the same call draws anew."""
        if self.rate <= 0 or not kinds:
            return None
        with self._lock:
            self._tries[key] += 1
            tries = self._tries[key]
        digest = hashlib.sha256(f"{self.seed}|{key}|{tries}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        if rng.random() >= self.rate:
            return None
        kind = rng.choice(kinds)
        with self._lock:
            self.injected[kind] += 1
        return kind

    def apply(self, kind: str | None) -> None:
        """Raise or wait for the call-level kinds (`error`, `rate_limit`, `slow`)."""
        if kind == "error":
            raise SimulatedFailure("simulated fault: the model call failed", kind="simulated")
        if kind == "rate_limit":
            raise rate_limit_error(self.retry_after_s)
        if kind == "slow":
            time.sleep(self.slow_s)

    def wrong(self, cell: WrongCell) -> None:
        """Record a cell made wrong."""
        with self._lock:
            if cell not in self.wrong_cells:
                self.wrong_cells.add(cell)
                self.injected["wrong_value"] += 1

    @staticmethod
    def rng(*parts: object) -> random.Random:
        """A deterministic generator for the details of a fault (which cells to drop)."""
        digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))
