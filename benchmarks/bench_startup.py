"""Start-up benchmark: time from process start to the first model request of a `--api-base` run.

A user's `amapreduce mapreduce run DECISION --model M --api-base URL` pays the process's start-up
(imports, settings, pre-flight, the models, the solver, the tools) before its first model call;
on a short run that start-up is most of the wall time. This script serves a simulated model
(deterministic code, not an LLM) on a loopback OpenAI-compatible endpoint
(`amapreduce.testing.openai_server`), starts the CLI as a subprocess over the bundled sandbox
corpus, and records when the endpoint receives its first request. Each repetition also times a
baseline in the same run: `python -c 'import amapreduce.cli.app'` (the CLI's own import, what any
command pays), so the ratio compares like with like on whatever machine runs it.

Per repetition it prints: the time from `Popen` to the first request the endpoint receives, the
whole run's wall time, the baseline, and first-call / baseline; then the medians, and whether
LiteLLM was imported by the run (it should not be: `--api-base` uses the OpenAI client).

The runs start as an installed package does: with its bytecode compiled (pip compiles it at
install). So `PYTHONDONTWRITEBYTECODE` is dropped from the runs' environment and one warm-up run,
not counted, writes the bytecode of a fresh checkout first; without that each run would compile
every module of the package again (about 0.2 s here).

Run: `.venv/bin/python benchmarks/bench_startup.py` (3 repetitions); `--repeat 1` is its
smallest size. Nothing leaves loopback; the run folders go to a temporary folder that is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.sandbox import sandbox_world
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, final_answer

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima"}
DECISION = {
    "task_matrix": [[c] for c in CAPITALS],
    "template": "What is the capital of __0__?",
    "json_schema": {"type": "object", "properties": {"country": {}, "capital": {"description": "city name"}}},
    "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
}
DRIVER = r"""
import json, sys
from amapreduce.cli.app import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "litellm": "litellm" in sys.modules}), file=sys.stderr)
sys.exit(code)
"""


class FirstRequest:
    """The simulated sub-agent; remembers when the first request of the current run arrived."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.first: float | None = None

    def __call__(self, messages: list[Any], info: ModelInfo) -> Any:
        with self.lock:
            if self.first is None:
                self.first = time.perf_counter()
        text = "\n".join(message_text(m) for m in messages).rsplit("Sub-questions:", 1)[-1]
        rows = [{"task": n, "country": c, "capital": v}
                for n, (c, v) in enumerate(((c, v) for c, v in CAPITALS.items() if f"capital of {c}?" in text), 1)]
        return final_answer(json.dumps(rows))


def _baseline(env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import amapreduce.cli.app"], env=env, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (each: one baseline, one run)")
    parser.add_argument("--smoke", action="store_true", help="smallest size: one repetition")
    args = parser.parse_args()
    if args.smoke:
        args.repeat = 1
    first_call: list[float] = []
    baselines: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        folder = Path(tmp)
        decision = folder / "decision.json"
        decision.write_text(json.dumps(DECISION), encoding="utf-8")
        index = sandbox_world(cache_dir=folder / "cache").index_dir
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AMAPREDUCE_", "OPENAI_")) and k != "PYTHONDONTWRITEBYTECODE"}
        env.update(AMAPREDUCE_RUNS_DIR=str(folder / "runs"), AMAPREDUCE_API_KEY="sk-bench",
                   AMAPREDUCE_ENV_FILE=os.devnull, AMAPREDUCE_SEARCH_BACKEND=f"corpus:{index}",
                   AMAPREDUCE_CACHE_DIR=str(folder / "cache"))
        model = FirstRequest()
        with OpenAICompatibleServer(FunctionModel(model, model_id="sim-model"), keep_requests=False) as server, \
                allow_model_requests():
            command = [sys.executable, "-c", DRIVER, "mapreduce", "run", str(decision), "--model", "sim-model",
                       "--api-base", server.base_url, "--workers", "4", "--json"]
            subprocess.run(command, env=env, capture_output=True, check=False)  # warm-up: writes the bytecode
            for k in range(1, args.repeat + 1):
                baseline = _baseline(env)
                model.first = None
                start = time.perf_counter()
                proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
                wall = time.perf_counter() - start
                facts = json.loads(proc.stderr.strip().splitlines()[-1])
                if facts["code"] != 0 or model.first is None:
                    raise SystemExit(f"the run failed (exit {facts['code']}):\n{proc.stderr[-2000:]}")
                first = model.first - start
                first_call.append(first)
                baselines.append(baseline)
                print(f"run {k}: first model request {first:.2f} s after process start, run wall {wall:.2f} s; "
                      f"baseline `import amapreduce.cli.app` {baseline:.2f} s; ratio {first / baseline:.2f}; "
                      f"litellm imported: {facts['litellm']}", flush=True)
    median_first, median_base = statistics.median(first_call), statistics.median(baselines)
    print(f"median: first model request {median_first:.2f} s, baseline {median_base:.2f} s, "
          f"ratio {median_first / median_base:.2f} (target: first request <= 1.5 s)")


if __name__ == "__main__":
    main()
