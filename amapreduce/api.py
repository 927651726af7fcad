"""The Python API: a question (or a decision) in, a table and a pandas DataFrame out (a list to
enrich: `amapreduce.enrich_api`).

Why a module of its own: a run is a `session.Session`, which needs a `Settings` object and
returns the one `RunOutcome`, which is right for the CLI and awkward in a notebook. `ask` and
`run_decision` here take the command line's options as keywords, read the rest of the
configuration as the CLI does (keyword > environment > defaults, `settings.load_settings`,
`AMAPREDUCE_EXECUTOR` included), refuse a bad model or search backend before a run directory is
made (the session's pre-flight), run the same session, and hand back `RunResult`, a thin view of
its `RunOutcome`. Nothing is printed unless `show_progress=True`,
and nothing calls `sys.exit`.

How a run ends, for a caller:

* complete, incomplete, or stopped by a budget: a `RunResult` (`status` says which; a stopped
  run keeps its partial table);
* failed (a provider or search backend down, or refusing the run: a wrong key, no such model):
  `RunError`, whose `result` attribute holds the `RunResult` with what was found (and whose
  `run_dir` field names its run directory);
* Ctrl-C (a notebook's "interrupt"): the run directory records `stopped: interrupted` with the
  partial table, as the CLI does, and `KeyboardInterrupt` is raised, so a loop over questions
  stops too;
* a mistake in the arguments: `UserError` (`ConfigError`, `DecisionError`), before anything runs.

`ask_async` and `run_decision_async` run the same call in a worker thread
(`asyncio.to_thread`) for notebooks whose event loop is already running. Cancelling the awaiting
task interrupts the run exactly as Ctrl-C does (a `KeyboardInterrupt` delivered to the worker
thread, which the run handles at its next Python step: at once in the engine's wait loop, after
the model call in flight otherwise); the cancellation completes once the run directory has
recorded `stopped: interrupted`, then `asyncio.CancelledError` propagates as usual.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

from pydantic import SecretStr, ValidationError

from amapreduce.errors import ConfigError, RunError, UserError
from amapreduce.mapreduce.result import Completeness, RunEnding, RunStatus
from amapreduce.session.outcome import RunOutcome
from amapreduce.settings import Settings, load_settings
from amapreduce.table.table import CellStatus, Table

if TYPE_CHECKING:
    import pandas as pd

    from amapreduce.decision.model import Decision
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.progress import ProgressSink
    from amapreduce.session.estimate import Estimate
    from amapreduce.session.executor import Executor
    from amapreduce.session.record import RunRecord

__all__ = [
    "EVIDENCE_FIELDS",
    "RunResult",
    "RunUsage",
    "ask",
    "ask_async",
    "run_decision",
    "run_decision_async",
    "to_dataframe",
]

EVIDENCE_FIELDS = ("status", "source", "quote", "evidence", "confidence")
"""What `to_dataframe(evidence=True)` adds after each output column `c`: the columns `c status`
(`found`, `missing` or `conflict`), `c source` (the URL, `task_matrix`, or None), `c quote` (the
verbatim text the sub-agent quoted, or None) and `c evidence` (`verified`, `unverified` or
`no_evidence`: the quote checked against what the tools fetched), what a table cell carries
(`table.table.Cell`); `c quote` and `c evidence` are named as `--csv F --evidence` names them."""

NO_MODEL_HELP = (
    "no model is configured. Pass model=..., e.g. model='openai/gpt-5-mini' (with OPENAI_API_KEY set), or an "
    "OpenAI-compatible server: model='qwen2.5', api_base='http://127.0.0.1:8000/v1'; or set AMAPREDUCE_MODEL "
    "(and AMAPREDUCE_API_BASE)."
)

_KEYWORDS = {
    "model": "model",
    "api_base": "api_base",
    "api_key": "api_key",
    "search": "search_backend",
    "workers": "workers",
    "max_cost": "max_cost_usd",
    "max_tokens": "max_tokens",
    "runs_dir": "runs_dir",
}
"""The named keywords of `ask`/`run_decision` and the setting each one sets (as the CLI's flags)."""

_SECRET_SETTINGS = frozenset(n for n, f in Settings.model_fields.items() if "SecretStr" in str(f.annotation))

P = ParamSpec("P")
R = TypeVar("R")


def to_dataframe(table: Table, *, evidence: bool = False) -> pd.DataFrame:
    """`table` as a pandas DataFrame: one column per output column, its rows in the table's
    order (matrix order), each cell its text as found, None for a missing cell.

    With `evidence=True`, each output column `c` is followed by `c status`, `c source`, `c quote`,
    `c evidence` and `c confidence` (`EVIDENCE_FIELDS`; the confidence a float in [0, 1],
    `table.cell_confidence`), so a filter such as `df[df["Capital evidence"] == "unverified"]` or
    `df.sort_values("Capital confidence")` finds the cells to check by hand.

    Raises:
        UserError: an evidence column's name is also an output column's (`Capital` and
            `Capital source` both in the schema).
    """
    import pandas as pd

    fields = ("", *EVIDENCE_FIELDS) if evidence else ("",)
    names = [f"{c} {f}" if f else c for c in table.columns for f in fields]
    taken = sorted({n for n in names if names.count(n) > 1})
    if taken:
        raise UserError(f"the evidence columns would repeat the table's column(s) {taken}; use evidence=False.")
    data: list[list[str | float | None]] = []
    for row in table.rows:
        line: list[str | float | None] = []
        for column in table.columns:
            cell = row.cells[column]
            line.append(None if cell.status is CellStatus.MISSING else cell.value)
            if evidence:
                line += [str(cell.status), cell.source, cell.quote, str(cell.evidence), cell.confidence]
        data.append(line)
    frame = pd.DataFrame(data, columns=names, dtype=object)
    for column in table.columns if evidence else ():
        frame[f"{column} confidence"] = frame[f"{column} confidence"].astype(float)
    return frame


@dataclass(frozen=True)
class RunUsage:
    """A run's usage in the words of its `result.json` (`usage.total`) and of `--json`.

    `cost_usd` is None when a model without a known price was used (listed in `unpriced_models`),
    as `RunResult.cost_usd` and `result.json` say; the priced calls' sum is `priced_cost_usd`.
    """

    requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cost_usd: float | None
    priced_cost_usd: float
    unpriced_models: tuple[str, ...]
    abandoned: int = 0
    """Of `requests`, those given up on the wire, charged their prompt's estimate (`Usage.abandoned`)."""

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def of(cls, meter: UsageMeter) -> RunUsage:
        """The whole run's usage as `meter` counted it."""
        total, unpriced = meter.total(), tuple(meter.unpriced())
        return cls(requests=total.requests, prompt_tokens=total.input_tokens, completion_tokens=total.output_tokens,
                   cached_tokens=total.cached_tokens, cost_usd=None if unpriced else total.cost_usd,
                   priced_cost_usd=total.cost_usd, unpriced_models=unpriced, abandoned=total.abandoned)

    def to_json(self) -> dict[str, Any]:
        """`result.json`'s `usage.total`: `requests`, `prompt_tokens`, `completion_tokens`,
        `cached_tokens`, `cost_usd` (null when unpriced), `abandoned`."""
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "cached_tokens": self.cached_tokens,
                "cost_usd": self.cost_usd, "abandoned": self.abandoned}


@dataclass(frozen=True)
class RunResult:
    """What `ask` or `run_decision` produced: the reduced table, how complete it is, what it cost,
    how the run ended and where its run directory is. A thin view of the run's `RunOutcome`
    (`outcome`), which stays available for anything not shown here."""

    outcome: RunOutcome

    @property
    def table(self) -> Table:
        """The reduced table, each cell with its status and source."""
        return self.outcome.table

    @property
    def completeness(self) -> Completeness:
        """Rows, expected rows, missing cells and short tasks (`Completeness.complete`)."""
        return self.outcome.completeness

    @property
    def markdown(self) -> str:
        """The table as WideSearch-readable markdown (for `ask` without a table: the manager's answer)."""
        return self.outcome.markdown

    @property
    def ending(self) -> RunEnding:
        """How the run ended, with the reason of a stop."""
        return self.outcome.ending

    @property
    def status(self) -> RunStatus:
        """`complete`, `incomplete`, `no_table` (`ask` only), `stopped` or `failed` (a `RunStatus`,
        which compares equal to those strings)."""
        return self.ending.status

    @property
    def estimate(self) -> Estimate | None:
        """What the manager's decision would cost (`ask(..., estimate=True)`; else None): calls,
        tokens, dollars and wall time, each low to high (`Estimate.to_json()` is `--estimate --json`'s)."""
        return self.outcome.estimate

    @property
    def meter(self) -> UsageMeter:
        """The run's usage meter: usage by role (`by_role()`), cost."""
        return self.outcome.meter

    @property
    def usage(self) -> RunUsage:
        """Requests, `prompt_tokens`, `completion_tokens`, cached tokens and dollars of the whole run,
        named as in `result.json` (`cost_usd` None when a model without a known price was used)."""
        return RunUsage.of(self.outcome.meter)

    @property
    def cost_usd(self) -> float | None:
        """Dollars spent, or None when a model without a known price was used (`usage.cost_usd`)."""
        return self.outcome.meter.cost_usd()

    @property
    def run_dir(self) -> Path:
        """The run directory (`result.json`, `table.md`, `table.csv`, the trace and the journal)."""
        return self.outcome.run_dir.path

    @property
    def record(self) -> RunRecord:
        """The run's record: what its `result.json` holds (`RunRecord.to_json`)."""
        return self.outcome.record

    def to_pandas(self, *, evidence: bool = False) -> pd.DataFrame:
        """The table as a DataFrame in matrix order; see `to_dataframe`."""
        return to_dataframe(self.table, evidence=evidence)

    def __repr__(self) -> str:
        c = self.completeness
        return (f"RunResult(status={self.ending.label!r}, rows={c.rows}, missing_cells={c.missing_cells}, "
                f"run_dir={str(self.run_dir)!r})")


def _settings(named: Mapping[str, Any], extra: Mapping[str, Any]) -> Settings:
    """Settings from the keywords of a call (`named`: `_KEYWORDS`; `extra`: any `Settings` field by
    its name), over the environment and the defaults, as the CLI builds them from its flags.

    Raises:
        ConfigError: an unknown or repeated keyword, a keyword's bad value (the message names the
            keyword), a bad environment value, or no model at all.
    """
    given: dict[str, tuple[str, Any]] = {_KEYWORDS[k]: (k, v) for k, v in named.items() if v is not None}
    for name, value in extra.items():
        if name not in Settings.model_fields:
            raise ConfigError(
                f"unknown keyword {name!r}; give one of {', '.join(_KEYWORDS)} or a setting of "
                "amapreduce.settings.Settings by its field name (e.g. extraction_model='none')."
            )
        if name in given and value is not None:
            raise ConfigError(f"{name}= repeats {given[name][0]}=; give one of them.")
        if value is not None:
            given[name] = (name, value)
    values = {field: value for field, (_, value) in given.items()}
    try:
        Settings.model_validate(values)  # the keywords alone, so that a bad one is named as it was written
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        field = str(err["loc"][0])
        keyword = given[field][0] if field in given else field
        shown = "(a secret)" if field in _SECRET_SETTINGS else repr(err.get("input"))
        raise ConfigError(f"{keyword}={shown} is invalid (setting `{field}`): {err['msg']}.") from None
    settings = load_settings(**values)
    if not settings.model:
        raise ConfigError(NO_MODEL_HELP)
    return settings


def _executor(settings: Settings) -> Executor | None:
    """The executor `Settings.executor` names (`executor='ray'` or `AMAPREDUCE_EXECUTOR`), as the CLI's."""
    from amapreduce.cluster import executor_for

    return executor_for(settings.executor, source="executor=")


def _returned(result: RunResult) -> RunResult:
    """`result`, or how a run that did not end with a table is raised (see the module's docstring)."""
    if result.status is RunStatus.INTERRUPTED:
        raise KeyboardInterrupt
    if result.status is RunStatus.FAILED:
        failure = RunError(f"the run failed: {result.ending.error} (run directory: {result.run_dir})",
                           run_dir=str(result.run_dir), result=result)
        # `result` stays an attribute but is no structured field: errors pickle with their fields
        # (`errors`), and a run's outcome holds live objects (its meter's lock).
        failure.fields.pop("result")
        raise failure
    return result


def ask(
    query: str,
    *,
    model: str | None = None,
    api_base: str | None = None,
    api_key: str | SecretStr | None = None,
    search: str | None = None,
    workers: int | Literal["auto"] | None = None,
    memory: str | os.PathLike[str] | bool | None = None,
    max_cost: float | None = None,
    max_tokens: int | None = None,
    runs_dir: str | os.PathLike[str] | None = None,
    show_progress: bool | None = False,
    on_progress: ProgressSink | None = None,
    estimate: bool = False,
    **settings: Any,
) -> RunResult:
    """Answer a wide-search question with a table, as `amapreduce ask` does.

    Args:
        query: the question; name the columns you want, as in `amapreduce ask`.
        model: a LiteLLM id (`openai/gpt-5-mini`) or, with `api_base`, the server's model name.
        api_base: an OpenAI-compatible endpoint (vLLM, llama.cpp, Ollama, `amapreduce demo --serve`).
        api_key: the key for `api_base` (default: `AMAPREDUCE_API_KEY` or `OPENAI_API_KEY`).
        search: `ddgs`, `searxng:URL`, `serper`, `tavily` or `corpus:INDEX`.
        workers: sub-agents running at once, or `"auto"`: fitted to the server (its slots, else adapted;
            the default with `api_base`).
        memory: an experiential-memory store for the plan stage; None: the default store when it
            holds one; False: none.
        max_cost: stop after spending this many dollars (the partial table is kept); a fan-out whose
            estimate's low end (plus what the manager spent) costs more is not started: the run
            stops with the numbers in its `ending` (status `stopped: ...`).
        max_tokens: stop after this many tokens.
        runs_dir: where the run directory is made (default: `runs/`).
        show_progress: False (default): print nothing; None: as the CLI (a live bar on a terminal,
            else lines on stderr); True: the live bar.
        on_progress: also called with each `ProgressEvent` of the run, from its threads: first
            `started` (`data["run"]`: the run folder's name), then the engine's phases and batches.
        estimate: as `ask --estimate`: the manager scouts and writes its decision, and the run
            stops where it would fan out (status `stopped: estimate only ...`), with what the fan-out
            would cost in `RunResult.estimate` (None when the manager wrote no decision to run). No
            sub-agent is called; the manager's own calls are spent, and counted in `usage`.
        **settings: any other field of `amapreduce.settings.Settings` by its name
            (`extraction_model='none'`, `max_batches=20`, `cache_dir=...`).

    Every keyword left out (or None) comes from the environment (`AMAPREDUCE_*`), else its default.

    Raises:
        ConfigError: a bad keyword or value, no model, a model id without a provider, an unknown
            search backend (nothing is run and no run directory is made).
        UserError: `query` is empty, or `memory` holds no store.
        RunError: the run failed; its `result` attribute holds the `RunResult`, `run_dir` its folder.
        KeyboardInterrupt: Ctrl-C; the run directory keeps the partial table.
    """
    from amapreduce.memory.schema import memory_store_for
    from amapreduce.session import RunOptions, Session

    if not isinstance(query, str) or not query.strip():
        raise UserError(f"query must be a question (a non-empty string), got {query!r}.")
    named = {"model": model, "api_base": api_base, "api_key": api_key, "search": search, "workers": workers,
             "max_cost": max_cost, "max_tokens": max_tokens, "runs_dir": runs_dir}
    config = _settings(named, settings)
    store = memory_store_for(memory if isinstance(memory, bool | None) else Path(memory), config.memory_store,
                             named="memory=")
    session = Session(config, RunOptions(query=query, memory_store=store, show_progress=show_progress,
                                         on_progress=on_progress, executor=_executor(config), estimate_only=estimate))
    with session:
        outcome = session.ask()
    return _returned(RunResult(outcome))


def run_decision(
    decision: Decision | Mapping[str, Any] | str | os.PathLike[str],
    *,
    model: str | None = None,
    api_base: str | None = None,
    api_key: str | SecretStr | None = None,
    search: str | None = None,
    workers: int | Literal["auto"] | None = None,
    max_cost: float | None = None,
    max_tokens: int | None = None,
    runs_dir: str | os.PathLike[str] | None = None,
    label: str | None = None,
    show_progress: bool | None = False,
    on_progress: ProgressSink | None = None,
    **settings: Any,
) -> RunResult:
    """Run a decision through the engine and search sub-agents, with no manager, as
    `amapreduce mapreduce run` does.

    Args:
        decision: a `Decision` (e.g. `Decision.from_dataframe(df, ...)`), a dict in the decision
            format, or the path of a decision JSON file.
        label: names the run directory and is recorded as its query (default: the file's name
            without `.json`, else `decision`).
        model, api_base, api_key, search, workers, max_cost, max_tokens, runs_dir, show_progress,
            on_progress, **settings: as for `ask`. The batch plan is capped only when `max_batches` is given.

    Raises:
        DecisionError: the decision is invalid, or its batch plan is larger than `max_batches`.
        EstimateOverBudget: even the low end of the run's estimate costs more than `max_cost`
            (refused before any model call, no run directory made; the message holds the numbers).
        ConfigError, RunError, KeyboardInterrupt: as for `ask`.
    """
    from amapreduce.decision.model import Decision, load_decision
    from amapreduce.session import RunOptions, Session
    from amapreduce.session.journal import RunKind

    named = {"model": model, "api_base": api_base, "api_key": api_key, "search": search, "workers": workers,
             "max_cost": max_cost, "max_tokens": max_tokens, "runs_dir": runs_dir}
    config = _settings(named, settings)
    if isinstance(decision, Decision):
        parsed, default_label = decision, "decision"
    elif isinstance(decision, Mapping):
        parsed, default_label = Decision.parse(decision), "decision"
    elif isinstance(decision, str | os.PathLike):
        parsed = load_decision(Path(decision), max_bytes=config.max_decision_bytes, max_rows=config.max_decision_rows)
        default_label = Path(decision).stem
    else:
        raise UserError(f"decision must be a Decision, a dict or the path of a JSON file, got {type(decision).__name__}.")
    session = Session(config, RunOptions(kind=RunKind.MAPREDUCE_RUN, query=label or default_label, decision=parsed,
                                         show_progress=show_progress, on_progress=on_progress,
                                         executor=_executor(config)))
    with session:
        outcome = session.run()
    return _returned(RunResult(outcome))


class _Interruptible:
    """A call made in a worker thread that can be interrupted as Ctrl-C interrupts the main thread.

    `interrupt` delivers `KeyboardInterrupt` to the thread while the call runs (CPython's
    `PyThreadState_SetAsyncExc`); the runs handle it as they handle Ctrl-C. The call returns
    `_INTERRUPTED` instead of raising it, because a `KeyboardInterrupt` that reaches an asyncio
    task is re-raised out of the event loop (it would stop the notebook's loop). An interrupt
    that arrives after the call returned is cleared, so it cannot reach the pool's next job.
    """

    def __init__(self, call: Callable[[], R]) -> None:
        self._call = call
        self._lock = threading.Lock()
        self._thread: int | None = None
        self._interrupted = False

    def __call__(self) -> Any:
        try:
            with self._lock:
                if self._interrupted:
                    return _INTERRUPTED
                self._thread = threading.get_ident()
            try:
                return self._call()
            finally:
                with self._lock:
                    self._thread = None
                    _async_exc(threading.get_ident(), None)
        except KeyboardInterrupt:
            return _INTERRUPTED

    def interrupt(self) -> None:
        """Interrupt the call once (before it starts: it does not start)."""
        with self._lock:
            if not self._interrupted and self._thread is not None:
                _raise_in(self._thread, KeyboardInterrupt)
            self._interrupted = True


_INTERRUPTED = object()
"""What an interrupted `_Interruptible` call returns."""


def _async_exc(thread: int, exc: type[BaseException] | None) -> None:
    """Raise `exc` in `thread` at its next Python step (None: clear one not raised yet)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), None if exc is None else ctypes.py_object(exc))


def _raise_in(thread: int, exc: type[BaseException]) -> None:
    """Raise `exc` in `thread`, at its next Python step, and in no other thread.

    Why not just `_async_exc`: CPython 3.11 gives a new thread's state the id of the thread that
    starts it until the new thread runs, and `PyThreadState_SetAsyncExc` sets the exception on the
    newest state with the id. An interrupt that came while the run's thread was starting a thread
    (a batch's worker, a hedge's watcher) went to the newborn, which died of it before it told
    `Thread.start` it had started: the run waited in `Thread.start` forever (seen as a hung
    cancelled `run_decision_async`; `tests/test_api.py` starts threads in a loop and interrupts it).
    `Thread.start` lists the thread in `threading._limbo`, under `threading._active_limbo_lock`,
    before it makes the new state, and the new thread takes itself off once its id is its own. So
    the exception is set under that lock while the list is empty; while a thread is starting, a
    moment later. The two names are CPython's private ones; where they are missing, as at once."""
    lock, limbo = getattr(threading, "_active_limbo_lock", None), getattr(threading, "_limbo", None)
    if lock is None or limbo is None:
        _async_exc(thread, exc)
        return
    for _ in range(_RAISE_TRIES):
        with lock:
            if not limbo:
                _async_exc(thread, exc)
                return
        time.sleep(0.001)
    _async_exc(thread, exc)  # threads that never stop starting: at any step, as Ctrl-C would come


_RAISE_TRIES = 2000


def _in_a_thread(function: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """The async variant of `function`: the same call in a worker thread (`asyncio.to_thread`);
    cancelling the awaiting task interrupts it (see the module's docstring)."""

    @functools.wraps(function)
    async def variant(*args: P.args, **kwargs: P.kwargs) -> R:
        call = _Interruptible(functools.partial(function, *args, **kwargs))
        running = asyncio.ensure_future(asyncio.to_thread(call))
        running.add_done_callback(lambda f: f.cancelled() or f.exception())  # read: never "never retrieved"
        try:
            result = await asyncio.shield(running)
        except asyncio.CancelledError:
            call.interrupt()
            await asyncio.wait({running})  # the run records `stopped: interrupted` before the task ends
            raise
        if result is _INTERRUPTED:  # interrupted by nobody but `call.interrupt`: cannot happen uncancelled
            raise asyncio.CancelledError
        return result  # type: ignore[no-any-return]

    variant.__name__ = variant.__qualname__ = f"{function.__name__}_async"
    variant.__doc__ = (
        f"`{function.__name__}` for code that already runs an event loop (a notebook, an MCP server): the same keywords, "
        "the same result and errors; the call runs in a worker thread. Cancelling the task interrupts "
        "the run as Ctrl-C does and ends once its run directory recorded `stopped: interrupted`."
    )
    return variant


ask_async = _in_a_thread(ask)
run_decision_async = _in_a_thread(run_decision)
