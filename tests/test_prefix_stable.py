"""Prefix-stable prompts (issue 37, part 1): a wide run's sub-agent requests are laid out shared-first
(system prompt, tools, the batch template and columns, then the batch's entities, then page excerpts),
so a provider's prefix cache (OpenAI's and Anthropic's cached input, llama.cpp's and vLLM's KV cache)
serves most of every request; and nothing that varies per run sits in them, so two runs of the same
command send byte-identical requests.

Measured on the path users run: `mapreduce run` through HTTP against a loopback OpenAI-compatible
endpoint (a simulated model: deterministic code whose replies do not matter here, since a sub-agent's
first request is written before any reply), over the bundled sandbox corpus."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from sessions import mapreduce_run

from amapreduce.decision.model import Decision
from amapreduce.llm.guard import allow_model_requests
from amapreduce.sandbox import sandbox_world
from amapreduce.settings import load_settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply, final_answer

COUNTRIES = ["France", "Japan", "Kenya", "Peru", "Chile", "Egypt", "India", "Spain", "Italy", "Ghana", "Nepal", "Cuba"]
DECISION = {
    "task_matrix": [[c] for c in COUNTRIES], "template": "What is the capital of __0__?",
    "json_schema": {"type": "object", "properties": {"country": {}, "capital": {"description": "city name"}}},
    "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
}


def _reply(messages: list[Any], info: ModelInfo) -> Reply:
    return final_answer("[]") if info.tools else "[]"


def _request_text(body: dict[str, Any]) -> str:
    """A request as a prompt cache sees it: its tools, then its messages in order."""
    def content(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    return json.dumps(body.get("tools") or [], sort_keys=True) + "\n" + "\n".join(
        f"{m.get('role')}: {content(m.get('content'))}" for m in body["messages"])


def first_requests(tmp_path: Path, solver: str) -> list[str]:
    """Every sub-agent's first request of one `mapreduce run` (those with no reply in them yet), sorted."""
    index = sandbox_world(cache_dir=tmp_path / "cache").index_dir
    with OpenAICompatibleServer(FunctionModel(_reply, model_id="sim-model")) as server, allow_model_requests():
        settings = load_settings({}, model="sim-model", api_base=server.base_url, api_key="sk-prefix-test",
                                 runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache", search_backend=f"corpus:{index}",
                                 solver=solver, patch_rounds=0, max_attempts=1, workers=4, extraction_model="none")
        mapreduce_run(Decision.parse(DECISION), settings, show_progress=False)
    bodies = [b for b in server.requests if not any(m.get("role") in ("assistant", "tool") for m in b["messages"])]
    return sorted(_request_text(b) for b in bodies)


def shared_share(requests: list[str]) -> tuple[str, float]:
    """The requests' common prefix, and its length over the median request's."""
    prefix = os.path.commonprefix(requests)
    lengths = sorted(len(r) for r in requests)
    return prefix, len(prefix) / lengths[len(lengths) // 2]


@pytest.mark.parametrize("solver", ["agent", "read"])
def test_two_runs_of_one_command_send_byte_identical_sub_agent_requests(tmp_path: Path, solver: str) -> None:
    first = first_requests(tmp_path / "one", solver)
    again = first_requests(tmp_path / "two", solver)
    assert len(first) == len(COUNTRIES) and first == again  # nothing per run (dates, ids, counters) in them


def test_agent_sub_agents_share_almost_all_of_their_first_request(tmp_path: Path) -> None:
    requests = first_requests(tmp_path, "agent")
    prefix, share = shared_share(requests)
    assert share >= 0.8, f"the sub-agents' first requests share only {share:.0%} as a prefix"
    assert prefix.rstrip().endswith("What is the capital of")  # the entity is the first thing that differs
    assert not any(country in prefix for country in COUNTRIES)


def test_the_read_solver_puts_its_page_excerpts_after_the_shared_part(tmp_path: Path) -> None:
    """Its pages are each entity's own (most of its text), so they come last but for the sub-question:
    everything before them (instructions, columns) is the prefix every request shares."""
    requests = first_requests(tmp_path, "read")
    prefix, _ = shared_share(requests)
    for request in requests:
        excerpts = request.index("Excerpts:")
        assert excerpts < len(prefix)  # the shared part reaches the excerpts ...
        assert request.index("Sub-question:") > excerpts  # ... which the varying sub-question follows
    assert not any(country in prefix for country in COUNTRIES)
