"""Oracle benchmark: `amapreduce mapreduce run` on the path users run, against a gold-table model server.

`benchmarks/bench_engine.py` drives the engine with a scripted solver, so it never pays for
smolagents, the HTTP client or process start-up. This benchmark measures the real path: it
starts the oracle sub-agent server from `<repo>/../shared/tools/oracle/` (an OpenAI-compatible
server on 127.0.0.1 that answers from a gold table with a fixed latency and seeded faults, see
its README), generates the matching gold workload, and runs `python -m amapreduce mapreduce run
DECISION --model openai/oracle --api-base URL/v1 --json` as a subprocess for every configuration
(strategy × workers × faults × seed), so each run goes through the CLI, smolagents and HTTP.

Per configuration it prints the cells correct / missing / wrong (the result CSV against the gold
CSV by key, numbers compared as normalised text), requests and prompt tokens per entity (counted
by the server: `GET /stats`), CPU per model call of the amapreduce process (its user + system
time from `getrusage(RUSAGE_CHILDREN)` around the run, divided by the requests the server saw; it
includes process start-up, so the cheaper of two one-entity runs is measured too and the marginal CPU per
call is shown beside it), the run's wall time, and efficiency = the latency-bound ideal / wall,
ideal = ⌈batches / workers⌉ × calls per batch × latency (the oracle makes `search_steps` search
calls then `final_answer`: 2 calls per batch by default, read from its `/config`). The reference
figures of the oracle README (the published A-MapReduce tool, N=300, faults off, 210 ms per call)
are shown as ratios ours / reference. With the faults on it also prints how long the client waited
after each 429 it retried, from the `retry_waits` of each run's `model_call` trace events: the 429s,
the longest wait and its excess over the `Retry-After` asked, the waits past `Retry-After` plus
`RETRY_AFTER_SPREAD`, and the longest chain of one call's consecutive 429s with its total wait
(`waits_429` in `--json`).

Nothing leaves loopback: the sub-agents search a one-page local corpus (`--search corpus:...`),
page extraction is off, LiteLLM uses its bundled price map, proxies are unset for the child.
Every run writes its run directory into a temporary folder that is removed at the end.

The tail scenario (`--tail P,F`, e.g. `--tail 0.05,10`): a share P of the oracle's calls are
stragglers, F times slower (its `p_straggler` and `straggler_factor`). For each strategy and worker
count it runs, in one invocation, backups `auto` with no stragglers (the baseline: backups must add
no call), then with stragglers backups `off` and `auto` (`AMAPREDUCE_BACKUP`), faults otherwise
off, and prints wall, the no-straggler ideal, wall / ideal, extra calls (requests beyond
batches x calls per batch: hedged requests and backups' calls), backups started, stragglers the
oracle injected, and cells right.

Run: `.venv/bin/python benchmarks/bench_oracle.py` (defaults: N=300, workers 8,32, per_atom and
open/5, faults off and on, 210 ms per call, seed 1); a quick check:
`.venv/bin/python benchmarks/bench_oracle.py --n 40 --workers 8 --latency-ms 50`.
Pass `--server-python` for an interpreter with `bpe-openai` to get exact token counts (otherwise
the server estimates chars / 4, and says so).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from _cli import REPO, amapreduce_command, checkout_environment

from amapreduce._retry import RETRY_AFTER_SPREAD

DEFAULT_ORACLE_DIR = REPO.parent / "shared" / "tools" / "oracle"

SMOKE = ["--n", "4", "--workers", "2", "--strategies", "per_atom", "--faults", "off", "--latency-ms", "0"]
"""`--smoke`: the smallest run, one start-up baseline (CI runs it so)."""

FAULT_PROFILE: dict[str, float] = {
    "p_malformed": 0.15,
    "p_drop_rows": 0.15,
    "p_429": 0.10,
    "retry_after_s": 1,
}
NO_FAULTS: dict[str, float] = {
    "p_straggler": 0.0,
    "p_malformed": 0.0,
    "p_drop_rows": 0.0,
    "p_blank_cell": 0.0,
    "p_wrong_keys": 0.0,
    "p_429": 0.0,
    "p_500": 0.0,
}
CHUNK_SIZE = 5

# The oracle README's reference figures: the published A-MapReduce tool, N=300, faults off, 210 ms per call,
# re-measured on 2026-11-27 on the oracle with TCP_NODELAY (the earlier 0.78 / 0.46 and 0.77 / 0.44 carried a
# ~40 ms delayed-ACK stall per call).
REFERENCE_CONDITIONS = {"n": 300, "latency_ms": 210.0}
REFERENCE_EFFICIENCY = {("per_atom", 8): 0.92, ("open", 8): 0.89, ("per_atom", 32): 0.61, ("open", 32): 0.58}
REFERENCE_PROMPT_TOKENS_PER_ENTITY = {"per_atom": 5756, "open": 1214}

_NUMBER = re.compile(r"[+-]?\d[\d,_ ]*(?:\.\d+)?")


@dataclass
class RateLimitWaits:
    """How long the client waited after each 429 it retried, read from a run's trace.

    Each `model_call` event lists its retries (`retry_waits`: kind, the `Retry-After` asked,
    `waited_s` from the failed attempt to the next one sent, breaker and limiter waits included).
    The retry loop's promise (`amapreduce._retry`): a 429 with `Retry-After` R is retried after R
    plus at most `RETRY_AFTER_SPREAD` x R, never after an exponential backoff; `over_bound` counts
    the waits that broke it. A chain is one call's consecutive 429s."""

    count: int = 0
    """429s retried (a call's last attempt that gave up is not a wait)."""
    with_retry_after: int = 0
    """Of those, the ones whose reply carried `Retry-After`."""
    max_wait_s: float = 0.0
    max_over_s: float = 0.0
    """The largest wait less its `Retry-After` (of the 429s that carried one)."""
    over_bound: int = 0
    """Waits longer than `Retry-After` x (1 + `RETRY_AFTER_SPREAD`)."""
    max_late_s: float = 0.0
    """The largest wait less the retry loop's own backoff (`delay_s`): what the breaker, the
    limiter and the scheduler added, i.e. what a bound broken by the retry path itself shows."""
    unsent: int = 0
    """Retries never sent (the run stopped, or the breaker refused): no wait measured."""
    longest_chain: int = 0
    longest_chain_wait_s: float = 0.0
    """The total wait of the longest chain (the longest wait among chains of that length)."""

    def add_call(self, waits: list[dict[str, Any]], spread: float) -> None:
        """Add one `model_call` event's `retry_waits`."""
        chain, chain_wait = 0, 0.0
        for wait in [*waits, {"kind": "end"}]:
            if wait["kind"] != "rate_limit":
                self._chain(chain, chain_wait)
                chain, chain_wait = 0, 0.0
                continue
            self.count += 1
            waited, asked = wait.get("waited_s"), wait.get("retry_after_s")
            if waited is None:
                self.unsent += 1
                continue
            chain, chain_wait = chain + 1, chain_wait + waited
            self.max_wait_s = max(self.max_wait_s, waited)
            if wait.get("delay_s") is not None:
                self.max_late_s = max(self.max_late_s, waited - wait["delay_s"])
            if asked is not None:
                self.with_retry_after += 1
                self.max_over_s = max(self.max_over_s, waited - asked)
                self.over_bound += waited > asked * (1 + spread)

    def _chain(self, length: int, wait_s: float) -> None:
        if (length, wait_s) > (self.longest_chain, self.longest_chain_wait_s):
            self.longest_chain, self.longest_chain_wait_s = length, wait_s

    def merge(self, other: RateLimitWaits) -> None:
        self.count += other.count
        self.with_retry_after += other.with_retry_after
        self.max_wait_s = max(self.max_wait_s, other.max_wait_s)
        self.max_over_s = max(self.max_over_s, other.max_over_s)
        self.over_bound += other.over_bound
        self.max_late_s = max(self.max_late_s, other.max_late_s)
        self.unsent += other.unsent
        self._chain(other.longest_chain, other.longest_chain_wait_s)


def rate_limit_waits(run_dir: Path | None) -> RateLimitWaits:
    """The 429 waits of one run, from its `trace.jsonl` (empty when the run left none)."""
    waits = RateLimitWaits()
    trace = run_dir / "trace.jsonl" if run_dir is not None else None
    if trace is None or not trace.exists():
        return waits
    with trace.open(encoding="utf-8") as lines:
        for line in lines:
            if '"model_call"' not in line:
                continue
            event = json.loads(line)
            if event.get("event") == "model_call" and event.get("retry_waits"):
                waits.add_call(event["retry_waits"], RETRY_AFTER_SPREAD)
    return waits


@dataclass
class RunFigures:
    """What one configuration produced, summed over its seeds."""

    strategy: str
    workers: int
    faults: str
    seeds: list[int]
    entities: int
    batches: int
    cells_correct: int = 0
    cells_missing: int = 0
    cells_wrong: int = 0
    rows_missing: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    """The run's own wall time (`timings.wall_s` of `--json`): from the engine's start to its table."""
    process_s: float = 0.0
    """Wall time of the whole subprocess, start-up and shutdown included."""
    ideal_s: float = 0.0
    faults_injected: dict[str, int] = field(default_factory=dict)
    statuses: list[str] = field(default_factory=list)
    waits_429: RateLimitWaits = field(default_factory=RateLimitWaits)
    """The client's waits after the 429s it retried, all seeds together."""

    @property
    def efficiency(self) -> float:
        return self.ideal_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_ms_per_call(self) -> float:
        return 1000.0 * self.cpu_s / self.requests if self.requests else 0.0

    def per_entity(self, total: int) -> float:
        return total / (self.entities * len(self.seeds)) if self.entities else 0.0

    def add(self, one: OneRun, ideal_s: float) -> None:
        """Add one seed's run, whose latency-bound ideal wall time is `ideal_s`."""
        self.cells_correct += one.score["cells_correct"]
        self.cells_missing += one.score["cells_missing"]
        self.cells_wrong += one.score["cells_wrong"]
        self.rows_missing += one.score["rows_missing"]
        self.requests += int(one.stats["requests"])
        self.prompt_tokens += int(one.stats["prompt_tokens"])
        self.cpu_s += one.cpu_s
        self.wall_s += one.wall_s
        self.process_s += one.process_s
        self.ideal_s += ideal_s
        for name, count in one.stats["faults"].items():
            self.faults_injected[name] = self.faults_injected.get(name, 0) + int(count)
        self.statuses.append(one.status)
        self.waits_429.merge(one.waits_429)


def load_workload(oracle_dir: Path) -> ModuleType:
    """Import the oracle's `workload.py` (gold table, decision and cell scorer) from its folder."""
    path = oracle_dir / "workload.py"
    spec = importlib.util.spec_from_file_location("oracle_workload", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def http_json(url: str, payload: dict[str, Any] | None = None) -> Any:
    """GET (or POST `payload` to) a loopback URL of the oracle and return its JSON reply."""
    data = None if payload is None else json.dumps(payload).encode("utf-8")
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    with urllib.request.urlopen(request, timeout=30) as reply:  # noqa: S310 - always http://127.0.0.1
        return json.loads(reply.read().decode("utf-8"))


@contextmanager
def oracle_server(
    oracle_dir: Path, python: str, gold_csv: Path, work: Path, latency_ms: float
) -> Iterator[str]:
    """Start the oracle on loopback and yield its base URL; it is always terminated on exit.

    Its own idle and lifetime limits stop it even if this process is killed outright.
    """
    port_file = work / "oracle.port"
    log = (work / "oracle.log").open("w")
    command = [
        python,
        str(oracle_dir / "oracle_server.py"),
        "--gold",
        str(gold_csv),
        "--host",
        "127.0.0.1",
        "--port-file",
        str(port_file),
        "--latency-ms",
        str(latency_ms),
        "--idle-exit-s",
        "300",
        "--max-lifetime-s",
        "14400",
    ]
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"the oracle server did not start: {(work / 'oracle.log').read_text()[-500:]}"
                )
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text().strip()}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def child_environment(work: Path, max_batches: int) -> dict[str, str]:
    """The amapreduce child's environment: no inherited amapreduce/provider settings, nothing off loopback."""
    dropped = ("AMAPREDUCE_", "OPENAI_", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
    env = checkout_environment({k: v for k, v in os.environ.items() if not k.upper().startswith(dropped)})
    env.update(
        AMAPREDUCE_RUNS_DIR=str(work / "runs"),
        AMAPREDUCE_CACHE_DIR=str(work / "cache"),
        AMAPREDUCE_CACHE_TTL_S="0",
        AMAPREDUCE_EXTRACTION_MODEL="none",
        AMAPREDUCE_API_KEY="oracle-local",
        AMAPREDUCE_MAX_BATCHES=str(max_batches),
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        HF_HUB_OFFLINE="1",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    return env


def build_corpus(cli: list[str], work: Path) -> Path:
    """A one-page local corpus, so the sub-agents get a `web_search` tool that never leaves the machine."""
    docs = work / "corpus-docs"
    docs.mkdir()
    (docs / "about.md").write_text(
        "# Oracle benchmark corpus\n\nA placeholder page: the oracle sub-agent answers from its gold table.\n"
    )
    index = work / "corpus-index"
    subprocess.run([*cli, "corpus", "index", str(docs), "--out", str(index)], check=True, capture_output=True,
                   env=checkout_environment())
    return index


def cli_accepts_max_batches(cli: list[str]) -> bool:
    """Whether `mapreduce run` has a `--max-batches` flag (otherwise `AMAPREDUCE_MAX_BATCHES` does it)."""
    shown = subprocess.run(
        [*cli, "mapreduce", "run", "--help"],
        capture_output=True,
        text=True,
        env={**checkout_environment(), "COLUMNS": "200"},
    )
    return "--max-batches" in shown.stdout


def normalise_cell(value: Any) -> str:
    """A cell as comparable text: stripped; numbers without separators or a trailing `.0`."""
    text = "" if value is None else str(value).strip()
    if _NUMBER.fullmatch(text):
        text = re.sub(r"[,_ ]", "", text)
        if "." in text and set(text.split(".", 1)[1]) == {"0"}:
            text = text.split(".", 1)[0]
    return text


def read_result_rows(csv_path: Path) -> list[dict[str, str]]:
    if not csv_path.exists():
        return []
    with csv_path.open(newline="", encoding="utf-8") as f:
        return [{k: normalise_cell(v) for k, v in row.items()} for row in csv.DictReader(f)]


def child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class OneRun:
    """What one `mapreduce run` subprocess produced."""

    score: dict[str, int]
    stats: dict[str, Any]
    cpu_s: float
    wall_s: float
    process_s: float
    status: str
    backups: int = 0
    """Backup attempts the run started (`completeness.backups` of its `--json`)."""
    waits_429: RateLimitWaits = field(default_factory=RateLimitWaits)


def run_once(
    *,
    cli: list[str],
    url: str,
    work: Path,
    decision: dict[str, Any],
    gold_rows: list[dict[str, str]],
    workload: ModuleType,
    workers: int,
    fault_config: dict[str, float],
    seed: int,
    latency_ms: float,
    index: Path,
    max_batches_flag: bool,
    timeout_s: float,
    tag: str,
    env: dict[str, str] | None = None,
) -> OneRun:
    """Reset the oracle with `seed` and the fault profile, run the CLI once, score its CSV."""
    decision_file = work / f"{tag}.json"
    decision_file.write_text(json.dumps(decision))
    csv_path = work / f"{tag}.csv"
    batches_cap = len(decision["task_matrix"])
    command = [
        *cli,
        "mapreduce",
        "run",
        str(decision_file),
        "--model",
        "openai/oracle",
        "--api-base",
        f"{url}/v1",
        "--search",
        f"corpus:{index}",
        "--workers",
        str(workers),
        "--json",
        "--csv",
        str(csv_path),
    ]
    if max_batches_flag:
        command += ["--max-batches", str(batches_cap)]
    http_json(f"{url}/reset", {"seed": seed, "latency_ms": latency_ms, **NO_FAULTS, **fault_config})
    cpu_before = child_cpu_s()
    start = time.perf_counter()
    child = subprocess.Popen(
        command,
        cwd=work,
        env={**child_environment(work, batches_cap), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        stdout, stderr = child.communicate()
    process_s = time.perf_counter() - start
    cpu_s = child_cpu_s() - cpu_before
    stats = http_json(f"{url}/stats")
    try:
        reply = json.loads(stdout.strip().splitlines()[-1])
        status, wall_s = str(reply["status"]), float(reply["timings"]["wall_s"])
        backups = int(reply["completeness"].get("backups", 0))
        run_dir: Path | None = Path(reply["run_dir"])
    except (IndexError, ValueError, KeyError, TypeError):
        backups, run_dir = 0, None
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        status, wall_s = f"error (exit {child.returncode}): {last[:120]}", process_s
    gold = [{k: normalise_cell(v) for k, v in row.items()} for row in gold_rows]
    score = workload.score(read_result_rows(csv_path), gold)
    return OneRun(score=score, stats=stats, cpu_s=cpu_s, wall_s=wall_s, process_s=process_s, status=status,
                  backups=backups, waits_429=rate_limit_waits(run_dir))


@dataclass
class TailRow:
    """One tail-scenario run: a strategy and worker count, stragglers on or off, backups off or auto."""

    strategy: str
    workers: int
    p_straggler: float
    backup: str
    seed: int
    batches: int
    wall_s: float
    ideal_s: float
    requests: int
    needed: int
    """Requests the run needs without backups: batches x calls per batch (faults are off)."""
    backups: int
    stragglers: int
    cells_correct: int
    cells: int
    status: str

    @property
    def extra_calls(self) -> int:
        return self.requests - self.needed

    @property
    def over_ideal(self) -> float:
        return self.wall_s / self.ideal_s if self.ideal_s else 0.0


def run_tail(
    *, strategies: list[str], workers: list[int], seeds: list[int], p_straggler: float, factor: float, n: int,
    calls_per_batch: int, latency_ms: float, decision_for: Any, entities: list[str], gold_rows: list[dict[str, str]],
    common: dict[str, Any],
) -> list[TailRow]:
    """The tail scenario: per strategy, worker count and seed, backups `auto` without stragglers,
    then stragglers with backups `off` and `auto`."""
    rows: list[TailRow] = []
    for strategy in strategies:
        decision = decision_for(strategy, entities)
        batches = n if strategy == "per_atom" else math.ceil(n / CHUNK_SIZE)
        for w in workers:
            ideal_s = math.ceil(batches / w) * calls_per_batch * latency_ms / 1000.0
            for seed in seeds:
                for p, backup in ((0.0, "auto"), (p_straggler, "off"), (p_straggler, "auto")):
                    one = run_once(
                        decision=decision, gold_rows=gold_rows, workers=w, seed=seed,
                        fault_config={"p_straggler": p, "straggler_factor": factor},
                        tag=f"tail-{strategy}-w{w}-p{p:g}-{backup}-s{seed}", env={"AMAPREDUCE_BACKUP": backup}, **common,
                    )
                    rows.append(TailRow(
                        strategy=strategy, workers=w, p_straggler=p, backup=backup, seed=seed, batches=batches,
                        wall_s=one.wall_s, ideal_s=ideal_s, requests=int(one.stats["requests"]),
                        needed=batches * calls_per_batch, backups=one.backups,
                        stragglers=int(one.stats.get("stragglers", 0)), cells_correct=one.score["cells_correct"],
                        cells=3 * n, status=one.status,
                    ))
    return rows


def print_tail_table(rows: list[TailRow], args: argparse.Namespace, factor: float) -> None:
    print(
        f"tail scenario: amapreduce mapreduce run (CLI -> smolagents -> HTTP) against the oracle on 127.0.0.1; "
        f"N={args.n}, {args.latency_ms:g} ms per call, stragglers x{factor:g}, faults otherwise off, seeds {args.seeds}"
    )
    print(f"{'config':<16} {'stragglers':>10} {'backups':>7} {'wall s':>7} {'ideal s':>7} {'wall/ideal':>10} "
          f"{'extra calls':>11} {'extra %':>7} {'started':>7} {'injected':>8} {'cells right':>11}  status")
    for r in rows:
        config = f"{r.strategy}{'/' + str(CHUNK_SIZE) if r.strategy == 'open' else ''} w{r.workers} s{r.seed}"
        print(
            f"{config:<16} {r.p_straggler:>10g} {r.backup:>7} {r.wall_s:>7.2f} {r.ideal_s:>7.2f} {r.over_ideal:>10.2f} "
            f"{r.extra_calls:>11} {100 * r.extra_calls / r.needed:>6.1f}% {r.backups:>7} {r.stragglers:>8} "
            f"{r.cells_correct:>5}/{r.cells:<5}  {r.status}"
        )
    print(
        "\nideal = ceil(batches / workers) x calls per batch x latency (no stragglers); wall s: the run's timings.wall_s; "
        "extra calls: requests the oracle saw beyond batches x calls per batch (hedged requests, and a backup's calls "
        "less the calls its cancelled rival never sent); started: backups the run started (completeness.backups); injected: straggling "
        "calls the oracle served (GET /stats)."
    )


def ratio(ours: float, reference: float | None) -> str:
    return f"{ours / reference:.2f}" if reference else "-"


def print_table(
    rows: list[RunFigures],
    baseline: OneRun,
    args: argparse.Namespace,
    tokens_exact: bool,
    max_batches_how: str,
) -> None:
    print(
        f"amapreduce mapreduce run as a subprocess of {args.cli or 'python -m amapreduce'} (CLI -> smolagents -> HTTP) "
        "against the oracle "
        f"on 127.0.0.1; N={args.n}, {args.latency_ms:g} ms per call, seeds {args.seeds}; max batches via {max_batches_how}"
    )
    head = (
        f"{'config':<24} {'correct':>7} {'missing':>7} {'wrong':>5} {'req/ent':>7} {'ptok/ent':>8} {'cpu ms/call':>11} "
        f"{'Δcpu ms/call':>12} {'wall s':>7} {'ideal s':>7} {'proc s':>7} {'eff':>5} {'eff/ref':>7} {'ptok/ref':>8}  status"
    )
    print(head)
    base_calls = baseline.stats["requests"]
    for r in rows:
        config = f"{r.strategy}{'/' + str(CHUNK_SIZE) if r.strategy == 'open' else ''} w{r.workers} faults {r.faults}"
        extra_calls = r.requests - base_calls * len(r.seeds)
        marginal = (
            1000.0 * (r.cpu_s - baseline.cpu_s * len(r.seeds)) / extra_calls if extra_calls > 0 else 0.0
        )
        faults_off = r.faults == "off"
        ref_eff = REFERENCE_EFFICIENCY.get((r.strategy, r.workers)) if faults_off else None
        ref_tok = REFERENCE_PROMPT_TOKENS_PER_ENTITY.get(r.strategy) if faults_off else None
        statuses = ",".join(sorted(set(r.statuses)))
        print(
            f"{config:<24} {r.cells_correct:>7} {r.cells_missing:>7} {r.cells_wrong:>5} {r.per_entity(r.requests):>7.2f} "
            f"{r.per_entity(r.prompt_tokens):>8.0f} {r.cpu_ms_per_call:>11.1f} {marginal:>12.1f} {r.wall_s:>7.2f} "
            f"{r.ideal_s:>7.2f} {r.process_s:>7.2f} {r.efficiency:>5.2f} {ratio(r.efficiency, ref_eff):>7} "
            f"{ratio(r.per_entity(r.prompt_tokens), ref_tok):>8}  {statuses}"
        )
    for r in rows:
        injected = {k: v for k, v in r.faults_injected.items() if v}
        if injected:
            print(f"  faults injected, {r.strategy} w{r.workers}: {json.dumps(injected)}")
    waited = [r for r in rows if r.faults == "on"]
    if waited:
        print(f"\n{'429 waits (faults on)':<24} {'429s':>5} {'w/ R-A':>6} {'max wait s':>10} {'max wait-R-A s':>14} "
              f"{'over bound':>10} {'max late s':>10} {'unsent':>6} {'longest chain':>13} {'its wait s':>10}")
        for r in waited:
            w = r.waits_429
            config = f"{r.strategy}{'/' + str(CHUNK_SIZE) if r.strategy == 'open' else ''} w{r.workers}"
            print(f"{config:<24} {w.count:>5} {w.with_retry_after:>6} {w.max_wait_s:>10.3f} {w.max_over_s:>14.3f} "
                  f"{w.over_bound:>10} {w.max_late_s:>10.3f} {w.unsent:>6} {w.longest_chain:>13} "
                  f"{w.longest_chain_wait_s:>10.3f}")
    same = args.n == REFERENCE_CONDITIONS["n"] and args.latency_ms == REFERENCE_CONDITIONS["latency_ms"]
    print(
        "\ncells: 3 per entity (capital, population, currency), matched by key, numbers compared as normalised text; "
        f"rows missing: {', '.join(str(r.rows_missing) for r in rows)}.\nrequests and prompt tokens counted by the oracle "
        f"({'exact BPE' if tokens_exact else 'estimated as chars/4: run the server with bpe-openai for exact counts'}).\n"
        "cpu ms/call: user+system CPU of the amapreduce process (getrusage of the reaped child), start-up included, "
        "/ requests the server saw; Δcpu ms/call: the same after subtracting the cheaper of two one-entity per_atom runs "
        f"({baseline.cpu_s:.2f} s CPU for {base_calls} calls), i.e. the marginal CPU per call.\n"
        "wall s: the run's timings.wall_s (engine start to table); proc s: the whole subprocess; "
        "eff = ideal / wall s, ideal = ceil(batches / workers) x calls per batch x latency.\n"
        "429 waits: from each model_call's retry_waits in the run's trace, all seeds; wait = from the 429 to the retry "
        "sent (backoff, breaker and limiter); R-A = the Retry-After asked; over bound: waits > R-A x "
        "(1 + RETRY_AFTER_SPREAD); late: a wait less the retry loop's own backoff (what the breaker, the limiter and the "
        "scheduler added); unsent: retries never sent (the attempt was cancelled meanwhile); a chain is one call's "
        "consecutive 429s, its wait their total.\n"
        "eff/ref, ptok/ref: ours / the oracle README's reference (A-MapReduce, N=300, faults off, 210 ms)"
        + (
            ""
            if same
            else f" - this run's N={args.n} and {args.latency_ms:g} ms differ, so eff/ref is indicative only"
        )
        + "."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="entities in the workload")
    parser.add_argument("--workers", default="8,32", help="comma-separated worker counts")
    parser.add_argument("--strategies", default="per_atom,open", help="per_atom and/or open (chunk_size 5)")
    parser.add_argument(
        "--faults", default="off,on", help=f"off and/or on (on = {json.dumps(FAULT_PROFILE)})"
    )
    parser.add_argument("--latency-ms", type=float, default=210.0, help="oracle latency per model call")
    parser.add_argument("--seeds", type=int, default=1, help="seeds 1..S: one run each, figures summed")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument(
        "--oracle-dir", type=Path, default=DEFAULT_ORACLE_DIR, help="folder of oracle_server.py"
    )
    parser.add_argument("--server-python", default=sys.executable, help="interpreter for the oracle server")
    parser.add_argument(
        "--cli", default=None, help="an amapreduce executable (default: python -m amapreduce, this checkout)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="the smallest run (checks that it runs): " + " ".join(SMOKE)
    )
    parser.add_argument(
        "--run-timeout-s", type=float, default=1800.0, help="a run still going after this is killed"
    )
    parser.add_argument(
        "--tail", default=None, metavar="P,F",
        help="the tail scenario instead of the main table: a share P of calls straggle, F times slower "
        "(e.g. 0.05,10); backups off vs auto, and auto without stragglers",
    )
    args = parser.parse_args()
    if args.smoke:
        args = parser.parse_args([*sys.argv[1:], *SMOKE])
    cli = [args.cli] if args.cli else amapreduce_command()
    if not (args.oracle_dir / "oracle_server.py").exists():
        raise SystemExit(f"no oracle_server.py in {args.oracle_dir} (pass --oracle-dir)")
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    fault_modes = [f.strip() for f in args.faults.split(",") if f.strip()]
    if not set(strategies) <= {"per_atom", "open"} or not set(fault_modes) <= {"off", "on"}:
        raise SystemExit("--strategies takes per_atom,open and --faults takes off,on")
    workload = load_workload(args.oracle_dir)
    seeds = list(range(1, args.seeds + 1))
    max_batches_flag = cli_accepts_max_batches(cli)
    max_batches_how = "--max-batches" if max_batches_flag else "AMAPREDUCE_MAX_BATCHES"

    with tempfile.TemporaryDirectory(prefix="bench-oracle-") as tmp:
        work = Path(tmp)
        gold_rows = workload.make_gold(args.n)
        gold_csv = work / "gold.csv"
        workload.write_gold(str(gold_csv), gold_rows)
        entities = [row[workload.KEY] for row in gold_rows]
        index = build_corpus(cli, work)
        with oracle_server(args.oracle_dir, args.server_python, gold_csv, work, args.latency_ms) as url:
            calls_per_batch = int(http_json(f"{url}/config")["search_steps"]) + 1

            def decision_for(strategy: str, names: list[str]) -> dict[str, Any]:
                return {**workload.decision(names, strategy, CHUNK_SIZE), "key_columns": [workload.KEY]}

            common = {
                "cli": cli,
                "url": url,
                "work": work,
                "workload": workload,
                "latency_ms": args.latency_ms,
                "index": index,
                "max_batches_flag": max_batches_flag,
                "timeout_s": args.run_timeout_s,
            }
            if args.tail:
                p_straggler, factor = (float(x) for x in args.tail.split(","))
                tail = run_tail(
                    strategies=strategies, workers=workers, seeds=seeds, p_straggler=p_straggler, factor=factor,
                    n=args.n, calls_per_batch=calls_per_batch, latency_ms=args.latency_ms, decision_for=decision_for,
                    entities=entities, gold_rows=gold_rows, common=common,
                )
                if args.json:
                    print(json.dumps({"tail": {"p_straggler": p_straggler, "factor": factor},
                                      "rows": [{**asdict(r), "extra_calls": r.extra_calls, "over_ideal": r.over_ideal}
                                               for r in tail]}))
                else:
                    print_tail_table(tail, args, factor)
                return
            # The start-up baseline: the cheaper of two one-entity runs (the first may pay cold caches).
            baseline = min(
                (
                    run_once(
                        decision=decision_for("per_atom", entities[:1]),
                        gold_rows=gold_rows[:1],
                        workers=1,
                        fault_config=NO_FAULTS,
                        seed=1,
                        tag=f"baseline-{attempt}",
                        **common,
                    )
                    for attempt in ((1,) if args.smoke else (1, 2))
                ),
                key=lambda one: one.cpu_s,
            )
            rows: list[RunFigures] = []
            for strategy in strategies:
                decision = decision_for(strategy, entities)
                batches = args.n if strategy == "per_atom" else math.ceil(args.n / CHUNK_SIZE)
                for w in workers:
                    for faults in fault_modes:
                        fig = RunFigures(
                            strategy=strategy,
                            workers=w,
                            faults=faults,
                            seeds=seeds,
                            entities=args.n,
                            batches=batches,
                        )
                        for seed in seeds:
                            one = run_once(
                                decision=decision,
                                gold_rows=gold_rows,
                                workers=w,
                                seed=seed,
                                fault_config=FAULT_PROFILE if faults == "on" else NO_FAULTS,
                                tag=f"{strategy}-w{w}-{faults}-s{seed}",
                                **common,
                            )
                            fig.add(one, math.ceil(batches / w) * calls_per_batch * args.latency_ms / 1000.0)
                        rows.append(fig)
            tokens_exact = baseline.stats["prompt_tokens_bpe"] is not None

    if args.json:
        print(
            json.dumps(
                {
                    "path": "subprocess: amapreduce mapreduce run (CLI -> smolagents -> HTTP)",
                    "n": args.n,
                    "latency_ms": args.latency_ms,
                    "seeds": seeds,
                    "calls_per_batch": calls_per_batch,
                    "tokens": "bpe" if tokens_exact else "chars/4 estimate",
                    "max_batches_via": max_batches_how,
                    "baseline": {"cpu_s": baseline.cpu_s, "requests": baseline.stats["requests"]},
                    "rows": [
                        {
                            **asdict(r),
                            "efficiency": r.efficiency,
                            "cpu_ms_per_call": r.cpu_ms_per_call,
                            "requests_per_entity": r.per_entity(r.requests),
                            "prompt_tokens_per_entity": r.per_entity(r.prompt_tokens),
                        }
                        for r in rows
                    ],
                    "reference": {
                        "conditions": REFERENCE_CONDITIONS,
                        "efficiency": {f"{s}/w{w}": v for (s, w), v in REFERENCE_EFFICIENCY.items()},
                        "prompt_tokens_per_entity": REFERENCE_PROMPT_TOKENS_PER_ENTITY,
                    },
                }
            )
        )
        return
    print_table(rows, baseline, args, tokens_exact, max_batches_how)


if __name__ == "__main__":
    main()
