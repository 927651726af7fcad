"""The manager agent's tools: its observations are cut, the sub-agents' tools are not."""

from __future__ import annotations

from smolagents import Tool

from amapreduce.agents.manager import build_manager
from amapreduce.testing.scripted import ScriptedModel, final_answer, tool_call

PAGE = "x" * 500


class Crawl(Tool):
    """Stands in for `crawl_page`: one long page, and a count of calls kept on the tool."""

    name = "crawl_page"
    description = "Read a page."
    inputs = {"url": {"type": "string", "description": "the page"}}
    output_type = "string"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, url: str) -> str:
        self.calls += 1
        return PAGE


def test_manager_truncation_leaves_the_shared_tool_uncut() -> None:
    """The web tools given to the manager are the sub-agents' own objects: cutting them in place
    once cut every sub-agent page read to the manager's limit."""
    crawl = Crawl()
    model = ScriptedModel([tool_call("crawl_page", url="https://example.org"), final_answer("done")])
    agent = build_manager(model, [crawl], observation_chars=50)
    manager_view = agent.tools["crawl_page"](url="https://example.org")
    assert manager_view.startswith("x" * 50) and "[450 more characters not shown]" in manager_view
    assert crawl(url="https://example.org") == PAGE  # what a sub-agent gets
    assert agent.run("read it") == "done"
    assert crawl.calls == 3  # the manager's copy calls the original tool, whose state is the one updated
    assert "[450 more characters not shown]" in str(agent.memory.steps[-2].observations)
