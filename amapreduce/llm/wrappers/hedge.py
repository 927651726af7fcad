"""The hedge layer: a late request of an OpenAI-compatible client gets a hedge, charged like any call.

The hedging itself happens in our chat client (`llm.chat_client`, `llm.hedge.Hedger`): this layer
installs a hedger on it and answers its two questions. May a late request get a hedge
(`may_hedge`)? Only inside a run's attempt whose extra-call budget has room, not cancelled, and
when every layer below has room for one more request (`has_room_for`: the budget, the breaker,
the provider's slow-down, the limiter); the hedge then takes a limiter ticket. What did a hedged
call cost (`hedged`)? Each losing request is charged to the meter (its reply's usage, or for a
cancelled one its prompt's estimate) and the hedge is traced (`model_hedge`). Outermost, so its
room is the whole stack's; its `generate` is the stack's.
"""

from __future__ import annotations

from typing import Any

from smolagents.models import Model

from amapreduce.llm.events import ModelHedged
from amapreduce.llm.hedge import HedgeOutcome, Hedger
from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.scope import scope_cancelled, scope_extra_calls
from amapreduce.llm.usage import Usage
from amapreduce.llm.wrappers.base import WrapperModel, innermost
from amapreduce.llm.wrappers.trace import CallEvents, describe_text
from amapreduce.ratelimit import WindowGate

__all__ = ["HedgeModel"]


class HedgeModel(WrapperModel):
    """Installs a `Hedger` on the client at the bottom of `wrapped` when it takes one (our
    `ChatCompletionsClient`, whose `hedger` starts None); other clients are left as they are.

    Args:
        wrapped: the rest of the stack.
        meter: charged for each losing request, under `events.role`.
        limiter: the provider's limiter a hedge takes its ticket from (None: unlimited).
        events: where `model_hedge` events go.
    """

    def __init__(self, wrapped: Model, *, meter: UsageMeter, limiter: WindowGate | None, events: CallEvents) -> None:
        super().__init__(wrapped)
        self.meter = meter
        self.limiter = limiter
        self.events = events
        client: Any = getattr(innermost(wrapped), "client", None)
        if getattr(client, "hedger", False) is None:  # our OpenAI-compatible client (`llm.chat_client`)
            client.hedger = Hedger(admit=self.may_hedge, report=self.hedged)

    def may_hedge(self, request_bytes: int, again: bool, overdue: float = 1.0) -> bool:
        """Whether a late request of the call in this context may get its hedge (see the module doc)."""
        extra = scope_extra_calls()
        estimate = max(1, request_bytes // 4)
        if extra is None or scope_cancelled() or not self.has_room_for(Usage(requests=1, input_tokens=estimate)):
            return False
        if not extra.take_hedge(again=again, overdue=overdue):
            return False
        if self.limiter is not None:
            self.limiter.acquire(estimate)
        return True

    def hedged(self, outcome: HedgeOutcome[Any]) -> None:
        """Charge each request that lost a hedged call and trace the hedge (`model_hedge`)."""
        total = Usage()
        kinds: list[str] = []
        for loser in outcome.losers:
            used = getattr(loser, "usage", None)
            usage = Usage(
                requests=1,
                input_tokens=int(getattr(used, "prompt_tokens", None) or max(1, outcome.request_bytes // 4)),
                output_tokens=int(getattr(used, "completion_tokens", None) or 0),
                abandoned=0 if used is not None else 1,  # cancelled: its prompt's estimate (`Usage.abandoned`)
            )
            total = total + self.meter.record(self.events.role, self.model_id or "unknown", usage)
            kinds.append("answered" if used is not None else "cancelled")
        events = self.events
        events.emit(ModelHedged(role=events.role, model_id=events.model_id, labels=events.labels(), winner=outcome.winner,
                                hedges=outcome.hedges, after_s=round(outcome.after_s, 6),
                                threshold_s=round(outcome.threshold_s, 6), losers=tuple(kinds), usage=total.to_json(),
                                hedge_error=describe_text(outcome.hedge_error)))
