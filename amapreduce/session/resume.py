"""`amapreduce runs resume`: which run can be resumed, with which settings, and resuming it.

Why apart from the commands: the rules are the same whatever the run was. A run resumes only
from its journal (no journal: it cannot), never while its process still runs, and with the
settings it ran with (journaled in its `RunStarted`), not with whatever the environment says
today; only overrides that cannot change what a finished batch means (`workers`) are allowed.
API keys are never journaled: they come from the environment as usual.

`resume` finishes the run in its own directory, as one `Session` over its journal: a `mapreduce
run` runs its saved decision again (its finished batches replayed from the journal, a composed
one from `decision.json`, a wide one's finished chunks on its executor), an `ask` the decisions
its manager had executed (`executed.json`, else the journal's executions), without the manager.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amapreduce.errors import UserError
from amapreduce.session.journal import JOURNAL_NAME, RERUN_SETTINGS, RunJournal, RunKind, read_run_journal
from amapreduce.session.session import DECISION_FILE, EXECUTED_FILE, RunOptions, Session
from amapreduce.settings import ENV_ALIASES, ENV_PREFIX, Settings, load_env_file, load_settings

if TYPE_CHECKING:
    from smolagents import Tool

    from amapreduce.decision.model import Decision
    from amapreduce.mapreduce.batching import BatchPlan
    from amapreduce.session.executor import Executor
    from amapreduce.session.outcome import RunOutcome
    from amapreduce.session.parts import InnerFactory

__all__ = ["RESUMABLE_COMMANDS", "resume", "resume_settings", "saved_decisions", "saved_run"]

RESUMABLE_COMMANDS = (RunKind.MAPREDUCE_RUN, RunKind.ASK, RunKind.ENRICH)
"""The run kinds `runs resume` continues."""

_HOW_TO_FINISH = {
    RunKind.DEMO: "its model is the demo's simulated one; run `amapreduce demo` again",
    RunKind.EVAL: "it is a trial of an `eval run`; continue the evaluation with `amapreduce eval run --resume DIR` "
                  "(it reruns unfinished trials)",
}
"""What to do instead for each kind `runs resume` does not continue."""


def saved_run(path: Path) -> RunJournal:
    """The journal of the run in `path`, checked to be one `runs resume` can continue (or one
    that already finished: `RunJournal.finished`, which the caller reports).

    Raises:
        UserError: `path` has no journal, its process still runs, or its kind cannot be resumed.
    """
    saved = read_run_journal(path)
    if saved is None:
        raise UserError(
            f"{str(path)!r} has no {JOURNAL_NAME}, so it cannot be resumed (it is not a run directory, "
            "or an older amapreduce made it)."
        )
    if saved.finished:
        return saved
    if saved.ended is None and saved.started.process.alive():
        p = saved.started.process
        raise UserError(f"the run in {str(path)!r} is still running (pid {p.pid} on {p.host}); it cannot be resumed twice.")
    kind = saved.first.command
    if kind not in RESUMABLE_COMMANDS:
        raise UserError(
            f"the run in {str(path)!r} is a `{kind}` run, which `runs resume` does not continue "
            f"(only {', '.join(f'`{c}`' for c in RESUMABLE_COMMANDS)} runs): {_HOW_TO_FINISH[kind]}."
        )
    return saved


def resume_settings(saved: RunJournal, *, environ: dict[str, str] | None = None, **overrides: Any) -> Settings:
    """The settings the run ran with: its journaled values, the defaults for the rest (the
    environment's values of `RERUN_SETTINGS` are ignored), every other setting (keys, cache,
    folders) from the environment; `overrides` (not None) win.

    Raises:
        ConfigError: a journaled value or an override is not valid.
    """
    if environ is None:
        load_env_file()  # `runs resume` reads the `.env` keys like any other command
    env = dict(os.environ if environ is None else environ)
    for name in RERUN_SETTINGS:
        env.pop(ENV_PREFIX + name.upper(), None)
        if name in ENV_ALIASES:
            env.pop(ENV_ALIASES[name], None)
    given = {k: v for k, v in overrides.items() if v is not None}
    if "workers" in given:  # a number of workers given for the resume replaces the run's `auto`
        given.setdefault("workers_auto", False)
    return load_settings(env, **{**saved.first.settings, **given})


def resume(path: Path, saved: RunJournal, settings: Settings, *, inner: InnerFactory | None = None,
           web_tools: list[Tool] | None = None, show_progress: bool | None = None,
           executor: Executor | None = None) -> RunOutcome:
    """Finish the interrupted run in `path` (its journal: `saved`) in place, with `settings`
    (the run's own: `session.resume.resume_settings`).

    Raises:
        UserError: the run stopped before anything was recorded to run again, or a file it kept is damaged.
    """
    from amapreduce.decision.model import Decision
    from amapreduce.mapreduce.checkpoint import plan_from_manifest

    kind = saved.first.command
    options = RunOptions(kind=kind, query=saved.first.query, inner=inner, web_tools=web_tools,
                         show_progress=show_progress, roles=("subagent", "extraction"))
    if kind.is_ask:
        executions = saved_decisions(path, saved)
        if not executions:
            raise UserError(f"the run in {str(path)!r} stopped before the manager executed a decision, so there "
                            "is nothing to resume; ask the question again.")
        with Session(settings, options, resuming=(path, saved)) as session:
            return session.replay(executions)
    kept = path / DECISION_FILE
    if kept.is_file():
        try:
            decision = Decision.parse(json.loads(kept.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:  # DecisionError is a UserError; JSON errors are ValueErrors
            raise UserError(f"the run's {str(kept)!r} cannot be read ({exc}); start the run again.") from None
        with Session(settings, options, resuming=(path, saved)) as session:
            return session.run(decision)
    wide = saved.wide
    if wide is not None:  # a wide run on an executor: its chunks that came back are replayed, the rest run
        if executor is None:
            raise UserError(f"the run in {str(path)!r} ran in chunks on a cluster; resume it with its executor.")
        with Session(settings, options, resuming=(path, saved)) as session:
            return session.run_wide(Decision.parse(wide.decision), plan_from_manifest(wide.plan), executor,
                                    saved=saved)
    if not saved.executions:
        raise UserError(f"the run in {str(path)!r} stopped before its decision was recorded; start it again.")
    first = saved.executions[0]
    with Session(settings, options, resuming=(path, saved)) as session:
        return session.run(Decision.parse(first.decision), plan_from_manifest(first.plan))


def saved_decisions(path: Path, saved: RunJournal) -> list[tuple[Decision, BatchPlan | None]]:
    """The decisions a killed `ask` executed: `executed.json`'s when the run kept one, else the
    journal's executions (each plain). Raises `UserError` when the file is damaged."""
    from amapreduce.decision.model import Decision
    from amapreduce.mapreduce.checkpoint import plan_from_manifest

    kept = path / EXECUTED_FILE
    if kept.is_file():
        try:
            entries = json.loads(kept.read_text(encoding="utf-8"))
            return [(Decision.parse(e["decision"]), None if e["plan"] is None else plan_from_manifest(e["plan"]))
                    for e in entries]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"the run's {str(kept)!r} cannot be read ({exc}); ask the question again.") from None
    return [(Decision.parse(e.decision), plan_from_manifest(e.plan)) for e in saved.executions]
