"""Fault injection of the simulated model: seeded, per call, and classified like real failures."""

from __future__ import annotations

import pytest

from amapreduce.demo.faults import FAULT_KINDS, FaultPlan, SimulatedFailure
from amapreduce.llm.retry import classify


def test_draws_depend_on_seed_key_and_try_only() -> None:
    keys = [f"subagent|batch{i}|0" for i in range(400)]
    a, b = FaultPlan(rate=0.3, seed=7), FaultPlan(rate=0.3, seed=7)
    first = [a.draw(k, FAULT_KINDS) for k in keys]
    assert first == [b.draw(k, FAULT_KINDS) for k in reversed(keys)][::-1]  # order of calls does not matter
    assert 0.2 < sum(f is not None for f in first) / len(keys) < 0.4
    assert set(first) - {None} == set(FAULT_KINDS)
    retried = [a.draw(k, FAULT_KINDS) for k in keys]  # the same calls again: fresh draws
    assert retried != first
    assert [FaultPlan(rate=0.3, seed=8).draw(k, FAULT_KINDS) for k in keys] != first
    assert FaultPlan(rate=0.0).draw("k", FAULT_KINDS) is None


def test_call_faults_look_like_provider_failures() -> None:
    plan = FaultPlan(rate=1.0, retry_after_s=0.05)
    from amapreduce.llm.chat_client import RateLimitError

    with pytest.raises(RateLimitError) as caught:
        plan.apply("rate_limit")
    transient = classify(caught.value)
    assert transient is not None and transient.kind == "rate_limit" and transient.retry_after_s == 0.05
    with pytest.raises(SimulatedFailure) as failed:
        plan.apply("error")
    assert classify(failed.value) is None  # permanent: the attempt fails and the engine retries the batch
    plan.apply("slow")
    plan.apply(None)


def test_rate_must_be_a_probability() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        FaultPlan(rate=1.5)
