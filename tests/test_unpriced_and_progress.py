"""Issue 16, points 3 and 4.

3. A model with no known price is shown as unpriced everywhere (the meter, `--json`'s `usage`,
   `result.json`, `runs list`, the console and the progress), never as "$0.0000"; simulated models
   are priced (at $0, on purpose) and stay so.
4. Without a terminal, progress is plain timestamped lines on stderr at a bounded rate (one per
   stage change, at most one per 10 s otherwise, also while no event arrives), and "retries" means
   what the run's summary means: batch attempts after the first, not provider 429 retries.

Time never comes from the wall clock here: the progress gets a fake clock, a fixed timestamp and
a heartbeat wait that moves the fake clock.
"""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from fake_clock import FakeTime
from records import role_usage, write_record

from amapreduce.cli.app import main
from amapreduce.cli.output import cost_cell, usage_json
from amapreduce.decision import Decision
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.llm.meter import Price, PriceTable, UsageMeter, format_cost
from amapreduce.llm.retry import ProviderRetry
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.solver import BatchRequest, SolverReply
from amapreduce.progress import ProgressEvent
from amapreduce.session.progress import RunProgress
from amapreduce.session.rundir import list_runs
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import SIMULATED_PRICES, FunctionModel, ModelInfo, final_answer, tool_call

PRICED = PriceTable({"gpt-priced": Price(input=1e-6, output=2e-6)}, use_litellm=False)
STAMP = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} ")


def retry_event(n: int = 1) -> ProviderRetry:
    return ProviderRetry(role="subagent", model_id="sim-model", retry=n, kind="rate_limit", delay_s=0.5, error=None)


# -- point 3: unpriced usage -----------------------------------------------------------------


def test_a_run_that_used_an_unpriced_model_has_no_cost_but_its_priced_roles_keep_theirs() -> None:
    meter = UsageMeter(prices=PRICED)
    meter.record("manager", "gpt-priced", Usage(requests=1, input_tokens=1000, output_tokens=100))
    meter.record("subagent", "local/llama", Usage(requests=3, input_tokens=5000, output_tokens=900))
    assert meter.cost_usd() is None and meter.unpriced() == ["local/llama"]
    document = meter.to_json()
    assert document["total"]["cost_usd"] is None  # was 0.0012: the priced part passed off as the whole
    assert document["total"]["prompt_tokens"] == 6000 and document["unpriced_models"] == ["local/llama"]
    assert document["by_role"]["manager"]["cost_usd"] == pytest.approx(1.2e-3)
    assert document["by_role"]["subagent"]["cost_usd"] is None
    assert meter.cost_text() == "unpriced (local/llama; $0.0012 for the priced models)"
    assert meter.total().cost_usd == pytest.approx(1.2e-3)  # what a cost budget can see is unchanged


def test_simulated_models_are_priced_at_zero_not_unpriced() -> None:
    meter = UsageMeter(prices=PriceTable(by_prefix=SIMULATED_PRICES, use_litellm=False))
    meter.record("subagent", "simulated/sandbox", Usage(requests=2, input_tokens=400, output_tokens=50))
    assert meter.cost_usd() == 0.0 and meter.unpriced() == []
    assert meter.to_json()["total"]["cost_usd"] == 0.0 and meter.cost_text() == "$0.0000"
    assert usage_json(meter) == {"requests": 2, "prompt_tokens": 400, "completion_tokens": 50, "cached_tokens": 0, "cost_usd": 0.0,
                                 "abandoned": 0, "unpriced_models": []}


def test_json_usage_says_null_and_names_the_unpriced_models() -> None:
    meter = UsageMeter(prices=PRICED)
    meter.record("subagent", "openai/my-vllm-model", Usage(requests=1, input_tokens=10, output_tokens=5))
    assert usage_json(meter) == {"requests": 1, "prompt_tokens": 10, "completion_tokens": 5, "cached_tokens": 0,
                                 "cost_usd": None, "abandoned": 0,
                                 "unpriced_models": ["openai/my-vllm-model"]}


def test_cost_text_for_people() -> None:
    assert format_cost(0.01234) == "$0.0123"
    assert format_cost(None, ["b", "a", "b"]) == "unpriced (a, b)"
    assert format_cost(None) == "unpriced"


def write_result(runs: Path, name: str, cost: float | None, unpriced: list[str], *, requests: int = 1,
                 wall_s: float = 1.0) -> None:
    total = role_usage(requests, 10 * requests, requests, cost)
    write_record(runs / name, query=name, completeness={"rows": 1}, timings={"wall_s": wall_s},
                 usage={"by_role": {"subagent": total}, "total": total, "unpriced_models": unpriced})


def test_runs_list_reports_unpriced_runs_also_from_result_files_written_before(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_result(runs, "20260101-000001-old", 0.0, ["local/llama"])  # then an unpriced model counted as $0
    write_result(runs, "20260101-000002-new", None, ["local/llama"])
    write_result(runs, "20260101-000003-priced", 0.0123, [], wall_s=3.25)
    write_result(runs, "20260101-000004-failed-early", 0.0, [], requests=0, wall_s=0.5)
    by_run = {r["run"]: r for r in list_runs(runs)}
    for name in ("20260101-000001-old", "20260101-000002-new"):
        assert by_run[name]["cost_usd"] is None and by_run[name]["unpriced_models"] == ["local/llama"]
        assert cost_cell(by_run[name]) == "unpriced (local/llama)"
    assert by_run["20260101-000003-priced"]["cost_usd"] == 0.0123 and cost_cell(by_run["20260101-000003-priced"]) == "$0.0123"
    assert by_run["20260101-000004-failed-early"]["cost_usd"] is None and cost_cell(by_run["20260101-000004-failed-early"]) == ""
    # the wall time rides along (`runs list --json`, the UI's Runs page)
    assert by_run["20260101-000003-priced"]["wall_s"] == 3.25 and by_run["20260101-000004-failed-early"]["wall_s"] == 0.5


def test_runs_list_table_shows_unpriced_not_zero_dollars(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    runs = tmp_path / "runs"
    write_result(runs, "20260101-000001-local", 0.0, ["local/llama"])
    assert main(["runs", "list", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "unpriced" in out and "0.0" not in out
    assert main(["runs", "list", "--runs-dir", str(runs), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["runs"]
    assert listed[0]["cost_usd"] is None and listed[0]["unpriced_models"] == ["local/llama"]


# An `ask` and a `mapreduce run` end to end over HTTP with a model LiteLLM has no price for.

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi"}
DECISION = {
    "task_matrix": [[c] for c in CAPITALS],
    "template": "What is the capital of __0__?",
    "json_schema": {"type": "object", "properties": {"country": {}, "capital": {"description": "city name"}}},
    "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
}


def simulated(messages: list[Any], info: ModelInfo) -> Any:
    """Plays the manager (it is offered `mapreduce`) and the sub-agents (they are not)."""
    text = "\n".join(message_text(m) for m in messages)
    if "mapreduce" in info.tools:
        if '"call_stage": "execute"' in text:
            return final_answer("The table is complete.")
        return tool_call("mapreduce", **DECISION)
    tasks = text.rsplit("Sub-questions:", 1)[-1]
    asked = [c for c in CAPITALS if f"capital of {c}?" in tasks]
    return final_answer(json.dumps([{"task": n, "country": c, "capital": CAPITALS[c]} for n, c in enumerate(asked, 1)]))


@pytest.fixture
def unpriced_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("AMAPREDUCE_API_KEY", "sk-test")
    with OpenAICompatibleServer(FunctionModel(simulated, model_id="my-local-model")) as srv, allow_model_requests():
        yield srv


def test_ask_console_and_json_show_an_unpriced_model_as_unpriced(
    unpriced_server: OpenAICompatibleServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["ask", "Capitals of France, Japan and Kenya?", "--model", "my-local-model",
            "--api-base", unpriced_server.base_url, "--no-memory"]
    assert main([*args, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["usage"]["cost_usd"] is None and document["usage"]["unpriced_models"] == ["my-local-model"]
    saved = json.loads((Path(document["run_dir"]) / "result.json").read_text(encoding="utf-8"))
    assert saved["usage"]["total"]["cost_usd"] is None and saved["usage"]["unpriced_models"] == ["my-local-model"]
    assert main(args) == 0
    err = capsys.readouterr().err
    summary = next(line for line in err.splitlines() if "Run directory" in line)
    assert "unpriced (my-local-model)" in summary and "$0.0000" not in err


def test_mapreduce_run_json_shows_an_unpriced_model_as_unpriced(
    unpriced_server: OpenAICompatibleServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps(DECISION), encoding="utf-8")
    code = main(["mapreduce", "run", str(path), "--model", "my-local-model", "--api-base", unpriced_server.base_url, "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0 and document["rows"] == 3
    assert document["usage"]["cost_usd"] is None and document["usage"]["unpriced_models"] == ["my-local-model"]


def test_the_command_line_shows_the_price_warning_the_python_api_only_logs(
    unpriced_server: OpenAICompatibleServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The package logs through a NullHandler (the API prints nothing, tests/test_api.py); a command
    puts its warnings on stderr while it runs, and only then."""
    code = main(["ask", "Capitals of France, Japan and Kenya?", "--model", "my-local-model", "--api-base",
                 unpriced_server.base_url, "--no-memory", "--max-cost", "1", "--json"])
    err = capsys.readouterr().err.splitlines()
    assert code == 0
    assert [line for line in err if "has no known price" in line] == [
        "model 'my-local-model' has no known price, so its calls count as $0 and the cost budget of $1 cannot stop "
        "them; give its price in the JSON file named by AMAPREDUCE_PRICES_FILE "
        '(e.g. {"my-local-model": {"input": 2.5e-07, "output": 2e-06}}) or use --max-tokens.']
    assert [type(h) for h in logging.getLogger("amapreduce").handlers] == [logging.NullHandler]  # none left behind


# -- point 4: progress without a terminal; one meaning of "retries" ----------------------------


def plain_progress(fake: FakeTime, stream: io.StringIO, meter: UsageMeter | None = None, **kw: Any) -> RunProgress:
    return RunProgress(meter or UsageMeter(prices=PRICED), stream=stream, clock=fake.clock, wall=lambda: 1.8e9,
                       wait=kw.pop("wait", lambda s: True), **kw)


def phase(name: str, done: int, total: int, kind: str = "phase") -> ProgressEvent:
    return ProgressEvent(kind=kind, phase=name, done=done, total=total)


def test_without_a_terminal_progress_is_timestamped_lines_at_each_stage_and_at_most_every_10_s() -> None:
    fake, stream = FakeTime(), io.StringIO()
    meter = UsageMeter(prices=PRICED)
    with plain_progress(fake, stream, meter) as progress:
        assert progress.mode == "lines"
        progress.set_stage("manager")
        progress(phase("map", 0, 4))
        fake.sleep(3)
        progress(phase("map", 1, 4, "batch_done"))  # same stage, 3 s later: no line
        fake.sleep(6)
        meter.record("subagent", "gpt-priced", Usage(requests=1, input_tokens=1000, output_tokens=500))
        progress(phase("map", 2, 4, "batch_done"))  # 9 s: still no line
        progress.tick()
        fake.sleep(1)
        progress(phase("map", 3, 4, "batch_done"))  # 10 s after the last line: one
        progress(phase("patch1", 0, 1))  # a new stage: at once
        progress.tick()  # nothing due
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4 and all(STAMP.match(line) for line in lines)
    assert [line[20:].split(" · ")[0] for line in lines] == ["manager", "map", "map", "patch1"]
    assert "map · batches 0/4 · retries 0 · 0 tokens · 0s elapsed" in lines[1]  # no price before a call
    assert "map · batches 3/4 · retries 0 · 1500 tokens · $0.0020 · 10s elapsed" in lines[2]
    assert "patch1 · batches 0/1" in lines[3]


def test_a_heartbeat_writes_a_line_every_10_s_while_no_event_arrives() -> None:
    """A long manager step sends no event; the log must still show the run is alive."""
    fake, stream = FakeTime(), io.StringIO()
    answers = iter([False, False, False, True])  # the heartbeat's waits: three timeouts, then stop

    def wait(seconds: float) -> bool:
        fake.sleep(seconds)
        return next(answers)

    meter = UsageMeter(prices=PRICED)
    meter.record("manager", "local/llama", Usage(requests=1, input_tokens=10))
    with plain_progress(fake, stream, meter, wait=wait) as progress:
        assert progress._heartbeat is not None
        progress._heartbeat.join()  # it stops after its fourth wait
    lines = stream.getvalue().splitlines()
    assert [line.rsplit(" · ", 1)[1] for line in lines] == ["10s elapsed", "20s elapsed", "30s elapsed"]
    assert all(" · unpriced (local/llama) · " in line for line in lines)  # not "$0.0000"


def test_a_disabled_progress_and_a_finished_one_write_nothing() -> None:
    fake, stream = FakeTime(), io.StringIO()
    with plain_progress(fake, stream, enabled=False) as progress:
        assert progress.mode == "off"
        progress.set_stage("manager")
    finished = plain_progress(fake, stream)
    with finished:
        pass
    finished.set_stage("late")
    fake.sleep(60)
    finished.tick()
    assert stream.getvalue() == ""


def test_the_display_counts_retries_as_the_summary_does_and_provider_retries_apart() -> None:
    """The display used to add provider 429 retries: "retries 3" beside a summary's "1 retries"."""
    fake, stream = FakeTime(), io.StringIO()
    progress = plain_progress(fake, stream)

    class Solver:
        def solve(self, request: BatchRequest) -> SolverReply:
            if request.attempt == 1:  # two 429s, then a reply that leaves the capital missing
                progress.on_provider_retry(retry_event(1))
                progress.on_provider_retry(retry_event(2))
                return SolverReply(output='[{"task": 1, "country": "France"}]', usage=Usage(requests=1))
            return SolverReply(output='[{"task": 1, "country": "France", "capital": "Paris"}]', usage=Usage(requests=1))

    decision = Decision.parse({"task_matrix": [["France"]], "template": "About __0__", "json_schema": ["country", "capital"]})
    with progress:
        result = MapReduceEngine(Solver(), config=EngineConfig(workers=1), progress=progress).run(decision)
        fake.sleep(10)
        progress.tick()
    assert result.summary.retries == 1 and result.summary.complete
    assert progress.retries == result.summary.retries and progress.provider_retries == 2
    assert "retries 1 · provider retries 2 · " in stream.getvalue().splitlines()[-1]


def test_a_piped_mapreduce_run_prints_progress_lines_on_stderr(
    unpriced_server: OpenAICompatibleServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps(DECISION), encoding="utf-8")
    assert main(["mapreduce", "run", str(path), "--model", "my-local-model", "--api-base", unpriced_server.base_url]) == 0
    err = capsys.readouterr().err.splitlines()
    progress = [line for line in err if STAMP.match(line)]
    assert any(" map · batches 0/3 · retries 0 · " in line for line in progress), err
