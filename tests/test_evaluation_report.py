"""`eval report`: report.md and the PNG plots from synthetic `eval run` folders.

The folders are built here with numbers chosen so that every mean in the report can be checked
by hand (the comments show the arithmetic). matplotlib is a dev dependency: a missing one fails
these tests rather than skipping them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from amapreduce.errors import ConfigError, UserError
from amapreduce.evaluation.report import EvalReportFiles, load_eval_run, split_halves, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Memory on, per task: (trial 1, trial 2) of (f1_by_item, subagents, prompt, completion, cost, score).
# Task means of item F1: t1 0.6, t2 0.8, t3 0.95, t4 1.0; of sub-agents: 10, 7, 4, 3;
# of tokens: 1200, 900, 400, 300; of cost: 0.02 each.
ON_TASKS: dict[str, list[tuple[float, int, int, int, float, float]]] = {
    "t1": [(0.5, 10, 1000, 200, 0.01, 0.0), (0.7, 10, 1000, 200, 0.03, 0.0)],
    "t2": [(0.8, 8, 800, 100, 0.02, 0.0), (0.8, 6, 800, 100, 0.02, 0.0)],
    "t3": [(0.9, 4, 300, 100, 0.02, 0.0), (1.0, 4, 300, 100, 0.02, 1.0)],
    "t4": [(1.0, 2, 250, 50, 0.02, 1.0), (1.0, 4, 250, 50, 0.02, 1.0)],
}
# Memory off: every trial item F1 0.7, 10 sub-agents, 1500 tokens, cost 0.04.
OFF_TASKS = {iid: [(0.7, 10, 1200, 300, 0.04, 0.0)] * 2 for iid in ON_TASKS}
ORDER = ["t1", "t2", "t3", "t4"]

ON_LOG: list[dict[str, Any]] = [
    {"task_id": "t1", "order": 0, "hints": 0, "mean_w": None, "records": 1, "distillation": None},
    {"task_id": "t2", "order": 1, "hints": 1, "mean_w": 2.0, "pruned": [], "records": 2},
    {
        "task_id": "t3",
        "order": 2,
        "hints": 2,
        "mean_w": 3.0,
        "pruned": ["h-old"],
        "distillation": {"what": "refine+merge", "created": 2, "edited": 1, "removed": 0, "merged": 1},
        "prior_hints": [{"id": "h-1", "w_before": 2, "w_after": 4}],
    },
    {"task_id": "t4", "order": 3, "hints": 2, "mean_w": 2.5, "distillation": {"what": None}},
]


def trial_entry(trial: int, values: tuple[float, int, int, int, float, float]) -> dict[str, Any]:
    f1, subagents, prompt, completion, cost, score = values
    return {
        "trial": trial,
        "score": score,
        "precision_by_row": f1,
        "recall_by_row": f1,
        "f1_by_row": f1 - 0.1,
        "precision_by_item": f1,
        "recall_by_item": f1,
        "f1_by_item": f1,
        "msg": "",
        "cost_usd": cost,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "model_calls": subagents + 2,
        "subagents": subagents,
        "wall_s": 1.5,
        "status": "complete",
        "utility": f1,
        "run_dir": f"runs/x-{trial}",
        "a_future_field": {"ignored": True},
    }


def make_run(
    folder: Path,
    tasks: dict[str, list[tuple[float, int, int, int, float, float]]],
    *,
    store: str | None,
    log: list[dict[str, Any]] | None = None,
    per_task_order: list[str] | None = None,
    task_order: list[str] | None = ORDER,
) -> Path:
    folder.mkdir(parents=True)
    per_task = {
        iid: [trial_entry(k, v) for k, v in enumerate(tasks[iid], start=1)]
        for iid in (per_task_order or list(tasks))
    }
    document: dict[str, Any] = {
        "per_task": per_task,
        "summary": {"f1_by_item": {"avg_n": 0.0, "max_n": 0.0, "min_n": 0.0}, "cost_usd": 0.0},
        "memory": {
            "store": store,
            "learn": store is not None,
            "records_before": 0 if store else None,
            "records_after": 4 if store else None,
            "hints_before": 0 if store else None,
            "hints_after": 2 if store else None,
        },
        "utility": {"cost_weight": 1.0, "delay_weight": 0.0},
        "benchmark": "sandbox",
        "trials": 2,
    }
    if task_order is not None:
        document["task_order"] = task_order
    (folder / "results.json").write_text(json.dumps(document), encoding="utf-8")
    if log is not None:
        (folder / "memory_log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log), encoding="utf-8")
    return folder


@pytest.fixture
def memory_on(tmp_path: Path) -> Path:
    # per_task written in reverse: the report must follow task_order, not the dict order.
    return make_run(tmp_path / "on", ON_TASKS, store="/stores/mem", log=ON_LOG, per_task_order=ORDER[::-1])


@pytest.fixture
def memory_off(tmp_path: Path) -> Path:
    return make_run(tmp_path / "off", OFF_TASKS, store=None)


def assert_png(path: Path, min_width: int = 500) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 5000, f"{path} is too small to hold a plot ({len(data)} bytes)"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= min_width and height >= 300, (path, width, height)


def test_single_run_report_has_the_computed_numbers_and_plots(memory_on: Path) -> None:
    files = write_report(memory_on)

    assert files == EvalReportFiles(
        report=memory_on / "report.md",
        per_task_f1=memory_on / "per_task_f1.png",
        cost_vs_f1=memory_on / "cost_vs_f1.png",
        learning_curve=memory_on / "learning_curve.png",
        hint_pool=memory_on / "hint_pool.png",
    )
    assert len(files.plots) == 4
    for plot in files.plots:
        assert_png(plot)
    # Atomic writes leave no temporary file behind.
    names = sorted(p.name for p in memory_on.iterdir())
    assert names == sorted(
        ["results.json", "memory_log.jsonl", "report.md", *(p.name for p in files.plots)]
    ), names

    text = files.report.read_text(encoding="utf-8")
    # Headline: Avg@2 item F1 = (0.6 + 0.8 + 0.95 + 1.0) / 4; success = (0 + 0 + 0.5 + 1) / 4;
    # Pass@2 = t3 and t4 solved once = 2 / 4; row F1 = item F1 - 0.1.
    assert "| Avg@2 item F1 | 0.8375 |" in text
    assert "| Avg@2 row F1 | 0.7375 |" in text
    assert "| Avg@2 success rate | 0.3750 |" in text
    assert "| Pass@2 | 0.5000 |" in text
    assert "| cost per task (USD) | 0.020000 |" in text
    assert "| tokens per task (prompt + completion) | 700.00 |" in text
    assert "| sub-agents per task | 6.00 |" in text
    assert "| model calls per task | 8.00 |" in text
    assert "| wall per task (s) | 1.50 |" in text
    # Memory block and the log's totals.
    assert "| store | `/stores/mem` |" in text
    assert "| records before → after | 0 → 4 |" in text
    assert "| hints before → after | 0 → 2 |" in text
    assert "| committed instances | 4 |" in text
    assert (
        "| distillations (hints created, edited, removed, merged) | 1 (created 2, edited 1, removed 0, merged 1) |"
        in text
    )
    assert "| hints pruned | 1 |" in text
    # Halves in task order (t1, t2 | t3, t4): F1 0.7 | 0.975, sub-agents 8.5 | 3.5, tokens 1050 | 350.
    assert "| mean item F1 | 0.7000 | 0.9750 | 1.39 |" in text
    assert "| sub-agents per task | 8.50 | 3.50 | 0.41 |" in text
    assert "| tokens per task | 1050.00 | 350.00 | 0.33 |" in text
    assert "first half = tasks 1–2, second half = tasks 3–4" in text
    # Images, linked relatively; the spend axis is the cost because costs are not all zero.
    for plot in files.plots:
        assert f"]({plot.name})" in text
    assert "cost (USD)" in text and "every cost is 0" not in text
    assert "cost_weight=1.0" in text


def test_compare_sets_the_runs_side_by_side_with_ratios(
    memory_on: Path, memory_off: Path, tmp_path: Path
) -> None:
    alone = write_report(memory_on, out_dir=tmp_path / "alone")
    files = write_report(memory_on, compare=memory_off, out_dir=tmp_path / "both")

    assert files.report == tmp_path / "both" / "report.md"
    assert not (memory_on / "report.md").exists(), "out_dir must receive the report, not the eval folder"
    for plot in files.plots:
        assert_png(plot)
    # The compared run is drawn too: its curves change the images.
    assert files.learning_curve.read_bytes() != alone.learning_curve.read_bytes()
    assert files.per_task_f1.read_bytes() != alone.per_task_f1.read_bytes()

    text = files.report.read_text(encoding="utf-8")
    assert "|  | memory on | memory off | memory on / memory off |" in text
    assert "| Avg@2 item F1 | 0.8375 | 0.7000 | 1.20 |" in text
    assert "| cost per task (USD) | 0.020000 | 0.040000 | 0.50 |" in text
    assert "| sub-agents per task | 6.00 | 10.00 | 0.60 |" in text
    assert "| store | `/stores/mem` | none |" in text
    # Halves side by side: off is flat (F1 0.7, 10 sub-agents, 1500 tokens).
    assert "| first half | mean item F1 | 0.7000 | 0.7000 | 1.00 |" in text
    assert "| first half | sub-agents per task | 8.50 | 10.00 | 0.85 |" in text
    assert "| first half | tokens per task | 1050.00 | 1500.00 | 0.70 |" in text
    assert "| second half | mean item F1 | 0.9750 | 0.7000 | 1.39 |" in text
    assert "| second half | sub-agents per task | 3.50 | 10.00 | 0.35 |" in text
    assert "| second half | tokens per task | 350.00 | 1500.00 | 0.23 |" in text
    assert "different tasks" not in text


def test_a_run_without_memory_has_no_hint_pool_plot(memory_off: Path) -> None:
    files = write_report(memory_off)

    assert files.hint_pool is None
    assert not (memory_off / "hint_pool.png").exists()
    assert len(files.plots) == 3
    text = files.report.read_text(encoding="utf-8")
    assert "Not drawn: the run used no memory" in text
    assert "hint_pool.png" not in text
    assert "|  | memory off |" in text


def test_zero_costs_plot_tokens_and_say_so(tmp_path: Path) -> None:
    free = {
        iid: [(f1, s, p, c, 0.0, sc) for f1, s, p, c, _, sc in trials] for iid, trials in ON_TASKS.items()
    }
    folder = make_run(tmp_path / "free", free, store=None)

    text = write_report(folder).report.read_text(encoding="utf-8")

    assert "tokens (prompt + completion; every cost is 0)" in text
    assert "| cost per task (USD) | 0.000000 |" in text


def test_task_order_is_followed_and_unfinished_tasks_are_reported(tmp_path: Path) -> None:
    folder = make_run(
        tmp_path / "partial",
        ON_TASKS,
        store=None,
        per_task_order=["t4", "t1", "t3", "t2"],
        task_order=[*ORDER, "t5"],
    )

    run = load_eval_run(folder)
    first, second = split_halves(run)

    assert run.order == ("t1", "t2", "t3", "t4")
    assert run.unfinished == ("t5",)
    assert (first.tasks, first.item_f1, first.subagents) == (2, pytest.approx(0.7), 8.5)
    assert (second.tasks, second.item_f1, second.tokens) == (2, pytest.approx(0.975), 350.0)
    assert "1 task(s) of its task order have no result yet" in write_report(folder).report.read_text("utf-8")


def test_without_task_order_the_per_task_order_is_used(tmp_path: Path) -> None:
    folder = make_run(
        tmp_path / "old", ON_TASKS, store=None, per_task_order=["t3", "t4", "t1", "t2"], task_order=None
    )

    first, second = split_halves(load_eval_run(folder))

    assert (first.item_f1, second.item_f1) == (pytest.approx(0.975), pytest.approx(0.7))


def test_odd_task_count_puts_the_middle_task_in_the_second_half(tmp_path: Path) -> None:
    tasks = {iid: ON_TASKS[iid] for iid in ("t1", "t2", "t3")}
    folder = make_run(tmp_path / "odd", tasks, store=None, task_order=["t1", "t2", "t3"])

    first, second = split_halves(load_eval_run(folder))

    assert (first.tasks, second.tasks) == (1, 2)
    assert first.subagents == 10.0 and second.subagents == 5.5


def test_two_runs_with_the_same_memory_setting_are_told_apart_by_folder(
    memory_off: Path, tmp_path: Path
) -> None:
    other = make_run(tmp_path / "off2", OFF_TASKS, store=None)

    text = write_report(memory_off, compare=other).report.read_text(encoding="utf-8")

    assert "|  | memory off (off) | memory off (off2) |" in text


def test_a_trial_that_never_ran_counts_in_scores_but_not_in_run_facts(tmp_path: Path) -> None:
    # `eval run` stopped by --max-cost: the trial is scored (the official zero) but has no run facts.
    folder = make_run(tmp_path / "stopped", ON_TASKS, store=None)
    document = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    unrun = document["per_task"]["t4"][1]
    for fact in (
        "cost_usd",
        "prompt_tokens",
        "completion_tokens",
        "model_calls",
        "subagents",
        "wall_s",
        "status",
    ):
        del unrun[fact]
    unrun["f1_by_item"] = 0.0
    (folder / "results.json").write_text(json.dumps(document), encoding="utf-8")

    files = write_report(folder)

    for plot in files.plots:
        assert_png(plot)
    text = files.report.read_text(encoding="utf-8")
    assert "1 trial(s) were scored but never ran" in text
    # Item F1 counts the zero: t4 = (1.0 + 0.0) / 2, so (0.6 + 0.8 + 0.95 + 0.5) / 4.
    assert "| Avg@2 item F1 | 0.7125 |" in text
    # Sub-agents only over trials that ran: t4 = 2 (trial 1 only), so (10 + 7 + 4 + 2) / 4.
    assert "| sub-agents per task | 5.75 |" in text
    assert "| sub-agents per task | 8.50 | 3.00 | 0.35 |" in text


def test_missing_results_json_is_a_user_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"empty/results\.json does not exist"):
        write_report(tmp_path / "empty")
    with pytest.raises(UserError, match="is not a folder"):
        write_report(tmp_path / "nowhere")


def test_malformed_results_json_is_a_user_error_naming_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "results.json").write_text('{"per_task": {', encoding="utf-8")
    with pytest.raises(UserError, match=r"bad/results\.json is not readable JSON"):
        write_report(folder)


def test_a_missing_field_is_named(tmp_path: Path) -> None:
    folder = make_run(tmp_path / "run", ON_TASKS, store=None)
    document = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    del document["per_task"]["t2"][1]["f1_by_item"]
    (folder / "results.json").write_text(json.dumps(document), encoding="utf-8")

    with pytest.raises(UserError, match=r"run/results\.json .*per_task\.t2\.1\.f1_by_item: Field required"):
        write_report(folder)


def test_empty_results_are_a_user_error(tmp_path: Path) -> None:
    folder = tmp_path / "none"
    folder.mkdir()
    (folder / "results.json").write_text('{"per_task": {}}', encoding="utf-8")
    with pytest.raises(UserError, match="per_task is empty"):
        write_report(folder)
    (folder / "results.json").write_text('{"per_task": {"t1": []}}', encoding="utf-8")
    with pytest.raises(UserError, match="task 't1' has no trial result"):
        write_report(folder)


def test_a_malformed_memory_log_line_is_named(memory_on: Path) -> None:
    log = memory_on / "memory_log.jsonl"
    log.write_text(log.read_text(encoding="utf-8") + '{"task_id": "t5", "hints": 3}\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"memory_log\.jsonl line 5 is not a memory log entry: mean_w"):
        write_report(memory_on)
    log.write_text('{"task_id": \n', encoding="utf-8")
    with pytest.raises(UserError, match=r"memory_log\.jsonl line 1 is not valid JSON"):
        write_report(memory_on)


def test_a_bad_compare_folder_is_a_user_error(memory_on: Path, tmp_path: Path) -> None:
    (tmp_path / "not_a_run").mkdir()
    with pytest.raises(UserError, match=r"not_a_run/results\.json does not exist"):
        write_report(memory_on, compare=tmp_path / "not_a_run")
    assert not (memory_on / "report.md").exists()


def test_a_window_below_one_is_refused(memory_on: Path) -> None:
    with pytest.raises(UserError, match="`window` must be >= 1, got 0"):
        write_report(memory_on, window=0)


def test_missing_matplotlib_says_how_to_install_it(memory_on: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'amapreduce\[report\]'"):
        write_report(memory_on)
    assert not (memory_on / "report.md").exists()
