"""Reading tool outputs back out of a conversation, as the simulated model does."""

from __future__ import annotations

from amapreduce.demo.atlas_reader import (
    Observations,
    clean_cell,
    infobox,
    list_entries,
    plain_number,
    title_name,
)

SEARCH_CALL = "Calling tools:\n[{'id': 'call_1', 'type': 'function', 'function': {'name': 'web_search', 'arguments': {'query': \"Cote d'Ivoire\", 'n': 5}}}]"
RESULTS = "Observation:\n1. [Argentina — Sandbox Atlas](corpus://sandbox/countries/ar.html)\n   Argentina\n\n2. [Chile — Sandbox Atlas](corpus://sandbox/countries/cl.html)\n   Neighbours"
PAGES = (
    "Observation:\nTitle: Argentina — Sandbox Atlas\nURL: corpus://sandbox/countries/ar.html\n\n# Argentina\n\n"
    "| Attribute | Value | \n|---|---|\n| Capital | Buenos Aires | \n| Population | 44,494,502 | \n"
    "| Neighbours | [Chile](corpus://sandbox/countries/cl.html) | \n"
    "Title: Countries of Oceania — Sandbox Atlas\nURL: corpus://sandbox/lists/continent-oc.html\n\n"
    "| Country | ISO code | \n|---|---|\n| [Fiji](corpus://sandbox/countries/fj.html) | FJ | \n"
)


def test_observations_read_searches_results_and_pages() -> None:
    obs = Observations.parse([SEARCH_CALL, RESULTS, PAGES])
    assert obs.searched == {"Cote d'Ivoire"}
    assert obs.results == {"Argentina": "corpus://sandbox/countries/ar.html", "Chile": "corpus://sandbox/countries/cl.html"}
    assert set(obs.pages) == {"corpus://sandbox/countries/ar.html", "corpus://sandbox/lists/continent-oc.html"}
    facts = infobox(obs.pages["corpus://sandbox/countries/ar.html"])
    assert facts["Capital"] == "Buenos Aires" and "Fiji" not in str(facts)  # pages do not bleed into each other
    assert clean_cell(facts["Neighbours"]) == "Chile"
    entries = list_entries(obs.pages["corpus://sandbox/lists/continent-oc.html"])
    assert [(e.name, e.url, e.cells) for e in entries] == [("Fiji", "corpus://sandbox/countries/fj.html", ("FJ",))]


def test_numbers_and_titles() -> None:
    assert plain_number("44,494,502") == "44494502" and plain_number("+54") == "+54" and plain_number("12,34") == "12,34"
    assert title_name("Tokyo, Japan — Sandbox Atlas") == "Tokyo, Japan" and title_name("Travel guide") == "Travel guide"
