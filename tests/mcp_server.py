"""A small stdio MCP server for tests/test_mcp.py (run as `python tests/mcp_server.py`).

Tools:
* `capital(country)`: the capital of a few countries. With `MCP_TEST_GATHER=N` in its
  environment, each call waits until N calls are in flight at once before answering, so a client
  that sent them one at a time would never see an answer (the test's proof that calls from
  several sub-agent threads share the session concurrently); a safety limit ends the wait after
  `MCP_TEST_GATHER_LIMIT_S` seconds (default 60) so a broken client fails instead of hanging.
  Each call is logged as one JSON line `{"country", "in_flight"}` to `MCP_TEST_LOG` when set.
* `echo(text, times)`: `text` repeated `times` times (default 1), for argument and output tests.
* `describe(place, note)`: a nested object argument (a `$ref` in the schema) and an optional one.
* `web_search(query)`: clashes with the sub-agents' own tool of that name.
* `broken()`: always fails (an MCP error result saying `the broken tool broke`).

`MCP_TEST_PID_FILE`, when set, receives the server's process id, so a test can check the process
is gone once the client closed.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

CAPITALS = {"france": "Paris", "japan": "Tokyo", "kenya": "Nairobi", "peru": "Lima", "chile": "Santiago"}

server = MCPServer("facts")
_state = {"in_flight": 0}
_gathered = asyncio.Event()


@server.tool()
async def capital(country: str) -> str:
    """The capital city of a country."""
    gather = int(os.environ.get("MCP_TEST_GATHER", "0"))
    _state["in_flight"] += 1
    in_flight = _state["in_flight"]
    if in_flight >= gather:
        _gathered.set()
    try:
        if gather:
            await asyncio.wait_for(_gathered.wait(), float(os.environ.get("MCP_TEST_GATHER_LIMIT_S", "60")))
    except TimeoutError:
        pass  # reported through the log: in_flight stays below the number asked for
    finally:
        _state["in_flight"] -= 1
    log = os.environ.get("MCP_TEST_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"country": country, "in_flight": in_flight, "gathered": _gathered.is_set()}) + "\n")
    return f"The capital of {country} is {CAPITALS.get(country.lower(), 'unknown')}."


@server.tool()
def echo(text: str, times: int = 1) -> str:
    """Repeat a text."""
    return text * times


class Place(BaseModel):
    city: str
    country: str


@server.tool()
def describe(place: Place, note: str | None = None) -> str:
    """Describe a place (its argument schema has a `$ref` and an optional `anyOf`)."""
    return f"{place.city}, {place.country}" + (f" ({note})" if note else "")


@server.tool()
def web_search(query: str) -> str:
    """A tool whose name the sub-agents already use."""
    return f"mcp results for {query}"


@server.tool()
def broken() -> str:
    """Always fails."""
    raise ToolError("the broken tool broke")


if __name__ == "__main__":
    pid_file = os.environ.get("MCP_TEST_PID_FILE")
    if pid_file:
        Path(pid_file).write_text(str(os.getpid()), encoding="utf-8")
    server.run("stdio")
