"""Prefix-stable prompts beyond the sub-agents' first requests (issue 37, part 1): the manager's
requests, a sub-agent's later steps and the delta-patch rounds' requests are laid out so that a
provider's prefix cache serves them too.

* An agent's conversation only grows: each of its requests begins with the whole of its previous one
  (nothing earlier is rewritten, nothing per step — a counter, a remaining budget — is inserted), so
  a server's cache of the last request is the prefix of the next.
* Two runs of one command send the same manager requests, byte for byte, and the same first requests
  of a patch round (tool-call ids are the provider's, so later steps of a sub-agent differ there).
* A patch round's requests share their instructions, columns and the sub-question's start: the
  entity is the first thing that differs.

Measured on the path users run: `ask` and `mapreduce run` through HTTP against a loopback
OpenAI-compatible endpoint; the models are simulated (deterministic code playing the manager and
the sub-agents through the same messages a real model gets)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sessions import ask, manager_then_subagents, mapreduce_run
from test_prefix_stable import _request_text, shared_share

from amapreduce.decision.model import Decision
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.sandbox import sandbox_world
from amapreduce.settings import load_settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply, final_answer, tool_call

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima", "Chile": "Santiago",
            "Egypt": "Cairo", "India": "New Delhi", "Spain": "Madrid"}
DECISION = {
    "task_matrix": [[c] for c in CAPITALS], "template": "What is the capital of __0__?",
    "json_schema": {"type": "object", "properties": {"country": {}, "capital": {"description": "city name"}}},
    "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
}
PATCH_MARK = "Only this entry is still needed"


def _tools(body: dict[str, Any]) -> set[str]:
    return {str((t.get("function") or {}).get("name")) for t in body.get("tools") or []}


def _asked(messages: list[Any]) -> list[str]:
    return re.findall(r"capital of (\w+)\?", "\n".join(message_text(m) for m in messages).rsplit("Sub-questions:", 1)[-1])


def _answers(tasks: str) -> list[dict[str, Any]]:
    return [{"country": c, "capital": v} for c, v in CAPITALS.items() if f"capital of {c}?" in tasks]


def _extends(requests: list[dict[str, Any]]) -> bool:
    """Each request of one conversation begins with the whole of the one before (its text and its messages)."""
    texts = [_request_text(b) for b in requests]
    return all(later.startswith(earlier) and b["messages"][:len(a["messages"])] == a["messages"]
               for earlier, later, a, b in zip(texts, texts[1:], requests, requests[1:], strict=False))


def _without_call_ids(requests: list[dict[str, Any]]) -> str:
    """The requests' text but for their tool-call ids, which the provider writes (the simulated
    server numbers them across the process; OpenAI's are random)."""
    return re.sub(r"call_[0-9]{8}", "call_ID", json.dumps(requests, sort_keys=True))


def _ask_requests(tmp_path: Path) -> list[dict[str, Any]]:
    with OpenAICompatibleServer(FunctionModel(manager_then_subagents(DECISION, _answers), model_id="sim-model")) as server, \
            allow_model_requests():
        settings = load_settings({}, model="sim-model", api_base=server.base_url, api_key="sk-prefix-roles",
                                 runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache", extraction_model="none")
        outcome = ask("Capitals of eight countries?", settings, web_tools=[], show_progress=False)
    assert outcome.status == "complete"
    return [b for b in server.requests if "mapreduce" in _tools(b)]


def test_the_managers_requests_repeat_across_runs_and_each_extends_the_last(tmp_path: Path) -> None:
    first, again = _ask_requests(tmp_path / "one"), _ask_requests(tmp_path / "two")
    assert len(first) == 3  # the plan stage, the execution, the final answer
    assert _without_call_ids(first) == _without_call_ids(again)  # nothing per run (dates, run ids, timings) in them
    assert _extends(first)  # the plan stage's reply and the tool's answers are appended, nothing rewritten


def _sub_agent(patching: bool) -> Any:
    """A sub-agent that searches once, then answers from what it was asked; with `patching`, its first
    round leaves Kenya's and Peru's capitals empty so that a patch round asks for them."""
    def reply(messages: list[Any], info: ModelInfo) -> Reply:
        if not any(str(getattr(m, "role", "")).endswith("ASSISTANT") for m in messages) and "web_search" in info.tools:
            return tool_call("web_search", query=f"capital of {_asked(messages)[0]}")
        text = "\n".join(message_text(m) for m in messages)
        rows = [{"task": 1, "country": c, "capital": "" if patching and PATCH_MARK not in text and c in ("Kenya", "Peru")
                 else CAPITALS[c]} for c in _asked(messages)[:1]]
        return final_answer(json.dumps(rows))
    return reply


def _run_requests(tmp_path: Path, *, patching: bool) -> list[dict[str, Any]]:
    index = sandbox_world(cache_dir=tmp_path / "cache").index_dir
    with OpenAICompatibleServer(FunctionModel(_sub_agent(patching), model_id="sim-model")) as server, allow_model_requests():
        settings = load_settings({}, model="sim-model", api_base=server.base_url, api_key="sk-prefix-roles",
                                 runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache", search_backend=f"corpus:{index}",
                                 solver="agent", patch_rounds=1 if patching else 0, max_attempts=1, workers=4,
                                 extraction_model="none")
        outcome = mapreduce_run(Decision.parse(DECISION), settings, show_progress=False)
    assert outcome.status == "complete"
    return list(server.requests)


def _conversations(requests: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The requests by sub-agent (its system prompt and task message), in the order they were sent."""
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for body in requests:
        by_agent.setdefault(json.dumps(body["messages"][:2], sort_keys=True), []).append(body)
    return by_agent


def test_each_step_of_a_sub_agent_extends_its_last_request(tmp_path: Path) -> None:
    conversations = _conversations(_run_requests(tmp_path, patching=False))
    assert len(conversations) == len(CAPITALS)
    for steps in conversations.values():
        assert len(steps) == 2 and _extends(steps)  # the search's call and its results appended, nothing rewritten


def _patch_first_requests(tmp_path: Path) -> list[str]:
    requests = _run_requests(tmp_path, patching=True)
    firsts = [b for b in requests if not any(m.get("role") in ("assistant", "tool") for m in b["messages"])]
    return sorted(_request_text(b) for b in firsts if PATCH_MARK in _request_text(b))


def test_a_patch_rounds_requests_share_their_prefix_and_repeat_across_runs(tmp_path: Path) -> None:
    patches = _patch_first_requests(tmp_path / "one")
    assert len(patches) == 2  # Kenya's and Peru's capitals
    assert patches == _patch_first_requests(tmp_path / "two")
    prefix, share = shared_share(patches)
    assert share >= 0.8, f"the patch round's requests share only {share:.0%} as a prefix"
    assert prefix.rstrip().endswith("What is the capital of")  # the entity is the first thing that differs
