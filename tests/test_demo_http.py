"""The real client path: the simulated model behind the loopback OpenAI-compatible server,
driven by `ask` through smolagents' OpenAIModel, on a sandbox task, with 429s on the way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amapreduce.demo.faults import FaultPlan
from amapreduce.demo.model import SimulatedAtlasModel
from amapreduce.demo.run import load_sandbox_tasks, score_answer
from amapreduce.llm.guard import allow_model_requests
from amapreduce.session import RunOptions, Session
from amapreduce.settings import Settings, load_settings
from amapreduce.testing.openai_server import OpenAICompatibleServer


@pytest.fixture
def server() -> Any:
    model = SimulatedAtlasModel(faults=FaultPlan(rate=0.1, seed=3), model_id="simulated-sandbox")
    with OpenAICompatibleServer(model, rate_limit_first=2, retry_after_s=0.05) as srv, allow_model_requests():
        yield srv


def test_ask_over_http_solves_a_sandbox_task(server: OpenAICompatibleServer, tmp_path: Path) -> None:
    tasks, world = load_sandbox_tasks(Settings(cache_dir=tmp_path / "cache"))
    task = tasks["sbx_en_002"]
    settings = load_settings(
        {}, model="simulated-sandbox", api_base=server.base_url, api_key="sk-local", runs_dir=tmp_path / "runs",
        cache_dir=tmp_path / "cache", search_backend=f"corpus:{world.index_dir}", extraction_model="none", workers=3,
    )
    with Session(settings, RunOptions(query=task.query, task_id=task.instance_id, show_progress=False)) as session:
        outcome = session.ask()
    assert outcome.status == "complete"
    assert score_answer(task, world.gold_dir, outcome.markdown)["score"] == 1.0
    assert type(session.models["subagent"].inner).__name__ == "OpenAIModel"  # the real client class
    usage = outcome.meter.by_role()
    assert usage["manager"].requests >= 3 and usage["subagent"].requests >= 6
    assert len(server.requests) > usage["manager"].requests + usage["subagent"].requests  # 429s were retried
    assert all(r["model"] == "simulated-sandbox" for r in server.requests)
    assert {t["function"]["name"] for t in server.requests[0]["tools"]} >= {"web_search", "crawl_page", "mapreduce"}
