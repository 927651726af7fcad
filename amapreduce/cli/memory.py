"""`amapreduce memory ...`: inspect, search, prune and distil the experiential memory, and learn from `ask` runs.

Every command takes `--store PATH` (default: `Settings.memory_store`, `memory_store/default`) and
`--json` (exactly one JSON document on stdout). Only typer is imported at module level; the
memory package (and numpy, faiss, torch behind it) loads inside the command that needs it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from amapreduce.cli.help import App

if TYPE_CHECKING:
    from amapreduce.memory import ExperientialMemory, MemoryStore
    from amapreduce.settings import Settings

__all__ = ["app"]

app = App(help="Inspect, search, prune and distil the experiential memory.")

StoreOpt = typer.Option(None, "--store", metavar="PATH", help="Store folder (default: memory_store/default).")
JsonOpt = typer.Option(False, "--json", help="Print one JSON document on stdout.")
EncoderOpt = typer.Option(None, "--encoder", help="Encoder of a new store: minilm (default), st:MODEL, hashing[:DIM].")


def _folder(store: Path | None) -> Path:
    if store is not None:
        return store
    from amapreduce.settings import load_settings

    return load_settings().memory_store


def _open(store: Path | None, *, encoder: str | None = None, create: bool = False,
          readonly: bool = False) -> MemoryStore:
    """The store behind `--store`. Commands that only look (`stats`, `list`, `show`, `search`,
    `export`, `prune --dry-run`) open it `readonly`: SQLite's read-only mode, so they never write
    to the file, not even a schema into an empty one."""
    from amapreduce.memory import MemoryStore
    from amapreduce.memory.schema import DB_NAME

    folder = _folder(store)
    if encoder is None and create and not (folder / DB_NAME).exists():
        from amapreduce.settings import load_settings

        encoder = load_settings().memory_encoder  # a store's encoder is fixed when it is created
    return MemoryStore(folder, encoder=encoder, create=create, readonly=readonly)


def _memory(store: Path | None, *, encoder: str | None = None, model: Any | None = None,
            readonly: bool = False, **config: Any) -> ExperientialMemory:
    from amapreduce.errors import ConfigError
    from amapreduce.memory import ExperientialMemory, MemoryConfig

    try:
        cfg = MemoryConfig(**{k: v for k, v in config.items() if v is not None})
    except ValueError as exc:
        raise ConfigError(f"invalid memory option: {exc.errors()[0]['msg']}. Check the flag values.") from None  # type: ignore[attr-defined]
    return ExperientialMemory(_open(store, encoder=encoder, readonly=readonly), config=cfg, model=model)


def _emit(as_json: bool, payload: Any, text: str) -> None:
    if as_json:
        typer.echo(json.dumps(payload, ensure_ascii=False, default=str))
    else:
        typer.echo(text)


ModelOpt = typer.Option(None, "--model", help="Memory model: LiteLLM id or the server's model name "
                        "(default: AMAPREDUCE_MEMORY_MODEL, else AMAPREDUCE_MODEL; `none` disables).")
ApiBaseOpt = typer.Option(None, "--api-base", help="OpenAI-compatible endpoint of the model (default: AMAPREDUCE_API_BASE).")


def _build_model(model_id: str, settings: Settings) -> Any:
    """The managed memory model (retries, rate limits, budget) from the one model factory that
    builds `ask`'s role models; tests replace this function with a simulated model."""
    from amapreduce.llm.factory import build_role_model, new_meter

    return build_role_model(settings, "memory", model_id, meter=new_meter(settings))


def _memory_model(model: str | None, api_base: str | None) -> Any | None:
    """The memory model Φ and F_ψ use, chosen exactly as `ask` chooses it (so `search` shows the
    prior the plan stage gets): `--model`, else the `memory_model` setting, else the default
    `model`; None when none is configured or it is `none`."""
    from amapreduce.llm.factory import model_for_role
    from amapreduce.settings import load_settings

    settings = load_settings(memory_model=model, api_base=api_base)
    model_id = model_for_role(settings, "memory")
    return None if model_id is None else _build_model(model_id, settings)


@app.command("import")
def import_(file: Annotated[Path, typer.Argument(metavar="FILE", help="JSONL export or reference insights.json.")],
            store: Path | None = StoreOpt, encoder: str | None = EncoderOpt, as_json: bool = JsonOpt) -> None:
    """Import records and hints from a JSONL export or the reference's insights.json.

    The whole file is checked before the store is opened: a malformed one exits 2 with one line
    naming the line and the problem, and nothing is written (not even a new store).
    """
    from amapreduce.memory.io import import_file, read_import

    parsed = read_import(file)
    with _open(store, encoder=encoder, create=True) as st:
        counts = import_file(st, parsed)
    _emit(as_json, {"file": str(file), **counts},
          f"imported {_records_and_hints(counts)} from {file} "
          f"({counts['skipped']} already present)")


def _records_and_hints(counts: dict[str, Any]) -> str:
    from amapreduce.cli.output import counted

    return f"{counted(counts['records'], 'record')} and {counted(counts['hints'], 'hint')}"


@app.command("export")
def export(file: Annotated[Path, typer.Argument(metavar="FILE", help="JSONL file to write.")],
           store: Path | None = StoreOpt, as_json: bool = JsonOpt) -> None:
    """Export every record and hint as versioned JSONL."""
    from amapreduce.memory.io import export_jsonl

    with _open(store, readonly=True) as st:
        counts = export_jsonl(st, file)
    _emit(as_json, {"file": str(file), **counts}, f"exported {_records_and_hints(counts)} to {file}")


@app.command("search")
def search(query: str = typer.Argument(..., metavar="QUERY"), store: Path | None = StoreOpt,
           task_id: str | None = typer.Option(None, "--task-id", help="Exclude records of this task."),
           k_pos: int | None = typer.Option(None, "--k-pos", help="Positive neighbours (default 4)."),
           k_neg: int | None = typer.Option(None, "--k-neg", help="Negative neighbours (default 2)."),
           k_hints: int | None = typer.Option(None, "--k-hints", help="Hints kept (default 3)."),
           min_similarity: float | None = typer.Option(None, "--min-similarity", help="Cosine floor (default none)."),
           model: str | None = ModelOpt, api_base: str | None = ApiBaseOpt,
           no_project: bool = typer.Option(False, "--no-project", help="Show the raw hints as the prior (no model call)."),
           decision_file: Path | None = typer.Option(
               None, "--decision", metavar="FILE",
               help="A draft decision JSON: also compute the typed advice for it, as the plan stage does."),
           as_json: bool = JsonOpt) -> None:
    """Show what the plan stage would retrieve for QUERY: neighbours, ranked hints and the prior.

    The prior is projected by the memory model, as in `ask`, when one is configured; without one
    (or with --no-project) it lists the raw hints. With --decision, the typed advice the records
    support for that draft (measured choices and a proposal) is shown beside it.
    """
    import logging

    draft = None
    if decision_file is not None:
        from amapreduce.decision.model import load_decision

        draft = load_decision(decision_file)

    llm = None if no_project else _memory_model(model, api_base)
    core_log = logging.getLogger("amapreduce.memory.core")
    level = core_log.level
    core_log.setLevel(logging.ERROR)  # a failed projection is reported once, below, not also as a log line
    try:
        with _memory(store, model=llm, readonly=True, k_pos=k_pos, k_neg=k_neg, k_hints=k_hints,
                     min_similarity=min_similarity) as mem:
            retrieval, prior = mem.search(query, task_id=task_id, decision=draft)
    finally:
        core_log.setLevel(level)
    error = prior.details.get("projection_error")
    if error is not None:
        typer.echo(f"warning: the memory model's projection failed ({error}); the prior lists the raw hints.",
                   err=True)
    payload = {"positives": [n.to_json() for n in retrieval.positives],
               "negatives": [n.to_json() for n in retrieval.negatives],
               "hints": [h.to_json() for h in retrieval.hints], "prior": prior.text,
               "advice": None if prior.advice is None else dict(prior.advice)}
    lines = ["Positives:"] + [f"  {n.similarity:.3f}  {n.id}  {n.query}" for n in retrieval.positives]
    lines += ["Negatives:"] + [f"  {n.similarity:.3f}  {n.id}  {n.query}" for n in retrieval.negatives]
    lines += ["Hints (s = w + v):"] + [f"  s={h.s} w={h.w} v={h.v}  {h.id}  {h.text}" for h in retrieval.hints]
    lines += ["", "Prior:" if prior.details.get("projected") else "Prior (raw hints, not projected):", prior.text]
    if prior.advice is not None:
        lines += ["", "Typed advice (--json shows all of it):", json.dumps(
            {k: prior.advice[k] for k in ("shape", "draft", "similar_records", "proposal")}, default=str)]
    _emit(as_json, payload, "\n".join(lines))


@app.command("list")
def list_(store: Path | None = StoreOpt,
          records: bool = typer.Option(False, "--records", help="Only records."),
          hints: bool = typer.Option(False, "--hints", help="Only hints."),
          label: str | None = typer.Option(None, "--label", help="Records with this label: positive or negative."),
          contains: str | None = typer.Option(None, "--contains", help="Text (hints) or query (records) contains this."),
          sort: str = typer.Option("default", "--sort", help="default, created, id, score, support, query, label."),
          desc: bool = typer.Option(False, "--desc", help="Reverse the order."),
          limit: int | None = typer.Option(None, "--limit", min=1, help="At most this many items."),
          as_json: bool = JsonOpt) -> None:
    """List hints and records (both unless --records or --hints)."""
    from amapreduce.errors import UserError
    from amapreduce.memory.inspection import list_items

    if label not in (None, "positive", "negative"):
        raise UserError(f"--label must be positive or negative, got {label!r}.")
    both = records == hints
    with _open(store, readonly=True) as st:
        items = list_items(st, records=records or both, hints=hints or both,
                           label=None if label is None else label == "positive", contains=contains, sort=sort,
                           descending=desc, limit=limit)
    lines = []
    for i in items:
        if i["type"] == "hint":
            lines.append(f"hint    {i['id']}  w={i['w']:<3} support={i['support']:<4} {i['text']}")
        else:
            lines.append(f"record  {i['id']}  {'+' if i['label'] else '-'} q={i['quality']:.2f}  {i['query']}")
    _emit(as_json, items, "\n".join(lines) or "(empty)")


@app.command("show")
def show(item_id: str = typer.Argument(..., metavar="ID"), store: Path | None = StoreOpt, as_json: bool = JsonOpt) -> None:
    """Show one record or hint in full, with its provenance and change log."""
    from amapreduce.memory.inspection import show_item

    with _open(store, readonly=True) as st:
        item = show_item(st, item_id)
    _emit(as_json, item, json.dumps(item, ensure_ascii=False, indent=2, default=str))


@app.command("stats")
def stats(store: Path | None = StoreOpt, as_json: bool = JsonOpt) -> None:
    """Counts, label balance, hint-score histogram and clusters."""
    from amapreduce.memory.inspection import stats as compute

    with _open(store, readonly=True) as st:
        data = compute(st)
    lines = [f"{k}: {v}" for k, v in data.items()]
    _emit(as_json, data, "\n".join(lines))


@app.command("prune")
def prune(store: Path | None = StoreOpt,
          threshold: int = typer.Option(0, "--threshold", help="Remove hints with w <= this."),
          dry_run: bool = typer.Option(False, "--dry-run", help="Only show what would be removed."),
          as_json: bool = JsonOpt) -> None:
    """Remove hints whose score w is at or below the threshold."""
    from amapreduce.memory.store import prune_hints

    with _open(store, readonly=dry_run) as st:
        if dry_run:
            with st.read() as conn:
                doomed = prune_hints(conn, threshold, dry_run=True)
        else:
            with st.write() as conn:
                doomed = prune_hints(conn, threshold)
    items = [{"id": h["id"], "text": h["text"], "w": int(h["w"])} for h in doomed]
    from amapreduce.cli.output import counted

    verb = "would remove" if dry_run else "removed"
    _emit(as_json, {"dry_run": dry_run, "threshold": threshold, "pruned": items},
          f"{verb} {counted(len(items), 'hint')} with w <= {threshold}" + "".join(f"\n  {h['id']} w={h['w']} {h['text']}" for h in items))


@app.command("add")
def add(text: str = typer.Argument(..., metavar="TEXT"), store: Path | None = StoreOpt,
        score: int = typer.Option(2, "--score", help="Initial w (default 2, as new hints in the paper)."),
        provenance: Annotated[list[str] | None, typer.Option(
            "--provenance", metavar="RECORD_ID", help="A record the hint is for (repeatable).")] = None,
        question: Annotated[list[str] | None, typer.Option(
            "--question", metavar="QUESTION",
            help="A question the hint is for (repeatable): every record asking it, now or later, joins "
                 "its provenance.")] = None,
        encoder: str | None = EncoderOpt, as_json: bool = JsonOpt) -> None:
    """Add a hint by hand, for the records or questions it applies to.

    Retrieval reaches hints only through their provenance: a hint is shown for a question when one
    of the question's nearest records supports it, or when the question is close to one of its
    --question questions (at once, before any record asks them). So give --provenance RECORD_ID or
    --question QUESTION (as for hints imported from insights.json); a hint with neither is stored
    but never retrieved, and the command warns. Creates the store if needed (--encoder).
    """
    from amapreduce.errors import UserError
    from amapreduce.memory.schema import DB_NAME
    from amapreduce.memory.store import add_pending_provenance, hint_provenance, insert_hint

    questions = [" ".join(q.split()) for q in question or []]
    if not all(questions):  # checked before the store is opened: a refused command creates nothing
        raise UserError("--question needs the text of a question, got an empty one.")
    if not text.split():
        raise UserError("a hint needs non-empty text.")
    folder = _folder(store)
    if provenance and not (folder / DB_NAME).exists():
        raise UserError(f"--provenance names records, but there is no memory store at {folder}; "
                        "check --store, or use --question for records still to come.")
    detail: dict[str, Any] = {"provenance_questions": questions} if questions else {}
    with _open(folder, encoder=encoder, create=True) as st, st.write() as conn:
        hid = insert_hint(conn, text, score, origin="manual", provenance=provenance or [], **detail)
        add_pending_provenance(conn, hid, questions)
        support = hint_provenance(conn, hid)
    if not support and not questions:  # retrieval reaches a hint through its records or its questions
        typer.echo(f"warning: hint {hid}: it has no provenance, and retrieval shows a hint only for questions "
                   "whose nearest records support it or that are close to its --question questions. Add it with "
                   "--provenance RECORD_ID or --question QUESTION instead (remove this one with "
                   f"`amapreduce memory remove {hid}`).", err=True)
    _emit(as_json, {"id": hid, "text": " ".join(text.split()), "w": score, "provenance": support,
                    "questions": questions}, f"added hint {hid}" + (f" ({len(support)} supporting records)" if support else ""))


@app.command("edit")
def edit(hint_id: str = typer.Argument(..., metavar="ID"), store: Path | None = StoreOpt,
         text: str | None = typer.Option(None, "--text", help="New hint text."),
         score: int | None = typer.Option(None, "--score", help="New w."), as_json: bool = JsonOpt) -> None:
    """Edit a hint's text and/or score."""
    from amapreduce.errors import UserError
    from amapreduce.memory.store import update_hint

    if text is None and score is None:
        raise UserError("nothing to edit: give --text and/or --score.")
    with _open(store) as st, st.write() as conn:
        hint = update_hint(conn, hint_id, kind="edited_by_hand", text=text, score=score)
    _emit(as_json, {"id": hint["id"], "text": hint["text"], "w": int(hint["w"])}, f"edited hint {hint_id}")


@app.command("remove")
def remove(hint_id: str = typer.Argument(..., metavar="ID"), store: Path | None = StoreOpt, as_json: bool = JsonOpt) -> None:
    """Remove a hint."""
    from amapreduce.memory.store import delete_hint

    with _open(store) as st, st.write() as conn:
        delete_hint(conn, hint_id, kind="removed_by_hand")
    _emit(as_json, {"id": hint_id, "removed": True}, f"removed hint {hint_id}")


@app.command("distill")
def distill(store: Path | None = StoreOpt,
            dry_run: bool = typer.Option(False, "--dry-run", help="Cluster and list the model calls; change nothing."),
            refine: bool = typer.Option(True, "--refine/--no-refine", help="Contrastive ADD/EDIT/REMOVE/AGREE step."),
            merge: bool = typer.Option(True, "--merge/--no-merge", help="Merge redundant hints per cluster."),
            model: str | None = ModelOpt, api_base: str | None = ApiBaseOpt,
            finch_level: int | None = typer.Option(None, "--finch-level", help="FINCH partition (0 = finest; default 1)."),
            seed: int | None = typer.Option(None, "--seed", help="Seed for clustering and sampling (default 0)."),
            as_json: bool = JsonOpt) -> None:
    """Run the distillation F_ψ now: FINCH clusters, contrastive refinement, merge."""
    from amapreduce.errors import ConfigError

    llm = None if dry_run else _memory_model(model, api_base)
    if llm is None and not dry_run:
        raise ConfigError("distill needs a memory model and none is configured: pass --model MODEL_ID (and "
                          "--api-base URL), or set AMAPREDUCE_MEMORY_MODEL or AMAPREDUCE_MODEL; or use --dry-run.")
    with _memory(store, model=llm, finch_level=finch_level, seed=seed) as mem:
        report = mem.distill(refine=refine, merge=merge, dry_run=dry_run)
    data = report.to_json()
    text = [f"{'dry run: ' if dry_run else ''}{data['records']} records in {len(data['clusters'])} clusters; "
            f"{len(data['calls'])} model calls"]
    text += [f"  {c['step']:<8} cluster {c['cluster']}: {len(c['records'])} records, {len(c['hints'])} hints" for c in data["calls"]]
    if not dry_run:
        text.append(f"applied {len(data['applied'])} operations, merged {len(data['merged'])} batches, "
                    f"rejected {len(data['rejected'])}, pruned {len(data['pruned'])}")
    _emit(as_json, data, "\n".join(text))


@app.command("reindex")
def reindex(store: Path | None = StoreOpt, as_json: bool = JsonOpt) -> None:
    """Rebuild the faiss vector cache from SQLite."""
    with _memory(store) as mem:
        n = mem.rebuild_index()
    _emit(as_json, {"vectors": n}, f"indexed {n} vectors")


def _learn_text(outcome: Any, run: str) -> str:
    """The human-readable report of `memory learn`."""
    verdict = "positive" if outcome.label else "negative"
    if outcome.already_committed:
        return (f"the run {run} was already committed as record {outcome.record_id} ({verdict}); "
                "nothing was changed.")
    metrics = outcome.metrics
    shown = ", ".join(f"{k} {metrics[k]:.3f}" for k in ("score", "f1_by_row", "f1_by_item", "utility")
                      if isinstance(metrics.get(k), int | float))
    lines = [f"committed the run {run} as record {outcome.record_id}: {verdict} under the "
             f"`{outcome.label_rule}` rule ({shown})" + (f", task {outcome.task_id}" if outcome.task_id else "")]
    lines += [f"warning: {w}" for w in outcome.warnings]
    if outcome.credited:
        lines.append("hints credited (w before -> after):")
        lines += [f"  {c.id}  {c.w_before} -> {c.w_after}" + ("  (refuted: it did worse in most runs that followed it)"
                                                           if c.refuted else "") for c in outcome.credited]
    else:
        lines.append("hints credited: none (the run's prior held no hint)")
    if outcome.missing_hints:
        lines.append(f"hints of the prior no longer in the store: {', '.join(outcome.missing_hints)}")
    if outcome.pruned:
        lines.append(f"hints pruned (w <= 0): {', '.join(outcome.pruned)}")
    if outcome.distillation_due is None:
        lines.append("distillation: not due")
    else:
        done = outcome.distillation or {}
        if "skipped" in done or "failed" in done:
            lines.append(f"distillation due ({outcome.distillation_due}), not run: "
                         f"{done.get('skipped') or done.get('failed')}")
        else:
            lines.append(f"distillation ({outcome.distillation_due}) ran: " + ", ".join(
                f"{k} {done[k]}" for k in ("created", "edited", "agreed", "removed", "merged", "pruned") if k in done))
    return "\n".join(lines)


@app.command("learn")
def learn(
    run: str = typer.Argument(..., metavar="RUN", help="A finished `ask` run: its folder name (from `runs list`) or path."),
    utility: float | None = typer.Option(None, "--utility", metavar="U",
                                         help="How good the run's answer was, from 0 (useless) to 1 (exactly right)."),
    gold: Path | None = typer.Option(None, "--gold", metavar="FILE",
                                     help="Score the run's table instead: the task's gold CSV, or a folder of "
                                          "<instance_id>.csv (bundled for --benchmark sandbox)."),
    tasks: Path | None = typer.Option(None, "--tasks", metavar="FILE",
                                      help="With --gold: the tasks jsonl holding the task's evaluation spec."),
    task_id: str | None = typer.Option(None, "--task-id", metavar="ID",
                                       help="The task to score against (default: the run's, else the only one)."),
    benchmark: str | None = typer.Option(None, "--benchmark",
                                         help="Scorer and pass rule: widesearch (default) | deepwidesearch | sandbox "
                                              "(its tasks and gold are bundled: no --gold/--tasks needed)."),
    label_rule: str | None = typer.Option(None, "--label-rule",
                                          help="Pass rule of a scored run (default: the benchmark's, as `eval run`)."),
    threshold: float | None = typer.Option(None, "--threshold", min=0.0, max=1.0,
                                           help="Pass level of the utility rule (default 0.5)."),
    store: Path | None = StoreOpt, encoder: str | None = EncoderOpt,
    runs_dir: Path | None = typer.Option(None, "--runs-dir", help="Folder of run directories (default: runs/)."),
    model: str | None = ModelOpt, api_base: str | None = ApiBaseOpt,
    no_distill: bool = typer.Option(False, "--no-distill", help="Do not run a distillation that falls due."),
    as_json: bool = JsonOpt,
) -> None:
    """Commit a finished `ask` run to the memory: one record, its prior's hints credited (+2 / -1).

    Say how good the answer was with --utility U (passes at U >= --threshold), or score its table
    against the task's gold with --gold FILE --tasks TASKS.jsonl (the `eval score` scorer, exact
    judge). A run is committed once: learning it again changes nothing. A distillation that falls
    due runs with the memory model (--model, as `memory distill`) unless --no-distill.
    """
    from amapreduce.bench.learn import learn_from_run
    from amapreduce.memory.schema import DB_NAME
    from amapreduce.session.rundir import run_path
    from amapreduce.settings import load_settings

    settings = load_settings(memory_model=model, api_base=api_base)
    path = run_path(runs_dir or settings.runs_dir, run)
    folder = _folder(store)
    if encoder is None and not (folder / DB_NAME).exists():
        encoder = settings.memory_encoder  # a store's encoder is fixed when it is created
    llm = None if no_distill else _memory_model(model, api_base)
    outcome = learn_from_run(
        path, store=folder, utility=utility, gold=gold, tasks=tasks, task_id=task_id, benchmark=benchmark,
        label_rule=label_rule, threshold=threshold, cost_weight=settings.utility_cost_weight,
        delay_weight=settings.utility_delay_weight, encoder=encoder, model=llm, distill=not no_distill,
        cache_dir=settings.cache_dir,
    )
    _emit(as_json, outcome.to_json(), _learn_text(outcome, path.name))
