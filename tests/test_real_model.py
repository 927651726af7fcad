"""The real-model tier: the command line against a real local model server (issue "Real models", item 7).

The server is llama-cpp-python's OpenAI-compatible one serving SmolLM2-135M-Instruct (`tests/real_model.py` says
where it comes from; CI's `.ci/run` installs it, elsewhere the tier is skipped with what to set). The search is
the bundled corpus `tests/data/real_corpus/` (fourteen country pages), indexed at test time. Every command runs as
a user runs it: `python -m amapreduce ...` in a fresh folder, with `--model smollm2 --api-base URL --search
corpus:IDX`.

**Only invariants are asserted, never the model's accuracy**: a 135M model fills cells with whatever it likes,
and every test must pass whatever it says. What must hold:

* each run ends complete or incomplete (exit 0 or 3), with no traceback, and leaves a whole run folder;
* the cells of the task matrix are the matrix's, in its order (and `enrich` keeps the list's rows and order);
* every cell called verified has its quote on its source page (the bundled page's own text);
* the trace says which solver ran (not asserted which);
* a client killed with SIGKILL is resumed to a finished run, without running its finished batches again;
* a server killed mid-run ends the run failed, in bounded time, with a one-line error naming the endpoint,
  and the run resumes once the server is back;
* a request the server refuses (list content, forced) ends the run at once, with the server's own message;
* the endpoint probe finds the servers' dialects (server facts, not model quality).
"""

from __future__ import annotations

import csv
import io
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from real_model import (
    CORPUS,
    MODEL,
    CliRun,
    LlamaInstall,
    LlamaServer,
    check_run_folder,
    check_verified_quotes,
    child_env,
    corpus_texts,
    evidence_csv_cells,
    find_llama,
    journal_entries,
    kill_group,
    normalised,
    read_trace,
    run_cli,
    run_folders,
    start_cli,
    wait_for_settled_batch,
)

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

COUNTRIES = [row[0] for row in json.loads((CORPUS / "decision.json").read_text(encoding="utf-8"))["task_matrix"]]
RUN_TIMEOUT_S = 600.0
"""A run that has not ended by then hangs (the tier's whole budget is about eight minutes on two cores)."""


# --- fixtures: the servers, the corpus index, one cache folder --------------------------------------

@pytest.fixture(scope="session")
def llama() -> LlamaInstall:
    install, why = find_llama()
    if install is None:
        pytest.skip(why)
    return install


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llama-logs")


@pytest.fixture(scope="session")
def plain_server(llama: LlamaInstall, server_logs: Path) -> Iterator[LlamaServer]:
    """The server with its defaults (the model's own chat template: tools are ignored)."""
    server = LlamaServer(llama, server_logs / "plain.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tools_server(llama: LlamaInstall, server_logs: Path) -> Iterator[LlamaServer]:
    """The server with `--chat_format chatml-function-calling` (tool calls work)."""
    server = LlamaServer(llama, server_logs / "tools.log", chat_format="chatml-function-calling").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def corpus_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled pages indexed as a user does (`amapreduce corpus index`)."""
    folder = tmp_path_factory.mktemp("corpus")
    index = folder / "countries-index"
    done = run_cli(["corpus", "index", str(CORPUS / "pages"), "--out", str(index), "--name", "countries"],
                   cwd=folder, env=child_env(), timeout_s=120)
    assert done.returncode == 0, done.describe()
    return index


@pytest.fixture(scope="session")
def page_texts(corpus_index: Path) -> dict[str, str]:
    return corpus_texts(corpus_index)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache folder for the tier, as one user's: each server is probed once, then its findings are reused."""
    return tmp_path_factory.mktemp("cache")


def env_for(cache_dir: Path, **settings: str) -> dict[str, str]:
    return child_env({"AMAPREDUCE_CACHE_DIR": str(cache_dir), **settings})


def model_args(server: LlamaServer, corpus_index: Path) -> list[str]:
    return ["--model", MODEL, "--api-base", server.base_url, "--search", f"corpus:{corpus_index}"]


# --- the invariants of a run that ended ---------------------------------------------------------------

def check_ended_run(done: CliRun, runs_dir: Path, page_texts: dict[str, str], *,
                    matrix: list[str] | None = COUNTRIES) -> tuple[Path, dict[str, Any]]:
    """Complete or incomplete, no traceback, one whole run folder, the matrix's cells kept, the verified quotes
    on their pages, the solver named in the trace. Returns the folder and its `result.json`."""
    assert done.returncode in (0, 3), done.describe()
    assert "Traceback" not in done.stdout + done.stderr, done.describe()
    folders = run_folders(runs_dir)
    assert len(folders) == 1, folders
    result = check_run_folder(folders[0])
    assert result["status"] in ("complete", "incomplete"), result["status"]
    assert (result["status"] == "complete") == (done.returncode == 0), (result["status"], done.returncode)
    if matrix is not None:
        rows = result["table"]["rows"]
        assert [row["cells"]["country"]["value"] for row in rows] == matrix
    check_verified_quotes(result, page_texts)
    solvers = [event for event in read_trace(folders[0]) if event.get("event") == "solver"]
    assert solvers and all(isinstance(e.get("name"), str) and e["name"] for e in solvers), solvers
    return folders[0], result


def check_evidence_csv(path: Path, result: dict[str, Any]) -> None:
    """The `--csv --evidence` copy says of each cell what `result.json` says (quote and evidence)."""
    by_row = [row["cells"] for row in result["table"]["rows"]]
    cells = list(evidence_csv_cells(path.read_text(encoding="utf-8")))
    assert cells and {number for number, *_ in cells} == set(range(len(by_row)))
    for number, column, quote, evidence in cells:
        cell = by_row[number][column]
        assert (quote, evidence) == (cell["quote"] or "", cell["evidence"]), (number, column, cell)


# --- the three commands, against the plain server ---------------------------------------------------------

@pytest.mark.parametrize("decision", ["decision.json", "decision_open.json"], ids=["per_atom", "open"])
def test_mapreduce_run_against_the_plain_server(decision: str, tmp_path: Path, plain_server: LlamaServer,
                                                corpus_index: Path, cache_dir: Path,
                                                page_texts: dict[str, str]) -> None:
    done = run_cli(["mapreduce", "run", str(CORPUS / decision), *model_args(plain_server, corpus_index),
                    "--workers", "2", "--json", "--csv", "out.csv", "--evidence"],
                   cwd=tmp_path, env=env_for(cache_dir), timeout_s=RUN_TIMEOUT_S)
    folder, result = check_ended_run(done, tmp_path / "runs", page_texts)
    printed = json.loads(done.stdout)  # --json: exactly one object
    assert printed["status"] == result["status"] and (tmp_path / printed["run_dir"]).resolve() == folder.resolve()
    check_evidence_csv(tmp_path / "out.csv", result)


def test_enrich_against_the_plain_server(tmp_path: Path, plain_server: LlamaServer, corpus_index: Path,
                                         cache_dir: Path, page_texts: dict[str, str]) -> None:
    listed = tmp_path / "countries.csv"
    listed.write_bytes((CORPUS / "countries.csv").read_bytes())
    done = run_cli(["enrich", listed.name, "--columns", "Capital, Population, Currency code",
                    *model_args(plain_server, corpus_index), "--workers", "2", "--out", "enriched.csv",
                    "--evidence"], cwd=tmp_path, env=env_for(cache_dir), timeout_s=RUN_TIMEOUT_S)
    folder, result = check_ended_run(done, tmp_path / "runs", page_texts, matrix=None)
    rows = list(csv.DictReader(io.StringIO((tmp_path / "enriched.csv").read_text(encoding="utf-8"))))
    assert [row["Country"] for row in rows] == COUNTRIES  # every row kept, in the list's order
    assert all(row["enrich_status"] in ("complete", "partial", "failed") for row in rows)
    for row in rows:  # the enriched list's own evidence columns: a verified quote is on its page
        for column in ("Capital", "Population", "Currency code"):
            if row[f"{column} evidence"] == "verified":
                page = page_texts.get(row[f"{column} source"])
                assert page is not None, row
                assert normalised(row[f"{column} quote"]) in normalised(page), row


# --- against the server that calls tools --------------------------------------------------------------

def test_mapreduce_run_against_the_tool_calling_server(tmp_path: Path, tools_server: LlamaServer,
                                                       corpus_index: Path, cache_dir: Path,
                                                       page_texts: dict[str, str]) -> None:
    """Tool calls work here, so the search agent's loop runs against a real server (`--solver agent`: `auto` picks
    the read solver for a 2,048-token window). A 135M model rarely ends that loop well and its prompts are long
    (about 1,000-2,000 tokens): one attempt of one step (and the forced final answer) per batch and no patch round
    keep the run to about eight model calls. One worker: the server computes one request at a time anyway."""
    env = env_for(cache_dir, AMAPREDUCE_SUBAGENT_MAX_STEPS="1", AMAPREDUCE_MAX_ATTEMPTS="1",
                  AMAPREDUCE_PATCH_ROUNDS="0", AMAPREDUCE_SOLVER="agent")
    done = run_cli(["mapreduce", "run", str(CORPUS / "decision_open.json"), *model_args(tools_server, corpus_index),
                    "--workers", "1", "--json"], cwd=tmp_path, env=env, timeout_s=RUN_TIMEOUT_S)
    check_ended_run(done, tmp_path / "runs", page_texts)


# --- killed and resumed ----------------------------------------------------------------------------------

def map_attempts(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e.get("type") == "batch_attempt" and e.get("phase") == "map"]


def check_resumed_journal(folder: Path, done_before: set[str]) -> None:
    """The journal holds the resume's start, and no batch done before it was run again."""
    entries = journal_entries(folder)
    starts = [i for i, e in enumerate(entries) if e.get("type") == "run_start"]
    assert len(starts) >= 2 and entries[starts[-1]].get("resumed") is True, [e.get("type") for e in entries]
    again = {e["batch_id"] for e in map_attempts(entries[starts[-1]:])} & done_before
    assert not again, f"batches done before the resume were run again: {sorted(again)}"


def test_a_client_killed_with_sigkill_resumes(tmp_path: Path, plain_server: LlamaServer, corpus_index: Path,
                                              cache_dir: Path, page_texts: dict[str, str]) -> None:
    env = env_for(cache_dir)
    process = start_cli(["mapreduce", "run", str(CORPUS / "decision.json"),
                         *model_args(plain_server, corpus_index), "--workers", "2"], tmp_path, env, tmp_path / "first")
    try:
        folder = wait_for_settled_batch(tmp_path / "runs", process, timeout_s=300)
    finally:
        kill_group(process)
    assert process.returncode == -signal.SIGKILL, process.returncode  # killed while it ran, not ended by itself
    assert not (folder / "result.json").exists()  # nothing could write it
    done_before = {e["batch_id"] for e in map_attempts(journal_entries(folder)) if e.get("done")}
    listed = run_cli(["runs", "list", "--status", "interrupted", "--json"], cwd=tmp_path, env=env, timeout_s=60)
    assert listed.returncode == 0 and folder.name in listed.stdout, listed.describe()
    resumed = run_cli(["runs", "resume", str(folder)], cwd=tmp_path, env=env, timeout_s=RUN_TIMEOUT_S)
    check_ended_run(resumed, tmp_path / "runs", page_texts)
    check_resumed_journal(folder, done_before)


def test_a_server_killed_mid_run_fails_the_run_then_it_resumes(tmp_path: Path, llama: LlamaInstall,
                                                               server_logs: Path, corpus_index: Path,
                                                               cache_dir: Path, page_texts: dict[str, str]) -> None:
    """The provider's breaker waits `AMAPREDUCE_BREAKER_MAX_WAIT_S` for a server that stopped answering (120 s by
    default; 15 s here, to keep the tier short) and then ends the run; the bound allows for the requests in flight."""
    server = LlamaServer(llama, server_logs / "killed.log").start()
    env = env_for(cache_dir, AMAPREDUCE_BREAKER_MAX_WAIT_S=str(BREAKER_MAX_WAIT_S))
    try:
        process = start_cli(["mapreduce", "run", str(CORPUS / "decision.json"),
                             *model_args(server, corpus_index), "--workers", "2"], tmp_path, env, tmp_path / "first")
        try:
            folder = wait_for_settled_batch(tmp_path / "runs", process, timeout_s=300)
            server.kill()
            killed_at = time.monotonic()
            process.wait(timeout=SERVER_GONE_BOUND_S + 60)
            took = time.monotonic() - killed_at
        finally:
            kill_group(process)
        stderr = (tmp_path / "first" / "stderr.txt").read_text(encoding="utf-8", errors="replace")
        stdout = (tmp_path / "first" / "stdout.txt").read_text(encoding="utf-8", errors="replace")
        assert process.returncode == 1, f"exit {process.returncode} after {took:.0f} s\n{stdout[-2000:]}\n{stderr[-3000:]}"
        assert took <= SERVER_GONE_BOUND_S, f"the run took {took:.0f} s to fail after the server died\n{stderr[-3000:]}"
        assert "Traceback" not in stdout + stderr, stderr[-3000:]
        endpoint = f"127.0.0.1:{server.port}"
        last = [line for line in stderr.splitlines() if line.strip()][-1]  # the run's one-line ending
        assert "failed" in last and endpoint in last, stderr[-3000:]
        result = json.loads((folder / "result.json").read_text(encoding="utf-8"))
        assert result["status"] == "failed" and endpoint in str(result.get("error")), result
        done_before = {e["batch_id"] for e in map_attempts(journal_entries(folder)) if e.get("done")}

        server = LlamaServer(llama, server_logs / "restarted.log", port=server.port).start()
        resumed = run_cli(["runs", "resume", str(folder)], cwd=tmp_path, env=env, timeout_s=RUN_TIMEOUT_S)
        check_ended_run(resumed, tmp_path / "runs", page_texts)
        check_resumed_journal(folder, done_before)
    finally:
        server.stop()


BREAKER_MAX_WAIT_S = 15
SERVER_GONE_BOUND_S = BREAKER_MAX_WAIT_S + 45.0
"""How long a run may go on after its model server died: the breaker's wait, and time for what was in flight."""


# --- a refused request ends the run at once ---------------------------------------------------------------

def test_a_request_the_server_refuses_ends_the_run_at_once(tmp_path: Path, plain_server: LlamaServer,
                                                           corpus_index: Path, cache_dir: Path) -> None:
    """List content forced on a server that takes only strings (the probe off, so nothing corrects it): the
    server answers HTTP 500 with a validation error, which no retry can change."""
    env = env_for(cache_dir, AMAPREDUCE_ENDPOINT_PROBE="0")
    done = run_cli(["mapreduce", "run", str(CORPUS / "decision.json"), *model_args(plain_server, corpus_index),
                    "--workers", "2", "--message-content", "list"], cwd=tmp_path, env=env, timeout_s=120)
    assert done.returncode == 1, done.describe()
    assert done.wall_s < 10, done.describe()
    assert "Traceback" not in done.stdout + done.stderr, done.describe()
    message = "Input should be a valid string"
    folders = run_folders(tmp_path / "runs")
    result = json.loads((folders[0] / "result.json").read_text(encoding="utf-8")) if folders else {}
    assert message in done.stderr or message in str(result.get("error")), done.describe()
    if folders:
        assert result["status"] == "failed", result


# --- the endpoint probe: what each server accepts ------------------------------------------------------------

def probe_client() -> httpx.Client:
    """The probe's HTTP client, closed by the test (`probe_endpoint` does not close one it makes itself)."""
    return httpx.Client(timeout=httpx.Timeout(60.0, connect=5.0), trust_env=False)


def test_the_probe_finds_the_plain_servers_dialect(plain_server: LlamaServer) -> None:
    from amapreduce.llm.endpoint import probe_endpoint
    from amapreduce.llm.guard import allow_model_requests

    with allow_model_requests(), probe_client() as http:
        found = probe_endpoint(plain_server.base_url, MODEL, http=http)
    assert found.server == "llama-cpp-python", found.notes
    assert found.list_content is False, found.notes
    assert found.structured == "json_object_schema", found.notes
    assert found.context_window == 2048, found.notes
    assert found.tool_calling is False, found.notes


def test_the_probe_finds_the_tool_calling_servers_dialect(tools_server: LlamaServer) -> None:
    from amapreduce.llm.endpoint import probe_endpoint
    from amapreduce.llm.guard import allow_model_requests

    with allow_model_requests(), probe_client() as http:
        found = probe_endpoint(tools_server.base_url, MODEL, http=http)
    assert "auto" in found.tool_choices, found.notes
    assert found.tool_calling is True, found.notes
