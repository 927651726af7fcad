"""Token and request usage, added up per attempt, batch and run."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Usage"]


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Requests, tokens and dollars spent; instances add up with `+`."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            requests=self.requests + other.requests,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
        )

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def to_json(self) -> dict[str, Any]:
        """Plain JSON fields."""
        return asdict(self)
