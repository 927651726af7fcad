"""The labels a newcomer reads agree with each other: one usage vocabulary, run kinds that say
what made a run, patch rounds counted as the docs say (docs/index.md, "How it works"), error
messages that name the flag or the folder, and a demo that says why its official score is not its
corrected one."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from amapreduce.cli.app import main
from amapreduce.cli.output import counted, effort_text, usage_json
from amapreduce.demo.run import DemoOutcome, load_sandbox_tasks, run_demo, score_answer_corrected
from amapreduce.evaluation.score import explain_corrections
from amapreduce.llm.meter import Price, PriceTable, UsageMeter
from amapreduce.llm.usage import Usage
from amapreduce.session.journal import RunKind
from amapreduce.session.record import CompletenessRecord
from amapreduce.session.rundir import list_runs
from amapreduce.settings import Settings

HOME = Path(__file__).resolve().parents[1] / "docs" / "index.md"  # the docs' "How it works"
USAGE_WORDS = {"requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "abandoned"}


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("AMAPREDUCE_RUNS_DIR", "AMAPREDUCE_CACHE_DIR", "AMAPREDUCE_MODEL", "AMAPREDUCE_SEARCH_BACKEND"):
        monkeypatch.delenv(name, raising=False)


# -- one usage vocabulary --------------------------------------------------------------------


def test_result_json_and_json_output_spell_usage_the_same_way() -> None:
    meter = UsageMeter(prices=PriceTable({"priced-model": Price(input=1e-6, output=2e-6)}, use_litellm=False))
    meter.record("subagent", "priced-model", Usage(requests=2, input_tokens=1000, output_tokens=100, cached_tokens=40))
    stored = meter.to_json()  # what result.json's `usage` holds
    printed = usage_json(meter)  # what `ask --json` / `mapreduce run --json` print
    assert set(stored["total"]) == USAGE_WORDS and set(stored["by_role"]["subagent"]) == USAGE_WORDS
    assert set(printed) == USAGE_WORDS | {"unpriced_models"}
    assert {k: printed[k] for k in ("requests", "prompt_tokens", "completion_tokens", "cached_tokens")} == {
        "requests": 2, "prompt_tokens": 1000, "completion_tokens": 100, "cached_tokens": 40}
    assert stored["total"]["prompt_tokens"] == printed["prompt_tokens"]
    assert not {"input_tokens", "output_tokens"} & (set(stored["total"]) | set(printed))


def test_usage_reads_back_its_own_form_and_run_folders_written_before() -> None:
    usage = Usage(requests=3, input_tokens=70, output_tokens=9, cached_tokens=5, cost_usd=0.25, abandoned=1)
    assert Usage.from_json(usage.to_json()) == usage
    legacy = {"requests": 1, "input_tokens": 10, "output_tokens": 4, "cached_tokens": 0, "cost_usd": None}
    assert Usage.from_json(legacy) == Usage(requests=1, input_tokens=10, output_tokens=4)


# -- run kinds --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoOutcome:
    root = tmp_path_factory.mktemp("demo")
    settings = Settings.model_validate({"cache_dir": root / "cache", "runs_dir": root / "runs", "workers": 4})
    return run_demo(None, settings)


def test_a_demo_run_is_listed_as_a_demo_and_runs_resume_says_to_rerun_it(
    demo_run: DemoOutcome, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = demo_run.ask.run_dir.path
    assert json.loads((run_dir / "result.json").read_text(encoding="utf-8"))["kind"] == "demo"
    listed = list_runs(run_dir.parent)
    assert [r["kind"] for r in listed] == ["demo"]
    # An unfinished demo run (its journal cut after the start) is not resumed with a real model.
    journal = run_dir.parent.parent / "cut-demo"
    journal.mkdir()
    header, started = (run_dir / "journal.jsonl").read_text(encoding="utf-8").splitlines()[:2]
    entry = json.loads(started)
    assert entry["command"] == "demo"
    entry["process"]["pid"] = 2**22 + 1  # the process that ran it is gone
    (journal / "journal.jsonl").write_text(f"{header}\n{json.dumps(entry)}\n", encoding="utf-8")
    assert main(["runs", "resume", str(journal)]) == 2
    err = capsys.readouterr().err
    assert "is a `demo` run, which `runs resume` does not continue" in err and "run `amapreduce demo` again" in err


def test_every_kind_of_the_ask_lifecycle_can_teach_the_memory() -> None:
    assert {k.value for k in RunKind if k.is_ask} == {"ask", "demo", "eval"}
    assert not RunKind.MAPREDUCE_RUN.is_ask


# -- patch rounds and plurals -----------------------------------------------------------------


def test_patch_rounds_are_counted_per_execution_and_said_so() -> None:
    counts = {"rows": 1, "missing_cells": 0, "incomplete_tasks": 0, "complete": True, "attempts": 1, "timeouts": 0,
              "failures": 0, "backups": 0}
    one = CompletenessRecord(**counts, batches=1, retries=1, patch_rounds=1, executions=1)
    assert effort_text(one) == "1 batch, 1 retry, 1 patch round"
    two = CompletenessRecord(**counts, batches=28, retries=42, patch_rounds=4, executions=2)
    assert effort_text(two) == "28 batches, 42 retries, 4 patch rounds over 2 executions"
    assert counted(0, "missing cell") == "0 missing cells" and counted(1, "row") == "1 row"
    home = " ".join(HOME.read_text(encoding="utf-8").split())
    assert "for up to two rounds per execution of a decision" in home
    assert "`patch_rounds` sums them over the run's executions" in home


# -- errors that name the flag or the folder --------------------------------------------------


@pytest.mark.parametrize(("argv", "flag"), [
    (["ask", "q", "--workers", "100000"], "--workers"),
    (["ask", "q", "--max-cost", "-1"], "--max-cost"),
    (["demo", "--workers", "100000"], "--workers"),
])
def test_a_bad_flag_value_is_named_by_its_flag(argv: list[str], flag: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d.json").write_text("{}", encoding="utf-8")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {flag} is invalid" in err and "(override)" not in err
    assert not (tmp_path / "runs").exists()


def test_eval_score_on_a_folder_without_answers_names_the_folder(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "misnamed").mkdir()
    (tmp_path / "misnamed" / "answer.md").write_text("| a |\n|---|\n| 1 |\n", encoding="utf-8")
    argv = ["eval", "score", "--benchmark", "sandbox", "--out", str(tmp_path / "o.json")]
    assert main([*argv, "--pred-dir", "empty", "--pred-dir", "misnamed"]) == 2
    err = capsys.readouterr().err
    assert "empty (no .md file)" in err and "misnamed (1 .md file, e.g. 'answer.md')" in err


# -- the demo's official and corrected scores -------------------------------------------------


def test_an_int_column_with_a_blank_scores_zero_officially_and_the_correction_says_why(tmp_path: Path) -> None:
    settings = Settings.model_validate({"cache_dir": tmp_path / "cache"})
    tasks, world = load_sandbox_tasks(settings)
    task = tasks["sbx_en_003"]  # 58 countries; `Calling Code` is an integer column scored by exact match
    with (world.gold_dir / "sbx_en_003.csv").open(encoding="utf-8", newline="") as handle:
        header, *rows = list(csv.reader(handle))
    rows[0][header.index("Calling Code")] = ""  # one blank: pandas reads the whole column as floats (bug B1)
    markdown = "```markdown\n" + "\n".join(
        ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
    ) + "\n```"
    official, _ = score_answer_corrected(task, world.gold_dir, markdown, corrected=False)
    corrected, corrections = score_answer_corrected(task, world.gold_dir, markdown)
    assert official["f1_by_row"] == 0.0 and corrected["f1_by_row"] > 0.98  # 57 of 58 rows fully right
    assert corrections.get("B1 cells rendered as integers", 0) > 0
    why = explain_corrections(corrections)
    assert "B1 cells rendered as integers" in why and "`213.0` is not `213`" in why


def test_the_demo_prints_the_corrected_score_beside_the_official_one(
    demo_run: DemoOutcome, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    official = dict(demo_run.score, f1_by_row=0.0, score=0.0)
    shown = DemoOutcome(task_id=demo_run.task_id, ask=demo_run.ask, score=official, corrected_score=demo_run.score,
                        corrections={"B1 cells rendered as integers": 6}, faults={})
    monkeypatch.setattr("amapreduce.demo.run.run_demo", lambda *a, **k: shown)
    main(["demo", "--no-memory"])
    out = capsys.readouterr().out
    assert "Score against the sandbox gold (exact judge): success 0, item F1 1.000, row F1 0.000." in out
    assert "Corrected score (`eval score --corrected`): success 1, item F1 1.000, row F1 1.000." in out
    assert "Why they differ:" in out and "B1 cells rendered as integers: 6" in out
    # The same scores agree for the real run, so nothing extra is printed there.
    assert demo_run.corrected_score == demo_run.score and demo_run.corrections == {}
