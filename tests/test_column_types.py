"""Column types (`decision.column_types`): one closed set read by the decision parser, the sub-agents'
reply schema and prompt, the reducer's canonical values and the corrected scorer's preprocess."""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from amapreduce.decision import ColumnType, Decision, columns_from_schema, load_decision
from amapreduce.decision.column_types import column_type, scored_as, type_names
from amapreduce.errors import DecisionError
from amapreduce.evaluation.preprocess import DateContext, Preprocessor
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.read_solver import rows_schema
from amapreduce.mapreduce.solver import BatchRequest, SolverReply
from amapreduce.prompts import prompts_dir, render_prompt
from amapreduce.table.table import CellStatus, Table

ROOT = Path(__file__).resolve().parents[1]


# -- the set and its spellings -----------------------------------------------------------------------


def test_the_set_is_closed_and_small() -> None:
    assert [t.value for t in ColumnType] == ["text", "number", "integer", "date", "year", "url", "code", "boolean"]
    assert type_names() == "text, number, integer, date, year, url, code, boolean"
    assert ColumnType.INTEGER == "integer" and f"{ColumnType.DATE}" == "date"  # a member is its name


@pytest.mark.parametrize(
    ("spelling", "fmt", "expected"),
    [
        ("string", None, ColumnType.TEXT),  # JSON-schema spellings keep loading
        ("number", None, ColumnType.NUMBER),
        ("integer", None, ColumnType.INTEGER),
        ("boolean", None, ColumnType.BOOLEAN),
        (" Integer ", None, ColumnType.INTEGER),
        ("int", None, ColumnType.INTEGER),
        ("string", "date", ColumnType.DATE),
        ("string", "uri", ColumnType.URL),
        ("string", "email", ColumnType.TEXT),  # a format no type stands for leaves it text
        ("integer", "date", ColumnType.INTEGER),  # a format refines only a string
        ("year", None, ColumnType.YEAR),
        ("integr", None, None),
        ("array", None, None),
    ],
)
def test_spellings(spelling: str, fmt: str | None, expected: ColumnType | None) -> None:
    assert column_type(spelling, fmt) is expected


def test_decisions_in_the_wild_keep_their_meaning() -> None:
    columns = columns_from_schema({"properties": {
        "name": {"type": "string"}, "n": {"type": ["integer", "null"]}, "born": {"type": "string", "format": "date"},
        "site": {"format": "uri"}, "plain": {"description": "no type"}, "ok": {"type": "boolean"},
    }})
    assert [c.type for c in columns] == [ColumnType.TEXT, ColumnType.INTEGER, ColumnType.DATE, ColumnType.URL,
                                         None, ColumnType.BOOLEAN]
    assert columns[4].kind is ColumnType.TEXT  # no type: read as text
    assert [c.to_json() for c in columns[1:3]] == [{"type": "integer"}, {"type": "date"}]
    for path in (ROOT / "examples/decision.json", ROOT / "tests/data/real_corpus/decision.json",
                 ROOT / "tests/data/real_corpus/decision_open.json"):
        specs = {c.name: c.type for c in load_decision(path).column_specs}
        assert specs["population"] is ColumnType.INTEGER and specs["country"] is ColumnType.TEXT, path


@pytest.mark.parametrize(
    ("given", "problem"),
    [("integr", "names no column type"), ("array", "names no column type"), ("null", "names no column type"),
     (["string", "integer"], "names more than one column type"), (7, "names no column type")],
)
def test_an_unknown_type_is_refused_naming_the_allowed_ones(given: Any, problem: str) -> None:
    decision = {"task_matrix": [["France"]], "template": "About __0__",
                "json_schema": {"properties": {"country": {}, "population": {"type": given}}}}
    with pytest.raises(DecisionError) as caught:
        Decision.parse(decision)
    message = str(caught.value)
    assert f"column 'population' has type {given!r}, which {problem}" in message
    assert "use one of text, number, integer, date, year, url, code, boolean" in message


# -- each type's schema fragment and normaliser -------------------------------------------------------


FRAGMENTS = {
    ColumnType.TEXT: ({"type": "string"}, ["Paris", ""], []),
    ColumnType.NUMBER: ({"type": "string", "pattern": r"^(-?[0-9]+(\.[0-9]+)?)?$"}, ["1234.5", "-3", ""],
                        ["1,234.5", "12%", "1e3"]),
    ColumnType.INTEGER: ({"type": "string", "pattern": r"^(-?[0-9]+)?$"}, ["1234", "-7", ""], ["1,234", "1.5"]),
    ColumnType.DATE: ({"type": "string", "pattern": r"^([0-9]{4}(-[0-9]{2}(-[0-9]{2})?)?)?$"},
                      ["2024-03-05", "2024-03", "2024", ""], ["March 5, 2024", "2024/3/5"]),
    ColumnType.YEAR: ({"type": "string", "pattern": r"^([0-9]{1,4})?$"}, ["2019", ""], ["FY2019", "2019.0"]),
    ColumnType.URL: ({"type": "string", "pattern": '^(https?://[^ "\\\\\\x00-\\x1f]+)?$'},
                     ["https://x.org/a?b=c", "https://例え.jp", ""], ["harvard.edu", 'https://a"b', "https://a b"]),
    ColumnType.CODE: ({"type": "string"}, ["+33", ".fr", ""], []),
    ColumnType.BOOLEAN: ({"type": "string", "enum": ["Yes", "No", ""]}, ["Yes", "No", ""], ["yes", "true"]),
}


@pytest.mark.parametrize("kind", list(ColumnType))
def test_each_type_has_a_string_fragment_that_allows_not_found(kind: ColumnType) -> None:
    fragment, valid, invalid = FRAGMENTS[kind]
    assert kind.schema == fragment
    kind.schema["type"] = "mutated"  # a fresh copy each time: callers may extend it
    assert kind.schema == fragment
    for value in valid:
        jsonschema.validate(value, fragment)
        assert kind.normalize(value) == value  # what the schema allows is already canonical
    for value in invalid:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(value, fragment)


NORMALISED = [
    (ColumnType.TEXT, "  Paris  (FR) ", "  Paris  (FR) "),
    (ColumnType.INTEGER, "1,234", "1234"),
    (ColumnType.INTEGER, " +1,234,567 ", "1234567"),
    (ColumnType.INTEGER, "2019.0", "2019"),
    (ColumnType.INTEGER, "１２３", "123"),
    (ColumnType.INTEGER, "1\u202f234", "1234"),  # a narrow no-break space only groups digits
    (ColumnType.INTEGER, "100 200", "100 200"),  # a plain space may separate two numbers
    (ColumnType.INTEGER, "12,34", "12,34"),  # not thousands groups
    (ColumnType.INTEGER, "1234.5", "1234.5"),  # no integer
    (ColumnType.INTEGER, "1.2 million", "1.2 million"),
    (ColumnType.INTEGER, "-0", "0"),
    (ColumnType.NUMBER, "1,234.50", "1234.5"),
    (ColumnType.NUMBER, "\u22123.20", "-3.2"),
    (ColumnType.NUMBER, ".5", "0.5"),
    (ColumnType.NUMBER, "12.5%", "12.5%"),
    (ColumnType.NUMBER, "1e3", "1e3"),
    (ColumnType.NUMBER, "1,5", "1,5"),  # a decimal comma or a thousands comma: as written
    (ColumnType.NUMBER, "$1.2 billion", "$1.2 billion"),
    (ColumnType.DATE, "March 5, 2024", "2024-03-05"),
    (ColumnType.DATE, "5 Mar 2024", "2024-03-05"),
    (ColumnType.DATE, "May 1st 2020", "2020-05-01"),
    (ColumnType.DATE, "2024/3/5", "2024-03-05"),
    (ColumnType.DATE, "2024年3月5日", "2024-03-05"),
    (ColumnType.DATE, "March 2024", "2024-03"),
    (ColumnType.DATE, "2024", "2024"),
    (ColumnType.DATE, "03/05/2024", "03/05/2024"),  # day and month depend on the locale
    (ColumnType.DATE, "2023-02-30", "2023-02-30"),  # no such day
    (ColumnType.DATE, "Oct 15", "Oct 15"),  # no year
    (ColumnType.YEAR, "2019.0", "2019"),
    (ColumnType.YEAR, "2019年", "2019"),
    (ColumnType.YEAR, "2019-20", "2019-20"),
    (ColumnType.URL, "HTTPS://Example.COM/", "https://example.com"),
    (ColumnType.URL, "<https://x.org/A>", "https://x.org/A"),
    (ColumnType.URL, "[site](https://X.org/p?Q=1)", "https://x.org/p?Q=1"),
    (ColumnType.URL, "harvard.edu", "harvard.edu"),  # the scheme is unknown
    (ColumnType.CODE, " `FR` ", "FR"),
    (ColumnType.CODE, "007", "007"),
    (ColumnType.CODE, "+33", "+33"),
    (ColumnType.BOOLEAN, "TRUE", "Yes"),
    (ColumnType.BOOLEAN, "n", "No"),
    (ColumnType.BOOLEAN, "maybe", "maybe"),
]


@pytest.mark.parametrize(("kind", "raw", "expected"), NORMALISED)
def test_normalisers_rewrite_only_what_reads_one_way(kind: ColumnType, raw: str, expected: str) -> None:
    assert kind.normalize(raw) == expected
    assert kind.normalize(expected) == expected  # idempotent: replayed rows pass through again


def test_every_type_is_named_where_people_and_the_manager_read_the_set() -> None:
    manager = render_prompt("manager", "instructions", max_batches=7)
    guide = (ROOT / "docs/guides/decisions.md").read_text(encoding="utf-8")
    section = guide[guide.index("## Column types"):]
    for kind in ColumnType:
        assert re.search(rf"\b{kind.value}\b", manager), kind
        assert f"| `{kind.value}` |" in section, kind
    assert (prompts_dir() / "manager.yaml").is_file()


# -- the sub-agents' schema and prompt ----------------------------------------------------------------


TYPED = {
    "task_matrix": [["France"], ["Japan"]],
    "template": "About __0__",
    "json_schema": {"type": "object", "properties": {
        "country": {"type": "string"}, "population": {"type": "integer", "description": "inhabitants"},
        "founded": {"type": "date"}, "site": {"type": "url"}, "capital": {},
    }},
    "batch_size": 2,
}


def test_the_reply_schema_holds_typed_values_and_leaves_quotes_plain() -> None:
    schema = rows_schema(Decision.parse(TYPED).column_specs, 2)
    row = schema["properties"]["rows"]["items"]
    props = row["properties"]
    assert props["population"] == ColumnType.INTEGER.schema and props["founded"] == ColumnType.DATE.schema
    assert props["site"] == ColumnType.URL.schema
    assert props["country"] == props["capital"] == {"type": "string"}
    assert all(v == {"type": "string"} for v in props["quotes"]["properties"].values())
    good = {"rows": [{"task": 1, "quotes": {c: "" for c in props["quotes"]["properties"]}, "country": "France",
                      "population": "68170000", "founded": "", "site": "https://gouv.fr", "capital": "Paris",
                      "source": "https://x"}] * 2}
    jsonschema.validate(good, schema)
    bad = json.loads(json.dumps(good))
    bad["rows"][0]["population"] = "68,170,000"
    with pytest.raises(jsonschema.ValidationError, match="does not match"):
        jsonschema.validate(bad, schema)


def test_untyped_columns_give_the_same_schema_as_before() -> None:
    untyped = columns_from_schema(["country", "capital"])
    props = rows_schema(untyped)["properties"]["rows"]["items"]["properties"]
    assert props["country"] == props["capital"] == {"type": "string"}


def test_the_batch_prompt_tells_sub_agents_each_types_form() -> None:
    prompt = render_prompt("mapreduce", "batch", rationale="", shared_context={}, rows_per_task=None,
                           many_rows=False, columns=Decision.parse(TYPED).column_specs)
    assert '- "population" (integer: digits only, no thousands separators): inhabitants' in prompt
    assert '- "founded" (date: YYYY-MM-DD (YYYY-MM or YYYY when only that is known))' in prompt
    assert '- "country"\n' in prompt and '- "capital"\n' in prompt  # text shows no type


# -- the reducer ---------------------------------------------------------------------------------------


def test_the_table_stores_typed_values_in_canonical_form_so_replies_agree() -> None:
    normalizers = Decision.parse(TYPED).normalizers
    assert set(normalizers) == {"population", "founded", "site"}
    table = Table(["country", "population"], ["country"], normalizers=normalizers)
    table.upsert({"country": "France", "population": "68,170,000"}, task_index=0)
    table.upsert({"country": "France", "population": "68170000"}, task_index=0)
    cell = table.rows[0].cells["population"]
    assert (cell.value, cell.status, cell.agreements, cell.alternatives) == ("68170000", CellStatus.FOUND, 1, [])
    assert table.empty_like().normalizers == table.normalizers
    plain = Table(["country", "population"], ["country"])  # without the type: two values, a conflict
    plain.upsert({"country": "France", "population": "68,170,000"}, task_index=0)
    plain.upsert({"country": "France", "population": "68170000"}, task_index=0)
    assert plain.rows[0].cells["population"].status is CellStatus.CONFLICT


def test_a_typed_key_written_two_ways_is_one_row() -> None:
    table = Table(["year", "winner"], ["year"], normalizers={"year": ColumnType.YEAR.normalize})
    table.upsert({"year": "2019.0", "winner": "A"}, task_index=0)
    table.upsert({"year": "2019", "winner": "A"}, task_index=1)
    assert table.records() == [{"year": "2019", "winner": "A"}]
    assert table.find({"year": "2019.0"}) is table.rows[0]


class _Replies:
    """A sub-agent per attempt: attempt k answers `replies[k - 1]` (JSON rows)."""

    def __init__(self, replies: list[list[dict[str, Any]]]) -> None:
        self.replies = replies
        self.requests: list[BatchRequest] = []
        self._lock = threading.Lock()

    def solve(self, request: BatchRequest) -> SolverReply:
        with self._lock:
            self.requests.append(request)
        return SolverReply(output=json.dumps(self.replies[request.attempt - 1]), usage=Usage(requests=1))


def test_two_sub_agents_writing_an_integer_two_ways_agree_in_the_engine() -> None:
    decision = {"task_matrix": [["France"]], "template": "About __0__", "json_schema": {"properties": {
        "country": {}, "population": {"type": "integer"}, "capital": {}}}}
    solver = _Replies([[{"task": 1, "population": "68,170,000"}],  # capital missing: asked again
                       [{"task": 1, "population": "68170000", "capital": "Paris"}]])
    result = MapReduceEngine(solver, config=EngineConfig(patch_rounds=0)).run(Decision.parse(decision))
    assert len(solver.requests) == 2 and result.summary.complete
    cell = result.table.rows[0].cells["population"]
    assert (cell.value, cell.status, cell.agreements) == ("68170000", CellStatus.FOUND, 1)
    assert result.summary.conflicts == 0


def test_a_forced_typed_cell_finds_its_canonical_row() -> None:
    decision = Decision.parse({"task_matrix": [["1,000", "Alpha"]], "template": "Item __0__ (__1__)",
                               "json_schema": {"properties": {"id": {"type": "integer"}, "name": {}, "size": {}}},
                               "key_columns": ["id"]})
    assert decision.forced_values(0) == {"id": "1000", "name": "Alpha"}
    solver = _Replies([[{"task": 1, "size": "3"}]])
    result = MapReduceEngine(solver, config=EngineConfig()).run(decision)
    assert result.table.records() == [{"id": "1000", "name": "Alpha", "size": "3"}]
    assert result.summary.complete


# -- the scorer's preprocess ---------------------------------------------------------------------------


def test_scorers_read_columns_by_their_preprocess() -> None:
    assert scored_as("norm_str") is ColumnType.TEXT
    assert scored_as("extract_number") is ColumnType.NUMBER
    assert scored_as("norm_date") is ColumnType.DATE
    assert scored_as("url_match") is None


def test_the_corrected_preprocess_reads_cells_as_their_type_and_the_official_one_does_not() -> None:
    ref = dt.date(2026, 11, 21)
    official = Preprocessor(DateContext(reference=ref))
    fixed = Preprocessor(DateContext(reference=ref, corrected=True), corrected=True)
    assert official.apply("extract_number", "1\u202f234") == "1"  # the official first number
    assert fixed.apply("extract_number", "1\u202f234") == "1234"
    assert official.apply("extract_number", "1,234.50") == "1234.50"
    assert fixed.apply("extract_number", "1,234.50") == "1234.5"
    assert fixed.apply("extract_number", "about 40 km") == "40"  # not a number: the corrected rule as before
    assert fixed.apply("norm_date", "5 March 2024") == official.apply("norm_date", "5 March 2024") == "2024-03-05"
    assert fixed.apply("norm_date", "2024年3月5日") == "2024-03-05"
    assert fixed.apply("norm_str", "New  York") == official.apply("norm_str", "New  York") == "newyork"
