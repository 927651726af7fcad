"""`amapreduce demo`: the whole pipeline offline, with a simulated model (not an LLM).

Only typer is imported at module level; the pipeline loads inside the command so
`amapreduce --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from amapreduce.cli.exit_codes import EXIT_CODES_HELP
from amapreduce.cli.options import OtelOpt, VerifyOpt, WorkersOpt
from amapreduce.cli.output import counted, effort_text

if TYPE_CHECKING:
    from amapreduce.demo.discovery import Scouting

__all__ = ["demo", "register"]

_NOTE = (
    "Simulated model (deterministic code, not an LLM) over the bundled sandbox atlas: the manager agent, "
    "mapreduce tool, engine, sub-agents and reducer are real; no network, no API key."
)


def demo(
    task_id: str | None = typer.Argument(None, help="Sandbox task id (default: sbx_en_001; sbx_enrich_* enrich a given list as `amapreduce enrich` does)."),
    faults: float = typer.Option(0.0, "--faults", min=0.0, max=1.0, help="Fault rate of the simulated model (0-1)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the fault injection (and of --wrong-values)."),
    wrong_values: float = typer.Option(0.0, "--wrong-values", min=0.0, max=1.0, metavar="RATE", help=(
        "Share of the simulated sub-agents' cells answered wrong, with made-up quotes (0-1): measures the quote check.")),
    verify: VerifyOpt = None,
    workers: WorkersOpt = None,
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object on stdout."),
    memory: Path | None = typer.Option(
        None, "--memory", help="Demo memory store (default: <cache dir>/demo-memory; created if missing)."),
    no_memory: bool = typer.Option(False, "--no-memory", help="Neither read nor teach a memory."),
    sample: int = typer.Option(0, "--sample", min=0, help="Simulated manager's sample (0: its fixed default)."),
    scouting: str = typer.Option("mapreduce", "--scouting", metavar="MODE", help=(
        "How the simulated manager finds a discovery task's entities (sbx_disc_*): mapreduce (a decision with "
        "`discover`) or sequential (it reads every list page itself).")),
    serve: bool = typer.Option(False, "--serve", help="Serve the simulated model as a loopback OpenAI-compatible "
                               "endpoint and print the `ask` line to use against it (Ctrl-C stops)."),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="With --serve: the loopback port (0: any free port)."),
    otel: OtelOpt = False,
) -> None:
    """Run a sandbox task end to end with a simulated model, offline; print the table and its score.

    The run reads its plan-stage prior from a demo memory, is scored against the sandbox gold and
    is then committed to that memory (record, hint credit, distillation), so a second task of the
    same family uses the first one's experience.
    """
    from amapreduce.cli.exit_codes import exit_for_run
    from amapreduce.demo.faults import FaultPlan
    from amapreduce.demo.run import run_demo
    from amapreduce.errors import UserError
    from amapreduce.settings import load_settings

    if memory is not None and no_memory:
        raise UserError("use either --memory STORE or --no-memory, not both.")
    if scouting not in ("mapreduce", "sequential"):
        raise UserError(f"--scouting must be mapreduce or sequential, not {scouting!r}.")
    mode: Scouting = "sequential" if scouting == "sequential" else "mapreduce"  # the checked flag, typed
    settings = load_settings(workers=workers, otel=otel or None, verify=verify)
    if settings.otel:  # without the `otel` extra: a usage error, before anything is made
        from amapreduce import telemetry

        telemetry.enable()
    if serve:
        _serve(task_id, port, settings, mode)
        return
    store = None if no_memory else (memory or settings.cache_dir / "demo-memory")
    typer.echo(_NOTE, err=True)
    outcome = run_demo(task_id, settings, faults=FaultPlan(rate=faults, seed=seed, wrong_values=wrong_values),
                       show_progress=None if not as_json else False, memory_store=store, sample=sample,
                       scouting=mode)
    if as_json:
        typer.echo(json.dumps(outcome.to_json(), ensure_ascii=False))
    else:
        c = outcome.ask.record.completeness
        injected = ", ".join(f"{k} {v}" for k, v in sorted(outcome.faults.items())) or "none"
        typer.echo(outcome.ask.markdown)
        typer.echo(
            f"\nTask {outcome.task_id} ({outcome.ask.status}): {counted(c.rows, 'row')}, "
            f"{counted(c.missing_cells, 'missing cell')}; {effort_text(c)}; faults injected: {injected}."
        )
        for found in outcome.ask.record.discoveries or []:
            typer.echo(f"Discovery: {counted(found.sources, 'source')}, {counted(found.candidates, 'candidate')} -> "
                       f"{counted(found.entities, 'entity', 'entities')}; {counted(found.merge_calls, 'merge call')} "
                       f"({' '.join(n for n in found.nodes if n != 'map') or 'none'}), largest merge prompt "
                       f"{found.peak_prompt_tokens} tokens (budget {found.token_budget}).")
        typer.echo("Evidence of the sub-agents' cells: " + ", ".join(f"{v} {k}" for k, v in outcome.evidence().items()) + ".")
        typer.echo(f"Score against the sandbox gold (exact judge): {_metrics_text(outcome.score)}.")
        if outcome.corrected_score and outcome.corrected_score != outcome.score:
            from amapreduce.evaluation.score import explain_corrections

            typer.echo(f"Corrected score (`eval score --corrected`): {_metrics_text(outcome.corrected_score)}.\n"
                       f"  Why they differ: {explain_corrections(outcome.corrections)}")
        typer.echo(f"Model: simulated (not an LLM). Run directory: {outcome.ask.run_dir.path}")
        if outcome.memory is not None:
            _echo_memory(outcome.memory, outcome.ask.decisions)
    exit_for_run(outcome.ask.ending.status)


def _metrics_text(score: dict[str, float]) -> str:
    return f"success {score['score']:g}, item F1 {score['f1_by_item']:.3f}, row F1 {score['f1_by_row']:.3f}"


def _echo_memory(memory: dict[str, Any], decisions: list[Any]) -> None:
    """The prior the run was given and what the memory learned, in a few lines."""
    prior = memory["prior"]
    typer.echo(f"\nMemory {memory['store']}:")
    text = prior["text"] or "(no prior)"
    # The prior's guidance and exemplars; an exemplar's question is shown by its first line only.
    keep = ("Batching guidance", "- ", "Similar task", "  Its decision", "No ")
    shown = [line for line in text.splitlines() if line.startswith(keep)] or text.splitlines()[:1]
    typer.echo("  prior given to the manager:\n" + "\n".join(f"    {line}" for line in shown))
    _echo_advice(prior.get("advice"), prior.get("advice_used"))
    if decisions:
        strategy = decisions[0].batch_strategy
        typer.echo(f"  decision executed: {strategy.type}, batch size {decisions[0].batch_size or 1}"
                   f" ({strategy.rationale or 'no rationale'})")
    learned = memory["learned"]
    if not learned.get("committed"):
        typer.echo(f"  nothing learned: {learned.get('reason')}")
        return
    label = "success" if learned.get("label") else "weaker run"
    typer.echo(f"  learned: record {learned['record_id']} added ({label}, utility {memory['utility']:.3f})")
    for hint in learned.get("prior_hints", []):
        typer.echo(f"  hint {hint['id']} credited: w {hint['w_before']} -> {hint['w_after']}")
    if learned.get("pruned"):
        typer.echo(f"  pruned: {', '.join(learned['pruned'])}")
    distilled = learned.get("distillation")
    if distilled:
        typer.echo("  distillation ({what}): {created} hints created, {edited} edited, {removed} removed, "
                   "{merged} merges".format(**{k: distilled.get(k, 0) for k in
                                               ("what", "created", "edited", "removed", "merged")}))
    typer.echo(f"  the memory now holds {counted(learned['records'], 'record')} and {counted(learned['hints'], 'hint')}.")


def _echo_advice(advice: dict[str, Any] | None, used: dict[str, Any] | None) -> None:
    """The typed advice beside the prose: the choices similar records measured, the proposal, and
    the hints' payloads that apply to the draft."""
    if not advice:
        return

    def choice(c: dict[str, Any]) -> str:
        size = "whole groups" if c.get("batch_size") is None else f"{c['batch_size']} rows per batch"
        return f"{c['strategy']}, {size}"

    typer.echo(f"  typed advice ({counted(advice['similar_records'], 'similar record')}):")
    for c in advice.get("choices", []):
        tokens = "n/a" if c.get("tokens_per_row") is None else f"{c['tokens_per_row']:.0f}"
        typer.echo(f"    measured {choice(c)}: n {c['n']}, passed {c['successes']}, tokens per row {tokens}")
    proposal = advice.get("proposal")
    typer.echo(f"    proposal: {choice(proposal)}: {proposal['why']}" if proposal else "    proposal: none")
    for hint in advice.get("hints", []):
        state = "applies to this draft" if hint.get("applies") else "about other shapes"
        typer.echo(f"    hint {hint['id']}: {choice(hint['advice'])} ({state})")
    if used:
        typer.echo(f"    applied by the {str(used['by']).replace('_', ' ')}: {choice(used)}")


def _serve(task_id: str | None, port: int, settings: Any, scouting: Scouting) -> None:
    """`demo --serve`: serve until Ctrl-C (which ends the command with 130, as any interrupt)."""
    import threading

    from amapreduce.demo.run import DEFAULT_TASK, ENRICH_PREFIX, load_sandbox_tasks
    from amapreduce.demo.serve import serve
    from amapreduce.errors import UserError

    tasks, world = load_sandbox_tasks(settings)
    chosen = task_id or DEFAULT_TASK
    if chosen not in tasks:
        raise UserError(f"unknown sandbox task {chosen!r}. Sandbox tasks are: {', '.join(sorted(tasks))}.")
    command = None
    if chosen.startswith(ENRICH_PREFIX):  # a given list: the `enrich` command line, not `ask`'s
        from amapreduce.demo.enrichment import enrich_command

        def command(base_url: str) -> str:
            return enrich_command(chosen, world, base_url)
    try:
        stop = threading.Event()  # never set: only Ctrl-C ends the wait

        def wait() -> None:
            stop.wait()

        serve(port, world.index_dir, tasks[chosen].query, echo=typer.echo, wait=wait, scouting=scouting,
              command=command)
    except OSError as exc:  # the port is taken
        raise UserError(f"cannot serve on 127.0.0.1:{port}: {exc.strerror or exc}. Choose another --port.") from None


def register(app: typer.Typer) -> None:
    """Add the top-level `demo` command."""
    app.command("demo", epilog=EXIT_CODES_HELP)(demo)
