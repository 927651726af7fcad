"""Judges: the offline stand-ins and the model-backed judges (with simulated models)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from amapreduce.errors import RunError
from amapreduce.evaluation.judges import (
    ExactJudge,
    IdentityAligner,
    ModelAligner,
    ModelClient,
    ModelJudge,
    NormAligner,
    SubstringEntityJudge,
    entity_names,
    loose_form,
    parse_json_reply,
)
from amapreduce.llm.messages import message_text
from amapreduce.llm.reply_cache import ReplyCache
from amapreduce.testing.scripted import FunctionModel, ModelInfo, ScriptedModel


def test_loose_form_and_norm_aligner() -> None:
    assert loose_form("  Model_Name ") == loose_form("modelname") == "modelname"
    assert loose_form("Ｆｕｌｌ－ｗｉｄｔｈ") == "fullwidth"
    aligner = NormAligner()
    mapping = aligner.align(
        ["Harvard University!", "MIT", "a-b", "x"], ["harvard university", "A B", "ab", "M.I.T."]
    )
    assert mapping["Harvard University!"] == "harvard university"
    assert mapping["MIT"] == "M.I.T."
    assert "a-b" not in mapping  # two reference values share the form "ab": ambiguous
    assert "x" not in mapping
    assert IdentityAligner().align(["a"], ["a"]) == {}


def test_exact_judge_is_case_insensitive_only() -> None:
    scores = ExactJudge().judge_column(["abc", "ab c", "x"], ["ABC", "abc", "y"], "criterion")
    assert [s for s, _ in scores] == [1.0, 0.0, 0.0]


def test_parse_json_reply_takes_last_fence() -> None:
    reply = 'analysis...\n```json\n{"idx_0": 0}\n```\nfinal:\n```json\n{"idx_0": 1}\n```'
    assert parse_json_reply(reply) == {"idx_0": 1}
    assert parse_json_reply("no json") is None
    assert parse_json_reply("```json\n{broken\n```") is None


def test_model_judge_chunks_and_scores() -> None:
    prompts: list[str] = []

    def grade(messages: list, info: ModelInfo) -> str:
        text = message_text(messages[0])
        prompts.append(text)
        start = text.index("====== response-start ======") + len("====== response-start ======")
        pairs = ast.literal_eval(text[start : text.index("====== response-end ======")].strip())
        scores = {k: int(v["response"].lower() == v["target"].lower()) for k, v in pairs.items()}
        return "Item by item...\n```json\n" + json.dumps(scores) + "\n```"

    model = FunctionModel(grade)
    judge = ModelJudge(ModelClient(model), chunk_size=2)
    got = judge.judge_column(["a", "B", "c", "zz", "e"], ["A", "b", "x", "zz", "E"], "same meaning")
    assert [s for s, _ in got] == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert model.calls == 3  # 5 rows in chunks of 2
    assert "same meaning" in prompts[0] and "'idx_0'" in prompts[0]


def test_model_judge_parse_failure_scores_chunk_zero_and_missing_idx_zero() -> None:
    model = ScriptedModel(["I refuse", '```json\n{"idx_1": 1}\n```'])
    judge = ModelJudge(ModelClient(model), chunk_size=2)
    got = judge.judge_column(["a", "b", "c", "d"], ["a", "b", "c", "d"], None)
    assert [s for s, _ in got] == [0.0, 0.0, 0.0, 1.0]
    assert got[0][1] == "llm judge failed due to parse error"


def test_model_failure_raises_instead_of_scoring_zero() -> None:
    def broken(messages: list, info: ModelInfo) -> str:
        raise ConnectionError("no route to host")

    judge = ModelJudge(ModelClient(FunctionModel(broken)))
    with pytest.raises(RunError, match="no route to host"):
        judge.judge_column(["a"], ["a"], None)


def test_disk_cache_avoids_second_call(tmp_path: Path) -> None:
    model = ScriptedModel(['```json\n{"Harvard": "Harvard University"}\n```'])
    aligner = ModelAligner(ModelClient(model, ReplyCache(tmp_path)))
    first = aligner.align(["Harvard"], ["Harvard University"])
    again = ModelAligner(ModelClient(model, ReplyCache(tmp_path))).align(["Harvard"], ["Harvard University"])
    assert first == again == {"Harvard": "Harvard University"}
    assert model.calls == 1
    files = list(tmp_path.rglob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["model"] == "simulated/scripted-model"
    assert not list(tmp_path.rglob("*.tmp"))


def test_entity_names_and_substring_judge() -> None:
    assert entity_names("苏笑柏") == ["苏笑柏"]
    assert entity_names('```json\n{"entity": ["Alpha Corp", "Beta"]}\n```') == ["Alpha Corp", "Beta"]
    judge = SubstringEntityJudge()
    assert judge.judge("q", "The answer concerns BETA, the company.", '{"entity": ["Alpha Corp", "Beta"]}')
    assert not judge.judge("q", "Nothing relevant.", "苏笑柏")
    assert not judge.judge("q", "anything", "   ")
