"""One session per run, as the product runs it: helpers the tests share to run an `ask` or a
decision through `session.Session` with a test's options."""

from __future__ import annotations

from typing import Any

from amapreduce.decision.model import Decision
from amapreduce.session import RunOptions, RunOutcome, Session
from amapreduce.session.journal import RunKind
from amapreduce.settings import Settings


def ask(query: str, settings: Settings, **options: Any) -> RunOutcome:
    """`amapreduce ask`'s session: the manager with the `mapreduce` tool."""
    with Session(settings, RunOptions(query=query, **options)) as session:
        return session.ask()


def run_decision(decision: Decision, settings: Settings, *, label: str = "decision", **options: Any) -> RunOutcome:
    """`amapreduce mapreduce run`'s session: `decision` checked in pre-flight, then run."""
    with Session(settings, RunOptions(kind=RunKind.MAPREDUCE_RUN, query=label, decision=decision, **options)) as session:
        return session.run()
