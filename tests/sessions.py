"""One session per run, as the product runs it: helpers the tests share to run an `ask` or a
decision through `session.Session` with a test's options, or to call the manager's `mapreduce`
tool on a session whose sub-agents are a test's `BatchSolver`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from amapreduce.agents.mapreduce_tool import MapReduceTool
from amapreduce.decision.model import Decision
from amapreduce.mapreduce.solver import BatchSolver
from amapreduce.session import RunOptions, RunOutcome, Session
from amapreduce.session.journal import RunKind
from amapreduce.settings import Settings, load_settings
from amapreduce.testing.scripted import FunctionModel, ModelInfo


def ask(query: str, settings: Settings, **options: Any) -> RunOutcome:
    """`amapreduce ask`'s session: the manager with the `mapreduce` tool."""
    with Session(settings, RunOptions(query=query, **options)) as session:
        return session.ask()


def mapreduce_run(decision: Decision, settings: Settings, *, label: str = "decision", **options: Any) -> RunOutcome:
    """`amapreduce mapreduce run`'s session: `decision` checked in pre-flight, then run."""
    with Session(settings, RunOptions(kind=RunKind.MAPREDUCE_RUN, query=label, decision=decision, **options)) as session:
        return session.run()


def offline_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Settings of an offline test run (no environment read): a simulated model id, runs under
    `tmp_path`, no extraction model; `overrides` set the rest (`workers`, `patch_rounds`, ...)."""
    return load_settings({}, model="sim/test", runs_dir=tmp_path / "runs", extraction_model="none", **overrides)


def _never(messages: list[Any], info: ModelInfo) -> Any:
    raise AssertionError("a role model the test replaced by its solver was called")


def unused_models(role: str) -> FunctionModel:
    """`RunOptions.inner` for a session whose solver replaces the sub-agents: any call fails the test."""
    return FunctionModel(_never, model_id=f"sim/unused-{role}")


@contextlib.contextmanager
def tool_session(settings: Settings, solver: BatchSolver, **options: Any) -> Iterator[tuple[Session, MapReduceTool]]:
    """An open `ask` session whose sub-agents are `solver` (no web tools, no progress, and role
    models that must not be called unless `inner` is given), and the manager's `mapreduce` tool on it."""
    options = {"web_tools": [], "inner": unused_models, "show_progress": False, **options}
    with Session(settings, RunOptions(solver=solver, **options)) as session:
        yield session, MapReduceTool(session)


def manager_then_subagents(decision: Mapping[str, Any], answer: Callable[[str], list[dict[str, Any]]]) -> Callable[..., Any]:
    """A simulated model (deterministic code, not an LLM) for an `ask`: offered `mapreduce`, it plays
    the manager (the plan stage with `decision`, the same call again to execute, then its final
    answer, reading the tool's own output); otherwise a sub-agent, whose rows are `answer(its
    sub-questions)` numbered by task."""
    from amapreduce.llm.messages import message_text
    from amapreduce.testing.scripted import final_answer, tool_call

    def play(messages: list[Any], info: ModelInfo) -> Any:
        text = "\n".join(message_text(m) for m in messages)
        if "mapreduce" in info.tools:
            return final_answer("Done.") if '"call_stage": "execute"' in text else tool_call("mapreduce", **decision)
        rows = answer(text.rsplit("Sub-questions:", 1)[-1])
        return final_answer(json.dumps([{"task": n, **row} for n, row in enumerate(rows, 1)]))

    return play
