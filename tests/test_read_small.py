"""The read solver's small-model way: code grounds the model's values in the pages read.

`mapreduce.grounding` is checked on the page layouts a corpus holds (an attribute table, a table
of many columns, "Label: value" lists, prose); `ReadSolver(small=True)` with simulated models that
answer as SmolLM2-135M was measured to (values near the page's, quotes that are not quotes), each
answering only from the prompt it is given.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from smolagents.models import ChatMessage

from amapreduce.decision import Decision
from amapreduce.decision.columns import ColumnSpec
from amapreduce.llm.messages import message_text
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.grounding import choices, column_lines, ground
from amapreduce.mapreduce.read_small import CELL_REPLY_TOKENS, GroundedPage, ground_row
from amapreduce.mapreduce.read_solver import ReadSolver
from amapreduce.mapreduce.replies import parse_reply, project_row
from amapreduce.table.evidence import Evidence, FetchedPages, recording
from amapreduce.testing.scripted import ModelInfo
from amapreduce.web.service import WebService
from tests.test_read_solver import COLUMNS, corpus, managed, request, service

__all__ = ["corpus", "service"]  # the fixtures, used by name

ATLAS = """# Andorra

Andorra is a country in Europe. Its capital is Andorra la Vella. Andorra has a population of 77,006.

| Attribute | Value |
|---|---|
| Official name | Andorra |
| ISO code | AD |
| ISO3 code | AND |
| Capital | Andorra la Vella |
| Population | 77,006 |
| Currency | Euro (EUR) |
| Calling code | +376 |
"""
WIDE = """# Countries

| Country | Capital | Population | Currency |
|---|---|---|---|
| France | Paris | 68,170,000 | Euro (EUR) |
| Kenya | Nairobi | 55,100,000 | Kenyan shilling (KES) |
"""
LISTED = """# Argentina

- Capital: Buenos Aires
- Population (2023): 46,000,000

The capital of Argentina is Buenos Aires. The currency of Argentina is the Argentine peso (ISO 4217 code: ARS).
"""
CAPITAL, ISO3, CURRENCY = ColumnSpec(name="Capital"), ColumnSpec(name="ISO3 Code"), ColumnSpec(name="Currency Code")


# -- grounding --------------------------------------------------------------------------------------

def test_a_value_stated_by_its_columns_line_is_quoted_by_it() -> None:
    found = ground("AND", ATLAS, ISO3, entity=["Andorra"])
    assert (found.value, found.quote, found.how) == ("AND", "| ISO3 code | AND |", "stated")
    assert ground("Andorra la Vella", ATLAS, CAPITAL).how == "stated"


def test_another_columns_line_grounds_nothing() -> None:
    # "AD" is on the page, on the ISO code's line: not the ISO3 code's (the wrong cell once marked verified)
    assert ground("AD", ATLAS, ISO3).how == "ungrounded"
    assert ground("+376", ATLAS, CURRENCY).quote == ""
    # a page with no ISO3 line: the ISO code's line is not one of the column's
    assert column_lines(ATLAS.replace("| ISO3 code | AND |\n", ""), ISO3) == []


def test_a_value_a_few_letters_off_is_snapped_to_the_page() -> None:
    assert ground("Andora la Vella", ATLAS, CAPITAL).value == "Andorra la Vella"
    assert ground("Andorra la", ATLAS, CAPITAL).value == "Andorra la Vella"
    assert ground("SKOPJEBULAN", ATLAS, CAPITAL).how == "ungrounded"


def test_the_entitys_own_name_and_parts_of_names_are_not_values() -> None:
    assert ground("Andorra", ATLAS, CAPITAL, entity=["Andorra"]).how == "ungrounded"
    assert ground("Vella", ATLAS, CAPITAL, entity=["Andorra"]).how == "ungrounded"
    assert ground("The capital of Argentina is Buenos Aires.", LISTED, CAPITAL).how == "ungrounded"
    # but a capital that bears the country's name, stated by a labelled line, is one
    san_marino = "# San Marino\n\n| Attribute | Value |\n|---|---|\n| Capital | San Marino |\n"
    assert ground("San Marino", san_marino, CAPITAL, entity=["San Marino"]).how == "stated"


def test_a_part_of_a_slashed_name_is_no_value() -> None:
    city = "# Belém\n\nBelém is a city in Brazil. It uses the America/Belem time zone.\n"
    zone = ColumnSpec(name="Time zone")
    found = ground("America", city, zone, entity=["Belém"])  # measured: SmolLM2 wrote it
    assert (found.value, found.how) == ("America/Belem", "snapped")  # never "America", a part of the zone
    assert ground("America/Belem", city, zone, entity=["Belém"]).how == "stated"
    assert choices(column_lines(city, zone)[0], zone, ["Belém"]) == ["America/Belem"]


def test_a_code_column_takes_the_code_of_its_cell() -> None:
    for said in ("Euro", "Euro (EUR)", "EUR", "Eurp"):
        found = ground(said, ATLAS, CURRENCY)
        assert (found.value, found.quote) == ("EUR", "| Currency | Euro (EUR) |"), said
    # a column that does not ask for a code keeps the cell
    assert ground("Euro (EUR)", ATLAS, ColumnSpec(name="Currency")).value == "Euro (EUR)"


def test_a_wide_table_grounds_a_value_only_in_its_columns_cell() -> None:
    capital = ground("Paris", WIDE, CAPITAL, entity=["France"])
    assert (capital.value, capital.quote) == ("Paris", "| France | Paris | 68,170,000 | Euro (EUR) |")
    assert ground("68,170,000", WIDE, CAPITAL).how == "ungrounded"  # the population's cell, not the capital's
    assert ground("68170000", WIDE, ColumnSpec(name="Population")).how == "stated"


def test_lists_and_prose_ground_and_lose_the_sentences_point() -> None:
    assert ground("Buenos Aires", LISTED, CAPITAL).quote == "- Capital: Buenos Aires"
    code = ColumnSpec(name="currency_code", description="ISO 4217 code of its currency")
    found = ground("ARS", LISTED, code, entity=["Argentina"])
    assert found.how == "stated" and "ISO 4217 code: ARS" in found.quote
    assert ground("Buenos Aires.", LISTED, CAPITAL).value == "Buenos Aires"


def test_a_cells_choices_are_the_spans_of_its_columns_best_line() -> None:
    assert choices(column_lines(ATLAS, CAPITAL)[0], CAPITAL, ["Andorra"]) == ["Andorra la Vella"]
    assert choices(column_lines(ATLAS, CURRENCY)[0], CURRENCY) == ["EUR"]
    assert choices(column_lines(ATLAS, ISO3)[0], ISO3, ["Andorra"]) == ["AND"]  # a cell, though a stop word
    found = ground("Andorra la Vella", ATLAS, CAPITAL, entity=["Andorra"], lines=column_lines(ATLAS, CAPITAL)[:1])
    assert (found.how, found.quote) == ("stated", "Its capital is Andorra la Vella.")  # its point is no part of it
    prose = column_lines("# Kenya\n\nThe capital of Kenya is Nairobi, founded in 1899.", CAPITAL)[0]
    assert choices(prose, CAPITAL, ["Kenya"]) == ["Nairobi", "1899"]


# -- the small-model way ----------------------------------------------------------------------------

def small_model(messages: list[ChatMessage], info: ModelInfo) -> str:
    """As SmolLM2-135M was measured to answer: its "quotes" repeat its values, its capital is a few
    letters off the excerpt's, its population is the whole sentence; a cell's choice takes the
    first span offered."""
    prompt = message_text(messages[-1])
    if "Answer for " not in prompt:  # a cell's choice: the first span the grammar allows
        schema = info.response_format["json_schema"]["schema"]  # type: ignore[index]
        (name, spec), = schema["properties"].items()
        return json.dumps({name: spec["enum"][0]})
    entity = prompt.rsplit("Answer for ", 1)[1].rstrip(": \n")  # the prompt's last words name it
    capital = re.search(rf"capital of {entity} is ([A-Z]\w*(?: [A-Z]\w*)*)", prompt)
    sentence = re.search(rf"The population of {entity} is [\d,]+\d\.", prompt)
    values = {"country": entity, "capital": (capital.group(1)[:-1] + "x") if capital else "",
              "population": sentence.group(0) if sentence else ""}
    return json.dumps({"rows": [{"quotes": values, **values}]})


def test_the_small_way_grounds_each_value_and_asks_a_cell_it_could_not(service: WebService) -> None:
    model, server = managed(small_model, window=2048)
    solver = ReadSolver(model=model, reader=service)
    assert solver.small  # a 2,048-token window
    with recording(FetchedPages()) as pages:
        reply = solver.solve(request("Freedonia", forced=({"country": "Freedonia"},)))
    # one call for the row; the population's sentence grounded nothing, and its line offers one span
    assert server.calls == 1 and reply.usage.requests == 1
    first = server.requests[0]["prompt"]
    assert first.endswith("Answer for Freedonia:")
    assert len(first.split("Excerpt:\n", 1)[1]) <= 700  # the small way's short excerpt
    row = project_row(parse_reply(reply.output).rows[0], ["capital", "population"])
    assert row.values["capital"] == "Fredville"  # "Fredvillx", snapped to the page
    assert row.values["population"] == "1,234,567"
    assert row.quotes["capital"] == "The capital of Freedonia is Fredville."
    assert row.cell_sources["capital"] == "corpus://atlas/freedonia.md"
    assert pages.contains(row.quotes["population"], row.cell_sources["population"])
    assert reply.trace["grounding"] == {"snapped": 1, "single": 1}


def test_a_value_no_page_states_is_left_for_the_patch_round(service: WebService) -> None:
    def invents(messages: list[ChatMessage], info: ModelInfo) -> str:
        prompt = message_text(messages[-1])
        if "Answer for " not in prompt:
            raise AssertionError("no line names the column: no choice is asked")
        values = {"capital": "Sylvan City", "area": "3,000 km2"}
        return json.dumps({"rows": [{"quotes": values, **values}]})

    model, server = managed(invents, window=2048)
    columns = (COLUMNS[0], COLUMNS[1], ColumnSpec(name="area"))
    asked = dataclasses.replace(request("Sylvania", forced=({"country": "Sylvania"},)), column_specs=columns)
    reply = ReadSolver(model=model, reader=service).solve(asked)
    row = parse_reply(reply.output).rows[0]
    assert row["capital"] == "Sylvan City" and row["area"] == "" and "area" not in row["quotes"]
    assert server.calls == 1


KENYA = GroundedPage("corpus://atlas/kenya.md", "Kenya", "# Kenya\n\nThe capital of Kenya is Nairobi, founded in 1899.")


def test_a_cell_no_line_states_is_chosen_among_its_lines_spans() -> None:
    model, server = managed(small_model, window=2048)
    errors: list[str] = []
    row, usage, ways = ground_row(model, {"capital": "Mombasa"}, [CAPITAL], [KENYA], ["Kenya"],
                                  check=lambda: None, errors=errors)
    sent = server.requests[0]
    assert sent["response_format"]["json_schema"]["schema"]["properties"]["Capital"]["enum"] == ["Nairobi", "1899"]
    assert sent["prompt"].endswith("The capital of Kenya is Nairobi, founded in 1899.\n\nCapital of Kenya:")
    assert sent["max_tokens"] == CELL_REPLY_TOKENS
    assert row == {"task": 1, "Capital": "Nairobi", "source": KENYA.url,
                   "quotes": {"Capital": {"quote": "The capital of Kenya is Nairobi, founded in 1899.", "url": KENYA.url}}}
    assert ways == {"chosen": 1} and usage.requests == 1 and errors == []


def test_a_page_about_another_entity_grounds_only_lines_that_name_it() -> None:
    spain = GroundedPage("corpus://atlas/es.html", "Spain", "# Spain\n\nIts capital is Madrid. Its neighbours are "
                         "Andorra and Portugal.\n\n| Attribute | Value |\n|---|---|\n| Capital | Madrid |\n")
    model, server = managed(small_model, window=2048)
    row, _, ways = ground_row(model, {"Capital": "Madrid"}, [CAPITAL], [spain], ["Andorra"], check=lambda: None,
                              errors=[])
    assert row["Capital"] == "" and ways == {"empty": 1} and server.calls == 0
    wide = GroundedPage("corpus://atlas/countries.md", "Countries", WIDE)
    row, _, ways = ground_row(model, {"Capital": "Nairobi"}, [CAPITAL], [wide], ["Kenya"], check=lambda: None,
                              errors=[])
    assert row["Capital"] == "Nairobi" and ways == {"stated": 1}


def test_a_failed_choice_leaves_its_cell_empty_and_says_why() -> None:
    def fails_choices(messages: list[ChatMessage], info: ModelInfo) -> str:
        raise ValueError("the server refused the grammar")

    model, server = managed(fails_choices, window=2048)
    errors: list[str] = []
    row, usage, ways = ground_row(model, {"capital": "Mombasa"}, [CAPITAL], [KENYA], ["Kenya"],
                                  check=lambda: None, errors=errors)
    assert row["Capital"] == "" and row["quotes"] == {} and ways == {"empty": 1}
    assert server.calls == 1 and usage.requests == 1
    assert len(errors) == 1 and errors[0].startswith("cell 'Capital': ModelCallError")


def test_the_engine_verifies_every_grounded_cell(service: WebService) -> None:
    model, _ = managed(small_model, window=2048)
    decision = Decision.model_validate({
        "task_matrix": [["Freedonia"], ["Sylvania"]], "template": "What are the capital and population of __0__?",
        "json_schema": {"type": "object", "properties": {c.name: {"type": "string"} for c in COLUMNS}},
        "key_columns": ["country"], "batch_strategy": {"type": "per_atom"},
    })
    result = MapReduceEngine(ReadSolver(model=model, reader=service),
                             config=EngineConfig(workers=1, verify="record", patch_rounds=0)).run(decision)
    rows = {r.cells["country"].value: r.cells for r in result.table.rows}
    assert rows["Freedonia"]["capital"].value == "Fredville"
    assert rows["Freedonia"]["capital"].evidence is Evidence.VERIFIED
    assert rows["Sylvania"]["capital"].value == "Sylvan City"
    for cells in rows.values():
        for name in ("capital", "population"):
            assert cells[name].evidence in (Evidence.VERIFIED, Evidence.NO_EVIDENCE), (name, cells[name])


@pytest.mark.parametrize(("window", "model_id", "small"), [(2048, "gpt-4o", True), (8192, "smollm2-135m", True),
                                                           (8192, "gpt-4o", False)])
def test_the_small_way_is_for_small_windows_and_small_models(service: WebService, window: int, model_id: str,
                                                             small: bool) -> None:
    model, _ = managed(window=window, model_id=model_id)
    assert ReadSolver(model=model, reader=service).small is small
    assert ReadSolver(model=model, reader=service, small=not small).small is (not small)
