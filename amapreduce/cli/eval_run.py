"""`amapreduce eval run` and `amapreduce eval report`: run a benchmark end to end, then plot it.

The flags are parsed here; the evaluation itself is `amapreduce.bench.evaluate.run_benchmark`, the
report `amapreduce.evaluation.report.write_report`. The sandbox benchmark needs no files and, with
no `--model`, runs offline with the simulated model (deterministic code, not an LLM).
`--executor ray[:ADDRESS]` (or `AMAPREDUCE_EXECUTOR`) runs the trials as Ray tasks (`cluster.trials`).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from amapreduce.cli.exit_codes import EVAL_EXIT_CODES_HELP
from amapreduce.cli.options import AllowWebCrawlOpt, ExecutorOpt, OtelOpt, executor_for
from amapreduce.errors import UserError

if TYPE_CHECKING:
    from amapreduce.bench.journal import EvalConfig
    from amapreduce.bench.trial import SimulatedModels
    from amapreduce.evaluation.loaders import TaskSpec
    from amapreduce.settings import Settings

__all__ = ["register"]


def _sandbox_paths(settings: Settings) -> tuple[Path, Path, Path]:
    """(tasks file, gold folder, corpus index) of the bundled sandbox benchmark."""
    from amapreduce.sandbox import sandbox_world

    world = sandbox_world(settings.cache_dir)
    return world.tasks_file, world.gold_dir, world.index_dir


def benchmark_files(benchmark: str, tasks: Path | None, gold_dir: Path | None,
                    settings: Settings) -> tuple[Path, Path]:
    """The tasks file and gold folder to use: the sandbox's own, or the ones the user passed."""
    if benchmark == "sandbox":
        world_tasks, world_gold, _ = _sandbox_paths(settings)
        return tasks or world_tasks, gold_dir or world_gold
    if tasks is None or gold_dir is None:
        raise UserError(f"--benchmark {benchmark} needs --tasks FILE and --gold-dir DIR (the benchmark's tasks "
                        "jsonl and its folder of <instance_id>.csv gold tables); only the sandbox is bundled.")
    if not tasks.is_file():
        raise UserError(f"--tasks {tasks} is not a file.")
    if not gold_dir.is_dir():
        raise UserError(f"--gold-dir {gold_dir} is not a folder of <instance_id>.csv gold tables.")
    return tasks, gold_dir


def _chosen_ids(all_ids: list[str], ids: str | None, limit: int | None) -> list[str]:
    if ids is not None and limit is not None:
        raise UserError("use either --ids or --limit, not both.")
    if ids is not None:
        wanted = list(dict.fromkeys(i.strip() for i in ids.split(",") if i.strip()))
        if not wanted:
            raise UserError(f"--ids is empty, got {ids!r}. Pass comma-separated instance ids.")
        unknown = [i for i in wanted if i not in all_ids]
        if unknown:
            raise UserError(f"unknown instance id(s) {unknown[:5]}: not in the tasks file. Check --ids.")
        return wanted
    return all_ids[:limit] if limit is not None else all_ids


def _task_order(benchmark: str, tasks: Path | None, file_order: list[str], settings: Settings) -> list[str]:
    """The order an evaluation runs its tasks in without --ids: the file's, except for the bundled
    sandbox, which runs round-robin across its question families (`sandbox.benchmark_order`), as
    `benchmarks/bench_evolution.py` does. In file order its second generation of families (the ids
    after `sbx_en_042`) all falls in the second half, so the memory meets 4 of its 11 families there
    for the first time: measured, it saved 34 % of the second half's sub-agents where the benchmark's
    order saves 52 to 55 % (docs/guides/evaluation.md)."""
    if benchmark != "sandbox" or tasks is not None:
        return file_order
    from amapreduce.sandbox import benchmark_order, sandbox_families, sandbox_world

    known = set(file_order)
    return [i for i in benchmark_order(sandbox_families(sandbox_world(settings.cache_dir))) if i in known]


def run(
    resume_dir: Annotated[Path | None, typer.Argument(
        metavar="[DIR]", help="With --resume alone: the evaluation folder to continue.")] = None,
    benchmark: Annotated[str | None, typer.Option(
        "--benchmark", help="widesearch | deepwidesearch | sandbox (bundled, offline).")] = None,
    tasks: Annotated[Path | None, typer.Option(
        "--tasks", help="Tasks jsonl. Required for widesearch/deepwidesearch (not bundled); the sandbox's is built in.")] = None,
    gold_dir: Annotated[Path | None, typer.Option(
        "--gold-dir", help="Folder of <instance_id>.csv gold tables (required with --tasks).")] = None,
    ids: Annotated[str | None, typer.Option("--ids", help="Comma-separated instance ids, in this order.")] = None,
    limit: Annotated[int | None, typer.Option(
        "--limit", min=1, help="The first N tasks (of the file; the sandbox: of its round-robin family order).")] = None,
    trials: Annotated[int, typer.Option("--trials", min=1, max=32, help="Trials per task.")] = 1,
    out: Annotated[Path | None, typer.Option("--out", help="Evaluation folder (answers, runs, journal, results).")] = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="Model of every role (sandbox default: the simulated model, offline).")] = None,
    api_base: Annotated[str | None, typer.Option("--api-base", help="OpenAI-compatible endpoint.")] = None,
    search: Annotated[str | None, typer.Option(
        "--search", help="Search backend (sandbox default: its bundled corpus).")] = None,
    allow_web_crawl: AllowWebCrawlOpt = False,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="Sub-agents at once, per trial.")] = None,
    tasks_parallel: Annotated[int, typer.Option(
        "--tasks-parallel", min=1, help="Instances at once (commits stay in task order).")] = 1,
    memory: Annotated[Path | None, typer.Option(
        "--memory", help="Memory store (created if missing; default: DIR/memory, a fresh store).")] = None,
    no_memory: Annotated[bool, typer.Option("--no-memory", help="Run without a prior; nothing is learnt.")] = False,
    no_learn: Annotated[bool, typer.Option("--no-learn", help="Read the memory but never write it.")] = False,
    encoder: Annotated[str | None, typer.Option(
        "--encoder", help="Encoder of a NEW memory store: minilm, st:MODEL, hashing[:DIM] "
        "(default: AMAPREDUCE_MEMORY_ENCODER, else minilm).")] = None,
    judge: Annotated[str | None, typer.Option("--judge", help="llm_judge columns: exact or a model id.")] = None,
    align: Annotated[str, typer.Option("--align", help="identity | norm | a model id.")] = "identity",
    reference_date: Annotated[str | None, typer.Option("--reference-date", help="Pin 'today' (YYYY-MM-DD).")] = None,
    max_cost: Annotated[float | None, typer.Option(
        "--max-cost", min=0.0, help="Stop starting trials once the evaluation has spent this many USD.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the evaluation in DIR / --out.")] = False,
    otel: OtelOpt = False,
    executor: ExecutorOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object on stdout.")] = False,
) -> None:
    """Run a benchmark end to end (manager, mapreduce, sub-agents), score it, and let the memory learn.

    widesearch/deepwidesearch need --tasks and --gold-dir (the files are not bundled). The sandbox
    benchmark is bundled and, without --model, runs offline with the simulated model.
    """
    from rich.console import Console

    from amapreduce.bench.evaluate import run_benchmark
    from amapreduce.bench.journal import read_eval_config
    from amapreduce.session.progress import RunProgress
    from amapreduce.settings import load_settings

    if resume and resume_dir is not None and out is not None and resume_dir != out:
        raise UserError("give the evaluation folder once: `eval run --resume DIR` or `--out DIR --resume`.")
    folder = out or resume_dir
    if folder is None:
        raise UserError("--out DIR is required (or `eval run --resume DIR` to continue an evaluation).")
    if resume_dir is not None and not resume:
        raise UserError(f"unexpected argument {str(resume_dir)!r}; to continue an evaluation use --resume.")
    base = load_settings(model=model, api_base=api_base, workers=workers, otel=otel or None, executor=executor,
                         allow_web_crawl=allow_web_crawl or None)
    cluster = executor_for(base, executor)  # Ray checked importable before anything is made
    if benchmark is None:
        if not resume:
            raise UserError("--benchmark is required: widesearch, deepwidesearch or sandbox.")
        saved = read_eval_config(folder)
        if saved is None:
            raise UserError(f"--resume: {folder} holds no evaluation to continue.")
        config = saved
    else:
        config = _config(benchmark, folder, base, resumed=read_eval_config(folder) if resume else None, tasks=tasks, gold_dir=gold_dir, ids=ids, limit=limit, trials=trials,
                         search=search, memory=memory, no_memory=no_memory, no_learn=no_learn, encoder=encoder,
                         judge=judge, align=align, reference_date=reference_date, max_cost=max_cost)
    settings, simulated, memory_model = _wiring(config, base)
    _check_setup(config, settings, simulated=simulated is not None)
    task_specs = _tasks(config)
    from amapreduce.cli.eval_options import options_for
    from amapreduce.llm.factory import new_meter

    options = options_for("deepwidesearch" if config.benchmark == "deepwidesearch" else "widesearch", config.judge,
                          config.align, config.reference_date, settings=settings, meter=new_meter(settings))
    err = Console(stderr=True, highlight=False)
    if simulated is not None:
        err.print("Simulated model (deterministic code, not an LLM) over the bundled sandbox atlas; the memory, "
                  "scorer and pipeline are real.", markup=False)
    with contextlib.ExitStack() as stack:
        remote = None
        if cluster is not None:
            from amapreduce.cluster.trials import RayTrials

            remote = stack.enter_context(RayTrials(cluster.spec.address))
        outcome = run_benchmark(config, out=folder, tasks=task_specs, settings=settings, options=options,
                                tasks_parallel=tasks_parallel, simulated=simulated, memory_model=memory_model,
                                resume=resume, progress=stack.enter_context(RunProgress(None)), remote=remote)
    _print(outcome.results, outcome.status, outcome.reason, folder, as_json)
    if outcome.status == "failed":  # the provider refused a trial for good: one `error:` line, as every command
        typer.echo(f"error: evaluation stopped: {outcome.reason}", err=True)
    from amapreduce.cli.exit_codes import eval_exit_code

    code = eval_exit_code(outcome.status)
    if code:
        raise typer.Exit(code)


def _config(benchmark: str, folder: Path, settings: Settings, *, resumed: EvalConfig | None, tasks: Path | None, gold_dir: Path | None,
            ids: str | None, limit: int | None, trials: int, search: str | None, memory: Path | None,
            no_memory: bool, no_learn: bool, encoder: str | None, judge: str | None, align: str,
            reference_date: str | None, max_cost: float | None) -> EvalConfig:
    """The evaluation the flags ask for; `resumed`: the one the folder holds, for `--resume`.

    The encoder is recorded only when the store is new. On a resume of the same command, the store
    the first run created exists now: it is judged as the first run found it (new when that run
    recorded an encoder), so the same command plus `--resume` asks for the same evaluation.
    """
    from amapreduce.bench.journal import EvalConfig, benchmark_defaults
    from amapreduce.evaluation.loaders import load_tasks
    from amapreduce.memory.schema import DB_NAME

    defaults = benchmark_defaults(benchmark)
    if memory is not None and no_memory:
        raise UserError("use either --memory STORE or --no-memory, not both.")
    if no_memory and no_learn:
        raise UserError("--no-learn reads a memory; with --no-memory there is none. Use one of them.")
    if benchmark != "sandbox" and not settings.model:
        from amapreduce.session.parts import NO_MODEL_HELP

        raise UserError(NO_MODEL_HELP)
    tasks_file, gold = benchmark_files(benchmark, tasks, gold_dir, settings)
    specs = load_tasks(tasks_file, "deepwidesearch" if benchmark == "deepwidesearch" else "widesearch")
    chosen = _chosen_ids(_task_order(benchmark, tasks, list(specs), settings), ids, limit)
    store = None if no_memory else (memory or folder / "memory")
    created = (resumed is not None and resumed.encoder is not None and store is not None
               and resumed.memory_store == str(store.resolve()))  # this evaluation's first run made the store
    is_new = store is not None and (created or not (store / DB_NAME).exists())
    if encoder is not None and store is not None and not is_new:
        raise UserError(f"--encoder applies to a new store; {store} exists and keeps its own encoder.")
    new_encoder = (encoder or settings.memory_encoder) if is_new else None
    if new_encoder is not None:  # an unknown encoder is refused now, not after DIR and its store exist
        from amapreduce.llm.embed import get_encoder

        get_encoder(new_encoder)
    if search is None and benchmark == "sandbox":
        search = f"corpus:{_sandbox_paths(settings)[2]}"
    return EvalConfig(
        benchmark=benchmark,  # type: ignore[arg-type]
        tasks_file=str(tasks_file.resolve()), gold_dir=str(gold.resolve()), task_ids=chosen, trials=trials,
        model=settings.model, api_base=settings.api_base, search=search or settings.search_backend,
        memory_store=str(store.resolve()) if store is not None else None, learn=not no_learn, encoder=new_encoder,
        memory_config=dict(defaults.memory), judge=judge or settings.judge_model or "exact", align=align,
        reference_date=reference_date,
        cost_weight=settings.utility_cost_weight if settings.utility_cost_weight is not None else defaults.cost_weight,
        delay_weight=(settings.utility_delay_weight if settings.utility_delay_weight is not None
                      else defaults.delay_weight),
        max_cost_usd=max_cost or None,
    )


def _check_setup(config: EvalConfig, settings: Settings, *, simulated: bool) -> None:
    """Refuse a search backend or model the trials could not build, before the evaluation folder exists.

    Why: each trial builds its own parts, and a trial that fails is recorded while the evaluation
    goes on, so `--search bing` used to give an evaluation of failed trials that "completed" with
    exit 0 and left DIR behind. The simulated model reads the sandbox corpus only, so with it
    `--search` must name a corpus index.

    Raises:
        UserError: the search backend or a role's model cannot be built as given.
    """
    from amapreduce.session import RunOptions, Session
    from amapreduce.session.journal import RunKind

    if simulated and not config.search.startswith("corpus:"):
        raise UserError(f"--search {config.search!r}: the simulated model searches a local corpus only. Use "
                        "--search corpus:INDEX, leave --search out (the sandbox's own corpus), or pass --model.")
    Session(settings, RunOptions(kind=RunKind.EVAL, roles=() if simulated else None))  # its pre-flight; nothing is made


def _tasks(config: EvalConfig) -> dict[str, TaskSpec]:
    from amapreduce.evaluation.loaders import load_tasks

    return load_tasks(Path(config.tasks_file), "deepwidesearch" if config.benchmark == "deepwidesearch" else "widesearch")


def _wiring(config: EvalConfig, base: Settings) -> tuple[Settings, SimulatedModels | None, Any]:
    """The trials' settings, and the simulated models (sandbox without a model) or the real memory model."""
    settings = base.model_copy(update={"search_backend": config.search, "model": config.model,
                                       "api_base": config.api_base})
    if config.model is None:
        import dataclasses

        from amapreduce.bench.journal import benchmark_defaults
        from amapreduce.demo.benchmark import sandbox_models
        from amapreduce.demo.run import demo_settings

        index = config.search.removeprefix("corpus:")
        # `rebuild`: a Ray worker builds the same simulated models itself (they never cross)
        simulated = settings.model_copy(update=dict(benchmark_defaults(config.benchmark).settings))
        return demo_settings(simulated, index), dataclasses.replace(sandbox_models(), rebuild=sandbox_models), None
    from amapreduce.bench.trial import memory_model_for

    return settings, None, memory_model_for(settings) if config.memory_store is not None else None


def _print(results: dict[str, Any], status: str, reason: str | None, folder: Path, as_json: bool) -> None:
    summary = results.get("summary", {})
    if as_json:
        typer.echo(json.dumps({"status": status, "reason": reason, "out": str(folder),
                               "results_file": str(folder / "results.json") if status == "complete" else None,
                               "tasks": len(results.get("per_task", {})), "trials": results.get("trials"),
                               "summary": summary, "learning": results.get("learning"),
                               "memory": results.get("memory")}, ensure_ascii=False))
        return
    from rich.console import Console

    from amapreduce.evaluation.summary import render_summary

    console = Console(file=sys.stdout, soft_wrap=True, highlight=False)
    if summary:
        trials = int(results.get("trials") or 1)
        per_task = results.get("per_task", {})
        successes = [sum(1 for rows in per_task.values() if len(rows) > k and rows[k].get("score") == 1.0)
                     for k in range(trials)]
        console.print(render_summary({k: v for k, v in summary.items() if isinstance(v, dict)},
                                     tasks=len(per_task), trials=trials, successes=successes,
                                     title=f"{results.get('benchmark')} evaluation ({results.get('model')})"))
        console.print(f"per task: {summary['subagents_per_task']} sub-agents, {summary['model_calls_per_task']} model "
                      f"calls, {summary['prompt_tokens_per_task']:.0f} prompt tokens, ${summary['cost_usd']:.4f}, "
                      f"{summary['wall_s_per_task']:.1f} s", markup=False)
        learning = results.get("learning") or {}
        if learning.get("first_half") and learning.get("second_half"):
            first, second = learning["first_half"], learning["second_half"]
            console.print(f"learning (task order, per task): first half ({first['tasks']} tasks) "
                          f"{first['subagents_per_task']} sub-agents, Item F1 {first['item_f1']}; second half "
                          f"({second['tasks']} tasks) {second['subagents_per_task']} sub-agents, Item F1 "
                          f"{second['item_f1']}", markup=False)
        mem = results.get("memory") or {}
        if mem.get("store"):
            console.print(f"memory {mem['store']} ({'learning' if mem.get('learn') else 'read-only'}): records "
                          f"{mem['records_before']} -> {mem['records_after']}, hints {mem['hints_before']} -> "
                          f"{mem['hints_after']}", markup=False)
    if status == "complete":
        console.print(f"results written to {folder / 'results.json'}; answers in {folder}/trial*/", markup=False)
    elif status == "stopped":
        console.print(f"evaluation stopped: {reason}", markup=False)


def report(
    eval_dir: Annotated[Path, typer.Argument(help="An `eval run` folder.")],
    compare: Annotated[Path | None, typer.Option(
        "--compare", help="A second `eval run` folder (e.g. the same run with --no-memory).")] = None,
) -> None:
    """Write report.md and PNG plots (per-task Item F1, cost vs F1, learning curve, hint pool) into DIR."""
    from amapreduce.evaluation.report import write_report

    files = write_report(eval_dir, compare=compare)
    typer.echo(f"report written to {files.report}")
    for plot in files.plots:
        typer.echo(f"plot: {plot}")


def register(app: typer.Typer) -> None:
    """Add `eval run` and `eval report` to the `eval` command group."""
    app.command("run", epilog=EVAL_EXIT_CODES_HELP)(run)
    app.command("report")(report)
