"""Ray benchmark: local threads vs `--executor ray` on a wide oracle run and on the sandbox evaluation.

Wide run: a user's `per_atom` decision of N rows (default 1,000: N batches), each row asking the
code of an item; the sub-agent is a simulated model (deterministic code, not an LLM) that answers
every question at once from the question's text, served on a loopback OpenAI-compatible endpoint
(`amapreduce.testing.openai_server`), so the run goes through the CLI, smolagents, the HTTP client
and the endpoint, and the only cost measured is the framework's own. Each configuration runs
`amapreduce mapreduce run DECISION --json` in a subprocess: `local` with `--workers W`, `ray` with
`--executor ray` in a process that started a local Ray with `--cpus` CPUs (chunks of 4 × W
batches, `run.wide_ray`). Sandbox evaluation: `amapreduce eval run --benchmark sandbox --trials T`
offline, local and `--executor ray` (each trial one Ray task, `run.eval_ray`).

Per configuration it prints the subprocess's wall time (Ray's start included), the run's own wall
time where `result.json` has it, the overhead per batch (run wall / batches, with the simulated
model answering instantly this is all framework), the driver's peak RSS (the subprocess; Ray's
worker processes are not its children and are not counted), and whether the table (or the
scores) equal the local run's.

Run: `.venv/bin/python benchmarks/bench_ray.py` (N=1000, W=8, 2 CPUs, trials 2); options: `--rows
200 --workers 4 --cpus 4 --trials 1 --skip-eval`. Nothing leaves loopback; run folders go to a
temporary folder removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RAY_DRIVER = r"""
import sys, time
import ray
started = time.perf_counter()
ray.init(num_cpus=int(sys.argv[1]), include_dashboard=False, log_to_driver=False)
print(f"ray_init_s={time.perf_counter() - started:.2f}", file=sys.stderr)
from amapreduce.cli.app import main
code = main(sys.argv[2:])
ray.shutdown()
sys.exit(code)
"""


def _sub_agent(messages: list[Any], info: Any) -> Any:
    from amapreduce.llm.messages import message_text
    from amapreduce.testing.scripted import final_answer

    asked = re.findall(r"code of (item\d+)\?", "\n".join(message_text(m) for m in messages).rsplit("Sub-questions:", 1)[-1])
    return final_answer(json.dumps([{"task": k + 1, "item": item, "code": item.upper()} for k, item in enumerate(asked)]))


LOCAL_DRIVER = "import sys\nfrom amapreduce.cli.app import main\nsys.exit(main(sys.argv[1:]))\n"


def _run(argv: list[str], env: dict[str, str], *, cpus: int | None, folder: Path) -> tuple[int, float, float]:
    """Run the CLI (`cpus`: in a process that starts a local Ray first); (exit code, wall s, peak RSS MB)."""
    cmd = ([sys.executable, "-c", RAY_DRIVER, str(cpus), *argv] if cpus is not None
           else [sys.executable, "-c", LOCAL_DRIVER, *argv])
    started = time.perf_counter()
    with open(folder / "stdout.txt", "w") as out, open(folder / "stderr.txt", "w") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    if code not in (0, 3):
        sys.stderr.write((folder / "stderr.txt").read_text()[-3000:])
    return code, wall, usage.ru_maxrss / 1024


def bench_wide(rows: int, workers: int, cpus: int, folder: Path) -> list[dict[str, Any]]:
    """Local vs Ray on an N-row per_atom decision; one row of results per mode."""
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.testing.openai_server import OpenAICompatibleServer
    from amapreduce.testing.scripted import FunctionModel

    decision = folder / "wide.json"
    decision.write_text(json.dumps({
        "task_matrix": [[f"item{i:05d}"] for i in range(rows)], "template": "What is the code of __0__?",
        "json_schema": ["item", "code"], "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
    }), encoding="utf-8")
    results = []
    tables: dict[str, Any] = {}
    with OpenAICompatibleServer(FunctionModel(_sub_agent, model_id="sim-model"), keep_requests=False) as server, \
            allow_model_requests():
        for mode in ("local", "ray"):
            runs = folder / f"wide-{mode}"
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")},
                   "AMAPREDUCE_ENV_FILE": os.devnull, "AMAPREDUCE_RUNS_DIR": str(runs), "RAY_USAGE_STATS_ENABLED": "0"}
            argv = ["mapreduce", "run", str(decision), "--model", "sim-model", "--api-base", server.base_url,
                    "--workers", str(workers), "--json", *(["--executor", "ray"] if mode == "ray" else [])]
            code, wall, rss = _run(argv, env, cpus=cpus if mode == "ray" else None, folder=folder)
            (run_dir,) = runs.iterdir()
            record = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
            tables[mode] = record["table"]
            run_wall = float(record["timings"]["wall_s"])
            results.append({"what": f"wide N={rows}", "mode": mode, "exit": code, "wall_s": round(wall, 2),
                            "run_wall_s": round(run_wall, 2), "batches": record["completeness"]["batches"],
                            "ms_per_batch": round(1000 * run_wall / max(1, record["completeness"]["batches"]), 2),
                            "rss_mb": round(rss, 1), "rows": record["completeness"]["rows"],
                            "chunks": record.get("executor", {}).get("chunks", "-")})
    results[-1]["same_as_local"] = tables["ray"] == tables["local"]
    return results


def bench_eval(trials: int, cpus: int, folder: Path) -> list[dict[str, Any]]:
    """Local vs Ray on the offline sandbox evaluation."""
    results, scores = [], {}
    for mode in ("local", "ray"):
        out = folder / f"eval-{mode}"
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")},
               "AMAPREDUCE_ENV_FILE": os.devnull, "RAY_USAGE_STATS_ENABLED": "0"}
        argv = ["eval", "run", "--benchmark", "sandbox", "--trials", str(trials), "--encoder", "hashing",
                "--out", str(out), "--json", *(["--executor", "ray"] if mode == "ray" else [])]
        code, wall, rss = _run(argv, env, cpus=cpus if mode == "ray" else None, folder=folder)
        record = json.loads((out / "results.json").read_text(encoding="utf-8"))
        scores[mode] = {k: v for k, v in record["summary"].items() if isinstance(v, dict)}
        tasks = sum(len(v) for v in record["per_task"].values())
        results.append({"what": f"sandbox eval x{trials}", "mode": mode, "exit": code, "wall_s": round(wall, 2),
                        "run_wall_s": "-", "batches": f"{tasks} trials", "ms_per_batch": round(1000 * wall / max(1, tasks), 1),
                        "rss_mb": round(rss, 1), "rows": "-", "chunks": "-"})
    results[-1]["same_as_local"] = scores["ray"] == scores["local"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--skip-eval", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        rows = bench_wide(args.rows, args.workers, args.cpus, Path(tmp))
        if not args.skip_eval:
            rows += bench_eval(args.trials, args.cpus, Path(tmp))
    columns = ["what", "mode", "exit", "wall_s", "run_wall_s", "batches", "ms_per_batch", "rss_mb", "rows", "chunks",
               "same_as_local"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")


if __name__ == "__main__":
    main()
