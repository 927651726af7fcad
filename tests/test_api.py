"""The Python API (`amapreduce.ask`, `run_decision`, their async variants, `RunResult`,
`Decision.from_dataframe`), offline: the simulated model (deterministic code, not an LLM) served
over the loopback OpenAI-compatible server, searching the sandbox corpus — the real client path."""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import amapreduce
from amapreduce import ConfigError, Decision, DecisionError, RunError, RunStatus, UserError
from amapreduce.api import to_dataframe
from amapreduce.demo.run import load_sandbox_tasks
from amapreduce.demo.serve import SERVED_MODEL_NAME, serving_model
from amapreduce.llm.guard import allow_model_requests
from amapreduce.progress import ProgressEvent
from amapreduce.settings import Settings
from amapreduce.table.table import Table
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply

COUNTRY_TEMPLATE = 'In the Sandbox Atlas, find the capital and population of the country or territory "__0__".'
TO_FIND = {"Capital": {}, "Population": {"type": "integer", "description": "digits only, no thousands separators"}}
DECISION = {
    "task_matrix": [["Austria"], ["Malta"], ["Estonia"]],
    "template": COUNTRY_TEMPLATE,
    "json_schema": {"type": "object", "properties": {"Country": {}, **TO_FIND}},
}
EXPECTED = [["Austria", "Vienna", "8847037"], ["Malta", "Valletta", "483530"], ["Estonia", "Tallinn", "1320884"]]
"""The sandbox atlas's facts for `DECISION` (as in the gold tables)."""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any, Path]:
    cache = tmp_path_factory.mktemp("cache")
    tasks, sandbox = load_sandbox_tasks(Settings(cache_dir=cache))
    return tasks, sandbox, cache


@pytest.fixture
def notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A notebook's working folder: runs go to its `runs/`."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _serve(hook: Callable[[], None] | None = None, **server: Any) -> OpenAICompatibleServer:
    """The served simulated model; `hook` runs before each reply (in the server's thread)."""
    inner = serving_model()

    def reply(messages: list[Any], info: ModelInfo) -> Reply:
        if hook is not None:
            hook()
        return inner.function(messages, info)

    return OpenAICompatibleServer(FunctionModel(reply, model_id=inner.model_id), keep_requests=False, **server)


@pytest.fixture
def served() -> Iterator[OpenAICompatibleServer]:
    with _serve() as server, allow_model_requests():
        yield server


def _endpoint(server: OpenAICompatibleServer, world: tuple[dict[str, Any], Any, Path]) -> dict[str, Any]:
    """The keywords of a call to the served model over the sandbox corpus (as `demo --serve` prints)."""
    _, sandbox, cache = world
    return {"model": SERVED_MODEL_NAME, "api_base": server.base_url, "search": f"corpus:{sandbox.index_dir}",
            "extraction_model": "none", "cache_dir": cache}


def test_a_notebook_cell_gets_the_gold_table_as_a_dataframe(
    served: OpenAICompatibleServer, world: Any, notebook: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    tasks, sandbox, _ = world
    task = tasks["sbx_en_005"]
    # no hedged calls: a hedge's loser cancelled before the server read it is still charged (as it
    # should be), which would make the count below differ from the server's on a loaded machine
    r = amapreduce.ask(task.query, **_endpoint(served, world), backup="off")
    df = r.to_pandas()
    assert capfd.readouterr() == ("", "")  # no progress, nothing printed in a notebook
    gold = pd.read_csv(Path(sandbox.gold_dir) / "sbx_en_005.csv", dtype=str, keep_default_na=False)
    assert list(df.columns) == list(gold.columns)
    assert sorted(df.itertuples(index=False, name=None)) == sorted(gold.itertuples(index=False, name=None))
    # matrix order: the order of the manager's task matrix, row for row
    matrix = [row[0] for decision in r.record.decisions for row in decision["task_matrix"]]
    assert df["Country"].tolist() == matrix
    assert r.status == RunStatus.COMPLETE == "complete" and r.completeness.complete
    assert r.usage.requests == served.request_count and r.cost_usd is None  # the served model has no price
    assert r.run_dir.parent.resolve() == (notebook / "runs").resolve()
    assert json.loads((r.run_dir / "result.json").read_text(encoding="utf-8"))["status"] == "complete"
    assert "status='complete', rows=27, missing_cells=0" in repr(r)


def test_run_decision_takes_a_dict_or_a_path_and_shows_the_evidence(
    served: OpenAICompatibleServer, world: Any, notebook: Path
) -> None:
    from_dict = amapreduce.run_decision(DECISION, workers=2, **_endpoint(served, world))
    path = notebook / "europe.json"
    path.write_text(json.dumps(DECISION), encoding="utf-8")
    from_path = amapreduce.run_decision(path, **_endpoint(served, world))
    for r in (from_dict, from_path):
        assert r.status == "complete"
        assert r.to_pandas().values.tolist() == EXPECTED
    assert from_path.run_dir.name.endswith("europe") and from_dict.run_dir.name.endswith("decision")
    evidence = from_dict.to_pandas(evidence=True)
    assert list(evidence.columns) == [
        f"{c}{f}" for c in ("Country", "Capital", "Population")
        for f in ("", " status", " source", " quote", " evidence", " confidence")
    ]
    # a verified quote 0.9 (more where a later reply agreed), an entity the matrix gave 1.0: floats, to sort by
    assert evidence["Capital confidence"].dtype == float and min(evidence["Capital confidence"]) >= 0.9
    assert set(evidence["Country confidence"]) == {1.0}
    assert set(evidence["Capital status"]) == {"found"}
    # The simulated sub-agent quotes the page line it read; the quote is checked against the fetched page.
    assert set(evidence["Capital evidence"]) == {"verified"} and set(evidence["Country evidence"]) == {"no_evidence"}
    assert all(capital in quote for capital, quote in zip(evidence["Capital"], evidence["Capital quote"], strict=True))
    assert set(evidence["Country source"]) == {"task_matrix"}  # the entity comes from the matrix, not a model
    assert evidence["Capital source"].tolist() == [
        f"corpus://sandbox/countries/{code}.html" for code in ("at", "mt", "ee")
    ]


def test_a_dataframe_of_entities_goes_round_trip(served: OpenAICompatibleServer, world: Any, notebook: Path) -> None:
    entities = pd.DataFrame({"Country": ["Austria", "Malta", "Estonia"]})
    decision = Decision.from_dataframe(entities, template=COUNTRY_TEMPLATE, columns=TO_FIND)
    assert decision.task_matrix == DECISION["task_matrix"] and decision.template == COUNTRY_TEMPLATE
    assert decision.columns == ("Country", "Capital", "Population")
    assert decision.resolved_key_columns == ("Country",)
    found = amapreduce.run_decision(decision, **_endpoint(served, world)).to_pandas()
    pd.testing.assert_frame_equal(found[entities.columns], entities, check_dtype=False)
    assert found.values.tolist() == EXPECTED


@contextmanager
def no_logging_configured(name: str) -> Iterator[list[str]]:
    """As in a notebook or a script: no handler on the root logger (pytest's own are taken off for
    the block), so a record no handler takes would reach Python's last resort, stderr. Yields the
    messages logger `name` logs (seen by a filter, which is not a handler)."""
    saved, seen, logger = logging.root.handlers[:], [], logging.getLogger(name)

    def keep(record: logging.LogRecord) -> bool:
        seen.append(record.getMessage())
        return True

    logging.root.handlers.clear()
    logger.addFilter(keep)
    try:
        yield seen
    finally:
        logger.removeFilter(keep)
        logging.root.handlers[:] = saved


def test_usage_speaks_result_json_and_a_price_warning_is_logged_not_printed(
    served: OpenAICompatibleServer, world: Any, notebook: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with no_logging_configured("amapreduce.llm.meter") as logged:
        r = amapreduce.run_decision(DECISION, max_cost=1.0, **_endpoint(served, world))  # a budget the served
    assert capfd.readouterr() == ("", "")  # model has no price for: the warning is a log record, not output
    assert any("has no known price" in message for message in logged)
    usage = r.usage
    assert usage.to_json() == r.record.usage.total.model_dump()  # result.json's words: prompt_/completion_tokens
    assert usage.requests == served.request_count and usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert not hasattr(usage, "input_tokens") and not hasattr(usage, "output_tokens")
    # Unpriced: the run's cost is unknown, and both ways of asking say so.
    assert usage.cost_usd is None and r.cost_usd is None and usage.priced_cost_usd == 0.0
    assert usage.unpriced_models == tuple(r.record.usage.unpriced_models) != ()


def test_from_dataframe_writes_cells_as_text_and_refuses_what_it_cannot_place() -> None:
    df = pd.DataFrame({"city": ["Lyon", "Porto"], "country": ["France", "Portugal"], "rank": np.array([2, 2]),
                       "hint": ["on the Rhone", None]})
    d = Decision.from_dataframe(
        df, template="Population of __0__ (__1__), rank __2__? __3__", context_columns=["hint"],
        columns={"population": {"type": "integer", "description": "inhabitants"}}, batch_size=2,
    )
    assert d.task_matrix == [["Lyon", "France", "2", "on the Rhone"], ["Porto", "Portugal", "2", ""]]
    assert d.columns == ("city", "country", "rank", "population")  # the context column is no output
    assert d.resolved_matrix_columns == ("city", "country", "rank", None)
    assert d.column_specs[-1].description == "inhabitants" and d.batch_size == 2
    keyed = Decision.from_dataframe(df[["city"]], template="__0__", columns="population", key_columns=["city"])
    assert keyed.columns == ("city", "population") and keyed.resolved_key_columns == ("city",)
    bad: list[tuple[pd.DataFrame, dict[str, Any], str]] = [
        (pd.DataFrame({"city": ["Lyon", None]}), {}, "empty cell for key column 'city'"),
        (pd.DataFrame({0: ["Lyon"]}), {}, "column names must be text"),
        (df[["city"]], {"context_columns": ["nope"]}, "not columns of the DataFrame"),
        (df[["city"]], {"columns": ["city"]}, "already DataFrame columns"),
        (df[["city"]].iloc[:0], {}, "task_matrix is empty"),
        (df[["city"]], {"batch_sise": 2}, "unknown field"),
        (df[["city"]], {"matrix_columns": [None]}, r"makes \['matrix_columns'\] from the DataFrame"),
    ]
    for frame, options, message in bad:
        with pytest.raises(DecisionError, match=message):
            Decision.from_dataframe(frame, template="__0__", **{"columns": ["population"], **options})


def test_to_dataframe_shows_missing_cells_as_none_and_conflicts_in_the_evidence() -> None:
    table = Table(["name", "capital"], ["name"])
    table.upsert({"name": "France", "capital": "Paris"}, task_index=0, source="https://a")
    table.upsert({"name": "France", "capital": "Lyon"}, task_index=0, source="https://b")
    table.upsert({"name": "Spain"}, task_index=1)
    assert to_dataframe(table).values.tolist() == [["France", "Paris"], ["Spain", None]]
    evidence = to_dataframe(table, evidence=True)
    assert evidence["capital status"].tolist() == ["conflict", "missing"]
    assert evidence["capital source"].tolist() == ["https://a", None]
    assert evidence["capital quote"].tolist() == [None, None] and set(evidence["capital evidence"]) == {"no_evidence"}
    clash = Table(["name", "name status"], ["name"])
    assert list(to_dataframe(clash).columns) == ["name", "name status"]
    with pytest.raises(UserError, match=r"repeat the table's column\(s\) \['name status'\]"):
        to_dataframe(clash, evidence=True)


def test_ask_async_runs_in_a_running_event_loop_without_blocking_it(world: Any, notebook: Path) -> None:
    tasks, _, _ = world
    first_call, loop_answered = threading.Event(), threading.Event()
    released_by_the_loop: list[bool] = []

    def hook() -> None:
        if not first_call.is_set():
            first_call.set()
            # the run waits for the event loop: it can only go on if the loop is free
            released_by_the_loop.append(loop_answered.wait(timeout=60))

    async def cell(server: OpenAICompatibleServer) -> amapreduce.RunResult:
        running = asyncio.create_task(amapreduce.ask_async(tasks["sbx_en_001"].query, **_endpoint(server, world)))
        await asyncio.to_thread(first_call.wait, 60)
        loop_answered.set()
        return await running

    with _serve(hook) as server, allow_model_requests():
        r = asyncio.run(cell(server))
    assert released_by_the_loop == [True]
    assert r.status == "complete" and len(r.to_pandas()) == r.completeness.expected_rows > 0


def _cancel_mid_run(world: Any, start: Callable[[dict[str, Any]], Any]) -> tuple[dict[str, Any], int]:
    """Start a run with `start(keywords)`, cancel its task while the served model holds its first
    reply, and return the run's `result.json` and the requests the server answered."""
    holding, release = threading.Event(), threading.Event()

    def hook() -> None:
        if not holding.is_set():
            holding.set()
            release.wait(timeout=60)

    async def cell(server: OpenAICompatibleServer) -> None:
        running = asyncio.create_task(start(_endpoint(server, world)))
        await asyncio.to_thread(holding.wait, 60)
        running.cancel()
        await asyncio.sleep(0)  # the task's handler interrupts the run's thread first
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert await asyncio.to_thread(sum, range(10)) == 45  # the worker pool is sound afterwards

    with _serve(hook) as server, allow_model_requests():
        asyncio.run(cell(server))
        answered = server.request_count
    (run_dir,) = (Path("runs")).iterdir()
    return json.loads((run_dir / "result.json").read_text(encoding="utf-8")), answered


def test_cancelling_ask_async_interrupts_the_run_as_ctrl_c_does(world: Any, notebook: Path) -> None:
    tasks, _, _ = world
    record, answered = _cancel_mid_run(world, lambda kw: amapreduce.ask_async(tasks["sbx_en_005"].query, **kw))
    assert record["status"] == "stopped: interrupted"
    assert answered == 1  # the manager asked nothing after its first reply


def test_cancelling_run_decision_async_keeps_the_rows_found(world: Any, notebook: Path) -> None:
    record, _ = _cancel_mid_run(world, lambda kw: amapreduce.run_decision_async(DECISION, workers=1, **kw))
    assert record["status"] == "stopped: interrupted"
    assert record["completeness"]["rows"] == 3  # the matrix's entities are kept ...
    assert record["completeness"]["missing_cells"] >= 4  # ... and the batches after the first never started


def test_an_interrupt_never_lands_in_a_thread_the_run_is_starting() -> None:
    """CPython 3.11 gives a thread being started its parent's id until it runs, and an interrupt
    sent by that id while the parent starts it went to the newborn: it died before `Thread.start`
    heard from it, and the run's thread waited there forever (a cancelled `run_decision_async`
    hung once in 25 minutes; this loop hung about one interrupt in three). Each interrupt must
    reach the thread that runs the call, and that thread must come back."""
    from amapreduce.api import _INTERRUPTED, _Interruptible

    def start_threads_forever() -> None:  # as a run does: batch workers, hedge watchers
        while True:
            started = threading.Thread(target=lambda: None, daemon=True)
            started.start()
            started.join()

    for _ in range(40):
        call = _Interruptible(start_threads_forever)
        got: list[Any] = []
        runner = threading.Thread(target=lambda call=call, got=got: got.append(call()), daemon=True)
        runner.start()
        time.sleep(0.005)
        call.interrupt()
        runner.join(10)
        assert not runner.is_alive(), "the interrupted call never came back (stuck in Thread.start)"
        assert got == [_INTERRUPTED]


def test_on_progress_gets_the_runs_events_first_its_start_naming_the_run(
    served: OpenAICompatibleServer, world: Any, notebook: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    events: list[ProgressEvent] = []
    r = amapreduce.run_decision(DECISION, workers=1, on_progress=events.append, **_endpoint(served, world))
    assert capfd.readouterr() == ("", "")  # the events reach the callback, and nothing is printed
    assert (events[0].kind, events[0].data) == ("started", {"run": r.run_dir.name, "run_dir": str(r.run_dir)})
    done = [e for e in events if e.kind == "batch_done"]
    assert done and done[-1].done == done[-1].total


def test_a_spent_budget_returns_the_partial_result(served: OpenAICompatibleServer, world: Any, notebook: Path) -> None:
    r = amapreduce.run_decision(DECISION, workers=1, max_tokens=1, **_endpoint(served, world))
    assert r.status == RunStatus.STOPPED and "token budget" in (r.ending.reason or "")
    assert r.to_pandas()["Country"].tolist() == ["Austria", "Malta", "Estonia"]


def test_a_model_the_server_does_not_serve_fails_with_the_result_attached(world: Any, notebook: Path) -> None:
    with _serve(models=("simulated",)) as server, allow_model_requests():
        with pytest.raises(RunError, match="HTTP 404") as failed:
            amapreduce.ask("List the countries of Oceania.", **{**_endpoint(server, world), "model": "no-such-model"})
    result = vars(failed.value)["result"]  # `failed.value.result`, read past the exception's static type
    assert result.status == RunStatus.FAILED and result.run_dir.is_dir()
    assert str(result.run_dir) in str(failed.value)
    clone = pickle.loads(pickle.dumps(failed.value))  # errors pickle with their plain fields
    assert clone.fields == {"run_dir": str(result.run_dir)} and str(clone) == str(failed.value)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: amapreduce.ask("q", model="no-provider-model"), ConfigError, "'no-provider-model' needs a provider"),
        (lambda: amapreduce.ask("q", model="m", api_base="http://127.0.0.1:9/v1", search="bing"), ConfigError,
         "bing"),
        (lambda: amapreduce.ask("q", model="m", workers=0), ConfigError,
         r"workers=0 is invalid \(setting `workers`\)"),
        (lambda: amapreduce.ask("q", model="m", max_cost=-1), ConfigError, r"max_cost=-1 is invalid"),
        (lambda: amapreduce.ask("q", model="m", wokers=2), ConfigError, "unknown keyword 'wokers'"),
        (lambda: amapreduce.ask("q", model="m", search="ddgs", search_backend="ddgs"), ConfigError,
         "search_backend= repeats search="),
        (lambda: amapreduce.ask("q"), ConfigError, "no model is configured. Pass model="),
        (lambda: amapreduce.ask("  ", model="m"), UserError, "query must be a question"),
        (lambda: amapreduce.ask("q", model="openai/m", memory="nowhere"), UserError,
         "memory='nowhere' holds no experiential-memory store"),
        (lambda: amapreduce.ask("q", model="openai/m", memory=True), UserError,
         "memory='memory_store/default' holds no experiential-memory store"),
        (lambda: amapreduce.run_decision(42, model="m"), UserError, "decision must be a Decision, a dict or"),
        (lambda: amapreduce.run_decision("missing.json", model="m"), DecisionError, "does not exist"),
        (lambda: amapreduce.run_decision({**DECISION, "template": ""}, model="m"), DecisionError, "template"),
    ],
)
def test_bad_input_is_refused_before_a_run_directory_is_made(
    notebook: Path, call: Callable[[], Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        call()
    assert not (notebook / "runs").exists()


def test_a_memory_store_is_given_to_the_run_as_ask_memory_gives_it(
    notebook: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = notebook / "store"
    store.mkdir()
    (store / "memory.sqlite3").write_text("not a database", encoding="utf-8")  # opened, and refused
    endpoint = {"model": "m", "api_base": "http://127.0.0.1:9/v1"}
    with pytest.raises(UserError, match="not an amapreduce memory store"):
        amapreduce.ask("q", memory=store, **endpoint)
    monkeypatch.setenv("AMAPREDUCE_MEMORY_STORE", str(store))  # the default store, used when it holds one
    with pytest.raises(UserError, match="not an amapreduce memory store"):
        amapreduce.ask("q", **endpoint)
    assert not (notebook / "runs").exists()  # refused before the run, like `ask --memory`: no failed run left


def test_keywords_win_over_the_environment_which_wins_over_the_defaults(
    notebook: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMAPREDUCE_MODEL", "from-the-environment")
    with pytest.raises(ConfigError, match="'from-the-environment' needs a provider"):
        amapreduce.ask("q")
    with pytest.raises(ConfigError, match="'from-a-keyword' needs a provider"):
        amapreduce.ask("q", model="from-a-keyword")
    monkeypatch.setenv("AMAPREDUCE_WORKERS", "many")
    with pytest.raises(ConfigError, match="`AMAPREDUCE_WORKERS` is invalid"):
        amapreduce.ask("q", model="m")
    with pytest.raises(ConfigError, match="'m' needs a provider"):  # the keyword replaces the bad variable
        amapreduce.ask("q", model="m", workers=2)


def test_a_bad_key_is_named_but_never_shown() -> None:
    with pytest.raises(ConfigError) as bad:
        amapreduce.ask("q", model="m", api_key=["sk-secret-123"])
    assert "api_key=(a secret) is invalid" in str(bad.value) and "sk-secret-123" not in str(bad.value)
