"""Every script in `benchmarks/` has a smallest size (`--smoke`), and each runs at HEAD here, at that
size, as a subprocess: a benchmark that no longer runs fails the suite (and CI).

Figures are never asserted (speed is measured by the scripts, not by tests): a run passes when it
exits 0 and prints its figures. A script that needs what a checkout may lack skips with the reason:
Ray (the `ray` extra), the benchmark data (`AMAPREDUCE_DATA_DIR`), a real local model server (`bench_real_model.py`: `tests/real_model.py`). `bench_oracle.py` measures against
the oracle server in `../shared/tools/oracle`, which tests must not depend on: `.ci/run` smoke-runs it
after the tests.
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


def _needs(script: str, tmp_path: Path) -> list[str]:
    """The extra arguments `script` needs here; skips when what it needs is absent."""
    if script == "bench_ray.py" and importlib.util.find_spec("ray") is None:
        pytest.skip("bench_ray.py needs Ray (pip install 'amapreduce[ray]')")
    if script == "check_fidelity.py":
        if BENCHMARK_DATA is None or not (BENCHMARK_DATA / "widesearch" / "widesearch.jsonl").is_file():
            pytest.skip(f"check_fidelity.py needs the WideSearch data: {BENCHMARK_DATA_MISSING}")
        return ["--data", str(BENCHMARK_DATA)]
    if script == "bench_scorer.py":
        if BENCHMARK_DATA is None or not (BENCHMARK_DATA / "widesearch" / "widesearch.jsonl").is_file():
            pytest.skip(f"bench_scorer.py needs the WideSearch data: {BENCHMARK_DATA_MISSING}")
        return ["--data", str(BENCHMARK_DATA / "widesearch")]
    if script == "bench_evolution.py":
        return ["--out", str(tmp_path / "evolution")]
    if script in ("bench_real_model.py", "bench_prefix.py", "bench_workers.py"):
        from real_model import find_llama

        install, why = find_llama()
        if install is None:
            pytest.skip(f"{script} needs a real local model server: {why}")
        return ["--llama-python", install.python]
    return []


SCRIPTS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py") if not p.name.startswith("_"))
OUTSIDE_TESTS = ["bench_oracle.py"]
"""Run by `.ci/run` after the tests, not here: it measures against `../shared/tools/oracle`, which
tests must not depend on."""


def test_every_benchmark_has_a_smallest_size() -> None:
    """A new script is picked up by the glob; it needs a `--smoke` for the run below."""
    assert len(SCRIPTS) >= 11 and "check_fidelity.py" in SCRIPTS
    assert [s for s in SCRIPTS if '"--smoke"' not in (REPO / "benchmarks" / s).read_text(encoding="utf-8")] == []


@pytest.mark.slow
@pytest.mark.parametrize("script", [s for s in SCRIPTS if s not in OUTSIDE_TESTS])
def test_the_benchmark_runs_at_its_smallest_size(script: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
           "AMAPREDUCE_RUNS_DIR": str(tmp_path / "runs"), "AMAPREDUCE_CACHE_DIR": str(tmp_path / "cache")}
    command = [sys.executable, str(REPO / "benchmarks" / script), "--smoke", *_needs(script, tmp_path)]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}"
    assert done.stdout.strip(), f"{script} printed no figures"
