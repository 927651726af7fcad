"""Shared fixtures. Tests are offline by construction:

* pytest-socket (configured in pyproject) refuses every socket except loopback;
* `block_model_requests()` makes any real smolagents API-model call raise.

The suite runs on a fresh clone of the repository alone. The tests that check the scorers against
the real WideSearch / DeepWideSearch tasks and gold tables (not bundled: they are not ours to ship)
ask for the `benchmark_data` fixture, which reads the folder from `AMAPREDUCE_DATA_DIR` (CI's
`.ci/run` sets it to `../shared/data`) and skips them, with that reason, when it is unset or missing.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from amapreduce.llm.guard import block_model_requests

# Libraries that would otherwise try the network at import or load time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

block_model_requests()

# Property tests explore new examples locally; in CI they replay a fixed, reproducible set.
# Neither has a per-example deadline: tests never depend on wall-clock time (a loaded CI machine
# must not turn a slow example into a failure).
settings.register_profile("local", deadline=None)
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "local")

REPO_ROOT = Path(__file__).resolve().parents[1]

DATA_DIR_VARIABLE = "AMAPREDUCE_DATA_DIR"
"""The one test setting: where the benchmark data sets are. amapreduce itself never reads it."""


def locate_benchmark_data(value: str | None) -> tuple[Path | None, str]:
    """The benchmark data folder named by `value` (the variable's text), or None and why not.

    A relative path is taken from the working directory, as a shell user means it.
    """
    if not value:
        return None, (f"benchmark data not found: set {DATA_DIR_VARIABLE}=DIR to a folder holding "
                      "widesearch/ and deepwidesearch/ (CI's .ci/run uses ../shared/data)")
    folder = Path(value).expanduser().resolve()
    if not folder.is_dir():
        return None, (f"benchmark data not found: {DATA_DIR_VARIABLE}={value} is not a folder; set it to one "
                      "holding widesearch/ and deepwidesearch/ (CI's .ci/run uses ../shared/data)")
    return folder, ""


# Read once, at import: the autouse fixture below removes every AMAPREDUCE_* variable from each test.
BENCHMARK_DATA, BENCHMARK_DATA_MISSING = locate_benchmark_data(os.environ.get(DATA_DIR_VARIABLE))


@pytest.fixture(autouse=True)
def _no_user_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own settings (a model, an API base, a judge, a cache folder) must never
    reach a test: every test starts from the defaults and sets what it needs."""
    for name in list(os.environ):
        if name.startswith(("AMAPREDUCE_", "OPENAI_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AMAPREDUCE_ENV_FILE", os.devnull)  # nor a developer's `.env`
    # No endpoint probe (`llm.endpoint`) unless a test asks for one: tests point `--api-base` at closed ports to
    # see how a run fails once started, and at scripted servers whose every reply a test counts. The probe's
    # own tests set it: tests/test_llm_endpoint.py, test_unreachable_provider.py, test_real_model.py.
    monkeypatch.setenv("AMAPREDUCE_ENDPOINT_PROBE", "0")


@pytest.fixture(autouse=True, scope="session")
def _every_record_meets_the_published_schema() -> Iterator[None]:
    """Every `result.json` a run writes in this suite (ask, mapreduce run, enrich, demo, eval trials,
    failed, stopped and interrupted runs) is checked, as written, against the JSON Schema users get
    (`docs/reference/result.schema.json`): a record the schema refuses fails the test that wrote it."""
    import json

    import jsonschema

    from amapreduce.session.record import RunRecord, schema
    from amapreduce.session.rundir import RunDir

    # the published file is this schema (tests/test_run_record.py keeps it current); made here, not read,
    # so a copy of this conftest outside the repository (tests/test_setup_truths.py) works alike
    validator = jsonschema.Draft202012Validator(schema())
    write = RunDir.write_result

    def checked(self: RunDir, record: RunRecord) -> None:
        write(self, record)
        written = json.loads((self.path / "result.json").read_text(encoding="utf-8"))
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(written)]
        assert not errors, f"{self.path / 'result.json'} does not meet result.schema.json: {errors[:3]}"

    RunDir.write_result = checked  # type: ignore[method-assign]
    yield
    RunDir.write_result = write  # type: ignore[method-assign]


@pytest.fixture(autouse=True, scope="session")
def _every_trace_line_meets_the_trace_schema() -> Iterator[None]:
    """Every line any run writes to its run folder's `trace.jsonl` in this suite has an event and
    fields that `amapreduce.trace_schema` (`docs/reference/trace.md`) lists: a new event or field is
    documented or the test that wrote it fails. (A `TraceWriter` a test makes itself is its own.)"""
    from amapreduce.session.rundir import RunDir
    from amapreduce.trace import TraceWriter
    from amapreduce.trace_schema import problems

    write, opened = TraceWriter.write, RunDir.__init__

    def checked(self: TraceWriter, event: str, **data: Any) -> None:
        if getattr(self, "_run_folder_trace", False):
            found = problems({"ts": 0, "event": event, **data})
            assert not found, f"{self.path}: {found}"
        write(self, event, **data)

    def run_folder(self: RunDir, *args: Any, **kwargs: Any) -> None:
        opened(self, *args, **kwargs)
        self.trace._run_folder_trace = True  # type: ignore[attr-defined]

    TraceWriter.write = checked  # type: ignore[method-assign]
    RunDir.__init__ = run_folder  # type: ignore[method-assign]
    yield
    TraceWriter.write, RunDir.__init__ = write, opened  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _fresh_shared_limits() -> Iterator[None]:
    """Rate limiters and circuit breakers are process-wide, keyed by provider (`127.0.0.1:PORT` for
    the loopback servers): without this, an open breaker or a policy of one test would meet a later
    test that happens to get the same port."""
    from amapreduce.llm.breaker import forget_shared_breakers
    from amapreduce.ratelimit import forget_shared_limiters

    forget_shared_breakers()
    forget_shared_limiters()
    yield
    forget_shared_breakers()
    forget_shared_limiters()


@pytest.fixture(autouse=True)
def _no_registered_secrets() -> Iterator[None]:
    """Configured keys are registered process-wide for redaction by value (`trace.register_secrets`):
    a key one test registers must not mask text in the next."""
    from amapreduce.trace import forget_secrets

    forget_secrets()
    yield
    forget_secrets()


@pytest.fixture()
def python_sigint() -> Iterator[None]:
    """Python's own Ctrl-C handler for tests that simulate Ctrl-C with `_thread.interrupt_main()`.

    A process started in the background by a non-interactive shell inherits SIGINT *ignored*,
    and then `interrupt_main()` does nothing; CI may start the suite that way."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository checkout."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def benchmark_data() -> Path:
    """The WideSearch / DeepWideSearch tasks and gold tables (read-only; never copied into the repo).

    Skips the test, with the reason, when `AMAPREDUCE_DATA_DIR` is unset or names no folder: a
    fresh clone passes without them, and the summary says what it did not check.
    """
    if BENCHMARK_DATA is None:
        pytest.skip(BENCHMARK_DATA_MISSING)
    return BENCHMARK_DATA


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how many tests went without the benchmark data, and why, even under `-q` (which hides
    skip reasons): a skipped check must never pass for a passed one."""
    skipped = [r for r in terminalreporter.stats.get("skipped", [])
               if BENCHMARK_DATA_MISSING and BENCHMARK_DATA_MISSING in str(getattr(r, "longrepr", ""))]
    if skipped:
        noun = "test" if len(skipped) == 1 else "tests"
        terminalreporter.write_line(f"{len(skipped)} {noun} skipped: {BENCHMARK_DATA_MISSING}", yellow=True)
