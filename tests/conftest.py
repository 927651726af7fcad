"""Shared fixtures. Tests are offline by construction:

* pytest-socket (configured in pyproject) refuses every socket except loopback;
* `block_model_requests()` makes any real smolagents API-model call raise.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

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
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _no_user_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own settings (a model, an API base, a judge, a cache folder) must never
    reach a test: every test starts from the defaults and sets what it needs."""
    for name in list(os.environ):
        if name.startswith(("AMAPREDUCE_", "OPENAI_")):
            monkeypatch.delenv(name)


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
def shared_data() -> Path:
    """`../shared/data` beside the checkout (read-only benchmark data; never copied into the repo)."""
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data not found at {SHARED_DATA}; the checkout must sit beside ../shared")
    return SHARED_DATA
