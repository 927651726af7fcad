"""Client CPU benchmark: what one sub-agent call costs the process, through the openai SDK's
`chat.completions.create` and through amapreduce's lean client (`amapreduce.llm.chat_client`).

A wide run is CPU-bound in one process (issue 28): the GIL time of each model call, not the
provider's latency, sets how many calls a second the fan-out can keep in flight. This script
measures that CPU offline and single-threaded, so the figures do not depend on a server or on
other load: the replies come from httpx's `MockTransport` (no socket, no sleep).

Per client it prints the CPU (`time.process_time`) of

* one `chat.completions.create` with a sub-agent-sized request (a 3,000-character system prompt,
  the batch prompt, a tool call and its result, two tools), reply parsed (the SDK: to its pydantic
  `ChatCompletion`; amapreduce's client: `json.loads` and an attribute view);
* one whole sub-agent attempt through `SmolagentsSolver` (a fresh smolagents `ToolCallingAgent`
  per attempt): a `web_search` step then `final_answer`, two model calls;

best of `--repeat` rounds of `--n` each, and the raw floor (httpx post + `json.loads`).

Run: `.venv/bin/python benchmarks/bench_client.py`; `--smoke` is its smallest size.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
from smolagents import OpenAIModel, Tool
from smolagents.models import get_tool_json_schema

from amapreduce.decision.columns import ColumnSpec
from amapreduce.llm.chat_client import ChatCompletionsClient
from amapreduce.mapreduce.solver import BatchRequest, SmolagentsSolver

SMOKE = ["--n", "5", "--repeat", "1"]
"""`--smoke`: the smallest run (checks that it runs)."""

BASE_URL = "http://127.0.0.1:9/v1"


def _reply(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "bench", "object": "chat.completion", "created": 0, "model": "oracle",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call-1", "type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}]}}],
        "usage": {"prompt_tokens": 900, "completion_tokens": 30, "total_tokens": 930},
    }


SEARCH = _reply("web_search", {"query": "Country_001 capital population currency"})
FINAL = _reply("final_answer", {"answer": json.dumps([{"task": 1, "country": "Country_001", "capital": "Abc",
                                                       "population": "1000", "currency": "Xyz"}])})


def _handler(request: httpx.Request) -> httpx.Response:
    """The sub-agent's two steps: search first, then the final answer once a tool result is in."""
    messages = json.loads(request.content)["messages"]
    answered = any(m.get("role") in ("tool", "tool-response") for m in messages)
    return httpx.Response(200, json=FINAL if answered else SEARCH)


def _sdk() -> openai.OpenAI:
    return openai.OpenAI(base_url=BASE_URL, api_key="bench", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(_handler)))


class _WebSearch(Tool):  # type: ignore[misc,unused-ignore]  # smolagents may be untyped
    name = "web_search"
    description = "Search the web."
    inputs = {"query": {"type": "string", "description": "the query"}}
    output_type = "string"

    def forward(self, query: str) -> str:
        return "No results."


def _cpu_ms(fn: Callable[[], object], n: int, repeat: int) -> float:
    """Best-of-`repeat` CPU milliseconds of one `fn()` (`n` calls per round, one warm-up round)."""
    for _ in range(n):
        fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, time.process_time() - start)
    return 1000.0 * best / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="calls (or attempts) per round")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best is reported")
    parser.add_argument("--smoke", action="store_true", help="the smallest run: " + " ".join(SMOKE))
    args = parser.parse_args()
    if args.smoke:
        args = parser.parse_args(SMOKE)

    tools = [_WebSearch()]
    params = {
        "model": "oracle",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "You are a search sub-agent. " * 100}]},
            {"role": "user", "content": "Find the capital, population and currency of:\n1. Country_001"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call-1", "type": "function", "function": {"name": "web_search", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call-1", "content": "No results."},
        ],
        "tools": [get_tool_json_schema(t) for t in tools] * 2,
        "tool_choice": "required",
    }
    request = BatchRequest(batch_id="batch-001", attempt=1, prompt="Find the capital, population and currency of:\n1. Country_001",
                           tasks=("Country_001",), column_specs=(ColumnSpec(name="country"),))
    raw = httpx.Client(transport=httpx.MockTransport(_handler))
    floor = _cpu_ms(lambda: raw.post(f"{BASE_URL}/chat/completions", json=params).json(), args.n, args.repeat)
    print(f"CPU per model call and per sub-agent attempt, offline (httpx MockTransport), single thread, "
          f"best of {args.repeat} x {args.n}")
    print(f"{'client':<34} {'ms / call':>9} {'ms / attempt (2 calls)':>23}")
    print(f"{'raw httpx post + json.loads':<34} {floor:>9.2f} {'-':>23}")
    for name, lean in (("openai SDK chat.completions.create", False), ("amapreduce ChatCompletionsClient", True)):
        client: Any = ChatCompletionsClient(
            base_url=BASE_URL, api_key="bench", http_client=httpx.Client(transport=httpx.MockTransport(_handler)),
        ) if lean else _sdk()
        per_call = _cpu_ms(lambda c=client: c.chat.completions.create(**params), args.n, args.repeat)
        model = OpenAIModel(model_id="oracle", api_key="bench", api_base=BASE_URL)
        model.client = client
        solver = SmolagentsSolver(model=model, tools=tools, max_steps=3)
        per_attempt = _cpu_ms(lambda s=solver: s.solve(request), args.n, args.repeat)
        print(f"{name:<34} {per_call:>9.2f} {per_attempt:>23.2f}")


if __name__ == "__main__":
    main()
