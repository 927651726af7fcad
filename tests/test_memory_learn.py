"""`amapreduce memory learn RUN`: a finished `ask` run committed to the memory, once per run.

The runs are real `ask` runs (manager, `mapreduce` tool, engine, sub-agents, reducer, run
directory) played offline by the simulated atlas model (deterministic code, not an LLM) over the
sandbox corpus; their prior comes from a real store (hashing encoder) holding one hint.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sessions import ask as run_ask
from typer.testing import CliRunner

from amapreduce.bench.learn import HintCredit, learn_from_run, run_record_id
from amapreduce.cli import memory as memory_cli
from amapreduce.cli.app import main
from amapreduce.demo.model import SimulatedAtlasModel
from amapreduce.demo.run import DEFAULT_TASK, demo_settings, load_sandbox_tasks, score_answer
from amapreduce.errors import UserError
from amapreduce.llm.factory import new_meter
from amapreduce.memory import ExperientialMemory, MemoryConfig, MemoryStore
from amapreduce.memory.labels import confidence, infrastructure_failure_reason, label, required_metrics
from amapreduce.memory.records import DecisionSummary
from amapreduce.memory.store import insert_hint
from amapreduce.settings import Settings
from amapreduce.testing.scripted import SIMULATED_PRICES, FunctionModel

HINT = "h-learn-test"
SEED = "r-seed"
PASS = {"score": 1.0, "f1_by_row": 1.0, "f1_by_item": 1.0}


@dataclass(frozen=True)
class Template:
    """One finished `ask` run and the store its prior came from (copied by each test)."""

    run: Path
    store: Path
    cache: Path
    markdown: str
    prior_hints: tuple[str, ...]


def _seed_store(folder: Path, *, w: int = 3, extra_records: int = 0) -> None:
    """A hashing-encoder store with one positive record and one hint supported by it (w = `w`)."""
    with ExperientialMemory(folder, encoder="hashing") as mem:
        for n in range(1 + extra_records):
            mem.update(None, query=f"List the countries of a continent with their capitals ({n})",
                       decision=DecisionSummary(rows=10, cols=1, strategy="per_atom"), metrics=PASS,
                       record_id=SEED if n == 0 else f"r-extra-{n}")
        with mem.store.write() as conn:
            insert_hint(conn, "Check that every country of the list has a row.", w, origin="test",
                        provenance=[SEED], hint_id=HINT)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    root = tmp_path_factory.mktemp("learn")
    cache, store = root / "cache", root / "store"
    _seed_store(store)
    tasks, world = load_sandbox_tasks(Settings(cache_dir=cache))
    settings = demo_settings(Settings(cache_dir=cache, runs_dir=root / "runs", workers=4), world.index_dir)
    model = SimulatedAtlasModel()
    with ExperientialMemory(store, readonly=True) as provider:
        outcome = run_ask(tasks[DEFAULT_TASK].query, settings, inner=lambda role: model,
                          meter=new_meter(settings, prices_by_prefix=SIMULATED_PRICES), prior_provider=provider,
                          task_id=DEFAULT_TASK, show_progress=False)
    assert outcome.status in ("complete", "incomplete") and outcome.decisions
    assert outcome.prior is not None
    return Template(run=outcome.run_dir.path, store=store, cache=cache, markdown=outcome.markdown,
                    prior_hints=tuple(outcome.prior.hint_ids))


@pytest.fixture()
def run_dir(template: Template, tmp_path: Path) -> Path:
    """A private copy of the finished run (same folder name, so the same record id)."""
    target = tmp_path / "runs" / template.run.name
    shutil.copytree(template.run, target)
    return target


@pytest.fixture()
def store(template: Template, tmp_path: Path) -> Path:
    """A private copy of the store the run's prior came from."""
    target = tmp_path / "store"
    shutil.copytree(template.store, target)
    return target


def _state(store: Path) -> tuple[dict[str, int], dict[str, int], int]:
    """Counts, every hint's w and the number of logged events: everything a write would change."""
    with MemoryStore(store, readonly=True) as st:
        with st.read() as conn:
            weights = {r[0]: int(r[1]) for r in conn.execute("SELECT id, w FROM hints")}
            events = int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
        return st.counts(), weights, events


def _record(store: Path, record_id: str):  # type: ignore[no-untyped-def]
    with MemoryStore(store, readonly=True) as st:
        return st.record(record_id)


def _edit_result(run_dir: Path, **changes: object) -> None:
    path = run_dir / "result.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


# -- the pass rules ------------------------------------------------------------------------------

def test_the_utility_rule_needs_only_the_utility_and_the_scorer_rules_only_the_scores() -> None:
    assert required_metrics("utility") == ("utility",)
    assert required_metrics("widesearch") == required_metrics(None) == ("score", "f1_by_row", "f1_by_item")
    assert infrastructure_failure_reason({"utility": 0.7}, "utility") is None
    assert infrastructure_failure_reason({"utility": 0.7}, "widesearch") == "metric `score` is missing"
    assert infrastructure_failure_reason({"utility": 0.7}) == "metric `score` is missing"  # old callers: unchanged
    assert infrastructure_failure_reason(PASS, "utility") == "metric `utility` is missing"
    assert infrastructure_failure_reason({"utility": float("nan")}, "utility") == "metric `utility` is NaN"
    assert label({"utility": 0.5}, "utility") and not label({"utility": 0.49}, "utility")
    assert not label({"utility": 0.7}, "utility", utility_threshold=0.8)
    assert label({"utility": 0.8}, "utility", utility_threshold=0.8)
    with pytest.raises(ValueError, match="utility_threshold"):
        MemoryConfig(label_rule="utility", utility_threshold=1.5)


def test_the_store_labels_a_utility_record_by_its_threshold_and_refuses_one_without_it(tmp_path: Path) -> None:
    config = MemoryConfig(label_rule="utility", utility_threshold=0.7)
    with ExperientialMemory(tmp_path / "s", encoder="hashing", config=config) as mem:
        low = mem.update(None, query="q one", decision=DecisionSummary(), metrics={"utility": 0.6})
        high = mem.update(None, query="q two", decision=DecisionSummary(), metrics={"utility": 0.7})
        missing = mem.update(None, query="q three", decision=DecisionSummary(), metrics=PASS)
        assert (low.label, high.label) == (False, True)
        assert missing.record_id is None and missing.skipped == "metric `utility` is missing"
        assert mem.store.counts()["records"] == 2


# -- learning with the user's utility ------------------------------------------------------------

def test_a_passing_utility_commits_one_record_and_credits_the_prior_hint_plus_two(
        template: Template, run_dir: Path, store: Path) -> None:
    assert template.prior_hints == (HINT,)  # the run was shown the store's one hint
    (counts, weights, _) = _state(store)
    outcome = learn_from_run(run_dir, store=store, utility=0.9)
    assert outcome.record_id == run_record_id(run_dir) and not outcome.already_committed
    assert outcome.label is True and outcome.label_rule == "utility" and outcome.metrics == {"utility": 0.9}
    assert outcome.credited == (HintCredit(id=HINT, w_before=3, w_after=5),)
    assert outcome.pruned == () and outcome.missing_hints == () and outcome.distillation_due is None
    after, new_weights, _ = _state(store)
    assert after["records"] == counts["records"] + 1 and new_weights[HINT] == weights[HINT] + 2
    record = _record(store, outcome.record_id)
    saved = json.loads((run_dir / "result.json").read_text())
    assert record is not None and record.label and record.query == saved["query"]
    assert record.metrics == {"utility": 0.9}
    assert record.decision.strategy == saved["decisions"][0]["batch_strategy"]["type"]
    assert record.decision.rows == len(saved["decisions"][0]["task_matrix"])
    assert record.trace.batches == saved["completeness"]["batches"]
    assert record.trace.delay_s == saved["timings"]["wall_s"]


def test_learning_a_run_twice_changes_nothing(run_dir: Path, store: Path) -> None:
    first = learn_from_run(run_dir, store=store, utility=0.9)
    before = _state(store)
    again = learn_from_run(run_dir, store=store, utility=0.1)  # another verdict does not re-commit either
    assert again.already_committed and again.record_id == first.record_id
    assert again.label is True and again.metrics == {"utility": 0.9} and again.credited == ()
    assert _state(store) == before  # records, hint scores and even the event log are untouched


def test_a_failing_utility_subtracts_one_and_prunes_a_hint_that_reaches_zero(
        template: Template, run_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "low"
    shutil.copytree(template.store, store)
    with MemoryStore(store) as st, st.write() as conn:
        conn.execute("UPDATE hints SET w = 1 WHERE id = ?", (HINT,))
    outcome = learn_from_run(run_dir, store=store, utility=0.6, threshold=0.7)
    assert outcome.label is False
    assert outcome.credited == (HintCredit(id=HINT, w_before=1, w_after=0),) and outcome.pruned == (HINT,)
    assert HINT not in _state(store)[1]


def test_a_fresh_store_is_created_and_a_prior_hint_it_lacks_is_reported(run_dir: Path, tmp_path: Path) -> None:
    outcome = learn_from_run(run_dir, store=tmp_path / "fresh", utility=1.0, encoder="hashing")
    assert outcome.label is True and outcome.credited == () and outcome.missing_hints == (HINT,)
    assert _state(tmp_path / "fresh")[0]["records"] == 1


# -- learning from the scorer --------------------------------------------------------------------

def test_gold_scores_the_table_like_eval_score_and_labels_it_by_the_benchmark_rule(
        template: Template, run_dir: Path, store: Path) -> None:
    tasks, world = load_sandbox_tasks(Settings(cache_dir=template.cache))
    expected = score_answer(tasks[DEFAULT_TASK], world.gold_dir, template.markdown)
    gold = world.gold_dir / f"{DEFAULT_TASK}.csv"
    outcome = learn_from_run(run_dir, store=store, gold=gold, tasks=world.tasks_file)  # task: the file's name
    assert outcome.verdict == "gold" and outcome.task_id == DEFAULT_TASK and outcome.label_rule == "widesearch"
    assert {k: outcome.metrics[k] for k in expected} == expected
    assert outcome.metrics["utility"] == round(confidence(expected), 6)  # the paper's weights: quality only
    assert outcome.label == label(expected, "widesearch")
    reward = 2 if outcome.label else -1
    assert outcome.credited == (HintCredit(id=HINT, w_before=3, w_after=3 + reward),)
    record = _record(store, outcome.record_id)
    assert record is not None and record.task_id == DEFAULT_TASK and record.metrics == outcome.metrics


def test_a_renamed_gold_file_needs_the_task_id(template: Template, run_dir: Path, store: Path,
                                               tmp_path: Path) -> None:
    _, world = load_sandbox_tasks(Settings(cache_dir=template.cache))
    gold = tmp_path / "expected.csv"
    shutil.copyfile(world.gold_dir / f"{DEFAULT_TASK}.csv", gold)
    saved = json.loads((run_dir / "result.json").read_text())
    assert saved["task_id"] == DEFAULT_TASK  # `ask` records the task it was asked for
    saved.pop("task_id")  # a run that does not say which task it answered
    (run_dir / "result.json").write_text(json.dumps(saved))
    before = _state(store)
    with pytest.raises(UserError, match="pass --task-id"):
        learn_from_run(run_dir, store=store, gold=gold, tasks=world.tasks_file)
    assert _state(store) == before
    outcome = learn_from_run(run_dir, store=store, gold=gold, tasks=world.tasks_file, task_id=DEFAULT_TASK)
    assert outcome.task_id == DEFAULT_TASK and "score" in outcome.metrics


def test_the_recorded_task_id_finds_the_task(template: Template, run_dir: Path, store: Path, tmp_path: Path) -> None:
    _, world = load_sandbox_tasks(Settings(cache_dir=template.cache))
    gold = tmp_path / "expected.csv"
    shutil.copyfile(world.gold_dir / f"{DEFAULT_TASK}.csv", gold)
    outcome = learn_from_run(run_dir, store=store, gold=gold, tasks=world.tasks_file)
    assert outcome.task_id == DEFAULT_TASK and "score" in outcome.metrics


def test_the_sandbox_benchmark_uses_its_bundled_gold_rule_and_cost_weight(
        template: Template, run_dir: Path, store: Path) -> None:
    tasks, world = load_sandbox_tasks(Settings(cache_dir=template.cache))
    expected = score_answer(tasks[DEFAULT_TASK], world.gold_dir, template.markdown)
    saved = json.loads((run_dir / "result.json").read_text())
    tokens = saved["usage"]["total"]["prompt_tokens"] + saved["usage"]["total"]["completion_tokens"]
    outcome = learn_from_run(run_dir, store=store, benchmark="sandbox", task_id=DEFAULT_TASK,
                             cache_dir=template.cache)
    assert outcome.label_rule == "success" and outcome.label == (expected["score"] == 1.0)
    assert tokens > 0 and outcome.metrics["utility"] == round(confidence(expected) - tokens / 1_000_000, 6)


def test_a_due_distillation_runs_with_the_memory_model_or_is_reported(template: Template, run_dir: Path,
                                                                      tmp_path: Path) -> None:
    """The sandbox schedule distils from 3 records on: a store of 2 makes the learned run's commit due."""
    ran, skipped = tmp_path / "ran", tmp_path / "skipped"
    for folder in (ran, skipped):
        _seed_store(folder, extra_records=1)
    model = FunctionModel(lambda messages, info: "ADD: Keep rows atomic.")
    outcome = learn_from_run(run_dir, store=ran, benchmark="sandbox", task_id=DEFAULT_TASK,
                             cache_dir=template.cache, model=model)
    assert outcome.distillation_due == "refine+merge"
    assert outcome.distillation is not None and "skipped" not in outcome.distillation
    assert outcome.distillation["calls"] >= 1 and outcome.distillation["what"] == "refine+merge"
    off = learn_from_run(run_dir, store=skipped, benchmark="sandbox", task_id=DEFAULT_TASK,
                         cache_dir=template.cache, model=model, distill=False)
    assert off.distillation_due == "refine+merge" and off.distillation is not None
    assert off.distillation["skipped"].startswith("--no-distill")


# -- refusals: nothing is written ----------------------------------------------------------------

def test_a_folder_that_holds_no_run_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no run"):
        learn_from_run(tmp_path / "empty", store=tmp_path / "store", utility=0.5)
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("changes,message", [
    ({"decisions": [], "status": "no_table"}, "executed no decision"),
    ({"kind": "mapreduce_run"}, "`mapreduce_run` run"),
])
def test_a_run_without_a_decision_or_of_another_kind_is_refused(run_dir: Path, tmp_path: Path,
                                                                changes: dict[str, object], message: str) -> None:
    _edit_result(run_dir, **changes)
    with pytest.raises(UserError, match=message):
        learn_from_run(run_dir, store=tmp_path / "new-store", utility=0.5)
    assert not (tmp_path / "new-store").exists()


def test_an_unreadable_result_is_refused(run_dir: Path, store: Path) -> None:
    (run_dir / "result.json").write_text("{not json")
    before = _state(store)
    with pytest.raises(UserError, match="not valid JSON"):
        learn_from_run(run_dir, store=store, utility=0.5)
    assert _state(store) == before


def test_a_run_still_going_or_interrupted_is_refused(run_dir: Path, store: Path) -> None:
    journal = run_dir / "journal.jsonl"
    lines = journal.read_text().splitlines()
    ended = [n for n, line in enumerate(lines) if json.loads(line)["type"] == "run_end"]
    assert ended
    before = _state(store)
    journal.write_text("\n".join(lines[: ended[-1]]) + "\n")  # no end yet, and its process (this one) lives
    with pytest.raises(UserError, match="still running"):
        learn_from_run(run_dir, store=store, utility=0.5)
    end = json.loads(lines[ended[-1]]) | {"status": "interrupted", "label": "stopped: interrupted"}
    journal.write_text("\n".join([*lines[: ended[-1]], json.dumps(end)]) + "\n")
    with pytest.raises(UserError, match="runs resume"):
        learn_from_run(run_dir, store=store, utility=0.5)
    assert _state(store) == before


@pytest.mark.parametrize("kwargs,message", [
    ({}, "--utility U"),
    ({"utility": 0.5, "benchmark": "sandbox"}, "not both"),
    ({"utility": 1.5}, "from 0 to 1"),
    ({"utility": 0.5, "label_rule": "widesearch"}, "applies to scored runs"),
    ({"gold": Path("g.csv")}, "--tasks FILE"),
])
def test_a_missing_doubled_or_invalid_verdict_is_refused(run_dir: Path, tmp_path: Path,
                                                         kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        learn_from_run(run_dir, store=tmp_path / "new-store", **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "new-store").exists()


# -- the command line ----------------------------------------------------------------------------

@pytest.fixture()
def cli_env(monkeypatch: pytest.MonkeyPatch, template: Template) -> Iterator[None]:
    monkeypatch.setenv("AMAPREDUCE_CACHE_DIR", str(template.cache))
    yield


def test_cli_learns_once_and_prints_the_credit(run_dir: Path, store: Path, cli_env: None) -> None:
    runner = CliRunner()
    args = ["learn", run_dir.name, "--runs-dir", str(run_dir.parent), "--utility", "0.8", "--store", str(store)]
    first = runner.invoke(memory_cli.app, [*args, "--json"])
    assert first.exit_code == 0, first.output
    data = json.loads(first.stdout)
    assert data["record_id"] == run_record_id(run_dir) and data["label"] is True
    assert data["already_committed"] is False
    assert data["credited"] == [{"id": HINT, "w_before": 3, "w_after": 5, "refuted": False}]
    before = _state(store)
    again = runner.invoke(memory_cli.app, args)
    assert again.exit_code == 0, again.output
    assert f"already committed as record {data['record_id']}" in again.stdout
    assert _state(store) == before


def test_cli_text_report_and_usage_errors(run_dir: Path, store: Path, tmp_path: Path, cli_env: None,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "learn", str(run_dir), "--utility", "0.2", "--store", str(store), "--no-distill"]) == 0
    out = capsys.readouterr().out
    assert "negative under the `utility` rule" in out and f"{HINT}  3 -> 2" in out
    assert "distillation: not due" in out
    assert main(["memory", "learn", str(tmp_path / "nowhere"), "--utility", "0.5",
                 "--store", str(tmp_path / "s2")]) == 2
    assert "no run" in capsys.readouterr().err
    assert main(["memory", "learn", str(run_dir), "--utility", "0.5", "--gold", "x.csv",
                 "--store", str(tmp_path / "s2")]) == 2
    assert "not both" in capsys.readouterr().err
    assert not (tmp_path / "s2").exists()
