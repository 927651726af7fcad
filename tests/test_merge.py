"""The merge call of discovery: its prompt, lenient reply reading, and the never-drop rules."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from smolagents.models import ChatMessage

from amapreduce.llm.factory import build_role_model, new_meter
from amapreduce.llm.messages import message_text
from amapreduce.llm.tokens import TokenCounter
from amapreduce.mapreduce.merge import (
    Candidate,
    MergeGroup,
    ModelMerger,
    merge_prompt,
    normalize_groups,
    parse_merge_reply,
)
from amapreduce.mapreduce.tree_reduce import Node
from amapreduce.settings import load_settings
from amapreduce.testing.scripted import FunctionModel, ModelInfo

NODE = Node("final", 1, 0, 2, 40)
CITIES = [
    Candidate("c0", {"City": "Saint Petersburg", "Country": "Russia"}),
    Candidate("c1", {"City": "St. Petersburg", "Country": "Russia"}),
    Candidate("c2", {"City": "Oslo", "Country": "Norway"}),
]


def test_prompt_has_the_contract_first_line_and_ends_with_the_candidates() -> None:
    system, user = merge_prompt(CITIES[:2], ["City", "Country"])
    assert system.splitlines()[0] == "You merge lists of candidate entities: decide which candidates name the same entity."
    assert "City, Country" in system
    assert user.endswith(
        "Candidates (one JSON object per line):\n"
        '{"id": "c0", "City": "Saint Petersburg", "Country": "Russia"}\n'
        '{"id": "c1", "City": "St. Petersburg", "Country": "Russia"}'
    )
    assert '{"groups": [{"ids": ["c0", "c1"], "keep": "c0"}, {"ids": ["c2"], "keep": "c2"}]}' in user


@pytest.mark.parametrize(
    "text",
    [
        '{"groups": [{"ids": ["c0", "c1"], "keep": "c1"}]}',
        'Here you go:\n```json\n{"groups": [{"ids": ["c0", "c1"], "keep": "c1"}]}\n```',
        "{'groups': [{'ids': ['c0', 'c1'], 'keep': 'c1',}],}",
        '[{"ids": ["c0", "c1"], "keep": "c1"}]',
    ],
)
def test_replies_are_read_leniently(text: str) -> None:
    groups, warnings = normalize_groups(parse_merge_reply(text), ["c0", "c1", "c2"])
    assert groups == (MergeGroup(("c0", "c1"), "c1"), MergeGroup(("c2",), "c2"))
    assert warnings == []


def test_unreadable_reply_has_no_groups() -> None:
    assert parse_merge_reply("I cannot help with that.") is None
    assert parse_merge_reply('{"answer": 3}') is None


def test_left_out_ids_stay_alone_and_unknown_ids_are_warned(caplog: pytest.LogCaptureFixture) -> None:
    raw = [{"ids": ["c2", "c9"], "keep": "c9"}, {"ids": ["c2", "c0"], "keep": "c0"}, ["c1", "c3"]]
    with caplog.at_level(logging.WARNING):
        groups, warnings = normalize_groups(raw, ["c0", "c1", "c2", "c3", "c4"])
    # c9 unknown; c2 listed twice (kept in its first group, whose `keep` falls back to c2); c4 left out
    assert groups == (
        MergeGroup(("c0",), "c0"), MergeGroup(("c1", "c3"), "c1"), MergeGroup(("c2",), "c2"), MergeGroup(("c4",), "c4"),
    )
    assert any("unknown candidate id 'c9'" in w for w in warnings)
    assert any("'c2' in two groups" in w for w in warnings)
    assert any("keeps 'c9'" in w for w in warnings)
    assert "unknown candidate id 'c9'" in caplog.text


def _merging_model(replies: list[str]) -> FunctionModel:
    def reply(messages: list[ChatMessage], info: ModelInfo) -> str:
        return replies[info.call_index]

    return FunctionModel(reply, model_id="sim/merger")


def test_model_merger_makes_one_call_and_groups() -> None:
    seen: list[list[str]] = []

    def reply(messages: list[ChatMessage], info: ModelInfo) -> str:
        seen.append([message_text(m) for m in messages])
        return json.dumps({"groups": [{"ids": ["c1", "c0"], "keep": "c0"}]})

    model = FunctionModel(reply, model_id="sim/merger")
    merger = ModelMerger(model, counter=TokenCounter(None))
    out = merger.merge(CITIES, NODE)
    assert model.calls == 1 and merger.calls == 1
    assert out.groups == (MergeGroup(("c0", "c1"), "c0"), MergeGroup(("c2",), "c2"))
    assert seen[0][0].startswith("You merge lists of candidate entities")
    assert seen[0][1].endswith(CITIES[2].line())
    assert out.prompt_tokens == merger.counter.count(f"{seen[0][0]}\n{seen[0][1]}")  # no provider usage: counted
    assert out.prompt_tokens > merger.overhead_tokens(["City", "Country"]) > 0


def test_model_merger_never_drops_on_a_bad_reply() -> None:
    merger = ModelMerger(_merging_model(["no idea"]), counter=TokenCounter(None))
    out = merger.merge(CITIES, NODE)
    assert [g.ids for g in out.groups] == [("c0",), ("c1",), ("c2",)]
    assert out.warnings and "held no groups" in out.warnings[0]


def test_merge_usage_goes_through_the_meter() -> None:
    settings = load_settings({})
    meter = new_meter(settings)
    inner = _merging_model(['{"groups": [{"ids": ["c0", "c1"], "keep": "c1"}]}'])
    managed = build_role_model(settings, "subagent", "sim/merger", meter=meter, inner=inner)
    out = ModelMerger(managed).merge(CITIES, NODE)
    assert meter.by_role()["subagent"].requests == 1
    assert out.usage.requests == 1 and out.usage.input_tokens > 0
    assert out.prompt_tokens == out.usage.input_tokens  # the provider's (here: simulated) count wins
    assert out.groups[0] == MergeGroup(("c0", "c1"), "c1")


def test_candidate_line_is_compact_json() -> None:
    line: dict[str, Any] = json.loads(Candidate("c7", {"Name": "Zoë"}).line())
    assert line == {"id": "c7", "Name": "Zoë"}
    assert "Zoë" in Candidate("c7", {"Name": "Zoë"}).line()


def test_a_cached_reply_is_not_asked_again(tmp_path: Path) -> None:
    from amapreduce.llm.reply_cache import ReplyCache

    model = _merging_model(['{"groups": [{"ids": ["c0", "c1"], "keep": "c0"}]}'])
    first = ModelMerger(model, counter=TokenCounter(None), cache=ReplyCache(tmp_path))
    asked = first.merge(CITIES, NODE)
    again = ModelMerger(model, counter=TokenCounter(None), cache=ReplyCache(tmp_path)).merge(CITIES, NODE)
    assert model.calls == 1 and not asked.cached and again.cached
    assert again.groups == asked.groups and again.usage.requests == 0
    other = ModelMerger(_merging_model(["{}"]), counter=TokenCounter(None), cache=ReplyCache(tmp_path))
    assert not other.merge(CITIES[1:], NODE).cached  # another prompt: asked
