"""Model factory, managed calls, usage by role, prices and budgets."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from amapreduce.errors import BudgetExceeded, ConfigError
from amapreduce.llm.meter import Budget, Price, PriceTable, UsageMeter
from amapreduce.llm.models import ManagedModel, ModelSpec, build_model, is_reasoning_model, provider_of
from amapreduce.llm.retry import RetryPolicy
from amapreduce.llm.usage import Usage
from amapreduce.testing.scripted import SIMULATED_PRICES, FunctionModel, ModelInfo, final_answer

PRICES = PriceTable({"test-model": Price(input=1e-6, output=2e-6, cached_input=5e-7)}, use_litellm=False)


def test_reasoning_models_and_providers() -> None:
    assert is_reasoning_model("openai/gpt-5-mini") and is_reasoning_model("o3") and is_reasoning_model("deepseek-r1")
    assert not is_reasoning_model("openai/gpt-4o-mini") and not is_reasoning_model("ollama/llama3.1")
    assert provider_of(ModelSpec(model_id="anthropic/claude-x")) == "anthropic"
    assert provider_of(ModelSpec(model_id="m", api_base="http://127.0.0.1:8000/v1")) == "127.0.0.1:8000"


def test_openai_compatible_endpoint_params() -> None:
    meter = UsageMeter(prices=PRICES)
    m = build_model(ModelSpec(model_id="gpt-4o-mini", api_base="http://127.0.0.1:9/v1", temperature=0.2, max_tokens=50), role="manager", meter=meter)
    assert m.inner.kwargs == {"temperature": 0.2, "max_tokens": 50}
    r = build_model(ModelSpec(model_id="gpt-5-mini", api_base="http://127.0.0.1:9/v1", max_tokens=50), role="subagent", meter=meter)
    assert r.inner.kwargs == {}  # reasoning models get no sampling parameters
    # one retry policy, ours: smolagents' retryer is off and the client (ours, not the openai SDK's) has none
    assert m.inner.retryer.max_attempts == 1 and type(m.inner.client).__name__ == "ChatCompletionsClient"


def test_unprefixed_model_without_api_base_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="needs a provider prefix"):
        build_model(ModelSpec(model_id="gpt-4o"), role="manager", meter=UsageMeter())
    with pytest.raises(ConfigError, match="unknown model role 'boss'"):
        build_model(ModelSpec(model_id="openai/gpt-4o"), role="boss", meter=UsageMeter())


def test_litellm_model_builds_offline() -> None:
    m = build_model(ModelSpec(model_id="openai/gpt-4o-mini", api_key="sk-test"), role="judge", meter=UsageMeter())
    assert type(m.inner).__name__ == "LiteLLMModel"
    assert m.inner.retryer.max_attempts == 1


def test_usage_by_role_and_cost() -> None:
    meter = UsageMeter(prices=PRICES)
    inner = FunctionModel(lambda msgs, info: final_answer("x"), model_id="test-model")
    m = build_model(ModelSpec(model_id="test-model", api_base="http://unused"), role="subagent", meter=meter, inner=inner)
    m.generate([])
    m.generate([])
    used = meter.by_role()["subagent"]
    assert used.requests == 2 and used.output_tokens > 0
    assert used.cost_usd == pytest.approx(used.input_tokens * 1e-6 + used.output_tokens * 2e-6)
    assert PRICES.cost("test-model", Usage(input_tokens=100, cached_tokens=40, output_tokens=10)) == pytest.approx(60e-6 + 40 * 5e-7 + 20e-6)


def test_litellm_price_map_is_used_offline() -> None:
    price = PriceTable().price("openai/gpt-4o-mini")
    assert price is not None and price.input > 0
    assert PriceTable().price("made-up/model-x") is None
    assert PriceTable(use_litellm=False, by_prefix=SIMULATED_PRICES).price("simulated/sandbox") == Price(input=0.0, output=0.0)
    assert PriceTable(use_litellm=False).price("simulated/sandbox") is None  # the meter itself knows no simulated ids


def test_budget_stops_calls() -> None:
    meter = UsageMeter(budget=Budget(max_tokens=20), prices=PRICES)
    inner = FunctionModel(lambda msgs, info: "a reply of some length, enough tokens to matter here", model_id="test-model")
    m = ManagedModel(inner, role="manager", meter=meter)
    m.generate([])
    m.generate([])
    with pytest.raises(BudgetExceeded, match="token budget of 20 is spent"):
        m.generate([])


def test_managed_model_retries_rate_limits() -> None:
    request = httpx.Request("POST", "http://127.0.0.1:1/v1")
    failures = [openai.RateLimitError("slow down", response=httpx.Response(429, headers={"retry-after": "3"}, request=request), body=None)]

    def reply(msgs: list, info: ModelInfo) -> object:
        if failures:
            raise failures.pop()
        return final_answer("done")

    slept: list[float] = []
    m = ManagedModel(FunctionModel(reply), role="manager", meter=UsageMeter(prices=PRICES), retry=RetryPolicy(jitter=0), sleep=slept.append)
    assert m.generate([]).tool_calls[0].function.arguments == {"answer": "done"}
    assert slept == [3.0]


def test_price_overrides_file_feeds_the_run_meter(tmp_path: Path) -> None:
    from amapreduce.errors import ConfigError
    from amapreduce.llm.factory import new_meter
    from amapreduce.settings import load_settings

    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"my-local-model": {"input": 1e-6, "output": 3e-6}}), encoding="utf-8")
    meter = new_meter(load_settings({}, prices_file=prices, max_cost_usd=1.0))
    assert meter.record("manager", "my-local-model", Usage(input_tokens=1000, output_tokens=100)).cost_usd == pytest.approx(1.3e-3)
    prices.write_text(json.dumps({"m": {"input": -1, "output": 0}}), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"price of 'm' .* input Input should be greater than or equal to 0"):
        new_meter(load_settings({}, prices_file=prices))
    with pytest.raises(ConfigError, match="does not exist"):
        new_meter(load_settings({}, prices_file=tmp_path / "nope.json"))
