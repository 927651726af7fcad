"""`amapreduce eval score`: DeepWideSearch-only options, and `--pred-jsonl` keys and trial order."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from amapreduce.cli.app import main
from amapreduce.evaluation import judges, runner
from amapreduce.evaluation.loaders import gold_as_markdown, load_gold, load_predictions_jsonl, load_tasks
from amapreduce.evaluation.runner import EvalOptions
from amapreduce.llm import factory
from amapreduce.testing.scripted import ScriptedModel

ScoreOptions = Callable[..., EvalOptions]


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMAPREDUCE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def ws_paths(benchmark_data: Path) -> tuple[Path, Path]:
    root = benchmark_data / "widesearch"
    return root / "widesearch.jsonl", root / "widesearch_gold"


@pytest.fixture
def built_models(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The model factory builds offline models (the options are inspected, never asked); the list
    collects the ids it was asked for."""
    built: list[str] = []

    def build(settings: object, role: str, model_id: str, **kwargs: object) -> ScriptedModel:
        built.append(model_id)
        return ScriptedModel([], model_id=model_id)

    monkeypatch.setattr(factory, "build_role_model", build)
    return built


class _OptionsHandedOver(Exception):
    """Raised in place of scoring: `eval score` got as far as handing its options to the library."""

    def __init__(self, options: EvalOptions) -> None:
        super().__init__("eval score handed its options to run_evaluation")
        self.options = options


@pytest.fixture
def score_options(benchmark_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ScoreOptions:
    """`amapreduce eval score --benchmark B FLAGS...` up to the library call: the `EvalOptions` the
    command hands to `run_evaluation` (nothing is scored)."""

    def hand_over(tasks: Any, task_ids: Any, trials: Any, gold_dir: Any, options: EvalOptions, **kw: Any) -> Any:
        raise _OptionsHandedOver(options)

    monkeypatch.setattr(runner, "run_evaluation", hand_over)
    data = {
        "widesearch": benchmark_data / "widesearch" / "widesearch.jsonl",
        "deepwidesearch": benchmark_data / "deepwidesearch" / "overall_20250916.jsonl",
    }
    gold = {
        "widesearch": benchmark_data / "widesearch" / "widesearch_gold",
        "deepwidesearch": benchmark_data / "deepwidesearch" / "overall_20250916_tables",
    }
    answers = tmp_path / "answers"
    answers.mkdir()

    def run(benchmark: str, *flags: str) -> EvalOptions:
        argv = ["eval", "score", "--benchmark", benchmark, "--tasks", str(data[benchmark]),
                "--gold-dir", str(gold[benchmark]), "--pred-dir", str(answers), "--all-tasks",
                "--out", str(tmp_path / "results.json"), *flags]
        with pytest.raises(_OptionsHandedOver) as handed:
            main(argv)
        return handed.value.options

    return run


def options(score_options: ScoreOptions, benchmark: str, protocol: str, entity_judge: str = "substring") -> EvalOptions:
    return score_options(benchmark, "--judge", "sim/j", "--align", "sim/j", "--entity-judge", entity_judge,
                         "--protocol", protocol)


@pytest.mark.usefixtures("built_models")
@pytest.mark.parametrize(
    ("benchmark", "protocol", "amapreduce_copy"),
    [
        ("deepwidesearch", "amapreduce", True),
        ("deepwidesearch", "aidc", False),
        ("widesearch", "aidc", False),
    ],
)
def test_only_deepwide_amapreduce_rounds_and_parses_leniently(
    benchmark: str, protocol: str, amapreduce_copy: bool, score_options: ScoreOptions
) -> None:
    opts = options(score_options, benchmark, protocol)
    assert isinstance(opts.judge, judges.ModelJudge) and isinstance(opts.aligner, judges.ModelAligner)
    assert opts.judge.normalize is amapreduce_copy
    expected = judges.parse_json_reply_lenient if amapreduce_copy else judges.parse_json_reply
    assert opts.judge.parse is expected and opts.aligner.parse is expected


@pytest.mark.usefixtures("built_models")
def test_spelling_out_the_defaults_stays_valid_with_widesearch(score_options: ScoreOptions) -> None:
    """Documented commands keep working: only non-default DeepWideSearch options are refused
    (those cases are in test_evaluation_cli.py::test_bad_arguments_exit_2)."""
    assert options(score_options, "widesearch", "aidc", "substring").protocol == "aidc"


def test_pred_jsonl_extra_keys_and_trial_order(tmp_path: Path, ws_paths: tuple[Path, Path]) -> None:
    tasks_file, gold_dir = ws_paths
    tasks = load_tasks(tasks_file, "widesearch")
    good = gold_as_markdown(load_gold(gold_dir, tasks["ws_en_018"]))
    # The first task only has trials 10 and 2; trial 1 appears later. Official records carry extra keys.
    lines = [
        {"instance_id": "ws_en_013", "trial": 10, "response": "no table", "messages": []},
        {"instance_id": "ws_en_013", "trial": 2, "response": "no table", "trial_idx": 2},
        {"instance_id": "ws_en_018", "trial": 1, "response": good, "prediction": good},
        {"instance_id": "ws_en_018", "trial": 2, "response": "no table"},
        {"instance_id": "ws_en_018", "trial": 10, "response": "no table"},
    ]
    pred = tmp_path / "pred.jsonl"
    pred.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    out = tmp_path / "r.json"
    argv = ["eval", "score", "--tasks", str(tasks_file), "--gold-dir", str(gold_dir)]
    assert main([*argv, "--pred-jsonl", str(pred), "--ids", "ws_en_018", "--out", str(out)]) == 0
    scores = [t["score"] for t in json.loads(out.read_text())["per_task"]["ws_en_018"]]
    assert scores == [1.0, 0.0, 0.0]  # trials 1, 2, 10: by id, not by first appearance


def test_trial_order_falls_back_to_text(tmp_path: Path) -> None:
    def order(trials: list[str]) -> list[str]:
        path = tmp_path / "p.jsonl"
        path.write_text("".join(json.dumps({"instance_id": "a", "trial": t, "response": "x"}) + "\n" for t in trials))
        return list(load_predictions_jsonl(path))

    assert order(["10", "2", "1"]) == ["1", "2", "10"]
    assert order(["b", "a", "2"]) == ["2", "a", "b"]


@pytest.mark.parametrize(
    ("configured", "flag", "expected"),
    [
        (None, None, "exact"),
        ("sim/env-judge", None, "sim/env-judge"),
        ("sim/env-judge", "exact", "exact"),
        ("sim/env-judge", "sim/flag-judge", "sim/flag-judge"),
        ("none", None, "exact"),
    ],
)
def test_judge_defaults_to_the_judge_model_setting(
    configured: str | None,
    flag: str | None,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    built_models: list[str],
    score_options: ScoreOptions,
) -> None:
    """`AMAPREDUCE_JUDGE_MODEL` was documented but never read: `--judge` always defaulted to exact."""
    if configured is not None:
        monkeypatch.setenv("AMAPREDUCE_JUDGE_MODEL", configured)
    judge_flag = [] if flag is None else ["--judge", flag]
    opts = score_options("widesearch", *judge_flag, "--align", "identity", "--entity-judge", "substring",
                         "--protocol", "aidc")
    assert opts.judge.name == expected
    assert built_models == ([] if expected == "exact" else [expected])


def test_judge_default_is_in_the_help(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["eval", "score", "--help"]) == 0
    assert "Default: AMAPREDUCE_JUDGE_MODEL when set, else exact." in capsys.readouterr().out
