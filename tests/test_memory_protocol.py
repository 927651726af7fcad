"""App. D.5: one frozen snapshot per instance shared by its trials; one canonical trial committed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from test_memory_fixtures import FAIL, PASS, QUERY, ranked_store

from amapreduce.mapreduce.prior import PriorRequest
from amapreduce.memory import InstanceSession, TrialOutcome, canonical_trial
from amapreduce.memory.records import DecisionSummary


def _outcome(trial: int, metrics, prior=None, failure=None) -> TrialOutcome:  # type: ignore[no-untyped-def]
    return TrialOutcome(trial=trial, prior=prior, decision=DecisionSummary(template=f"trial {trial}"), metrics=metrics,
                        failure=failure)


def test_commit_rule_is_fixed_and_quality_based() -> None:
    mid = {"score": 0, "f1_by_row": 0.8, "f1_by_item": 0.9}
    outcomes = [_outcome(0, FAIL), _outcome(1, mid), _outcome(2, PASS, failure="crash"), _outcome(3, mid)]
    chosen = canonical_trial(outcomes)
    assert chosen is not None and chosen.trial == 1  # best valid quality; tie 1 vs 3 goes to 1
    assert canonical_trial(list(reversed(outcomes))) == chosen  # order of completion does not matter
    assert canonical_trial([_outcome(0, None), _outcome(1, PASS, failure="scorer down")]) is None


def test_trials_share_a_frozen_snapshot_and_cannot_leak_to_each_other(tmp_path: Path) -> None:
    mem, enc = ranked_store(tmp_path)
    enc.vectors["other instance"] = enc.at(0.99)
    session = InstanceSession(mem, task_id="task-1", query=QUERY)
    first = session.snapshot.prior(PriorRequest(query=QUERY, task_id="task-1"))
    # Meanwhile the live memory changes (another instance commits, weights move).
    mem.update(first, query="other instance", decision=DecisionSummary(), metrics=PASS, task_id="task-0")
    request = PriorRequest(query=QUERY, task_id="task-1")
    with ThreadPoolExecutor(4) as pool:
        priors = list(pool.map(lambda _: session.snapshot.prior(request), range(4)))
    assert all(p == first for p in priors)  # same hints, same neighbours, same scores
    assert "other instance" not in first.text
    live = mem.prior(request)
    assert live.record_ids[0] != first.record_ids[0] and live.details["hints"] != first.details["hints"]


def test_commit_writes_exactly_one_record_crediting_the_canonical_prior(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path)
    session = InstanceSession(mem, task_id="task-1", query=QUERY)
    prior = session.snapshot.prior(PriorRequest(query=QUERY, task_id="task-1"))
    before = mem.store.counts()["records"]
    result = session.commit([_outcome(0, FAIL, prior), _outcome(1, PASS, prior), _outcome(2, PASS, prior)])
    assert result is not None and result.label is True and result.credited == {"hB": 8, "hE": 5, "hA": 3}
    assert mem.store.counts()["records"] == before + 1
    record = mem.store.record(result.record_id or "")
    assert record is not None and record.decision.template == "trial 1" and record.task_id == "task-1"


def test_an_instance_whose_trials_all_failed_commits_nothing(tmp_path: Path) -> None:
    mem, _ = ranked_store(tmp_path)
    session = InstanceSession(mem, task_id="t", query=QUERY)
    assert session.commit([_outcome(0, None), _outcome(1, PASS, failure="timeout")]) is None
    assert mem.store.counts()["records"] == 8


def test_a_session_commits_once(tmp_path: Path) -> None:
    import pytest

    from amapreduce.errors import UserError

    mem, _ = ranked_store(tmp_path)
    session = InstanceSession(mem, task_id="t", query=QUERY)
    session.commit([_outcome(0, PASS)])
    with pytest.raises(UserError, match="already committed"):
        session.commit([_outcome(0, PASS)])
