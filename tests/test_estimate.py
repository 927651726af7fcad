"""Estimates before spending (issue 27 point 3): a batch plan multiplied out by the per-batch figures
of the user's own past runs (`amapreduce.session.estimate`), read from real run folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from records import write_record

from amapreduce.decision.model import Decision
from amapreduce.llm.meter import Price, PriceTable
from amapreduce.mapreduce.batching import plan_batches
from amapreduce.session.estimate import DEFAULTS, PastRun, estimate_plan, past_runs, profile_of


def decision(rows: int, batch_size: int = 1) -> Decision:
    return Decision.parse({"task_matrix": [[f"Item {i}"] for i in range(rows)], "template": "Code of __0__?",
                           "json_schema": ["item", "code"], "batch_size": batch_size,
                           "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"}})


def run_folder(runs: Path, name: str, *, rows: int, batches: int, calls_per_batch: int, prompt_per_call: int,
               latency_s: float = 0.5, model: str = "openai/m", kind: str = "ask", cached_per_call: int = 0) -> None:
    """A finished run folder as the session writes one: result.json and one model_call event per call;
    an `ask` records its `decisions`, another kind its one `decision`."""
    folder = runs / name
    executed = {"task_matrix": [[f"Item {i}"] for i in range(rows)], "template": "Code of __0__?"}
    write_record(folder, kind=kind, completeness={"rows": rows, "batches": batches, "attempts": batches},
                 **({"decisions": [executed]} if kind == "ask" else {"decision": executed}))
    calls = [{"event": "model_call", "role": "subagent", "model_id": model, "latency_s": latency_s, "error": None,
              "usage": {"requests": 1, "prompt_tokens": prompt_per_call, "completion_tokens": 20,
                        "cached_tokens": cached_per_call}}
             for _ in range(batches * calls_per_batch)]
    manager = {"event": "model_call", "role": "manager", "model_id": model, "latency_s": 9.0, "error": None,
               "usage": {"requests": 1, "prompt_tokens": 99999, "completion_tokens": 999}}
    (folder / "trace.jsonl").write_text("\n".join(json.dumps(e) for e in [manager, *calls]) + "\n", encoding="utf-8")


def test_without_past_runs_the_documented_defaults_are_used_and_named() -> None:
    estimate = estimate_plan(plan_batches(decision(10), max_batches=None), workers=4, profile=profile_of([]))
    assert estimate.source.startswith("defaults") and estimate.calls == (15, 45)  # 10 batches x 3 calls, +-50 %
    assert estimate.cost_usd is None and "unpriced" in "\n".join(estimate.lines())
    assert estimate.wall_s == (3 * 3 * DEFAULTS.call_s_median, 3 * 3 * DEFAULTS.call_s_p90)  # ceil(10/4) waves


def test_past_runs_give_the_figures_and_the_managers_calls_are_not_counted(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for k in range(4):  # per_atom runs: 2 calls a batch, 1,000 prompt tokens a call
        run_folder(runs, f"20260101-00000{k}-r", rows=10 + k, batches=10 + k, calls_per_batch=2, prompt_per_call=1000)
    (runs / "20260101-000009-broken").mkdir()  # no result: not a past run, not an error
    found = past_runs(runs)
    assert len(found) == 4 and all(isinstance(r, PastRun) and r.model_id == "openai/m" for r in found)
    profile = profile_of(found, model_id="openai/m")
    assert profile.calls_per_batch == 2 and profile.call_s_median == 0.5 and profile.source == "4 past runs (model openai/m)"
    prices = PriceTable(overrides={"openai/m": Price(input=1e-6, output=2e-6)})
    estimate = estimate_plan(plan_batches(decision(20), max_batches=None), workers=8, profile=profile,
                             model_id="openai/m", prices=prices)
    assert estimate.calls == (32, 48) and estimate.prompt_tokens == (32000, 48000)  # 20 x 2 x 1,000, +-20 %
    assert estimate.completion_tokens == (640, 960)  # 40 completion tokens a row
    assert estimate.cost_usd == pytest.approx((32000 * 1e-6 + 640 * 2e-6, 48000 * 1e-6 + 960 * 2e-6))
    assert json.loads(json.dumps(estimate.to_json()))["calls"] == {"low": 32, "high": 48}


def test_a_bigger_batch_costs_more_prompt_tokens_per_batch_but_fewer_in_all(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run_folder(runs, "20260101-000001-r", rows=10, batches=10, calls_per_batch=2, prompt_per_call=1000)
    profile = profile_of(past_runs(runs))
    one = estimate_plan(plan_batches(decision(20), max_batches=None), workers=8, profile=profile)
    five = estimate_plan(plan_batches(decision(20, batch_size=5), max_batches=None), workers=8, profile=profile)
    assert five.batches == 4 and five.prompt_tokens[0] < one.prompt_tokens[0]
    assert profile.prompt_tokens_per_batch(5) == 2000 * (0.5 + 0.5 * 5)  # half of a batch's tokens grow with rows


def test_one_odd_run_moves_the_median_little(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for k in range(4):
        run_folder(runs, f"20260101-00000{k}-r", rows=10, batches=10, calls_per_batch=2, prompt_per_call=1000)
    run_folder(runs, "20260101-000009-odd", rows=10, batches=10, calls_per_batch=8, prompt_per_call=20000)
    profile = profile_of(past_runs(runs))
    assert profile.calls_per_batch == 2 and profile.prompt_tokens_per_batch(1) == 2000


def test_runs_whose_sub_questions_were_worded_alike_are_preferred() -> None:
    def run(template: str, per_call: int) -> PastRun:
        return PastRun(model_id="m", batches=10, rows=10, calls=20, prompt_tokens=20 * per_call, completion_tokens=100,
                       call_seconds=(0.5,), template=template)

    lookups = [run("What is the capital of __0__?", 1000) for _ in range(4)]
    rankings = [run("Which country of __0__ ranks __1__ by population?", 9000) for _ in range(3)]
    ranked = profile_of(lookups + rankings, template="Which country of __0__ ranks __1__ by area?")
    assert ranked.prompt_tokens_per_batch(1) == 18000 and "worded alike" in ranked.source
    assert profile_of(lookups + rankings, template="Name the CEO of __0__.").prompt_tokens_per_batch(1) == 2000  # none alike


def test_plan_estimate_and_a_budget_below_it_refused_before_any_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from amapreduce.cli.app import main

    runs = tmp_path / "runs"
    for k in range(3):
        run_folder(runs, f"20260101-00000{k}-r", rows=10, batches=10, calls_per_batch=2, prompt_per_call=1000)
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(runs))
    monkeypatch.setenv("AMAPREDUCE_ENV_FILE", "/dev/null")
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"openai/m": {"input": 1e-6, "output": 2e-6}}), encoding="utf-8")
    monkeypatch.setenv("AMAPREDUCE_PRICES_FILE", str(prices))
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"task_matrix": [[f"Item {i}"] for i in range(20)], "template": "Code of __0__?",
                                "json_schema": ["item", "code"], "batch_strategy": {"type": "per_atom", "rationale": "r"}}))
    assert main(["mapreduce", "plan", str(path), "--estimate", "--model", "openai/m", "--workers", "4", "--json"]) == 0
    estimate = json.loads(capsys.readouterr().out)["estimate"]
    assert estimate["calls"] == {"low": 32, "high": 48} and estimate["source"] == "3 past runs (model openai/m)"
    assert estimate["cost_usd"]["low"] == pytest.approx(32000e-6 + 640 * 2e-6)
    monkeypatch.setenv("AMAPREDUCE_MAX_COST_USD", "0.01")  # below the low end: refused, nothing started
    monkeypatch.setenv("AMAPREDUCE_API_KEY", "sk-test")
    before = sorted(p.name for p in runs.iterdir())
    assert main(["mapreduce", "run", str(path), "--model", "openai/m", "--api-base", "http://127.0.0.1:9/v1"]) == 4
    assert "over the budget of $0.0100: nothing was run" in capsys.readouterr().err
    assert sorted(p.name for p in runs.iterdir()) == before


def test_a_run_of_one_decision_counts_as_a_past_run(tmp_path: Path) -> None:
    """`mapreduce run` and `enrich` record their one `decision` (an `ask` its `decisions`): both are past runs."""
    from amapreduce.session.estimate import read_past_run

    runs = tmp_path / "runs"
    run_folder(runs, "20260101-000000-r", rows=10, batches=5, calls_per_batch=2, prompt_per_call=1000, kind="enrich")
    found = read_past_run(runs / "20260101-000000-r")
    assert found is not None and (found.rows, found.calls, found.template) == (10, 10, "Code of __0__?")


def test_prompt_tokens_the_provider_cached_are_estimated_at_the_cached_rate(tmp_path: Path) -> None:
    """Issue 37, part 2: past runs whose provider served 75 % of the prompt from its prefix cache make
    the estimate expect that share, priced at the model's cached-input rate."""
    runs = tmp_path / "runs"
    for k in range(4):
        run_folder(runs, f"20260101-00000{k}-r", rows=10, batches=10, calls_per_batch=2, prompt_per_call=1000,
                   cached_per_call=750)
    profile = profile_of(past_runs(runs), model_id="openai/m")
    assert profile.cached_share == 0.75
    prices = PriceTable(overrides={"openai/m": Price(input=1e-6, output=2e-6, cached_input=1e-7)})
    estimate = estimate_plan(plan_batches(decision(20), max_batches=None), workers=8, profile=profile,
                             model_id="openai/m", prices=prices)
    assert estimate.prompt_tokens == (32000, 48000) and estimate.cached_tokens == (24000, 36000)
    per_prompt = 0.25 * 1e-6 + 0.75 * 1e-7
    assert estimate.cost_usd == pytest.approx((32000 * per_prompt + 640 * 2e-6, 48000 * per_prompt + 960 * 2e-6))
    assert estimate.to_json()["cached_tokens"] == {"low": 24000, "high": 36000}
    assert "(cached 24,000 - 36,000)" in "\n".join(estimate.lines())


def test_auto_workers_with_no_reported_slots_give_the_wall_time_from_the_most_to_the_start() -> None:
    plan = plan_batches(decision(64), max_batches=None)
    fixed = estimate_plan(plan, workers=32, profile=profile_of([]))
    auto = estimate_plan(plan, workers=32, profile=profile_of([]), workers_start=2)
    assert auto.wall_s[0] == fixed.wall_s[0] == 2 * 3 * DEFAULTS.call_s_median  # ceil(64/32) waves at the most
    assert auto.wall_s[1] == 32 * 3 * DEFAULTS.call_s_p90 > fixed.wall_s[1]  # ceil(64/2) waves at the start
    assert "with auto workers (2 - 32)" in auto.lines()[0] and "with 32 workers" in fixed.lines()[0]
    assert (auto.to_json()["workers"], auto.to_json()["workers_start"], fixed.to_json()["workers_start"]) == (32, 2, None)
    with pytest.raises(ValueError, match="workers_start"):
        estimate_plan(plan, workers=4, profile=profile_of([]), workers_start=8)


def test_an_estimate_takes_the_workers_the_run_would_have(tmp_path: Path) -> None:
    """An `--api-base` run is `--workers auto`: adapted (2 to 32) while the server's slots are not known, its
    slots once they are (the run's engine limits); a fixed `--workers N` is N."""
    from amapreduce.mapreduce.engine import EngineConfig
    from amapreduce.session.estimate import estimate_for
    from amapreduce.settings import load_settings

    plan = plan_batches(decision(10), max_batches=None)
    base = {"model": "openai/m", "runs_dir": tmp_path / "runs", "api_key": "sk-test"}
    server = load_settings({}, api_base="http://127.0.0.1:9/v1", **base)
    assert server.workers_auto
    adapted = estimate_for(server, plan, "Code of __0__?")
    assert (adapted.workers, adapted.workers_start) == (32, 2)
    one_slot = estimate_for(server, plan, "Code of __0__?",
                            engine=EngineConfig.from_settings(server, decisions_by="user", slots=1))
    assert (one_slot.workers, one_slot.workers_start) == (1, None) and "with 1 worker (" in one_slot.lines()[0]
    fixed = estimate_for(load_settings({}, api_base="http://127.0.0.1:9/v1", workers=4, **base), plan, "Code of __0__?")
    assert (fixed.workers, fixed.workers_start) == (4, None)
