"""Every script in `benchmarks/` has a smallest size (`--smoke`), and the quick ones run at HEAD here,
as subprocesses. The others (`bench_pipeline`, `bench_evolution`, `bench_oracle`, `bench_discovery`,
`bench_ray`, `bench_startup`: 10-50 s each even at their smallest, mostly process start-up, a sandbox index or Ray)
are run by hand with `--smoke`: the suite's time is CI's.

Figures are never asserted (speed is measured by the scripts, not by tests): a run passes when it
exits 0. A script that needs what a checkout may lack skips with the reason: Ray (the `ray`
extra), the WideSearch data (`AMAPREDUCE_DATA_DIR`), the oracle server (`../shared/tools/oracle`
beside the checkout).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BENCHMARK_DATA, BENCHMARK_DATA_MISSING

REPO = Path(__file__).resolve().parents[1]
ORACLE_DIR = REPO.parent / "shared" / "tools" / "oracle"


def _needs(script: str, tmp_path: Path) -> list[str]:
    """The extra arguments `script` needs here; skips when what it needs is absent."""
    if script == "bench_ray.py" and importlib.util.find_spec("ray") is None:
        pytest.skip("bench_ray.py needs Ray (pip install 'amapreduce[ray]')")
    if script == "bench_scorer.py":
        if BENCHMARK_DATA is None or not (BENCHMARK_DATA / "widesearch" / "widesearch.jsonl").is_file():
            pytest.skip(f"bench_scorer.py needs the WideSearch data: {BENCHMARK_DATA_MISSING}")
        return ["--data", str(BENCHMARK_DATA / "widesearch")]
    if script == "bench_oracle.py":
        if not (ORACLE_DIR / "oracle_server.py").is_file():
            pytest.skip(f"bench_oracle.py needs the oracle server in {ORACLE_DIR}")
        return ["--oracle-dir", str(ORACLE_DIR)]
    if script == "bench_evolution.py":
        return ["--out", str(tmp_path / "evolution")]
    return []


SCRIPTS = sorted(p.name for p in (REPO / "benchmarks").glob("bench_*.py"))
QUICK = ["bench_engine.py", "bench_memory.py", "bench_scorer.py", "bench_web.py"]
"""The scripts whose smallest run takes a few seconds."""


def test_every_benchmark_has_a_smallest_size() -> None:
    """A new script is picked up by the glob; it needs a `--smoke` for the run below."""
    assert len(SCRIPTS) >= 9
    assert [s for s in SCRIPTS if '"--smoke"' not in (REPO / "benchmarks" / s).read_text(encoding="utf-8")] == []


@pytest.mark.slow
@pytest.mark.parametrize("script", QUICK)
def test_the_benchmark_runs_at_its_smallest_size(script: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
           "AMAPREDUCE_RUNS_DIR": str(tmp_path / "runs"), "AMAPREDUCE_CACHE_DIR": str(tmp_path / "cache")}
    command = [sys.executable, str(REPO / "benchmarks" / script), "--smoke", *_needs(script, tmp_path)]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}"
    assert done.stdout.strip(), f"{script} printed no figures"
