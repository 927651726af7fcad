"""One `ask` reads the model layer's settings once (`llm.factory.ModelFactory`): every key the
settings know registered for redaction once, before anything is written, and the role models
resolved once (they used to be registered ten times and resolved five on one ask). The table holds
the rows as the sub-agents wrote them: the run's logs are what is masked."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from sessions import ask, manager_then_subagents

from amapreduce import trace
from amapreduce.llm import factory
from amapreduce.llm.factory import ModelFactory, ModelSettings, RoleModels
from amapreduce.settings import Settings, load_settings
from amapreduce.testing.scripted import FunctionModel

SECRET = "sk-once-SECRET-0123456789"
DECISION = {
    "task_matrix": [["France"], ["Japan"]],
    "template": "What is the capital of __0__?",
    "json_schema": {"type": "object", "properties": {"country": {}, "capital": {}}},
    "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
}
CAPITALS = {"France": "Paris", "Japan": "Tokyo"}


def counting(monkeypatch: pytest.MonkeyPatch, calls: Counter[str], name: str, real: Callable[..., Any]) -> None:
    """Count calls of `real` under `name` in every module of the package that imported it."""

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return real(*args, **kwargs)

    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("amapreduce") and getattr(module, name, None) is real:
            monkeypatch.setattr(module, name, counted)


def test_one_ask_registers_the_keys_once_and_resolves_the_roles_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Counter[str] = Counter()
    counting(monkeypatch, calls, "register_secrets", trace.register_secrets)
    counting(monkeypatch, calls, "model_for_role", factory.model_for_role)
    real_of = RoleModels.of.__func__  # type: ignore[attr-defined]

    def of(cls: type[RoleModels], settings: Settings) -> RoleModels:
        calls["RoleModels.of"] += 1
        return real_of(cls, settings)  # type: ignore[no-any-return]

    monkeypatch.setattr(RoleModels, "of", classmethod(of))

    def answer(text: str) -> list[dict[str, Any]]:  # a sub-agent that echoes the key it never saw
        return [{"country": c, "capital": f"{v} ({SECRET})"} for c, v in CAPITALS.items() if f"capital of {c}?" in text]

    play = manager_then_subagents(DECISION, answer)
    settings = load_settings({}, model="sim/test", runs_dir=tmp_path / "runs", api_key=SECRET)
    outcome = ask("Capitals?", settings, web_tools=[], show_progress=False,
                  inner=lambda role: FunctionModel(play, model_id="sim/test"))
    assert outcome.status == "complete" and {"manager", "subagent"} <= set(outcome.meter.by_role())
    assert calls == Counter({"register_secrets": 1, "RoleModels.of": 1})  # no model_for_role on the way
    logs = {name: (outcome.run_dir.path / name).read_text(encoding="utf-8")
            for name in ("trace.jsonl", "journal.jsonl", "result.json")}
    assert [name for name, text in logs.items() if SECRET in text] == []  # registered before anything was written
    assert "[REDACTED]" in logs["journal.jsonl"]  # the echoed key was there, masked


def _registered(values: Iterable[str | None]) -> list[str | None]:
    return list(values)


def test_the_factory_keeps_only_the_model_layers_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str | None]] = []
    monkeypatch.setattr(factory, "register_secrets", lambda values: seen.append(_registered(values)))
    settings = load_settings({}, model="sim/a", subagent_model="sim/b", extraction_model="none", api_key=SECRET,
                             model_rpm=30, retry_max_retries=2, breaker_failures=3)
    made = ModelFactory(settings)
    assert seen == [list(settings.secret_values())] and SECRET in seen[0]
    assert made.roles.ids == {"manager": "sim/a", "subagent": "sim/b", "memory": "sim/a", "judge": "sim/a"}
    assert made.roles.get("extraction") is None  # `none` disables the role
    config = made.config
    assert isinstance(config, ModelSettings) and config.rpm == 30 and config.retry.max_retries == 2
    assert config.breaker.failures == 3 and config.api_base is None and made.endpoint("sim/a") is None
