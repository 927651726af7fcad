"""The progress counters: batch retries as the run's summary counts them, provider retries apart."""

from __future__ import annotations

from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.retry import ProviderRetry
from amapreduce.progress import ProgressEvent
from amapreduce.session.progress import RunProgress


def test_batch_and_provider_retries_are_counted_apart() -> None:
    progress = RunProgress(UsageMeter(), enabled=False)
    with progress:
        progress(ProgressEvent(kind="phase", phase="map", done=0, total=2))
        progress(ProgressEvent(kind="attempt", phase="map", done=0, total=0, data={"attempt": 1}))
        progress(ProgressEvent(kind="attempt", phase="map", done=0, total=0, data={"attempt": 2}))
        progress.on_provider_retry(
            ProviderRetry(role="subagent", model_id="sim-model", retry=1, kind="rate_limit", delay_s=0.5, error=None)
        )
        progress(ProgressEvent(kind="batch_done", phase="patch1", done=1, total=2))
    assert progress.retries == 1 and progress.provider_retries == 1
    assert progress.stage == "patch1"


def test_backups_are_shown_and_not_counted_as_retries() -> None:
    progress = RunProgress(UsageMeter(), enabled=False)
    with progress:
        progress(ProgressEvent(kind="phase", phase="map", done=0, total=2))
        progress(ProgressEvent(kind="attempt", phase="map", done=0, total=0, data={"attempt": 2}))
        progress(ProgressEvent(kind="backup", phase="map", done=0, total=0, data={"batch_id": "b", "attempt": 2}))
        progress(ProgressEvent(kind="attempt", phase="map", done=0, total=0, data={"attempt": 2, "backup": True}))
    assert progress.retries == 1
    assert "retries 1 · backups 1 · " in progress._facts()
