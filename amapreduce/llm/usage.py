"""Token and request usage, added up per attempt, batch and run.

One vocabulary for usage in every JSON amapreduce writes (`result.json`, the `--json` outputs,
an evaluation's `results.json`, `model_call` trace events): OpenAI's `prompt_tokens`,
`completion_tokens` and `cached_tokens`. `Usage.to_json` is the one place that spelling is made
and `Usage.from_json` the one place it is read back (it also reads the `input_tokens` /
`output_tokens` of run folders written before 0.4). In code the fields keep the names of
smolagents' `TokenUsage`, which every model call reports them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
    abandoned: int = 0
    """Of `requests`, those given up on the wire (a hedged call's cancelled copy, the call of an attempt the
    engine abandoned): each is charged its prompt's estimate and no completion, since a hosted API bills
    the prompt of a request it received though its client closed the connection (an upper bound: the
    server may not have read it), and a budget must not count less than was spent."""

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            requests=self.requests + other.requests,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            abandoned=self.abandoned + other.abandoned,
        )

    @classmethod
    def of_reply(cls, reply: Any, requests: int = 1) -> Usage:
        """The usage of `requests` calls that ended in `reply` (a smolagents `ChatMessage`, whose
        `token_usage` may be None: no tokens counted)."""
        used = getattr(reply, "token_usage", None)
        return cls(requests=requests, input_tokens=used.input_tokens if used else 0,
                   output_tokens=used.output_tokens if used else 0)

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def to_json(self) -> dict[str, Any]:
        """The JSON form: `requests`, `prompt_tokens`, `completion_tokens`, `cached_tokens`, `cost_usd`,
        `abandoned`."""
        return {
            "requests": self.requests,
            "prompt_tokens": self.input_tokens,
            "completion_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "cost_usd": self.cost_usd,
            "abandoned": self.abandoned,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Usage:
        """Read `to_json`'s form back (or the older `input_tokens`/`output_tokens` spelling).

        Missing, negative or non-numeric counts read as 0, and a null `cost_usd` (unpriced) as
        0.0: callers that must tell unpriced from free read `cost_usd` themselves.
        """

        def count(*keys: str) -> int:
            for key in keys:
                value = data.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                    return value
            return 0

        cost = data.get("cost_usd")
        return cls(
            requests=count("requests"),
            input_tokens=count("prompt_tokens", "input_tokens"),
            output_tokens=count("completion_tokens", "output_tokens"),
            cached_tokens=count("cached_tokens"),
            cost_usd=float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else 0.0,
            abandoned=count("abandoned"),
        )
