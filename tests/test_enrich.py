"""`amapreduce enrich` and `amapreduce.enrich`: a user's list in, the same list with columns added out.

The sub-agents are simulated models (deterministic code, not an LLM) behind the loopback
OpenAI-compatible server, so the CLI's real client path runs; the sandbox list is answered by the
sandbox's simulated model through the real search and crawl tools over the sandbox corpus.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import amapreduce
from amapreduce.cli.app import main
from amapreduce.demo.enrichment import enrich_command
from amapreduce.demo.model import SimulatedAtlasModel
from amapreduce.demo.run import load_sandbox_tasks, score_answer
from amapreduce.enrichment import ENRICH_FILE, ENRICHED_FILE, EnrichRequest
from amapreduce.errors import UserError
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.session.journal import JOURNAL_NAME
from amapreduce.settings import Settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, final_answer
from tests.test_run_resume import done_batches, killed_at_the_end, wait_for

ITEM = re.compile(r'Item:? "(item\d{3})"')


class ItemAgents:
    """Sub-agents that answer `Code` for each `Item "itemNNN"` sub-question of their batch (its
    code is the name upper-cased), except for the items in `unknown`; after `open_for` answers they
    hold every request until `release` is set (so a run can be killed with batches in flight)."""

    def __init__(self, *, unknown: frozenset[str] = frozenset(), open_for: int | None = None) -> None:
        self.asked: Counter[str] = Counter()
        self.release = threading.Event()
        self.unknown = unknown
        self._open_for = open_for
        self._lock = threading.Lock()

    def __call__(self, messages: list[Any], info: ModelInfo) -> Any:
        text = "\n".join(message_text(m) for m in messages).rsplit("Sub-questions:", 1)[-1]
        items = ITEM.findall(text)
        with self._lock:
            self.asked.update(items)
            turn = sum(self.asked.values())
        if self._open_for is not None and turn > self._open_for:
            self.release.wait(timeout=120)
        return final_answer(json.dumps([{"task": n, "Item": item, "Code": item.upper()}
                                        for n, item in enumerate(items, 1) if item not in self.unknown]))


def _items_csv(tmp_path: Path, rows: int, name: str = "items.csv") -> Path:
    """A list of `rows` items, in an order that is not sorted, with a context column."""
    order = [(i * 7) % rows for i in range(rows)]  # 7 and rows coprime: a permutation
    frame = pd.DataFrame({"Note": [f"note {i}" for i in order], "Item": [f"item{i:03d}" for i in order]})
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return path


def _cli(path: Path, server: OpenAICompatibleServer, *args: str) -> list[str]:
    return ["enrich", str(path), "--columns", "Code", "--model", "sim-model", "--api-base", server.base_url,
            "--no-memory", *args]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    runs = tmp_path / "runs"
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(runs))
    monkeypatch.setenv("AMAPREDUCE_EXTRACTION_MODEL", "none")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    return runs


def test_every_row_is_kept_in_order_and_failed_rows_keep_their_input(
    tmp_path: Path, env: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = _items_csv(tmp_path, 11)
    agents = ItemAgents(unknown=frozenset({"item003", "item008"}))
    out = tmp_path / "out.csv"
    with OpenAICompatibleServer(FunctionModel(agents, model_id="sim-model")) as srv, allow_model_requests():
        code = main(_cli(path, srv, "--out", str(out), "--workers", "3"))
    captured = capsys.readouterr()
    assert code == 3, captured.err  # incomplete: two rows could not be filled
    assert "key: Note (inferred" in captured.err and "2 failed" in captured.err
    given = pd.read_csv(path, dtype=str, keep_default_na=False)
    got = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(got.columns) == ["Note", "Item", "Code", "enrich_status"]
    assert got[["Note", "Item"]].equals(given)  # every input row and column, in the input's order
    failed = got[got["Item"].isin(["item003", "item008"])]
    assert list(failed["Code"]) == ["", ""] and set(failed["enrich_status"]) == {"failed"}
    done = got[~got["Item"].isin(["item003", "item008"])]
    assert list(done["Code"]) == [i.upper() for i in done["Item"]] and set(done["enrich_status"]) == {"complete"}
    run_dir = next(env.iterdir())
    assert json.loads((run_dir / "result.json").read_text())["kind"] == "enrich"
    kept = pd.read_csv(run_dir / ENRICHED_FILE, dtype=str, keep_default_na=False)
    assert kept[["Note", "Item", "Code", "enrich_status"]].equals(got)


def test_evidence_adds_a_status_source_quote_and_evidence_per_new_cell(
    tmp_path: Path, env: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = _items_csv(tmp_path, 4)
    with OpenAICompatibleServer(FunctionModel(ItemAgents(unknown=frozenset({"item002"})), model_id="sim-model")) as srv, \
            allow_model_requests():
        code = main(_cli(path, srv, "--key", "Item", "--evidence", "--instructions", "Codes are upper case."))
        prompts = json.dumps(srv.requests)
    captured = capsys.readouterr()
    assert "Codes are upper case." in prompts and 'Note: \\"note 1\\"' in prompts  # instructions and context
    assert code == 3
    assert "key: Item;" in captured.err  # given, not inferred
    got = pd.read_csv(__import__("io").StringIO(captured.out), dtype=str, keep_default_na=False)
    assert list(got.columns) == ["Note", "Item", "Code", "enrich_status", "Code status", "Code source",
                                 "Code quote", "Code evidence"]
    row = got.set_index("Item")
    assert row.loc["item002", "Code status"] == "missing" and row.loc["item002", "Code"] == ""
    assert row.loc["item001", "Code status"] == "found" and row.loc["item001", "Code evidence"] == "no_evidence"


@pytest.mark.parametrize(("make", "args", "message"), [
    (lambda p: p.write_text("Item,Note\nitem001,a\nitem001,b\n"), ["--key", "Item"], "duplicate key ['item001']"),
    (lambda p: p.write_text("Item\nitem001\n"), ["--key", "Name"], "no such column 'Name' for --key"),
    (lambda p: p.write_text(""), [], "is empty"),
    (lambda p: p.write_text("Item,Note\n"), [], "has no rows"),
    (lambda p: p.write_text("Item\nitem001\n"), ["--max-file-mb", "0.000001"], "larger than the 1e-06 MiB"),
    (lambda p: p.write_text("Item,Code\nitem001,x\n"), [], "already in the input"),
    (lambda p: p.write_text("Item\na\na\n"), [], "no input column names every row once"),
    (lambda p: p.write_text("Item\n N/A \nb\n"), ["--key", "Item"], "has no usable key"),
    (lambda p: None, [], "does not exist"),
])
def test_bad_input_exits_2_before_any_model_call_and_leaves_no_run_folder(
    tmp_path: Path, env: Path, capsys: pytest.CaptureFixture[str], make: Any, args: list[str], message: str,
) -> None:
    path = tmp_path / "list.csv"
    make(path)
    # No server listens there and the guard refuses model requests: a model call would fail otherwise.
    code = main(["enrich", str(path), "--columns", "Code", "--model", "sim-model", "--api-base",
                 "http://127.0.0.1:9/v1", "--no-memory", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and err.startswith("error: ")
    assert not env.exists()


def test_an_unknown_suffix_and_a_missing_engine_are_usage_errors(tmp_path: Path, env: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    odd = tmp_path / "list.odt"
    odd.write_text("x")
    assert main(["enrich", str(odd), "--columns", "Code", "--model", "m", "--no-memory"]) == 2
    assert "is not a list file enrich reads" in capsys.readouterr().err
    sheet = tmp_path / "list.xlsx"
    sheet.write_bytes(b"not a workbook")
    assert main(["enrich", str(sheet), "--columns", "Code", "--model", "m", "--no-memory"]) == 2
    err = capsys.readouterr().err  # without openpyxl its name; with it, why the file is no workbook
    assert "needs openpyxl" in err or f"cannot read {str(sheet)!r} as excel" in err
    assert not env.exists()


def test_the_python_api_enriches_a_dataframe_and_reads_jsonl(tmp_path: Path, env: Path) -> None:
    frame = pd.DataFrame({"Item": [f"item{i:03d}" for i in (5, 1, 3, 0)], "Rank": [1, 2, 3, 4]})
    with OpenAICompatibleServer(FunctionModel(ItemAgents(), model_id="sim-model")) as srv, allow_model_requests():
        got = amapreduce.enrich(frame, columns=["Code"], model="sim-model", api_base=srv.base_url,
                                runs_dir=tmp_path / "api-runs", memory=False)
        listed = tmp_path / "items.jsonl"
        frame.to_json(listed, orient="records", lines=True)
        from_file = amapreduce.enrich(listed, columns={"Code": {"description": "the item's code"}}, key="Item",
                                      evidence=True, model="sim-model", api_base=srv.base_url,
                                      runs_dir=tmp_path / "api-runs", memory=False)
    assert list(got.columns) == ["Item", "Rank", "Code", "enrich_status"]
    assert got["Item"].tolist() == frame["Item"].tolist() and got["Rank"].tolist() == [1, 2, 3, 4]
    assert got["Code"].tolist() == [i.upper() for i in frame["Item"]]
    assert got.attrs["status"] == "complete" and Path(got.attrs["run_dir"]).is_dir()
    assert from_file["Code"].tolist() == got["Code"].tolist() and "Code evidence" in from_file.columns
    assert from_file.attrs["status"] == "complete"
    with pytest.raises(UserError, match="duplicate key"):
        amapreduce.enrich(pd.concat([frame, frame]), columns=["Code"], key="Item", model="sim-model")


def test_enrich_async_runs_in_a_running_event_loop(tmp_path: Path, env: Path) -> None:
    frame = pd.DataFrame({"Item": [f"item{i:03d}" for i in (2, 7)]})

    async def main_loop() -> pd.DataFrame:
        ticks = 0

        async def tick() -> None:  # the loop keeps running while the run works in its thread
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        try:
            return await amapreduce.enrich_async(frame, columns=["Code"], model="sim-model", api_base=srv.base_url,
                                                 runs_dir=tmp_path / "async-runs", memory=False)
        finally:
            ticker.cancel()
            assert ticks > 1

    with OpenAICompatibleServer(FunctionModel(ItemAgents(), model_id="sim-model")) as srv, allow_model_requests():
        got = asyncio.run(main_loop())
    assert got["Code"].tolist() == ["ITEM002", "ITEM007"] and got.attrs["status"] == "complete"


def test_a_request_survives_its_run_directory_file() -> None:
    frame = pd.DataFrame({"Country": ["NA-land", "007"], "Code": ["NA", "007"]})
    request = EnrichRequest.of(frame, ["Capital"], key_columns=["Country"], instructions="Use the atlas.")
    again = EnrichRequest.from_json(json.loads(json.dumps(request.to_json())))
    assert again.frame.equals(frame) and again.keys == request.keys and again.instructions == "Use the atlas."
    assert 'Country "__0__"' in request.template() and 'Code: "__1__"' in request.template()


@pytest.fixture
def gated() -> Iterator[tuple[OpenAICompatibleServer, ItemAgents]]:
    agents = ItemAgents(open_for=3)
    with OpenAICompatibleServer(FunctionModel(agents, model_id="sim-model")) as srv:
        try:
            yield srv, agents
        finally:
            agents.release.set()


def test_a_killed_enrichment_resumes_without_redoing_finished_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    gated: tuple[OpenAICompatibleServer, ItemAgents],
) -> None:
    srv, agents = gated
    rows, path, runs = 8, _items_csv(tmp_path, 8), tmp_path / "runs"
    env = {**os.environ, "AMAPREDUCE_RUNS_DIR": str(runs), "AMAPREDUCE_EXTRACTION_MODEL": "none",
           "OPENAI_API_KEY": "sk-local"}
    child = subprocess.Popen(
        [sys.executable, "-c", "from amapreduce.cli.app import run; run()", *_cli(path, srv, "--key", "Item",
         "--batch-size", "1", "--workers", "2", "--json")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    with killed_at_the_end(child):
        run_dir = wait_for("the run directory", lambda: next((p for p in runs.glob("*") if (p / JOURNAL_NAME).is_file()), None))
        wait_for("finished batches", lambda: (run_dir / JOURNAL_NAME).read_bytes().count(b'"done":true') >= 3)
    done_before = done_batches(run_dir)
    assert 3 <= len(done_before) < rows and not (run_dir / "result.json").exists()
    assert (run_dir / ENRICH_FILE).is_file()
    asked_before = Counter(agents.asked)
    agents.release.set()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    with allow_model_requests():
        code = main(["runs", "resume", run_dir.name, "--runs-dir", str(runs), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["status"] == "complete" and out["row_status"] == {"complete": rows, "partial": 0, "failed": 0}
    assert out["key_columns"] == ["Item"] and out["run_dir"] == str(run_dir)
    resumed = agents.asked - asked_before
    order = pd.read_csv(path, dtype=str)["Item"].tolist()
    finished = {order[int(b.rsplit("-", 1)[1]) - 1] for b in done_before}  # batch-k is row k (one row per batch)
    assert finished and not finished & set(resumed), resumed
    assert set(resumed) == set(order) - finished
    kept = pd.read_csv(run_dir / ENRICHED_FILE, dtype=str, keep_default_na=False)
    assert kept["Item"].tolist() == order and kept["Code"].tolist() == [i.upper() for i in order]


def test_the_demo_enriches_a_sandbox_list_and_scores_it(tmp_path: Path) -> None:
    from amapreduce.demo.run import run_demo
    from amapreduce.settings import load_settings

    settings = load_settings({}, runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache", workers=4)
    outcome = run_demo("sbx_enrich_002", settings)
    assert outcome.ask.kind == "enrich" and outcome.ask.status == "complete"
    assert outcome.score["f1_by_item"] == 1.0 and outcome.score["score"] == 1.0
    assert outcome.evidence()["verified"] == 14 * 3
    record = json.loads((outcome.ask.run_dir.path / "result.json").read_text())
    assert record["prior"]["text"]  # the plan stage ran (no memory here: the no-memory prior)
    enriched = pd.read_csv(outcome.ask.run_dir.path / ENRICHED_FILE, dtype=str, keep_default_na=False)
    _tasks, world = load_sandbox_tasks(settings)
    given = pd.read_csv(world.enrich_dir / "sbx_enrich_002.csv", dtype=str, keep_default_na=False)
    assert enriched[["Country", "ISO code"]].equals(given) and set(enriched["enrich_status"]) == {"complete"}


def test_the_sandbox_list_of_244_countries_is_enriched_complete_with_item_f1_1(
    tmp_path: Path, env: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    tasks, world = load_sandbox_tasks(Settings(cache_dir=tmp_path / "cache"))
    task = tasks["sbx_enrich_001"]
    given = world.enrich_dir / "sbx_enrich_001.csv"
    out = tmp_path / "countries.csv"
    with OpenAICompatibleServer(SimulatedAtlasModel()) as srv, allow_model_requests():
        # The command `demo sbx_enrich_001 --serve` prints, as a user pastes it.
        printed = enrich_command("sbx_enrich_001", world, srv.base_url)
        env_part, _, command = printed.partition(" amapreduce ")
        assert env_part == "AMAPREDUCE_EXTRACTION_MODEL=none"
        args = shlex.split(command)
        assert args[:2] == ["enrich", str(given.resolve())]
        code = main([*args, "--workers", "8", "--no-memory", "--out", str(out), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["rows"] == 244 and report["row_status"]["complete"] == 244 and report["status"] == "complete"
    got = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert got["Country"].tolist() == pd.read_csv(given, dtype=str, keep_default_na=False)["Country"].tolist()
    markdown = json.loads((Path(report["run_dir"]) / "result.json").read_text())
    table = (Path(report["run_dir"]) / "table.md").read_text()
    assert markdown["kind"] == "enrich"
    assert score_answer(task, world.enrich_gold_dir, table)["f1_by_item"] == 1.0


def test_the_sandbox_benchmark_runs_the_enrichment_tasks(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMAPREDUCE_CACHE_DIR", str(tmp_path / "cache"))
    _tasks, world = load_sandbox_tasks(Settings(cache_dir=tmp_path / "cache"))
    code = main(["eval", "run", "--benchmark", "sandbox", "--tasks", str(world.enrich_tasks_file), "--gold-dir",
                 str(world.enrich_gold_dir), "--trials", "1", "--out", str(tmp_path / "eval"), "--no-memory",
                 "--workers", "4", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["status"] == "complete" and report["tasks"] == 2
    assert report["summary"]["f1_by_item"]["min_n"] == 1.0
    kinds = {json.loads(p.read_text())["kind"] for p in (tmp_path / "eval").rglob("result.json")}
    assert kinds == {"enrich"}


def test_the_plan_stage_reads_the_memorys_prior(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from amapreduce.demo.serve import serving_model

    monkeypatch.setenv("AMAPREDUCE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("AMAPREDUCE_EXTRACTION_MODEL", "none")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    _tasks, world = load_sandbox_tasks(Settings(cache_dir=tmp_path / "cache"))
    store = tmp_path / "memory"
    assert main(["eval", "run", "--benchmark", "sandbox", "--tasks", str(world.enrich_tasks_file), "--gold-dir",
                 str(world.enrich_gold_dir), "--ids", "sbx_enrich_002", "--trials", "1", "--out", str(tmp_path / "eval"),
                 "--memory", str(store), "--encoder", "hashing", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["memory"]["records_after"] == 1
    with OpenAICompatibleServer(serving_model()) as srv, allow_model_requests():
        code = main(["enrich", str(world.enrich_dir / "sbx_enrich_002.csv"), "--columns", "Capital, Population",
                     "--model", "simulated", "--api-base", srv.base_url, "--search", f"corpus:{world.index_dir}",
                     "--memory", str(store), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["row_status"]["complete"] == 14
    record = json.loads((Path(out["run_dir"]) / "result.json").read_text())
    assert record["kind"] == "enrich" and "Similar task that succeeded" in record["prior"]["text"]
    assert Path(out["run_dir"]).name.endswith("-enrich-sbx-enrich-002-add-capital-popula")


def test_a_budget_stop_keeps_every_row(tmp_path: Path, env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, out = _items_csv(tmp_path, 6), tmp_path / "out.jsonl"
    with OpenAICompatibleServer(FunctionModel(ItemAgents(), model_id="sim-model")) as srv, allow_model_requests():
        code = main(_cli(path, srv, "--key", "Item", "--batch-size", "1", "--workers", "1", "--max-tokens", "1",
                         "--out", str(out)))
    err = capsys.readouterr().err
    assert code == 4, err  # stopped by the budget; the partial list is written
    got = pd.read_json(out, lines=True, dtype=False)
    assert got["Item"].tolist() == pd.read_csv(path)["Item"].tolist()
    assert "failed" in set(got["enrich_status"]) and "stopped" in err
