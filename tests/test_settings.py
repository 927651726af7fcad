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


def test_invalid_override_is_reported() -> None:
    with pytest.raises(ConfigError, match=r"`workers` is invalid \(override\)"):
        load_settings({}, workers=-1)
