"""One run, one session: `Session` builds a run's parts once, owns its directory, journal, meter
and table, and ends in one `RunOutcome`; `ask`, `mapreduce run`, `runs resume`, the Python API,
the demo and an evaluation's trial are each one `Session`.

The names are loaded when first used: importing `session.rundir` (the UI, `runs list`) must not
load the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amapreduce.session.outcome import RunOutcome
    from amapreduce.session.session import RunOptions, Session

__all__ = ["RunOptions", "RunOutcome", "Session"]


def __getattr__(name: str) -> Any:
    if name == "RunOutcome":
        from amapreduce.session.outcome import RunOutcome

        return RunOutcome
    if name in ("RunOptions", "Session"):
        from amapreduce.session import session

        return getattr(session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
