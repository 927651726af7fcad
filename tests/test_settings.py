"""Settings: environment and overrides enter in one place, with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from amapreduce.errors import ConfigError
from amapreduce.settings import load_settings


def test_defaults_with_empty_environment() -> None:
    s = load_settings({})
    assert s.workers == 8
    assert s.max_batches == 50
    assert s.max_tool_calls == 4
    assert s.memory_store == Path("memory_store/default")


def test_environment_then_overrides() -> None:
    s = load_settings({"AMAPREDUCE_WORKERS": "16", "AMAPREDUCE_PATCH_ROUNDS": "1"}, workers=4, max_attempts=None)
    assert s.workers == 4  # override wins
    assert s.patch_rounds == 1  # environment wins over default
    assert s.max_attempts == 3  # None override ignored


def test_invalid_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"`AMAPREDUCE_WORKERS`.*got '0'"):
        load_settings({"AMAPREDUCE_WORKERS": "0"})


def test_invalid_override_is_reported_by_the_flag_it_comes_from() -> None:
    with pytest.raises(ConfigError, match=r"^--workers is invalid \(setting `workers`\): .*got -1\.$"):
        load_settings({}, workers=-1)
    with pytest.raises(ConfigError, match=r"^--search is invalid \(setting `search_backend`\)"):
        load_settings({}, search_backend=12)


def test_max_batches_caps_user_decisions_only_when_set_explicitly() -> None:
    """The paper's 50 caps plans a manager writes; a user's own decision is capped only on request."""
    default = load_settings({})
    assert (default.batch_cap("manager"), default.batch_cap("user")) == (50, None)
    from_env = load_settings({"AMAPREDUCE_MAX_BATCHES": "120"})
    assert (from_env.batch_cap("manager"), from_env.batch_cap("user")) == (120, 120)
    flag_wins = load_settings({"AMAPREDUCE_MAX_BATCHES": "120"}, max_batches=7)
    assert (flag_wins.batch_cap("manager"), flag_wins.batch_cap("user")) == (7, 7)
    assert load_settings({}, max_batches=50).batch_cap("user") == 50  # the default value, but asked for


def test_engine_config_defaults_are_the_settings_defaults() -> None:
    from amapreduce.mapreduce.engine import EngineConfig

    settings, config = load_settings({}), EngineConfig()
    for name in ("workers", "max_attempts", "batch_timeout_s", "patch_rounds", "max_batches"):
        assert getattr(config, name) == getattr(settings, name), name


def test_engine_config_from_settings() -> None:
    from amapreduce.mapreduce.engine import EngineConfig

    settings = load_settings(
        {"AMAPREDUCE_WORKERS": "32", "AMAPREDUCE_MAX_ATTEMPTS": "4", "AMAPREDUCE_BATCH_TIMEOUT_S": "60",
         "AMAPREDUCE_PATCH_ROUNDS": "0"}
    )
    config = EngineConfig.from_settings(settings, decisions_by="user")
    assert (config.workers, config.max_attempts, config.batch_timeout_s, config.patch_rounds) == (32, 4, 60.0, 0)
    assert config.max_batches is None
    assert EngineConfig.from_settings(settings, decisions_by="manager").max_batches == 50


def test_retry_policy_defaults_are_the_retry_loops() -> None:
    from amapreduce._retry import RetryPolicy

    assert load_settings({}).model_retry_policy() == RetryPolicy()


def test_retry_environment_reaches_the_models_policy() -> None:
    from amapreduce._retry import RetryPolicy
    from amapreduce.llm.factory import build_role_model, new_meter
    from amapreduce.testing.scripted import FunctionModel, final_answer

    settings = load_settings(
        {"AMAPREDUCE_RETRY_MAX_RETRIES": "9", "AMAPREDUCE_RETRY_BASE_DELAY_S": "0.5", "AMAPREDUCE_RETRY_MAX_DELAY_S": "7"}
    )
    model = build_role_model(
        settings, "subagent", "sim-model", meter=new_meter(settings),
        inner=FunctionModel(lambda messages, info: final_answer("x"), model_id="sim-model"),
    )
    assert model.retry == RetryPolicy(max_retries=9, base_delay_s=0.5, max_delay_s=7.0)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AMAPREDUCE_RETRY_MAX_RETRIES", "-1"),
        ("AMAPREDUCE_RETRY_MAX_RETRIES", "many"),
        ("AMAPREDUCE_RETRY_BASE_DELAY_S", "-0.5"),
        ("AMAPREDUCE_RETRY_MAX_DELAY_S", "inf"),
        ("AMAPREDUCE_MAX_BATCHES", "0"),
    ],
)
def test_invalid_limit_names_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"`{variable}`.*got '{value}'"):
        load_settings({variable: value})


def test_a_run_caps_the_batch_plan_by_who_writes_its_decisions(tmp_path: Path) -> None:
    """`ask` (a manager in the run) keeps the paper's 50; `mapreduce run` (no manager) runs the user's decision uncapped."""
    from amapreduce.session import RunOptions, Session
    from amapreduce.session.journal import RunKind
    from amapreduce.testing.scripted import FunctionModel, final_answer

    settings = load_settings({}, model="sim-model", runs_dir=tmp_path / "runs")

    def inner(role: str) -> FunctionModel:
        return FunctionModel(lambda messages, info: final_answer("x"), model_id="sim-model")

    def cap(kind: RunKind) -> int | None:
        with Session(settings, RunOptions(kind=kind, query="q", inner=inner, web_tools=[], show_progress=False)) as run:
            return run.parts.engine.config.max_batches

    assert cap(RunKind.ASK) == 50
    assert cap(RunKind.MAPREDUCE_RUN) is None
