"""What the simulated model understands (and what it honestly does not)."""

from __future__ import annotations

import pytest
from smolagents import ToolCallingAgent

from amapreduce.demo.model import SimulatedAtlasModel
from amapreduce.demo.plan import Column, column_specs, parse_intent, parse_question, read_column
from amapreduce.evaluation.loaders import load_tasks
from amapreduce.sandbox import WORLD_DIR


def test_every_sandbox_question_is_recognised() -> None:
    tasks = load_tasks(WORLD_DIR / "tasks.jsonl", "widesearch")
    intents = {iid: parse_intent(t.query) for iid, t in tasks.items()}
    assert [iid for iid, i in intents.items() if i is None] == []  # every family of the benchmark
    first = ("sbx_en_001", "sbx_en_002", "sbx_en_003", "sbx_en_004", "sbx_en_005")
    assert {iid: (i.kind, i.scopes, i.k, i.euro) for iid, i in intents.items() if i and iid in first} == {
        "sbx_en_001": ("members", ("South America",), 0, False),
        "sbx_en_002": ("ranked", ("Africa", "Asia", "Europe", "North America", "Oceania", "South America"), 3, False),
        "sbx_en_003": ("members", ("Africa",), 0, False),
        "sbx_en_004": ("top_cities", ("Japan", "Germany", "Brazil", "Mexico", "Nigeria"), 5, False),
        "sbx_en_005": ("members", ("Europe",), 0, True),
    }
    assert intents["sbx_en_003"] is not None and intents["sbx_en_003"].columns == ("Country", "ISO3 Code", "Capital", "Calling Code")
    assert parse_intent("Who won the 2018 World Cup?") is None


def test_sub_questions_and_columns() -> None:
    assert parse_question('In the Sandbox Atlas, find the capital of the country or territory "Cabo Verde".').name == "Cabo Verde"  # type: ignore[union-attr]
    city = parse_question('find the population of the city "Sao Paulo" in Brazil.\nOnly this entry is still needed: x')
    assert city is not None and (city.kind, city.name, city.country) == ("city", "Sao Paulo", "Brazil")
    ranked = parse_question("which country or territory of North America ranks 2 by population (1 = most populous)?")
    assert ranked is not None and (ranked.continent, ranked.rank) == ("North America", 2)
    facts = {"Official name": "Argentina", "Currency": "Peso (ARS)", "Population": "44,494,502", "Calling code": "+54"}
    cols = {c.name: c for c in column_specs(["Country", "Currency Code", "Population", "Calling Code", "Capital"])}
    assert [read_column(cols[n], facts) for n in cols] == ["Argentina", "ARS", "44494502", "+54", ""]
    assert read_column(Column(name="Population", description="as written"), facts) == "44,494,502"


def test_numeric_columns_are_whole_words_so_country_is_a_name() -> None:
    """`Country` contains `count`: it once got the "integer, digits only" note in every decision."""
    specs = {c.name: c for c in column_specs(["Country", "Discount", "Population", "Area (km2)", "Rank", "population_2020"])}
    assert not specs["Country"].numeric and "integer" not in specs["Country"].description
    assert not specs["Discount"].numeric
    assert all(specs[n].numeric for n in ("Population", "Area (km2)", "Rank", "population_2020"))


@pytest.mark.parametrize("tools", [["web_search", "crawl_page", "mapreduce"], ["web_search", "crawl_page"]])
def test_an_unknown_question_gets_an_honest_answer_not_a_table(tools: list[str]) -> None:
    from smolagents import Tool

    class Stub(Tool):
        inputs = {"query": {"type": "string", "description": "q"}}
        output_type = "string"
        description = "stub"

        def __init__(self, name: str) -> None:
            self.name = name
            super().__init__()

        def forward(self, query: str) -> str:
            raise AssertionError("the simulated model must not call tools for a question it cannot plan")

    model = SimulatedAtlasModel()
    agent = ToolCallingAgent(tools=[Stub(n) for n in tools], model=model, verbosity_level=-1)
    answer = str(agent.run("Who won the 2018 World Cup?"))
    assert "does not know" in answer and model.calls == 1
