"""One exception tree for amapreduce, split by audience.

```
AmapreduceError                 base of everything we raise on purpose
├── UserError                   a usage or configuration mistake; the CLI exits 2 with the message
│   ├── DecisionError           an invalid decision Θ (matrix, template, columns, batching)
│   └── ConfigError             an invalid setting, flag or environment value
├── RunError                    a runtime failure; carries structured fields
│   ├── SolverError             one sub-agent attempt failed (crash, bad reply)
│   ├── BatchTimeout            one sub-agent attempt ran past its deadline
│   ├── BudgetExceeded          the run's cost or token budget is spent; the run stops cleanly
│   │   └── EstimateOverBudget  even the low end of the run's estimate costs more than its budget: refused before the fan-out
│   ├── ProviderUnavailable     a model provider's circuit breaker is open: the provider is down; the run stops
│   │   ├── SearchUnavailable   a search backend's circuit breaker is open: search is down; the run stops
│   │   └── ProviderRejected    a provider refused the run's requests for good (wrong key, no access,
│   │                           no such model, invalid request); the run stops at once
│   ├── RunCancelled            the `mapreduce` tool's stop: its execution ended early (no result in it)
│   └── StorageError            a file or database could not be written or read (disk full, I/O error,
│                               no permission, read-only file system); names the path and what to do
└── ToolError                   model-facing: a tool call did not succeed; the message tells the model what to do
    ├── ToolCallRefused         the tool turned the call away on purpose (bad arguments, URL policy, call limits)
    └── ToolCallFailed          the call was valid but its work failed (network down, missing page, backend error)
```

Messages say what is wrong, show the value and say what to do, e.g.
"`workers` must be >= 1, got 0. Use a positive number of parallel sub-agents."

Every class pickles cleanly (structured fields included) because batches may cross process
boundaries once a distributed executor runs them.
"""

from __future__ import annotations

import errno as _errno
from typing import Any

__all__ = [
    "AmapreduceError",
    "BatchTimeout",
    "BudgetExceeded",
    "ConfigError",
    "DecisionError",
    "EstimateOverBudget",
    "ProviderRejected",
    "ProviderUnreachable",
    "ProviderUnavailable",
    "RunCancelled",
    "RunError",
    "SearchUnavailable",
    "SolverError",
    "StorageError",
    "ToolCallFailed",
    "ToolCallRefused",
    "ToolError",
    "UserError",
]
# `find_cause`, `is_storage_fault` and `storage_error` (below) are helpers, not part of the exception tree that `__all__` lists.


def _rebuild(cls: type[AmapreduceError], message: str, fields: dict[str, Any]) -> AmapreduceError:
    """Recreate an exception from its message and structured fields (pickle support)."""
    return cls(message, **fields)


class AmapreduceError(Exception):
    """Base class of every error amapreduce raises on purpose.

    Keyword arguments become attributes (structured fields), so callers can react to a
    failure without parsing its message.
    """

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields
        for name, value in fields.items():
            setattr(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.fields))

    def __str__(self) -> str:
        return self.message


class UserError(AmapreduceError):
    """A usage or configuration mistake the user can fix; the CLI prints it and exits 2."""


class DecisionError(UserError):
    """An invalid decision Θ: the message names the exact field and problem."""


class ConfigError(UserError):
    """An invalid setting, command-line flag or environment variable."""


class RunError(AmapreduceError):
    """A failure while running: a sub-agent, a model, a network call."""


class SolverError(RunError):
    """One sub-agent attempt failed; the engine retries the batch."""


class BatchTimeout(RunError):
    """One sub-agent attempt ran past its deadline; the engine abandons it and retries."""


class BudgetExceeded(RunError):
    """The run's cost or token budget is spent; the run stops and keeps what it has."""


class EstimateOverBudget(BudgetExceeded):
    """Even the low end of a run's estimate (`session.estimate`) costs more than its cost budget
    (`--max-cost`, `max_cost=`, `AMAPREDUCE_MAX_COST_USD`): the fan-out is refused before any
    sub-agent call (the CLI exits 4). The message holds the numbers; so do the fields `low_usd`,
    `high_usd` (the estimate's cost range), `spent_usd` (what the run had spent already: an
    `ask`'s manager) and `max_cost_usd` (the budget)."""

    low_usd: float
    high_usd: float
    spent_usd: float
    max_cost_usd: float


class ProviderUnavailable(RunError):
    """A model provider is down: its circuit breaker (`amapreduce.llm.breaker`) is open and the
    outage has lasted longer than a run waits. Nothing was sent; the run stops and keeps what it has.

    The message is the one-line reason; the fields are `provider` (the provider key), `failures`
    (failed requests in a row) and `last_error` (the last one, credentials redacted).
    """

    provider: str
    failures: int
    last_error: str | None


class SearchUnavailable(ProviderUnavailable):
    """A search backend is down: its circuit breaker (`amapreduce.web.backends.base`) is open and
    the outage has lasted longer than a run waits. Nothing was sent; the run stops `failed`.

    Why a `ProviderUnavailable`: it is the same event for the same reason — a service the run cannot
    do without stopped answering — so it stops a run wherever a provider outage does (it is one of
    `mapreduce.result.RUN_STOPPING_ERRORS` through its base), and the web tools let it through
    instead of showing it to the model as one more failed call. `provider` is the backend's name.
    """


class ProviderRejected(ProviderUnavailable):
    """A model provider or search backend refused a request in a way no retry can change: the key
    is wrong (HTTP 401), it has no access (403), the model or endpoint does not exist (404), or the
    request is invalid for this model (400, 422). The run stops `failed` at once with the one-line
    message, which says what to check.

    Why a `ProviderUnavailable`: to the run it is the same event as an outage — a service it cannot
    do without will not serve it, and every later call would be refused the same way — so it stops
    a run wherever an outage does (`mapreduce.result.RUN_STOPPING_ERRORS`, the web tools, the
    manager). Retrying it only multiplied the refusals: a wrong key once cost 9 requests per task
    and ended the run `incomplete`, exit 0.

    Fields: `provider` (the provider or backend), `status` (the HTTP status, None when the error
    had none), `failures` (always 1: one refusal is enough) and `last_error` (the provider's own
    message, on one line, credentials redacted).
    """

    status: int | None


class ProviderUnreachable(ProviderRejected):
    """A model provider that has not answered once in this process cannot be connected to: its host
    is unknown (DNS), nothing listens there (refused), the TLS handshake fails, the proxy refuses, or
    the connection times out. A setup problem, not an outage: the run stops `failed` at its first
    attempt with the host and the cause, instead of retrying connection errors for most of a minute
    and then advising about rate limits. `status` is None (no HTTP answer); `host` is `host:port`.
    """

    host: str


class RunCancelled(RunError):
    """The `mapreduce` tool's execution ended early (a spent budget, `cancel()`, Ctrl-C, a provider
    down, an estimate-only run). Raised only by the tool, so that smolagents ends the manager's run;
    it carries no result: the engine, compose and the session return theirs, with its ending, and
    the session keeps the run's (`Session.stopped`)."""


class StorageError(RunError, OSError):
    """The machine refused a file or database operation: the disk is full (ENOSPC, EDQUOT, SQLite's
    "database or disk is full"), the device failed (EIO), or the path cannot be used (EACCES, EPERM,
    EROFS, ENOTDIR, ...). The message names the path and says what to do.

    Fields: `path` (the file or folder, None when unknown), `errno` (the OS error number, None for
    a SQLite error without one) and `usage` (True when the path itself cannot be used — no
    permission, a read-only file system, not a folder — a fix the user makes: the CLI exits 2;
    False for a full or failing disk: exit 1). Also an `OSError`, so code that handles a failed
    file operation (`except OSError`) handles it as before.
    """

    path: str | None
    errno: int | None
    usage: bool


_DISK_FULL = frozenset({_errno.ENOSPC, _errno.EDQUOT, _errno.EFBIG})
_UNUSABLE_PATH = frozenset({_errno.EACCES, _errno.EPERM, _errno.EROFS, _errno.ENOTDIR, _errno.EISDIR,
                            _errno.ENOENT, _errno.ENAMETOOLONG, _errno.ELOOP, _errno.EEXIST})


def is_storage_fault(exc: BaseException) -> bool:
    """True for an `OSError` of the disk or a path (full, failing, no permission, read-only), not
    of the network (a refused or reset connection is an `OSError` too, but no disk's fault)."""
    return (isinstance(exc, OSError) and not isinstance(exc, ConnectionError | TimeoutError)
            and exc.errno in _DISK_FULL | _UNUSABLE_PATH | {_errno.EIO})


def storage_error(exc: OSError, *, path: object = None, then: str | None = None) -> StorageError:
    """The `StorageError` for the OS error `exc`: one line naming the path (`path`, else the error's
    own file name) and what to do; `then` says how to go on once that is done (default: "run the
    command again"; a run says how to resume it).

    Why one function: every writer (run directories, journals, traces, stores, caches, indexes)
    says the same thing for the same fault, and the CLI turns any `OSError` that reaches it into
    this message too, so a full disk never ends in a traceback.
    """
    number = exc.errno
    where = path if path is not None else (exc.filename if exc.filename is not None else None)
    shown = str(where) if where is not None else None
    reason = exc.strerror or str(exc) or type(exc).__name__
    if number in _DISK_FULL:
        advice = "Free space on that disk (or point the command at a folder on another disk)"
    elif number == _errno.EIO:
        advice = "The device reported an I/O error: check the disk (and `dmesg`)"
    elif number in _UNUSABLE_PATH:
        advice = "Use a path this user can write (check its permissions, that the file system is not read-only " \
                 "and that each parent is a folder)"
    else:
        advice = "Check the path and the machine"
    code = f" ({_errno.errorcode[number]})" if number is not None and number in _errno.errorcode else ""
    target = f" on {shown!r}" if shown else ""
    message = f"{reason}{code}{target}. {advice}, then {then or 'run the command again'}."
    return StorageError(message, path=shown, errno=number, usage=number in _UNUSABLE_PATH)


class ToolError(AmapreduceError):
    """Raised inside a tool when a call does not succeed; the agent shows the message to the model.

    Why model-facing and not a `RunError`: the run goes on. smolagents turns the exception into the
    step's observation, and the model reads it and tries something else.
    """


class ToolCallRefused(ToolError):
    """The tool turned the call away on purpose: invalid arguments, a refused URL, a call limit.

    The message must tell the model what to change so its next call succeeds.
    """


class ToolCallFailed(ToolError):
    """The call was valid but its work failed: the network, the search backend, a missing page.

    The message says what went wrong and what to try instead (another URL, a later retry).
    """


def find_cause(exc: BaseException, *kinds: type[BaseException]) -> BaseException | None:
    """The first exception of one of `kinds` in `exc`'s cause/context chain, or None.

    Agent frameworks wrap the errors raised inside tools and models (smolagents raises
    `AgentGenerationError` from a model's `BudgetExceeded`); this finds the one that matters.
    """
    visited: set[int] = set()  # a chain can loop (an error re-raised as its own cause)
    seen: BaseException | None = exc
    while seen is not None and id(seen) not in visited:
        if isinstance(seen, kinds):
            return seen
        visited.add(id(seen))
        seen = seen.__cause__ or seen.__context__
    return None
