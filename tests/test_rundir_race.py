"""Run folders are claimed atomically (issue 17, point 4): two runs never share one.

The probe behind the issue started the same `mapreduce run` twice in one second: in 2 of 13 pairs
both reported the same `run_dir`, their traces interleaved and one `result.json` overwrote the
other, because `RunDir.create` checked that the name was free and then made the folder with
`exist_ok=True`. A folder is now claimed by `mkdir` itself, which succeeds for one caller only.
"""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path
from typing import Any

import pytest

from amapreduce.errors import UserError
from amapreduce.session.rundir import RunDir
from tests.test_store_integrity import start_together

NOW = 1_790_000_000.0
"""One fixed start time: every run below is started "in the same second"."""
THREADS, PROCESSES, PER_PROCESS = 32, 6, 4


def test_a_name_taken_between_the_check_and_the_mkdir_is_not_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving that lost runs, made to happen every time: another run takes the name
    just before this one creates its folder."""
    runs = tmp_path / "runs"
    taken: list[Path] = []
    real_mkdir = Path.mkdir

    def mkdir_after_another_run(self: Path, *args: Any, **kwargs: Any) -> None:
        if self.parent == runs and not taken:
            real_mkdir(self)  # the other run, started in the same second, wins the race for the name
            taken.append(self)
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir_after_another_run)
    run = RunDir.create(runs, "Top 10 lakes", now=NOW)
    run.close()
    assert taken and run.path != taken[0]
    assert run.path.name == f"{taken[0].name}-2"


def test_names_in_use_get_the_next_suffix(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    made = [RunDir.create(runs, "Top 10 lakes", now=NOW) for _ in range(3)]
    for run in made:
        run.close()
    first = made[0].path.name
    assert [r.path.name for r in made] == [first, f"{first}-2", f"{first}-3"]


def test_many_threads_starting_at_once_get_distinct_folders(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    barrier = threading.Barrier(THREADS)
    paths: list[Path] = []
    lock = threading.Lock()

    def start() -> None:
        barrier.wait()
        run = RunDir.create(runs, "same question", now=NOW)
        run.close()
        with lock:
            paths.append(run.path)

    threads = [threading.Thread(target=start) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(paths) == THREADS and len(set(paths)) == THREADS
    assert sorted(p.name for p in runs.iterdir()) == sorted(p.name for p in paths)


def _start_runs(runs: str, out: Any, start: Any) -> None:
    """One process: wait for the others, then start PER_PROCESS runs as fast as it can."""
    start.wait(60)
    made = []
    for _ in range(PER_PROCESS):
        run = RunDir.create(Path(runs), "same question", now=NOW)
        run.close()
        made.append(str(run.path))
    out.put(made)


def test_many_processes_starting_at_once_get_distinct_folders(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    out = multiprocessing.get_context("spawn").Queue()
    start_together(_start_runs, [(str(runs), out)] * PROCESSES)
    paths = [path for _ in range(PROCESSES) for path in out.get(timeout=120)]
    assert len(paths) == PROCESSES * PER_PROCESS == len(set(paths))
    assert len(list(runs.iterdir())) == PROCESSES * PER_PROCESS


def test_reopening_a_run_needs_its_folder(tmp_path: Path) -> None:
    """`RunDir(path)` reopens an existing run (`runs resume`); it never makes a folder."""
    run = RunDir.create(tmp_path / "runs", "q", now=NOW)
    run.close()
    again = RunDir(run.path)
    again.close()
    assert again.path == run.path
    with pytest.raises(UserError, match="no run folder"):
        RunDir(tmp_path / "runs" / "absent")
    assert not (tmp_path / "runs" / "absent").exists()
