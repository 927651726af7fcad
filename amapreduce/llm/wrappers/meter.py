"""The meter layer: each call counted in flight while it waits, then its usage priced and charged by role.

The provider's usage when it reports one (cached prompt tokens included, `cached_tokens`), else
the prompt's estimate and the reply's (a call given up on the wire, `RequestCancelled`: its prompt's
estimate, counted `abandoned`); charged to the run's meter (and so to every open usage
scope: the batch attempt's usage is what the meter charged for it) and written into the call's
log for the trace layer above. A call of a run that may hedge also counts towards the base of
the run's share of extra calls (`hedge.ExtraCalls.count_call`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from smolagents.models import ChatMessage, Model

from amapreduce.llm.hedge import RequestCancelled
from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.scope import scope_extra_calls
from amapreduce.llm.usage import Usage
from amapreduce.llm.wrappers.base import WrapperModel, call_log, reply_usage

__all__ = ["MeterModel", "cached_tokens"]


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def cached_tokens(raw: Any) -> int:
    """Prompt tokens served from the provider's cache, read from a raw reply (0 when not reported).

    smolagents' `TokenUsage` has no cached count, so it comes from the provider's own usage
    object: OpenAI, LiteLLM and vLLM (with prefix caching) report
    `usage.prompt_tokens_details.cached_tokens`, Anthropic `usage.cache_read_input_tokens`, and
    llama.cpp's own server (`llama-server`) the prompt tokens it took from its KV cache as
    `timings.cache_n`. All count them inside the prompt tokens (LiteLLM adds Anthropic's cache reads
    to `prompt_tokens`), which is how `PriceTable.cost` prices them. (llama-cpp-python's server
    reuses its cache too, "prefix-match hit" in its log, but reports nothing of it: 0.)
    """
    usage = _field(raw, "usage")
    timings = _field(raw, "timings")
    found = (
        _field(_field(usage, "prompt_tokens_details"), "cached_tokens") if usage is not None else None,
        _field(usage, "cache_read_input_tokens") if usage is not None else None,
        _field(timings, "cache_n") if timings is not None else None,
    )
    return next((value for value in found if isinstance(value, int) and not isinstance(value, bool) and value > 0), 0)


class MeterModel(WrapperModel):
    """Charges each call's usage to `meter` under `role`."""

    def __init__(self, wrapped: Model, *, meter: UsageMeter, role: str) -> None:
        super().__init__(wrapped)
        self.meter = meter
        self.role = role

    def generate(self, messages: list[ChatMessage], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        with call_log() as log:
            waiting = self.meter.call_started(time.monotonic())
            try:
                reply = super().generate(messages, stop_sequences, response_format, tools_to_call_from, **kwargs)
            except Exception as exc:
                if isinstance(exc, RequestCancelled) or isinstance(exc.__cause__, RequestCancelled):
                    # given up on the wire with its attempt (the retry layer wraps it): charged as sent
                    log.usage = self.meter.record(self.role, self.model_id or "unknown", Usage(
                        requests=1, input_tokens=log.prompt_tokens(messages), abandoned=1))  # `Usage.abandoned`
                raise
            finally:
                self.meter.call_ended(waiting)
            usage = reply_usage(reply, log, messages, cached_tokens(reply.raw))
            extra = scope_extra_calls()
            if extra is not None:  # a call of a run that may hedge: the base of its share of late calls
                extra.count_call()
            log.usage = self.meter.record(self.role, self.model_id or "unknown", usage)
        return reply
