"""`amapreduce eval score`: WideSearch/DeepWideSearch scores that match the official scorers (`eval run` and
`eval report` live in `amapreduce.cli.eval_run`, the scoring options both build in `amapreduce.cli.eval_options`).

Only typer and light amapreduce modules are imported at module level; the evaluation package
(pandas, dateparser) loads inside the command so `amapreduce --help` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from amapreduce.cli.eval_options import score_options
from amapreduce.cli.help import App
from amapreduce.errors import RunError, UserError

if TYPE_CHECKING:
    from amapreduce.evaluation.runner import Trial

__all__ = ["app"]

app = App()

_PER_TASK_ROWS = 30
"""Runs with at most this many tasks also print one row per task."""


def _trials(pred_dirs: list[Path], pred_jsonl: Path | None, candidate_ids: list[str]) -> list[Trial]:
    from amapreduce.evaluation.loaders import load_predictions_dir, load_predictions_jsonl
    from amapreduce.evaluation.runner import Trial

    if pred_dirs and pred_jsonl is not None:
        raise UserError("use either --pred-dir (one per trial) or --pred-jsonl, not both.")
    if not pred_dirs and pred_jsonl is None:
        raise UserError("no predictions given. Pass --pred-dir TRIAL_DIR (repeatable) or --pred-jsonl FILE.")
    if pred_jsonl is not None:
        return [Trial(label, answers) for label, answers in load_predictions_jsonl(pred_jsonl).items()]
    return [Trial(str(d), load_predictions_dir(d, candidate_ids)) for d in pred_dirs]


def _folders_text(trials: list[Trial]) -> str:
    """The trials' sources for an error message, each folder with what it holds:
    `runs/t1 (3 .md files, e.g. 'ws_001.md')`, `runs/t2 (no .md file)`."""
    from amapreduce.cli.output import counted

    parts = []
    for trial in trials:
        folder = Path(trial.label)
        if not folder.is_dir():
            parts.append(trial.label)
            continue
        names = sorted(p.name for p in folder.glob("*.md"))
        held = f"{counted(len(names), '.md file')}, e.g. {names[0]!r}" if names else "no .md file"
        parts.append(f"{folder} ({held})")
    return "; ".join(parts)


def _task_ids(all_ids: list[str], ids: str | None, all_tasks: bool, trials: list[Trial]) -> list[str]:
    if ids is not None and all_tasks:
        raise UserError("use either --ids or --all-tasks, not both.")
    if all_tasks:
        return all_ids
    if ids is not None:
        wanted = [i.strip() for i in ids.split(",") if i.strip()]
        if not wanted:
            raise UserError(f"--ids is empty, got {ids!r}. Pass comma-separated instance ids.")
        return list(dict.fromkeys(wanted))
    answered = {iid for t in trials for iid, text in t.answers.items() if text is not None}
    chosen = [i for i in all_ids if i in answered]
    if not chosen:
        raise UserError(f"no answer in {_folders_text(trials)} matches a task id. Name answers <instance_id>.md, "
                        "or pass --ids / --all-tasks.")
    return chosen


@app.command("score")
def score(
    out: Annotated[Path, typer.Option("--out", help="Results JSON: per_task and summary.")],
    tasks: Annotated[
        Path | None, typer.Option("--tasks", help="The benchmark's tasks jsonl (built in for sandbox).")
    ] = None,
    gold_dir: Annotated[
        Path | None,
        typer.Option("--gold-dir", help="Folder of <instance_id>.csv gold tables (built in for sandbox)."),
    ] = None,
    benchmark: Annotated[
        str, typer.Option("--benchmark", help="widesearch | deepwidesearch | sandbox (the bundled benchmark).")
    ] = "widesearch",
    pred_dir: Annotated[
        list[Path] | None,
        typer.Option("--pred-dir", help="One trial: a folder of <instance_id>.md answers. Repeatable."),
    ] = None,
    pred_jsonl: Annotated[
        Path | None,
        typer.Option(
            "--pred-jsonl",
            help='Lines {"instance_id", "trial", "response"} (other keys ignored); trials sorted by id.',
        ),
    ] = None,
    ids: Annotated[str | None, typer.Option("--ids", help="Comma-separated instance ids to score.")] = None,
    all_tasks: Annotated[
        bool, typer.Option("--all-tasks", help="Score every task (missing answers score 0).")
    ] = False,
    judge: Annotated[
        str | None,
        typer.Option(
            "--judge",
            help="llm_judge columns: exact (offline stand-in) or a model id. "
            "Default: AMAPREDUCE_JUDGE_MODEL when set, else exact.",
        ),
    ] = None,
    align: Annotated[
        str, typer.Option("--align", help="Header/key alignment: identity | norm | a model id.")
    ] = "identity",
    entity_judge: Annotated[
        str, typer.Option("--entity-judge", help="DeepWideSearch only: entity check, substring | a model id.")
    ] = "substring",
    protocol: Annotated[
        str, typer.Option("--protocol", help="DeepWideSearch only: aidc (entity gate) | amapreduce.")
    ] = "aidc",
    judge_chunk_size: Annotated[
        int, typer.Option("--judge-chunk-size", help="Rows per LLM judge call.")
    ] = 100,
    api_base: Annotated[
        str | None,
        typer.Option(
            "--api-base",
            help="OpenAI-compatible endpoint for the model ids given (default: the api_base setting).",
        ),
    ] = None,
    reference_date: Annotated[
        str | None, typer.Option("--reference-date", help="Pin dateparser's 'today' (YYYY-MM-DD).")
    ] = None,
    corrected: Annotated[
        bool,
        typer.Option(
            "--corrected", help="Fix bugs B1, B2, B5, B6, B11, B12, B13 (not comparable to published numbers)."
        ),
    ] = False,
    details: Annotated[
        Path | None, typer.Option("--details", help="Write a per-row detail CSV per task and trial here.")
    ] = None,
) -> None:
    """Score answers like the official WideSearch/DeepWideSearch scorers."""
    from rich.console import Console

    from amapreduce._atomic import write_json
    from amapreduce.cli.eval_run import benchmark_files
    from amapreduce.evaluation.loaders import load_tasks
    from amapreduce.evaluation.runner import run_evaluation
    from amapreduce.evaluation.summary import render_per_task, render_summary
    from amapreduce.llm.factory import new_meter
    from amapreduce.session.progress import RunProgress
    from amapreduce.settings import load_settings

    settings = load_settings(api_base=api_base)
    meter = new_meter(settings)
    tasks, gold_dir = benchmark_files(benchmark, tasks, gold_dir, settings)
    if benchmark == "sandbox":
        benchmark = "widesearch"  # the sandbox's tasks and gold are in the WideSearch format
    options = score_options(
        benchmark,
        judge,
        align,
        entity_judge,
        protocol,
        judge_chunk_size,
        reference_date,
        corrected,
        details,
        settings=settings,
        meter=meter,
    )
    task_specs = load_tasks(tasks, options.benchmark)
    if not gold_dir.is_dir():
        raise UserError(f"--gold-dir {gold_dir} is not a folder of <instance_id>.csv gold tables.")
    all_ids = list(task_specs)
    trials = _trials(pred_dir or [], pred_jsonl, all_ids)
    chosen = _task_ids(all_ids, ids, all_tasks, trials)
    stray = sorted({i for t in trials for i in t.answers if i not in task_specs})
    for folder in pred_dir or []:
        stray.extend(sorted(p.stem for p in folder.glob("*.md") if p.stem not in task_specs))
    if stray:
        typer.echo(
            f"warning: {len(stray)} answer(s) match no task and are ignored, e.g. {stray[:3]}", err=True
        )
    try:
        with RunProgress(None) as progress:
            report = run_evaluation(task_specs, chosen, trials, gold_dir, options, progress=progress)
        judged = meter.total()
        document = report.to_json()
        if judged.requests:  # model judges were asked (not only the offline stand-ins or the cache)
            document["judge_usage"] = meter.to_json()
        write_json(out, document, indent=2)
    except OSError as exc:  # --out / --details / cache folders not writable, disk full, ...
        raise RunError(
            f"cannot write results: {exc}. Check that the --out and --details folders are writable."
        ) from exc
    console = Console(file=sys.stdout, soft_wrap=True)
    title = f"{options.benchmark} scores (judge {options.judge.name}, align {options.aligner.name})"
    if len(chosen) <= _PER_TASK_ROWS:
        console.print(render_per_task(report.per_task, [t.label for t in trials]))
    console.print(
        render_summary(
            report.summary, tasks=len(chosen), trials=len(trials), successes=report.successes, title=title
        )
    )
    if options.corrected:
        changed = ", ".join(f"{k}: {v}" for k, v in sorted(report.corrections.items()) if v) or "nothing"
        console.print(f"--corrected changed: {changed}", highlight=False, markup=False)
    if judged.requests:
        console.print(
            f"judge models: {judged.requests} calls, {judged.total_tokens} tokens, ${judged.cost_usd:.4f}",
            highlight=False,
            markup=False,
        )
    console.print(f"results written to {out}", highlight=False, markup=False)


def _register_run() -> None:
    from amapreduce.cli.eval_run import register

    register(app)


_register_run()
