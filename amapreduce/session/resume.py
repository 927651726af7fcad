"""`amapreduce runs resume`: which run can be resumed, and with which settings.

Why apart from the commands: the rules are the same whatever the run was. A run resumes only
from its journal (no journal: it cannot), never while its process still runs, and with the
settings it ran with (journaled in its `RunStarted`), not with whatever the environment says
today; only overrides that cannot change what a finished batch means (`workers`) are allowed.
API keys are never journaled: they come from the environment as usual.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from amapreduce.errors import UserError
from amapreduce.session.journal import JOURNAL_NAME, RERUN_SETTINGS, RunJournal, RunKind, read_run_journal
from amapreduce.settings import ENV_ALIASES, ENV_PREFIX, Settings, load_env_file, load_settings

__all__ = ["RESUMABLE_COMMANDS", "resume_settings", "saved_run"]

RESUMABLE_COMMANDS = (RunKind.MAPREDUCE_RUN, RunKind.ASK)
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
            f"(only {' and '.join(f'`{c}`' for c in RESUMABLE_COMMANDS)} runs): {_HOW_TO_FINISH[kind]}."
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
    return load_settings(env, **{**saved.first.settings, **{k: v for k, v in overrides.items() if v is not None}})
