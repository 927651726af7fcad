"""Text from models, tools and users is data (issue 17): a lone surrogate, a zero-width key or a
reply nested too deeply is handled at the boundary where it enters, and never ends a run or prints
a traceback.

The regressions of the issue's "Why": a sub-agent reply carrying `"\\ud83d"` (a split emoji) ended
the run with 0 rows kept; `mapreduce plan` printed a traceback for a decision holding `"\\ud800"`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from amapreduce._text import REPLACEMENT, is_clean
from amapreduce.cli.app import main
from amapreduce.decision.model import Decision
from amapreduce.evaluation.answer import parse_answer_table
from amapreduce.evaluation.loaders import load_predictions_jsonl, load_tasks
from amapreduce.mapreduce.replies import cell_text, parse_reply, project_row
from amapreduce.table.keys import is_blank
from amapreduce.table.table import Table
from amapreduce.web.main_text import extract_main_text

COUNTRIES = ["France", "Spain", "Italy"]
CAPITALS = {"France": "Paris", "Spain": "Madrid", "Italy": "Rome"}


def country_decision(tmp_path: Path) -> Path:
    path = tmp_path / "capitals.json"
    path.write_text(json.dumps({
        "task_matrix": [[c] for c in COUNTRIES],
        "template": "What is the capital of __0__?",
        "json_schema": ["country", "capital"],
        "batch_size": 3,
    }), encoding="utf-8")
    return path


def run_with_reply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: Any) -> int:
    """`mapreduce run` of the three-country decision against a simulated sub-agent answering `answer`."""
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.testing.openai_server import OpenAICompatibleServer
    from amapreduce.testing.scripted import FunctionModel, ModelInfo, final_answer

    def sub_agent(messages: list[Any], info: ModelInfo) -> Any:
        return final_answer(answer)

    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "runs"))
    with OpenAICompatibleServer(FunctionModel(sub_agent, model_id="sim-model")) as server, allow_model_requests():
        code = main(["mapreduce", "run", str(country_decision(tmp_path)), "--model", "sim-model",
                     "--api-base", server.base_url, "--json"])
    return code


@pytest.mark.parametrize(
    "answer",
    [
        # the model's reply text holds the escape (the JSON text the sub-agent wrote)
        '[{"task": 1, "country": "France", "capital": "Paris \\ud83d"}, '
        '{"task": 2, "country": "Spain", "capital": "Madrid"}, {"task": 3, "country": "Italy", "capital": "Rome"}]',
        # the tool call's arguments already decoded it: the answer object holds a lone surrogate
        [{"task": 1, "country": "France", "capital": "Paris \ud83d"},
         {"task": 2, "country": "Spain", "capital": "Madrid"}, {"task": 3, "country": "Italy", "capital": "Rome"}],
    ],
    ids=["escape-in-text", "surrogate-in-object"],
)
def test_a_run_whose_reply_carries_a_lone_surrogate_completes_with_every_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, answer: Any
) -> None:
    code = run_with_reply(tmp_path, monkeypatch, answer)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    out = json.loads(captured.out)
    assert code == 0, out
    assert out["status"] == "complete" and out["rows"] == 3 and out["missing_cells"] == 0
    assert f"| France | Paris {REPLACEMENT} |" in out["table_markdown"]
    assert "| Italy | Rome |" in out["table_markdown"]
    run_dir = Path(out["run_dir"])
    for path in run_dir.rglob("*"):  # every file the run wrote is valid UTF-8 (and the JSON ones parse)
        if path.is_file():
            text = path.read_bytes().decode("utf-8")
            if path.suffix == ".json":
                json.loads(text)
            elif path.suffix == ".jsonl":
                assert all(json.loads(line) is not None for line in text.splitlines())
    assert json.loads((run_dir / "result.json").read_text(encoding="utf-8"))["status"] == "complete"


# -- replies ---------------------------------------------------------------------------------------


def test_reply_rows_are_scrubbed_and_a_split_pair_is_joined() -> None:
    parsed = parse_reply('[{"name": "A\\ud83d", "note": "\\ud83d\\ude00", "nested": ["\\udc00"]}]')
    assert parsed.error is None
    (row,) = parsed.rows
    assert row == {"name": f"A{REPLACEMENT}", "note": "\U0001f600", "nested": [REPLACEMENT]}
    assert all(is_clean(cell_text(v)) for v in row.values())
    (obj,) = parse_reply([{"name\ud800": "x\udfff"}]).rows  # a reply handed over as an object
    assert obj == {f"name{REPLACEMENT}": f"x{REPLACEMENT}"}


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("[" * 100_000, None),  # a cut reply that deep: nothing closed, nothing kept
    ],
)
def test_a_reply_nested_too_deeply_fails_that_attempt_not_the_run(reply: str, error: str | None) -> None:
    parsed = parse_reply(reply)
    assert parsed.rows == [] and parsed.error is not None
    if error:
        assert error in parsed.error


def test_a_deeply_nested_reply_object_is_a_parse_error() -> None:
    deep: Any = "x"
    for _ in range(5_000):
        deep = [deep]
    parsed = parse_reply([{"name": deep}])
    assert parsed.rows == [] and parsed.error is not None and "nested too deeply" in parsed.error


def test_odd_task_numbers_and_huge_numbers_never_raise() -> None:
    row = project_row({"task": "²", "name": "x"}, ["name"])  # "²".isdigit() is True, int("²") raises
    assert row.task is None and row.values == {"name": "x"}
    assert project_row({"task": "\u0663", "name": "x"}, ["name"]).task == 3  # an Arabic-Indic 3 reads as 3
    assert project_row({"task": "9" * 5000}, ["name"]).task is None
    assert cell_text(10**5000) == ""  # beyond str(int)'s digit limit: a missing cell, never a crash


# -- decisions -------------------------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_plan_of_a_decision_with_a_lone_surrogate_prints_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    path = tmp_path / "d.json"
    path.write_text(
        '{"task_matrix": [["France\\ud800"], ["Spain"]], "template": "Capital of __0__ \\ud800?", '
        '"json_schema": ["country", "capital"], "batch_strategy": {"type": "per_atom", "rationale": "why \\udfff"}}',
        encoding="utf-8",
    )
    assert main(["mapreduce", "plan", str(path), *(["--json"] if as_json else [])]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert is_clean(captured.out)
    if as_json:
        assert json.loads(captured.out)["batches"][0]["rationale"] == f"why {REPLACEMENT}"
    else:
        assert f"First sub-query: Capital of France{REPLACEMENT} {REPLACEMENT}?" in captured.out


def test_a_decision_given_as_data_is_scrubbed() -> None:
    """The manager's `mapreduce` tool hands over Python data, not a file: scrubbed the same way."""
    decision = Decision.parse({
        "task_matrix": [["Fr\ud83d"], ["Es"]], "template": "__0__?", "json_schema": {"properties": {"c\udc00": {}}},
    })
    assert decision.task_matrix[0] == [f"Fr{REPLACEMENT}"] and decision.columns == (f"c{REPLACEMENT}",)
    assert is_clean(decision.task_text(0))


# -- tables ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", " \t", "\u200b", "\u200d\ufeff", "\u2060\u00ad", "\u3164", "\u2800", "\u0301"])
def test_invisible_text_is_blank(text: str) -> None:
    assert is_blank(text)


@pytest.mark.parametrize("text", ["a", "\u200bx", "7", "-", "*", "\U0001f600", "\u4e2d", "\u0915\u094d"])
def test_visible_text_is_not_blank(text: str) -> None:
    assert not is_blank(text)


def test_a_row_whose_key_is_only_a_zero_width_space_is_not_placed() -> None:
    table = Table(["country", "capital"], ["country"])
    assert table.upsert({"country": "\u200b", "capital": "Paris"}, task_index=0) is None
    row = table.upsert({"country": "France", "capital": "\ufeff"}, task_index=0)
    assert row is not None and row.missing() == ["capital"]
    assert len(table) == 1


# -- pages and answers ----------------------------------------------------------------------------


def test_a_page_in_a_charset_that_makes_surrogates_is_scrubbed() -> None:
    body = b"Title line \\ud800 and text \\udfff."
    extracted = extract_main_text(body, "text/plain", url="http://example.test/a.txt", encoding="unicode_escape")
    assert extracted.text == f"Title line {REPLACEMENT} and text {REPLACEMENT}."


def test_an_answer_with_a_lone_surrogate_is_scored_as_text(tmp_path: Path) -> None:
    table = parse_answer_table("```markdown\n| Country | Capital |\n|---|---|\n| France | Paris \ud83d |\n```")
    assert table is not None and table.cells == [["France"], [f"Paris {REPLACEMENT}"]]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"instance_id": "a", "trial": 1, "response": "| x \\ud83d |"}\n', encoding="utf-8")
    assert load_predictions_jsonl(jsonl) == {"1": {"a": f"| x {REPLACEMENT} |"}}


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"[" * 100_000, "nested too deeply"),
        (b'{"instance_id": ' + b"9" * 5000 + b"}", "4300 digits"),
        (b"\n\xff\xfe\x00x\n", r"f\.jsonl:2: byte 1 is not UTF-8"),  # the line is counted from 1
        (b'{"instance_id": "a", "evaluation": "' + b"[" * 100_000 + b'"}', "nested too deeply"),
    ],
)
def test_malformed_jsonl_files_are_one_line_errors(tmp_path: Path, content: bytes, reason: str) -> None:
    from amapreduce.errors import UserError

    path = tmp_path / "f.jsonl"
    path.write_bytes(content)
    with pytest.raises(UserError, match=reason):
        load_tasks(path, "widesearch")
    if b"evaluation" not in content:
        with pytest.raises(UserError, match=reason):
            load_predictions_jsonl(path)

