"""The exit codes of the `amapreduce` commands, defined once.

Why one module: a script runs `ask`, `mapreduce run`, `demo`, `runs resume` or `eval run` and must
tell success from failure by the exit status alone, the same way for every command. How a run
ended is its `RunStatus` (`amapreduce.mapreduce.result`); `run_exit_code` is the one mapping from
it to an exit code, and every run command ends through `exit_for_run`.

Only constants live at module level: `cli.app` imports this module, and `amapreduce --help`
must not load the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import typer

if TYPE_CHECKING:
    from amapreduce.mapreduce.result import RunStatus

__all__ = [
    "EVAL_EXIT_CODES_HELP",
    "EXIT_BUDGET",
    "EXIT_CODES_HELP",
    "EXIT_FAILED",
    "EXIT_INCOMPLETE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "ROOT_EXIT_CODES_HELP",
    "eval_exit_code",
    "exit_for_run",
    "run_exit_code",
]

EXIT_OK = 0
"""The run completed: every expected row, no missing cell."""
EXIT_FAILED = 1
"""The run failed (a provider that stayed down, an error); `result.json` says why."""
EXIT_USAGE = 2
"""Bad input: a flag, a file or a setting was refused before anything was made."""
EXIT_INCOMPLETE = 3
"""The run finished but its table is incomplete (cells missing, short tasks, or no table); it is saved."""
EXIT_BUDGET = 4
"""A budget (`--max-cost`, `--max-tokens`) stopped the run; the partial table is saved."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT, as shells report it); the partial table is saved."""

EXIT_CODES_HELP = (
    "Exit codes: 0 complete; 3 incomplete (table saved); 4 stopped by a budget (partial table saved); "
    "1 failed; 2 bad input; 130 interrupted (Ctrl-C)."
)
"""The `--help` epilog of the run commands (`ask`, `mapreduce run`, `demo`, `runs resume`)."""

ROOT_EXIT_CODES_HELP = (
    "Exit codes of ask, mapreduce run, demo and runs resume: 0 complete; 3 incomplete (table saved); 4 stopped "
    "by a budget (partial table saved); 1 failed; 2 bad input; 130 interrupted. eval run: 0 completed, 4 stopped "
    "by --max-cost. Other commands: 0 done, 1 failed, 2 bad input."
)
"""The `--help` epilog of `amapreduce` itself."""

EVAL_EXIT_CODES_HELP = (
    "Exit codes: 0 the evaluation completed (answers that are incomplete included); 4 stopped by --max-cost "
    "(resume it with a larger budget); 1 failed; 2 bad input; 130 interrupted (Ctrl-C)."
)
"""The `--help` epilog of `eval run`: it scores incomplete answers, so they do not fail it."""


def run_exit_code(status: RunStatus) -> int:
    """The exit code of a run command whose run ended with `status`.

    `no_table` (the manager answered without ever executing a decision) counts as incomplete: the
    run finished and saved what it had, but the table the question asked for is not there.
    `stopped` is a budget stop: the run commands stop a run only for a spent budget (a provider
    that stays down ends it `failed`).
    """
    from amapreduce.mapreduce.result import RunStatus

    codes = {
        RunStatus.COMPLETE: EXIT_OK,
        RunStatus.INCOMPLETE: EXIT_INCOMPLETE,
        RunStatus.NO_TABLE: EXIT_INCOMPLETE,
        RunStatus.STOPPED: EXIT_BUDGET,
        RunStatus.INTERRUPTED: EXIT_INTERRUPTED,
        RunStatus.FAILED: EXIT_FAILED,
    }
    return codes[status]


def exit_for_run(status: RunStatus) -> None:
    """End a run command with `run_exit_code(status)` (return normally for 0).

    Raises:
        typer.Exit: the run did not complete.
    """
    code = run_exit_code(status)
    if code != EXIT_OK:
        raise typer.Exit(code)


def eval_exit_code(status: Literal["complete", "stopped", "failed"]) -> int:
    """The exit code of `eval run` for its outcome's status.

    An evaluation stops when `--max-cost` is spent before a trial could start (4), and fails when
    the provider refused a trial's run for good (1: a wrong key, no such model; every later trial
    would be refused too); one whose answers are incomplete still completed (its scores say how
    good they are).
    """
    return {"complete": EXIT_OK, "stopped": EXIT_BUDGET, "failed": EXIT_FAILED}[status]
