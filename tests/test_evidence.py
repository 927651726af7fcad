"""Evidence per cell: quote normalisation, numbers, value in quote, what the tools recorded, the
reply format (old replies have no evidence), the table's fields, `--verify strict`, the outputs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from amapreduce.decision import Decision
from amapreduce.errors import ConfigError
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.checkpoint import BatchAttempt, MergedRow
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.evidence import with_evidence
from amapreduce.mapreduce.replies import parse_reply, project_row
from amapreduce.mapreduce.solver import BatchRequest, SolverReply
from amapreduce.settings import load_settings
from amapreduce.table.evidence import (
    Evidence,
    FetchedPages,
    check_evidence,
    normalize_quote,
    quote_in_text,
    record_fetched,
    recording,
    value_in_quote,
)
from amapreduce.table.render import to_csv, to_jsonl
from amapreduce.table.table import CellStatus, Table
from amapreduce.web.models import Page, SearchResult
from amapreduce.web.tools import CrawlPageTool, WebSearchTool

PAGE = "Title: Norway\n| Capital | Oslo |\n| Population | 5,425,270 |\n| Area   (km²) |  385,207 |\nMotto: “Alt for Norge”"


# -- normalisation and numbers --------------------------------------------------------------------


def test_normalisation_folds_unicode_case_quotes_and_whitespace() -> None:
    assert normalize_quote("  ＯＳＬＯ\u00a0is\n\tthe   capital ") == "oslo is the capital"  # NFKC full width, nbsp
    assert normalize_quote("“Alt for Norge” – ﬁne") == '"alt for norge" - fine'  # quotes, dash, ligature
    assert quote_in_text("Motto: \"ALT FOR NORGE\"", PAGE)
    assert quote_in_text("Area (km2) | 385207", PAGE)  # ² → 2 by NFKC; 385,207 read as a number


@pytest.mark.parametrize(
    ("quote", "text", "found"),
    [
        ("1,234", "it has 1234 people", True),
        ("1234", "it has 1,234 people", True),
        ("1,234.50 km", "1234.5 km", True),
        ("7.0", "about 7 units", True),
        ("12", "it has 123 people", False),  # never part of a longer number
        ("23", "it has 123 people", False),
        ("1.5", "a 1.55 ratio", False),
        ("Population | 5,425,270", PAGE, True),
        ("Population | 5,425,271", PAGE, False),
    ],
)
def test_numbers_compare_as_numbers(quote: str, text: str, found: bool) -> None:
    assert quote_in_text(quote, text) is found


@pytest.mark.parametrize(
    ("value", "quote", "held"),
    [
        ("Oslo", "| Capital | Oslo |", True),
        ("oslo", "Capital: OSLO", True),
        ("Bergen", "| Capital | Oslo |", False),
        ("5425270", "Population | 5,425,270", True),
        ("$5,425,270", "Population 5425270", True),  # currency sign aside, the same number
        ("54%", "a share of 54 %", True),
        ("542527", "Population | 5,425,270", False),
        ("5425270", "Population | 5,425,270,000", False),
    ],
)
def test_value_must_be_in_the_quote(value: str, quote: str, held: bool) -> None:
    assert value_in_quote(value, quote) is held


def test_check_evidence_verified_unverified_and_no_evidence() -> None:
    pages = FetchedPages()
    pages.add("https://Atlas.example/no/#top", PAGE)
    url = "https://atlas.example/no"
    assert check_evidence("5425270", "Population | 5,425,270", url, pages) is Evidence.VERIFIED
    assert check_evidence("5425270", "Population | 5,425,270", url + "/", pages) is Evidence.VERIFIED  # same page
    assert check_evidence("5425270", "Population | 5,425,270", None, pages) is Evidence.VERIFIED  # any page of the attempt
    assert check_evidence("6000000", "Population | 6,000,000", url, pages) is Evidence.UNVERIFIED  # made up
    assert check_evidence("Oslo", "Population | 5,425,270", url, pages) is Evidence.UNVERIFIED  # value not in quote
    assert check_evidence("Oslo", "Capital | Oslo", "https://other.example/", pages) is Evidence.UNVERIFIED  # not read there
    assert check_evidence("Oslo", None, url, pages) is Evidence.NO_EVIDENCE
    assert check_evidence("Oslo", "  ", url, pages) is Evidence.NO_EVIDENCE


# -- what the tools record ----------------------------------------------------------------------


class _Service:
    def search(self, query: str, n: int) -> list[SearchResult]:
        return [SearchResult(rank=1, title="Norway facts", url="https://atlas.example/no", snippet="capital Oslo")]

    def crawl(self, url: str, max_chars: int) -> Page:
        return Page(url=url, final_url="https://atlas.example/no", title="Norway", text=PAGE, content_type="text/html")


def test_tools_record_what_they_fetched_only_inside_a_recording() -> None:
    search, crawl = WebSearchTool(_Service()), CrawlPageTool(_Service(), focused=False)  # type: ignore[arg-type]
    pages = FetchedPages()
    search.forward("norway")  # outside an attempt: nothing to record into, nothing fails
    with recording(pages):
        search.forward("norway")
        crawl.forward("http://atlas.example/redirect")
    assert pages.urls() == ["https://atlas.example/no", "http://atlas.example/redirect"]
    assert pages.contains("capital Oslo", "https://atlas.example/no")  # the search snippet
    assert pages.contains("Population | 5,425,270", "http://atlas.example/redirect")  # request and final URL
    crawl.forward("https://atlas.example/later")
    assert "https://atlas.example/later" not in pages.urls()
    record_fetched("text", None, "")  # no URL: nothing recorded, no error


# -- the reply format -----------------------------------------------------------------------------


def _projected(row: dict[str, Any]) -> Any:
    return project_row(parse_reply(json.dumps([row])).rows[0], ["country", "capital", "population"])


def test_reply_quotes_per_cell_and_per_cell_urls() -> None:
    row = _projected({
        "task": 1, "country": "Norway", "capital": "Oslo", "population": "5425270", "source": "https://atlas.example/no",
        "Quotes": {"Capital": "| Capital | Oslo |", "population": {"quote": "5,425,270", "url": "https://stats.example/no"},
                   "unknown": "ignored"},
    })
    assert row.quotes == {"capital": "| Capital | Oslo |", "population": "5,425,270"}
    assert row.cell_sources == {"population": "https://stats.example/no"}
    assert "Quotes" not in row.extra
    pages = FetchedPages()
    pages.add("https://atlas.example/no", PAGE)
    checked = with_evidence(row, pages, "record")
    # the population quote names a page the attempt never fetched
    assert checked.evidence == {"country": Evidence.NO_EVIDENCE, "capital": Evidence.VERIFIED,
                                "population": Evidence.UNVERIFIED}
    assert with_evidence(row, pages, "off").evidence == {}


def test_old_replies_without_quotes_still_parse_and_have_no_evidence() -> None:
    row = _projected({"task": 1, "country": "Norway", "capital": "Oslo", "source": "https://atlas.example/no"})
    assert row.values["capital"] == "Oslo" and row.quotes == {}
    pages = FetchedPages()
    pages.add("https://atlas.example/no", PAGE)
    assert set(with_evidence(row, pages, "strict").evidence.values()) == {Evidence.NO_EVIDENCE}


def test_old_journal_rows_replay_without_evidence() -> None:
    old = {"task_index": 0, "values": {"country": "Norway", "capital": "Oslo"}, "source": "u", "matrix_columns": ["country"]}
    attempt = BatchAttempt.model_validate({"execution": 1, "batch_id": "b", "phase": "map", "attempt": 1,
                                           "outcome": "ok", "done": True, "rows": [old]})
    tables = {0: Table(["country", "capital"], ["country"])}
    assert attempt.rows[0].apply(tables)
    cell = tables[0].rows[0].cells["capital"]
    assert cell.quote is None and cell.evidence is Evidence.NO_EVIDENCE
    new = MergedRow(task_index=0, values={"country": "Norway", "capital": "Oslo"}, source="u", matrix_columns=("country",),
                    quotes={"capital": "Oslo"}, evidence={"capital": Evidence.VERIFIED})
    assert MergedRow.model_validate_json(new.model_dump_json()) == new  # the journal keeps quotes and evidence


# -- the table, --verify strict -------------------------------------------------------------------


def _table(strict: bool = False) -> Table:
    table = Table(["country", "capital"], ["country"], strict_evidence=strict)
    table.upsert({"country": "Norway", "capital": "Bergen"}, task_index=0, source="u1",
                 sources={"country": "task_matrix"}, quotes={"capital": "Capital | Bergen"},
                 evidence={"capital": Evidence.UNVERIFIED})
    return table


def test_strict_counts_unverified_as_missing_and_a_verified_value_replaces_it() -> None:
    assert _table().rows[0].missing() == []
    table = _table(strict=True)
    assert table.rows[0].missing() == ["capital"] and table.missing_cells() == [(0, "capital")]
    table.upsert({"country": "Norway", "capital": "Trondheim"}, task_index=0, quotes={"capital": "x"},
                 evidence={"capital": Evidence.UNVERIFIED})  # unverified does not replace unverified
    assert table.rows[0].cells["capital"].value == "Bergen"
    table.upsert({"country": "Norway", "capital": "Oslo"}, task_index=0, source="u2", quotes={"capital": "Capital | Oslo"},
                 evidence={"capital": Evidence.VERIFIED})
    cell = table.rows[0].cells["capital"]
    assert (cell.value, cell.source, cell.quote, cell.evidence) == ("Oslo", "u2", "Capital | Oslo", Evidence.VERIFIED)
    assert cell.status is CellStatus.CONFLICT and cell.alternatives == ["Trondheim", "Bergen"]  # never lost
    assert table.missing_cells() == []
    reduced = Table(["country", "capital"], ["country"], strict_evidence=True)
    reduced.merge_row(table.rows[0])  # the reduce keeps the verified value: alternatives are no evidence
    assert reduced.rows[0].cells["capital"].value == "Oslo"
    assert reduced.evidence_counts() == {"verified": 1, "unverified": 0, "no_evidence": 0}  # the matrix cell is not counted


def test_record_keeps_the_first_value() -> None:
    table = _table()
    table.upsert({"country": "Norway", "capital": "Oslo"}, task_index=0, evidence={"capital": Evidence.VERIFIED})
    assert table.rows[0].cells["capital"].value == "Bergen" and table.rows[0].cells["capital"].alternatives == ["Oslo"]


def test_json_csv_and_jsonl_carry_quote_and_evidence() -> None:
    table = _table()
    cells = table.to_json()["rows"][0]["cells"]
    assert cells["capital"] == {"value": "Bergen", "status": "found", "source": "u1", "quote": "Capital | Bergen",
                                "evidence": "unverified", "confidence": 0.3}
    assert cells["country"]["quote"] is None and cells["country"]["evidence"] == "no_evidence"
    assert to_csv(table) == "country,capital\nNorway,Bergen\n"
    assert to_csv(table, evidence=True).splitlines() == [
        "country,country quote,country evidence,country confidence,capital,capital quote,capital evidence,"
        "capital confidence",
        "Norway,,no_evidence,1,Bergen,Capital | Bergen,unverified,0.3",  # the country: given by the task matrix
    ]
    line = json.loads(to_jsonl(table, with_status=True))
    assert line["_quotes"] == {"capital": "Capital | Bergen"}
    assert line["_evidence"] == {"country": "no_evidence", "capital": "unverified"}
    assert line["_confidence"] == {"country": 1.0, "capital": 0.3}


def test_verify_setting_is_checked() -> None:
    assert load_settings({}).verify == "record"
    assert load_settings({"AMAPREDUCE_VERIFY": "strict"}).verify == "strict"
    with pytest.raises(ConfigError, match="AMAPREDUCE_VERIFY"):
        load_settings({"AMAPREDUCE_VERIFY": "sometimes"})


# -- the engine: what an attempt fetched, and strict re-asking -----------------------------------


class _FetchingSolver:
    """Reads a page through the tool seam (`record_fetched`) and answers with a quote: attempts in
    `wrong` answer a made-up population with a made-up quote."""

    def __init__(self, wrong: Callable[[BatchRequest], bool]) -> None:
        self.wrong = wrong
        self.requests: list[BatchRequest] = []

    def solve(self, request: BatchRequest) -> SolverReply:
        self.requests.append(request)
        record_fetched(PAGE, "https://atlas.example/no")
        value, quote = ("6000000", "Population | 6,000,000") if self.wrong(request) else ("5425270", "Population | 5,425,270")
        rows = [{"task": 1, "population": value, "source": "https://atlas.example/no", "quotes": {"population": quote}}]
        return SolverReply(output=json.dumps(rows), usage=Usage(requests=1))


_DECISION = {"task_matrix": [["Norway"]], "template": "Population of __0__", "json_schema": ["country", "population"]}


@pytest.mark.parametrize("verify", ["record", "strict"])
def test_engine_checks_quotes_and_strict_asks_again(verify: str) -> None:
    solver = _FetchingSolver(lambda request: request.attempt == 1 and not request.batch_id.startswith("patch"))
    result = MapReduceEngine(solver, config=EngineConfig(verify=verify)).run(Decision.parse(_DECISION))  # type: ignore[arg-type]
    cell = result.table.rows[0].cells["population"]
    if verify == "record":
        assert len(solver.requests) == 1 and (cell.value, cell.evidence) == ("6000000", Evidence.UNVERIFIED)
        assert result.summary.complete
    else:
        assert len(solver.requests) == 2 and "still missing population" in solver.requests[1].prompt
        assert (cell.value, cell.evidence, cell.alternatives) == ("5425270", Evidence.VERIFIED, ["6000000"])


def test_strict_patch_round_asks_for_unverified_cells() -> None:
    solver = _FetchingSolver(lambda request: not request.batch_id.startswith("patch"))
    config = EngineConfig(verify="strict", max_attempts=1, patch_rounds=1)
    result = MapReduceEngine(solver, config=config).run(Decision.parse(_DECISION))
    assert len(solver.requests) == 2 and solver.requests[1].batch_id.startswith("patch1.")
    assert "find its population" in solver.requests[1].prompt
    assert result.table.rows[0].cells["population"].evidence is Evidence.VERIFIED and result.summary.complete


def test_strict_unverified_cells_leave_the_run_incomplete() -> None:
    solver = _FetchingSolver(lambda request: True)
    config = EngineConfig(verify="strict", max_attempts=1, patch_rounds=0)
    result = MapReduceEngine(solver, config=config).run(Decision.parse(_DECISION))
    assert result.summary.missing_cells == 1 and not result.summary.complete


def test_attempts_do_not_see_each_others_pages() -> None:
    def solve(request: BatchRequest) -> SolverReply:
        if request.tasks[0].endswith("Norway"):  # only this attempt reads the page
            record_fetched(PAGE, "https://atlas.example/no")
        rows = [{"task": 1, "population": "5425270", "source": "https://atlas.example/no",
                 "quotes": {"population": "Population | 5,425,270"}}]
        return SolverReply(output=json.dumps(rows))

    solver = type("S", (), {"solve": staticmethod(solve)})()
    decision = {**_DECISION, "task_matrix": [["Norway"], ["Sweden"]]}
    result = MapReduceEngine(solver, config=EngineConfig(workers=2)).run(Decision.parse(decision))
    assert [r.cells["population"].evidence for r in result.table.rows] == [Evidence.VERIFIED, Evidence.UNVERIFIED]


def test_csv_copy_has_evidence_only_when_asked(tmp_path: Path) -> None:
    from amapreduce.cli.output import write_table_copies

    table = _table()
    write_table_copies(table, "md", out=None, csv_out=tmp_path / "a.csv")
    write_table_copies(table, "md", out=None, csv_out=tmp_path / "b.csv", evidence=True)
    assert "evidence" not in (tmp_path / "a.csv").read_text()
    assert "capital evidence" in (tmp_path / "b.csv").read_text()


def test_a_quote_that_only_names_the_entity_verifies_no_other_column() -> None:
    """SmolLM2-135M filled `capital` with the country's name and quoted it from the country's page:
    a quote found on the page, which says nothing of the capital."""
    from amapreduce.mapreduce.evidence import with_evidence
    from amapreduce.mapreduce.replies import project_row
    from amapreduce.table.evidence import Evidence, FetchedPages

    pages = FetchedPages()
    pages.add("corpus://atlas/ke.html", "Kenya is a country in Africa. Its capital is Nairobi.")
    row = project_row({"capital": "Kenya", "country": "Kenya", "source": "corpus://atlas/ke.html",
                       "quotes": {"capital": "Kenya", "country": "Kenya"}}, ["country", "capital"])
    checked = with_evidence(row, pages, "record", {"Kenya": "country"})
    assert checked.evidence == {"capital": Evidence.UNVERIFIED, "country": Evidence.VERIFIED}
    right = project_row({"capital": "Nairobi", "source": "corpus://atlas/ke.html",
                         "quotes": {"capital": "Its capital is Nairobi"}}, ["country", "capital"])
    assert with_evidence(right, pages, "record", {"Kenya": "country"}).evidence == {"capital": Evidence.VERIFIED}
    assert with_evidence(row, pages, "record").evidence["capital"] is Evidence.VERIFIED  # no entity known
