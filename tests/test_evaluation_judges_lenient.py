"""Protocol `amapreduce`: model-judge replies parsed leniently, as the AMapReduce DeepWideSearch copy does."""

from __future__ import annotations

import pytest

from amapreduce.evaluation.judges import (
    ModelAligner,
    ModelClient,
    ModelJudge,
    parse_json_reply,
    parse_json_reply_lenient,
)
from amapreduce.testing.scripted import ScriptedModel


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('Scores: {"idx_0": 1, "idx_1": "yes"}', {"idx_0": 1, "idx_1": "yes"}),  # no fence at all
        ('```json\n{"idx_0": 1}\n```\nthen\n```json\n{broken}\n```', {"idx_0": 1}),  # last fence broken
        ('```json\n{"idx_0": 0}\n```\n```json\n{"idx_0": 1}\n```', {"idx_0": 1}),  # last good fence wins
        ('first {"a": 1} then {"b": 2} and {oops', {"b": 2}),  # the last raw object that decodes
        ('```json\n["not", "an object"]\n```', None),
        ("no json here", None),
        ("{" * 5000, None),  # never a crash
    ],
)
def test_parse_json_reply_lenient(reply: str, expected: object) -> None:
    assert parse_json_reply_lenient(reply) == expected


def test_strict_parser_is_unchanged() -> None:
    assert parse_json_reply('Scores: {"idx_0": 1}') is None
    assert parse_json_reply('```json\n{"idx_0": 1}\n```\n```json\n{broken}\n```') is None


def test_model_judge_lenient_scores_unfenced_reply() -> None:
    reply = 'Scores: {"idx_0": 1, "idx_1": "yes"}'
    strict = ModelJudge(ModelClient(ScriptedModel([reply])), normalize=True)
    assert [s for s, _ in strict.judge_column(["a", "b"], ["a", "b"], None)] == [0.0, 0.0]
    lenient = ModelJudge(ModelClient(ScriptedModel([reply])), normalize=True, lenient=True)
    assert [s for s, _ in lenient.judge_column(["a", "b"], ["a", "b"], None)] == [1.0, 1.0]


def test_model_aligner_lenient() -> None:
    reply = 'Mapping: {"Harvard": "Harvard University"}'
    assert ModelAligner(ModelClient(ScriptedModel([reply]))).align(["Harvard"], ["Harvard University"]) == {}
    lenient = ModelAligner(ModelClient(ScriptedModel([reply])), lenient=True)
    assert lenient.align(["Harvard"], ["Harvard University"]) == {"Harvard": "Harvard University"}
