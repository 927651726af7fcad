"""What the spans of a run say (issue 25): one span per tool call, the root's cost as `result.json`
has it, `OPENINFERENCE_HIDE_*` honoured by our own spans, eval trials labelled, and the simulated
model's calls traced as LLM spans like a real model's.

Before: every manager tool call was two nested TOOL spans (the manager's clipping copy called the
tool again through `Tool.__call__`); the root said `cost_usd 0.0` where `result.json` said null;
the question and the whole table were exported with `OPENINFERENCE_HIDE_INPUTS/OUTPUTS=true`; an
evaluation's root spans named no task or trial; the demo's trace had no LLM span at all.

Offline: spans go to the SDK's in-memory exporter; the models are simulated (deterministic code,
not LLMs), in process (the demo, the sandbox evaluation) or behind the loopback server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from amapreduce import telemetry
from amapreduce.cli.app import main
from amapreduce.demo.run import run_demo
from amapreduce.session.rundir import slugify
from amapreduce.settings import Settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from tests.test_cli_exit_codes import Items, serving, workdir  # noqa: F401 - `workdir`: an autouse fixture
from tests.test_otel import Tree, all_text, tracing_off_after  # noqa: F401 - `tracing_off_after`: autouse

QUESTION = "What is the code of each item?"


@pytest.fixture
def exported() -> InMemorySpanExporter:
    """Tracing on, to an in-memory exporter (`tracing_off_after` turns it off)."""
    exporter = InMemorySpanExporter()
    telemetry.enable(exporter=exporter)
    return exporter


@pytest.fixture
def server() -> Iterator[OpenAICompatibleServer]:
    with serving(Items()) as srv:
        yield srv


def kind(span: object) -> object:
    return getattr(span, "attributes", {}).get("openinference.span.kind")


def ask_over_http(server: OpenAICompatibleServer, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    code = main(["ask", QUESTION, "--model", "sim-model", "--api-base", server.base_url, "--no-memory", "--otel",
                 "--json"])
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    assert code == 0 and out["status"] == "complete"
    return out


def run_record(folder: Path) -> dict[str, object]:
    (run_dir,) = (folder / "runs").iterdir()
    record: dict[str, object] = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    return record


def test_the_demo_traces_each_tool_call_once_and_each_model_call_as_an_llm_span(
    exported: InMemorySpanExporter, tmp_path: Path,
) -> None:
    settings = Settings.model_validate({"cache_dir": tmp_path / "cache", "runs_dir": tmp_path / "runs", "workers": 4})
    outcome = run_demo("sbx_en_001", settings)
    assert outcome.ask.status == "complete"
    tree = Tree(exported.get_finished_spans())
    tools = [s for s in tree.spans if kind(s) == "TOOL"]
    assert tools and not [s for s in tools if kind(tree.parent(s)) == "TOOL"]  # none nested in another
    steps = [json.loads(line) for line in (outcome.ask.run_dir.path / "trace.jsonl").read_text().splitlines()]
    manager_calls = [c for e in steps if e["event"] == "manager_step" for c in e.get("tool_calls") or []]
    mapreduce_spans = [s for s in tools if s.attributes.get("tool.name") == "mapreduce"]
    assert len(mapreduce_spans) == outcome.ask.record.completeness.mapreduce_calls >= 1
    assert len([s for s in tools if s.attributes.get("tool.name") != "final_answer"]) >= len(
        [c for c in manager_calls if c.get("name") != "final_answer"])
    llm = [s for s in tree.spans if kind(s) == "LLM"]
    usage = outcome.ask.record.usage.total
    assert len(llm) == usage.requests > 0  # every model call, manager's and sub-agents', once
    assert all(any(kind(a) == "AGENT" for a in tree.ancestors(s)) for s in llm)
    assert all(s.attributes.get("llm.token_count.prompt") for s in llm)
    (root,) = tree.named("amapreduce.run")
    assert root.attributes["amapreduce.cost_usd"] == pytest.approx(usage.cost_usd)  # the demo prices its model


def test_an_unpriced_run_has_no_cost_on_its_root_span(
    exported: InMemorySpanExporter, server: OpenAICompatibleServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out = ask_over_http(server, capsys)
    assert out["usage"]["cost_usd"] is None and run_record(tmp_path)["usage"]["total"]["cost_usd"] is None
    (root,) = Tree(exported.get_finished_spans()).named("amapreduce.run")
    assert "amapreduce.cost_usd" not in root.attributes
    assert list(root.attributes["amapreduce.unpriced_models"]) == ["sim-model"]


def test_openinference_hide_inputs_and_outputs_hide_our_question_and_table(
    server: OpenAICompatibleServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("OPENINFERENCE_HIDE_INPUTS", "true")
    monkeypatch.setenv("OPENINFERENCE_HIDE_OUTPUTS", "true")
    exporter = InMemorySpanExporter()
    telemetry.enable(exporter=exporter)
    out = ask_over_http(server, capsys)
    finished = exporter.get_finished_spans()
    (root,) = Tree(finished).named("amapreduce.run")
    assert root.attributes["input.value"] == root.attributes["output.value"] == "__REDACTED__"
    text = all_text(finished)
    assert not [t for t in text if QUESTION in t]
    slug = slugify(QUESTION)  # the run folder's name: not the session id, not a path on any span
    assert len(slug) > 10 and not [t for t in text if slug[:12] in t]
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{10}", str(root.attributes["session.id"]))
    table_row = str(out["table_markdown"]).splitlines()[3]  # a row of the answer: in no span
    assert table_row.startswith("|") and not [t for t in text if table_row in t]


def test_each_eval_trial_root_span_names_its_task_and_trial(
    exported: InMemorySpanExporter, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["eval", "run", "--benchmark", "sandbox", "--ids", "sbx_en_001", "--trials", "2", "--no-memory",
                 "--out", str(tmp_path / "ev"), "--otel", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["status"] == "complete"
    roots = Tree(exported.get_finished_spans()).named("amapreduce.run")
    assert sorted((r.attributes["amapreduce.task_id"], r.attributes["amapreduce.trial"]) for r in roots) == [
        ("sbx_en_001", 1), ("sbx_en_001", 2)]
    assert all(r.attributes["amapreduce.kind"] == "eval" for r in roots)
