"""`amapreduce demo --serve`: the simulated model as a loopback OpenAI-compatible endpoint.

It lets anyone run `ask` (or `eval run`, `mapreduce run`) through the real client path — LiteLLM
or smolagents' OpenAI client, HTTP, JSON tool calls — offline, against the sandbox atlas. The
endpoint accepts any model name. Its replies are the simulated model's (deterministic code, not
an LLM): `SimulatedAtlasModel` for the manager and the sub-agents, `SimulatedMemoryModel` for the
memory's projection and distillation prompts, told apart by the prompt as a real model would see it.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amapreduce.demo.discovery import Scouting
from amapreduce.demo.memory_model import SimulatedMemoryModel
from amapreduce.demo.model import SIMULATED_MODEL_ID, SimulatedAtlasModel
from amapreduce.llm.messages import message_text
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply

__all__ = ["MEMORY_PROMPT_MARKS", "SERVED_MODEL_NAME", "ask_command", "serve", "serving_model"]

SERVED_MODEL_NAME = "simulated"
"""The model name the printed command uses (the endpoint accepts any)."""
MEMORY_PROMPT_MARKS = ("### Historical hints", "## SUCCESSFUL decision", "## Current batching hints")
"""Headings only the memory's prompts (prompts/memory.yaml) contain."""


def serving_model(scouting: Scouting = "mapreduce") -> FunctionModel:
    """One model answering every role: memory prompts go to the simulated memory model, the rest to
    the simulated atlas model (whose manager scouts discovery tasks as `scouting` says)."""
    atlas, memory = SimulatedAtlasModel(scouting=scouting), SimulatedMemoryModel()

    def reply(messages: list[Any], info: ModelInfo) -> Reply:
        text = "\n".join(message_text(m) for m in messages)
        chosen = memory if any(mark in text for mark in MEMORY_PROMPT_MARKS) else atlas
        return chosen.function(messages, info)

    return FunctionModel(reply, model_id=SIMULATED_MODEL_ID)


def ask_command(query: str, base_url: str, index_dir: Any) -> str:
    """The exact `ask` command line to run against the endpoint at `base_url`."""
    return ("AMAPREDUCE_EXTRACTION_MODEL=none amapreduce ask " + shlex.quote(query)
            + f" --model {SERVED_MODEL_NAME} --api-base {base_url} --search corpus:{Path(index_dir).resolve()}")


def serve(port: int, index_dir: Any, query: str, *, echo: Callable[[str], None],
          wait: Callable[[], None], scouting: Scouting = "mapreduce",
          command: Callable[[str], str] | None = None) -> int:
    """Serve until `wait` returns (the CLI waits for Ctrl-C); return the number of requests answered.
    The command line printed is `ask`'s for `query`, or `command(base_url)` when given (an
    enrichment task's `enrich` command)."""
    from amapreduce.testing.openai_server import OpenAICompatibleServer

    with OpenAICompatibleServer(serving_model(scouting), port=port, keep_requests=False) as server:
        echo(f"Serving the simulated model (deterministic code, not an LLM) at {server.base_url} "
             "(loopback only; any model name is accepted). Ctrl-C stops it. In another terminal:")
        echo(command(server.base_url) if command is not None else ask_command(query, server.base_url, index_dir))
        wait()
        return server.request_count
