"""`amapreduce eval score`: WideSearch/DeepWideSearch scores that match the official scorers (`eval run` and
`eval report` live in `amapreduce.cli.eval_run`).

Only typer is imported at module level; the evaluation package (pandas, dateparser) loads
inside the command so `amapreduce --help` stays fast.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from amapreduce.errors import RunError, UserError

if TYPE_CHECKING:
    from smolagents import Model

    from amapreduce.evaluation.judges import ModelClient
    from amapreduce.evaluation.runner import EvalOptions, Trial
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.settings import Settings

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, add_completion=False)

_BENCHMARKS = ("widesearch", "deepwidesearch")
_PROTOCOLS = ("aidc", "amapreduce")
_PER_TASK_ROWS = 30
"""Runs with at most this many tasks also print one row per task."""


def _parse_date(value: str | None) -> dt.date | None:
    if value is None:
        return None
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise UserError(f"--reference-date must be YYYY-MM-DD, got {value!r}. Example: 2026-01-01.") from None


def _judge_model(model_id: str, settings: Settings, meter: UsageMeter) -> Model:
    """The judge role's managed model from the one model factory that builds every role's model:
    retries, the provider's rate limits, and every call charged to `meter` (the settings' budget).
    Tests replace this function with a simulated model."""
    from amapreduce.llm.factory import build_role_model

    return build_role_model(settings, "judge", model_id, meter=meter)


def _client(model_id: str, settings: Settings, meter: UsageMeter) -> ModelClient:
    """A judge client for `model_id`, its replies cached under `<cache_dir>/judge`."""
    from amapreduce.evaluation.judges import JudgeCache, ModelClient

    return ModelClient(_judge_model(model_id, settings, meter), JudgeCache(settings.cache_dir / "judge"))


def _check_deepwide_only(benchmark: str, protocol: str, entity_judge: str) -> None:
    """Reject DeepWideSearch-only choices with WideSearch instead of ignoring or half-applying them.

    Why an error: WideSearch has no entity check and one protocol, so `--protocol amapreduce`
    or a model `--entity-judge` there would either do nothing or (for the judge scores) make
    the run differ from the official WideSearch scorer without saying so. The defaults
    (`aidc`, `substring`) stay accepted, so a command that spells them out keeps working.
    """
    if benchmark != "widesearch":
        return
    if protocol != "aidc":
        raise UserError(
            f"--protocol is a DeepWideSearch option, got --protocol {protocol} with --benchmark widesearch. "
            "Drop --protocol, or use --benchmark deepwidesearch."
        )
    if entity_judge != "substring":
        raise UserError(
            f"--entity-judge is a DeepWideSearch option, got --entity-judge {entity_judge} with "
            "--benchmark widesearch. Drop --entity-judge, or use --benchmark deepwidesearch."
        )


def _judge_id(judge: str | None, settings: Settings) -> str:
    """The `--judge` in force: the flag, else `AMAPREDUCE_JUDGE_MODEL`, else the offline `exact`.

    Why: the judge is one of the model roles the settings configure; a `judge_model` set in the
    environment must not be silently ignored. `--judge exact` still forces the offline judge, and
    `none` (the settings' "role off" value) means the same.
    """
    if judge is not None:
        return judge
    configured = (settings.judge_model or "").strip()
    return "exact" if not configured or configured.lower() == "none" else configured


def _options(
    benchmark: str,
    judge: str | None,
    align: str,
    entity_judge: str,
    protocol: str,
    chunk_size: int,
    reference_date: str | None,
    corrected: bool,
    details: Path | None,
    *,
    settings: Settings,
    meter: UsageMeter,
) -> EvalOptions:
    """The scoring options the flags ask for; model judges are built with `settings` and charge
    `meter`."""
    from amapreduce.evaluation import judges
    from amapreduce.evaluation.runner import EvalOptions

    if benchmark not in _BENCHMARKS:
        raise UserError(f"--benchmark must be one of {list(_BENCHMARKS)}, got {benchmark!r}.")
    if protocol not in _PROTOCOLS:
        raise UserError(f"--protocol must be one of {list(_PROTOCOLS)}, got {protocol!r}.")
    if chunk_size < 1:
        raise UserError(
            f"--judge-chunk-size must be >= 1, got {chunk_size}. Use a positive number of rows per call."
        )
    judge = _judge_id(judge, settings)
    for flag, value in (("--judge", judge), ("--align", align), ("--entity-judge", entity_judge)):
        if not value.strip():
            raise UserError(f"{flag} must not be empty. Use a stand-in name or a model id.")
    _check_deepwide_only(benchmark, protocol, entity_judge)
    # Only the AMapReduce DeepWideSearch copy rounds judge scores and parses replies leniently.
    amapreduce_copy = benchmark == "deepwidesearch" and protocol == "amapreduce"
    column_judge: judges.ColumnJudge = (
        judges.ExactJudge()
        if judge == "exact"
        else judges.ModelJudge(
            _client(judge, settings, meter),
            chunk_size=chunk_size,
            normalize=amapreduce_copy,
            lenient=amapreduce_copy,
        )
    )
    aligner: judges.Aligner
    if align == "identity":
        aligner = judges.IdentityAligner()
    elif align == "norm":
        aligner = judges.NormAligner()
    else:
        aligner = judges.ModelAligner(_client(align, settings, meter), lenient=amapreduce_copy)
    entity: judges.EntityJudge = (
        judges.SubstringEntityJudge()
        if entity_judge == "substring"
        else judges.ModelEntityJudge(_client(entity_judge, settings, meter))
    )
    return EvalOptions(
        benchmark=benchmark,  # type: ignore[arg-type]
        judge=column_judge,
        aligner=aligner,
        entity_judge=entity,
        protocol=protocol,  # type: ignore[arg-type]
        reference_date=_parse_date(reference_date),
        corrected=corrected,
        details_dir=details,
        date_cache_dir=settings.cache_dir / "dates",
    )


def options_for(
    benchmark: str, judge: str | None, align: str, reference_date: str | None, *, settings: Settings, meter: UsageMeter
) -> EvalOptions:
    """The scoring options of `eval run`: `eval score`'s defaults for everything it has no flag for,
    so that `eval score` on its answer folders (with the same --judge/--align) gives the same numbers."""
    return _options(benchmark, judge, align, "substring", "aidc", 100, reference_date, False, None,
                    settings=settings, meter=meter)


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
            "--corrected", help="Fix bugs B1, B2, B5, B6, B11, B12 (not comparable to published numbers)."
        ),
    ] = False,
    details: Annotated[
        Path | None, typer.Option("--details", help="Write a per-row detail CSV per task and trial here.")
    ] = None,
) -> None:
    """Score answers like the official WideSearch/DeepWideSearch scorers."""
    from rich.console import Console

    from amapreduce.cli.eval_run import benchmark_files
    from amapreduce.evaluation.loaders import load_tasks
    from amapreduce.evaluation.runner import run_evaluation, write_json_atomic
    from amapreduce.evaluation.summary import render_per_task, render_summary
    from amapreduce.llm.factory import new_meter
    from amapreduce.settings import load_settings

    settings = load_settings(api_base=api_base)
    meter = new_meter(settings)
    tasks, gold_dir = benchmark_files(benchmark, tasks, gold_dir, settings)
    if benchmark == "sandbox":
        benchmark = "widesearch"  # the sandbox's tasks and gold are in the WideSearch format
    options = _options(
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
    err = Console(stderr=True)

    def progress(done: int, total: int) -> None:
        if done == total or done % 25 == 0:
            err.print(f"scored {done}/{total} tasks", highlight=False)

    try:
        report = run_evaluation(task_specs, chosen, trials, gold_dir, options, progress=progress)
        judged = meter.total()
        document = report.to_json()
        if judged.requests:  # model judges were asked (not only the offline stand-ins or the cache)
            document["judge_usage"] = meter.to_json()
        write_json_atomic(out, document)
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
