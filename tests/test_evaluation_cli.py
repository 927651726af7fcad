"""`amapreduce eval score` end to end, through `main([...])`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from amapreduce.cli.app import main
from amapreduce.evaluation.loaders import gold_as_markdown, load_gold, load_tasks
from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.models import ManagedModel
from amapreduce.settings import Settings

IDS = ["ws_en_013", "ws_en_018", "ws_en_022"]


def score_argv(tasks_file: Path, gold_dir: Path) -> list[str]:
    """The `eval score --tasks ... --gold-dir ...` prefix every CLI test shares."""
    return ["eval", "score", "--tasks", str(tasks_file), "--gold-dir", str(gold_dir)]


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The CLI caches dates and judge replies under the settings' cache dir: keep it in tmp."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("AMAPREDUCE_CACHE_DIR", str(cache))
    return cache


@pytest.fixture(scope="module")
def ws_paths(benchmark_data: Path) -> tuple[Path, Path]:
    root = benchmark_data / "widesearch"
    return root / "widesearch.jsonl", root / "widesearch_gold"


def write_trial(
    folder: Path, tasks_file: Path, gold_dir: Path, ids: list[str], *, drop_last_row: bool = False
) -> None:
    tasks = load_tasks(tasks_file, "widesearch")
    folder.mkdir(parents=True, exist_ok=True)
    for iid in ids:
        text = gold_as_markdown(load_gold(gold_dir, tasks[iid]))
        if drop_last_row:
            lines = text.split("\n")
            text = "\n".join(lines[:-2] + lines[-1:])
        (folder / f"{iid}.md").write_text(text, encoding="utf-8")


def test_two_trials_json_shape_and_summary(
    tmp_path: Path, ws_paths: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    tasks_file, gold_dir = ws_paths
    write_trial(tmp_path / "t1", tasks_file, gold_dir, IDS)
    write_trial(tmp_path / "t2", tasks_file, gold_dir, IDS[:2], drop_last_row=True)  # ws_en_022 missing
    out = tmp_path / "results.json"
    code = main(
        [
            *score_argv(tasks_file, gold_dir),
            "--pred-dir",
            str(tmp_path / "t1"),
            "--pred-dir",
            str(tmp_path / "t2"),
            "--reference-date",
            "2026-01-01",
            "--details",
            str(tmp_path / "details"),
            "--out",
            str(out),
        ]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    assert set(doc) == {"per_task", "summary"}
    assert list(doc["per_task"]) == IDS
    keys = {
        "score",
        "precision_by_row",
        "recall_by_row",
        "f1_by_row",
        "precision_by_item",
        "recall_by_item",
        "f1_by_item",
        "msg",
    }
    for trials in doc["per_task"].values():
        assert len(trials) == 2 and all(set(t) == keys for t in trials)
    assert doc["per_task"]["ws_en_022"][1]["msg"] == "response is None"
    assert doc["per_task"]["ws_en_018"][1]["recall_by_row"] == pytest.approx(0.9)
    assert doc["summary"]["score"] == {"avg_n": 0.5, "max_n": 1.0, "min_n": 0.0}
    assert set(doc["summary"]) == keys - {"msg"}
    stdout = capsys.readouterr().out
    assert "Avg@2" in stdout and "f1_by_item" in stdout
    assert "ws_en_018" in stdout  # small runs also list each task
    detail = tmp_path / "details"
    files = sorted(p.name for p in detail.glob("*.csv"))
    assert len(files) == 5  # ws_en_022 has no answer in trial 2: no detail file
    with (detail / [f for f in files if f.startswith("ws_en_018_trial_1")][0]).open(
        encoding="utf-8"
    ) as handle:
        rows = list(csv.DictReader(handle))
    assert sum(1 for r in rows if r["exist_flag_gt"] == "1") == 1  # the dropped gold row


def test_pred_jsonl_and_ids(tmp_path: Path, ws_paths: tuple[Path, Path]) -> None:
    tasks_file, gold_dir = ws_paths
    tasks = load_tasks(tasks_file, "widesearch")
    lines = [
        {
            "instance_id": iid,
            "trial": trial,
            "response": gold_as_markdown(load_gold(gold_dir, tasks[iid])) if trial == "a" else "no table",
        }
        for trial in ("a", "b")
        for iid in IDS
    ]
    pred = tmp_path / "pred.jsonl"
    pred.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    out = tmp_path / "r.json"
    assert (
        main(
            [
                *score_argv(tasks_file, gold_dir),
                "--pred-jsonl",
                str(pred),
                "--ids",
                "ws_en_018",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert list(doc["per_task"]) == ["ws_en_018"]
    assert [t["score"] for t in doc["per_task"]["ws_en_018"]] == [1.0, 0.0]
    assert doc["per_task"]["ws_en_018"][1]["msg"] == "response_df is None"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--benchmark", "nope"], "--benchmark must be one of"),
        (["--reference-date", "21/11/2026"], "--reference-date must be YYYY-MM-DD"),
        (["--ids", "ws_en_999"], "unknown instance id"),
        (["--ids", "ws_en_013", "--all-tasks"], "either --ids or --all-tasks"),
        (["--judge-chunk-size", "0"], "--judge-chunk-size must be >= 1"),
        (["--protocol", "amapreduce"], "--protocol is a DeepWideSearch option"),
        (["--entity-judge", "sim/j"], "--entity-judge is a DeepWideSearch option"),
    ],
)
def test_bad_arguments_exit_2(
    tmp_path: Path,
    ws_paths: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    tasks_file, gold_dir = ws_paths
    write_trial(tmp_path / "t", tasks_file, gold_dir, IDS[:1])
    code = main(
        [
            *score_argv(tasks_file, gold_dir),
            "--pred-dir",
            str(tmp_path / "t"),
            "--out",
            str(tmp_path / "o.json"),
            *extra,
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_missing_gold_malformed_jsonl_and_no_predictions(
    tmp_path: Path, ws_paths: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    tasks_file, gold_dir = ws_paths
    write_trial(tmp_path / "t", tasks_file, gold_dir, IDS[:1])
    empty_gold = tmp_path / "gold"
    empty_gold.mkdir()
    base = ["eval", "score", "--tasks", str(tasks_file), "--out", str(tmp_path / "o.json")]
    assert main([*base, "--gold-dir", str(empty_gold), "--pred-dir", str(tmp_path / "t")]) == 2
    assert "gold table not found for ws_en_013" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": "ws_en_013", "trial": 1, "response": "x"}\n{not json\n', encoding="utf-8")
    assert main([*base, "--gold-dir", str(gold_dir), "--pred-jsonl", str(bad)]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err
    assert main([*base, "--gold-dir", str(gold_dir)]) == 2
    assert "no predictions given" in capsys.readouterr().err
    bad_tasks = tmp_path / "tasks.jsonl"
    bad_tasks.write_text('{"instance_id": "x", "evaluation": "{\\"required\\": []}"}\n', encoding="utf-8")
    assert (
        main(
            [
                *score_argv(bad_tasks, gold_dir),
                "--pred-dir",
                str(tmp_path / "t"),
                "--out",
                str(tmp_path / "o.json"),
            ]
        )
        == 2
    )
    assert "malformed task line" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_unreadable_answer_is_a_clear_error(
    tmp_path: Path, ws_paths: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    tasks_file, gold_dir = ws_paths
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "ws_en_013.md").write_bytes(b"\xff\xfe\x00broken")
    code = main(
        [
            *score_argv(tasks_file, gold_dir),
            "--pred-dir",
            str(folder),
            "--ids",
            "ws_en_013",
            "--out",
            str(tmp_path / "o.json"),
        ]
    )
    assert code == 2
    assert "cannot be read" in capsys.readouterr().err


def test_deepwidesearch_run(tmp_path: Path, benchmark_data: Path) -> None:
    root = benchmark_data / "deepwidesearch"
    tasks_file, gold_dir = root / "overall_20250916.jsonl", root / "overall_20250916_tables"
    tasks = load_tasks(tasks_file, "deepwidesearch")
    iid = "wide2deep_ws_en_024"
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / f"{iid}.md").write_text(gold_as_markdown(load_gold(gold_dir, tasks[iid])), encoding="utf-8")
    out = tmp_path / "d.json"
    assert (
        main(
            [
                "eval",
                "score",
                "--benchmark",
                "deepwidesearch",
                "--protocol",
                "amapreduce",
                "--tasks",
                str(tasks_file),
                "--gold-dir",
                str(gold_dir),
                "--pred-dir",
                str(folder),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    entry = doc["per_task"][iid][0]
    assert entry["score"] == 1.0 and entry["column_f1"] == 1.0 and entry["entity_acc"] == 1.0
    assert {"entity_acc", "column_precision", "column_recall", "column_f1"} <= set(doc["summary"])


def test_model_judge_and_aligner_through_the_cli(
    tmp_path: Path,
    ws_paths: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    _cache_in_tmp: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--judge MODEL --align MODEL`: every column judged by the model, replies cached on disk."""
    import ast

    from amapreduce.cli import eval_options
    from amapreduce.llm.factory import build_role_model
    from amapreduce.llm.messages import message_text
    from amapreduce.testing.scripted import FunctionModel

    def reply(messages: list, info: object) -> str:
        text = message_text(messages[0])
        if "align two vocabularies" in text:
            return "```json\n{}\n```"
        body = text[
            text.index("====== response-start ======") + 28 : text.index("====== response-end ======")
        ]
        pairs = ast.literal_eval(body.strip())
        return "```json\n" + json.dumps({k: 1 for k in pairs}) + "\n```"

    model = FunctionModel(reply, model_id="sim/judge")
    built: list[str] = []

    def build(model_id: str, settings: Settings, meter: UsageMeter) -> ManagedModel:
        built.append(model_id)  # the real factory, with the provider client replaced by the simulated judge
        return build_role_model(settings, "judge", model_id, meter=meter, inner=model)

    monkeypatch.setattr(eval_options, "_judge_model", build)
    tasks_file, gold_dir = ws_paths
    write_trial(tmp_path / "t", tasks_file, gold_dir, ["ws_en_093"])  # newline cells: exact judge fails them
    args = [
        *score_argv(tasks_file, gold_dir),
        "--pred-dir",
        str(tmp_path / "t"),
        "--judge",
        "sim/judge",
        "--align",
        "sim/judge",
        "--out",
        str(tmp_path / "o.json"),
    ]
    assert main(args) == 0
    first_calls = model.calls
    document = json.loads((tmp_path / "o.json").read_text())
    entry = document["per_task"]["ws_en_093"][0]
    assert built == ["sim/judge", "sim/judge"] and first_calls > 0
    assert entry["f1_by_item"] > 0.99  # the model accepted the cells exact match cannot
    # The judge is metered like a run's models: every call is charged to the judge role and reported.
    assert document["judge_usage"]["by_role"]["judge"]["requests"] == first_calls
    assert f"judge models: {first_calls} calls" in capsys.readouterr().out
    assert main(args) == 0
    assert model.calls == first_calls  # second run answered from the disk cache
    assert list((_cache_in_tmp / "judge").rglob("*.json"))


def test_unwritable_out_is_a_run_error(
    tmp_path: Path, ws_paths: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    tasks_file, gold_dir = ws_paths
    write_trial(tmp_path / "t", tasks_file, gold_dir, IDS[:1])
    blocker = tmp_path / "file"
    blocker.write_text("not a folder", encoding="utf-8")
    code = main(
        [
            *score_argv(tasks_file, gold_dir),
            "--pred-dir",
            str(tmp_path / "t"),
            "--out",
            str(blocker / "o.json"),
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "cannot write results" in err and "Traceback" not in err


def test_stray_answer_files_are_reported(
    tmp_path: Path, ws_paths: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    tasks_file, gold_dir = ws_paths
    write_trial(tmp_path / "t", tasks_file, gold_dir, IDS[:1])
    (tmp_path / "t" / "ws_en_9999.md").write_text("| a |", encoding="utf-8")
    args = [
        *score_argv(tasks_file, gold_dir),
        "--pred-dir",
        str(tmp_path / "t"),
    ]
    assert main([*args, "--out", str(tmp_path / "o.json")]) == 0
    assert "1 answer(s) match no task" in capsys.readouterr().err


def test_reference_date_makes_date_columns_reproducible(tmp_path: Path) -> None:
    """A year-only answer is filled from the reference date: pinning it fixes the score."""
    evaluation = {
        "unique_columns": ["album"],
        "required": ["album", "released"],
        "eval_pipeline": {
            "album": {"preprocess": ["norm_str"], "metric": ["exact_match"]},
            "released": {"preprocess": ["norm_date"], "metric": ["date_near"]},
        },
    }
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text(
        json.dumps({"instance_id": "t1", "query": "q", "evaluation": json.dumps(evaluation)}) + "\n",
        encoding="utf-8",
    )
    gold = tmp_path / "gold"
    gold.mkdir()
    (gold / "t1.csv").write_text("Album,Released\nBlue,2024-03-01\n", encoding="utf-8")
    pred = tmp_path / "pred"
    pred.mkdir()
    (pred / "t1.md").write_text(
        "```markdown\n| Album | Released |\n|---|---|\n| Blue | 2024 |\n```", encoding="utf-8"
    )

    def run(reference: str) -> float:
        out = tmp_path / f"{reference}.json"
        args = ["eval", "score", "--tasks", str(tasks_file), "--gold-dir", str(gold), "--pred-dir", str(pred)]
        assert main([*args, "--reference-date", reference, "--out", str(out)]) == 0
        return float(json.loads(out.read_text())["per_task"]["t1"][0]["score"])

    assert run("2026-03-15") == 1.0  # "2024" -> 2024-03-01
    assert run("2026-11-21") == 0.0  # "2024" -> 2024-11-01, more than 31 days away
    assert run("2026-03-15") == 1.0  # same date, same score (and the date cache agrees)


def test_model_judge_over_http_sends_official_prompt_at_temperature_zero(
    tmp_path: Path, ws_paths: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real client path: the project's model layer talks to a loopback OpenAI-compatible server."""
    import ast

    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.llm.messages import message_text
    from amapreduce.testing.openai_server import OpenAICompatibleServer
    from amapreduce.testing.scripted import FunctionModel

    def grade(messages: list, info: object) -> str:
        text = message_text(messages[-1])
        body = text[
            text.index("====== response-start ======") + 28 : text.index("====== response-end ======")
        ]
        return "```json\n" + json.dumps(dict.fromkeys(ast.literal_eval(body.strip()), 1)) + "\n```"

    tasks_file, gold_dir = ws_paths
    write_trial(tmp_path / "t", tasks_file, gold_dir, ["ws_en_093"])
    with OpenAICompatibleServer(FunctionModel(grade, model_id="judge-sim")) as server, allow_model_requests():
        monkeypatch.setenv("AMAPREDUCE_API_BASE", server.base_url)
        out = tmp_path / "o.json"
        args = [
            *score_argv(tasks_file, gold_dir),
            "--pred-dir",
            str(tmp_path / "t"),
        ]
        assert main([*args, "--judge", "judge-sim", "--judge-chunk-size", "50", "--out", str(out)]) == 0
    assert server.requests, "the judge was never called"
    assert all(r.get("temperature") == 0 for r in server.requests)
    assert all(r["model"] == "judge-sim" for r in server.requests)
    first = (
        message_text(server.requests[0]["messages"][-1])
        if isinstance(server.requests[0]["messages"][-1], dict)
        else ""
    )
    assert "You are an expert in grading answers" in first
    entry = json.loads(out.read_text())["per_task"]["ws_en_093"][0]
    assert entry["f1_by_item"] > 0.99
