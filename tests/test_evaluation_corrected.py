"""`--corrected`: each fixed bug (B1, B2, B5, B6, B11, B12, B13) changes the score it should, and is counted."""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path

import pytest

from amapreduce.evaluation.judges import ExactJudge, IdentityAligner
from amapreduce.evaluation.loaders import GoldTable, TaskSpec, gold_as_markdown, load_gold, load_tasks
from amapreduce.evaluation.preprocess import DateContext
from amapreduce.evaluation.score import ScoreConfig, TableResult, explain_corrections, score_table
from amapreduce.sandbox import WORLD_DIR

FENCE = "```"


@pytest.fixture(scope="module")
def ws(benchmark_data: Path) -> tuple[dict[str, TaskSpec], Path]:
    root = benchmark_data / "widesearch"
    return load_tasks(root / "widesearch.jsonl", "widesearch"), root / "widesearch_gold"


def both(task: TaskSpec, gold_dir: Path, make_text: object) -> tuple[TableResult, TableResult]:
    """Score the same answer officially and corrected (each with its own gold reading)."""
    out = []
    for corrected in (False, True):
        gold = load_gold(gold_dir, task, corrected=corrected)
        cfg = ScoreConfig(
            "widesearch",
            ExactJudge(),
            IdentityAligner(),
            DateContext(reference=dt.date(2026, 1, 1), corrected=corrected),
            corrected=corrected,
        )
        out.append(score_table(task, gold, make_text(gold), cfg))  # type: ignore[operator]
    return out[0], out[1]


def table(gold: GoldTable, rows: list[list[str]] | None = None, headers: list[str] | None = None) -> str:
    heads = headers or list(gold.raw_headers)
    body = rows if rows is not None else [[" ".join(v.splitlines()) for v in r] for r in gold.rows]
    lines = [
        "| " + " | ".join(heads) + " |",
        "|" + "---|" * len(heads),
        *("| " + " | ".join(r) + " |" for r in body),
    ]
    return f"{FENCE}markdown\n" + "\n".join(lines) + f"\n{FENCE}"


def test_b5_newline_cells_and_b12_quoted_key(ws: tuple[dict[str, TaskSpec], Path]) -> None:
    tasks, gold_dir = ws
    for iid in ("ws_en_093", "ws_zh_006", "ws_en_003"):
        official, fixed = both(tasks[iid], gold_dir, gold_as_markdown)
        assert official.score == 0.0 and fixed.score == 1.0, iid
    _, fixed = both(tasks["ws_zh_006"], gold_dir, gold_as_markdown)
    assert fixed.corrections["B12 cells with a literal leading quote"] >= 1


def test_b1_integer_years_match_float_gold(ws: tuple[dict[str, TaskSpec], Path]) -> None:
    tasks, gold_dir = ws

    def filled(gold: GoldTable) -> str:
        ci = gold.columns.index("completionyear")
        rows = [
            [("2030" if v in ("nan",) else v.removesuffix(".0")) if i == ci else v for i, v in enumerate(r)]
            for r in gold.rows
        ]
        return table(gold, rows)

    official, fixed = both(tasks["ws_en_054"], gold_dir, filled)
    assert official.f1_by_row == 0.0
    assert fixed.f1_by_row == pytest.approx(0.5)  # the 8 real years now match; the 8 gaps stay wrong


def test_b2_near_duplicate_rows_no_longer_inflate_recall(ws: tuple[dict[str, TaskSpec], Path]) -> None:
    tasks, gold_dir = ws

    def dup(gold: GoldTable) -> str:
        rows = [list(r) for r in gold.rows]
        extra = list(rows[0])
        extra[0] = extra[0].lower()
        return table(gold, [*rows, extra])

    official, fixed = both(tasks["ws_en_018"], gold_dir, dup)
    assert official.recall_by_row == pytest.approx(1.1)
    assert fixed.recall_by_row == 1.0 and fixed.score == 1.0
    assert fixed.corrections["B2 rows merged after preprocess"] == 1


def test_b11_last_table_and_dash_rows(ws: tuple[dict[str, TaskSpec], Path]) -> None:
    tasks, gold_dir = ws

    def draft_then_final(gold: GoldTable) -> str:
        return "Draft:\n" + table(gold, [["TBD"] * len(gold.columns)]) + "\nFinal:\n" + gold_as_markdown(gold)

    official, fixed = both(tasks["ws_en_018"], gold_dir, draft_then_final)
    assert official.score == 0.0 and fixed.score == 1.0
    assert fixed.corrections["B11 table extraction changed"] == 1

    def dash_row(gold: GoldTable) -> str:
        return table(gold, [*[list(r) for r in gold.rows], ["-"] * len(gold.columns)])

    official, fixed = both(tasks["ws_en_018"], gold_dir, dash_row)
    assert official.score == 1.0  # silently dropped by the official parser
    assert fixed.precision_by_row == pytest.approx(10 / 11)


def test_b6_unparseable_dates_no_longer_match_each_other() -> None:
    task = TaskSpec.model_validate(
        {
            "instance_id": "t",
            "evaluation": {
                "unique_columns": ["name"],
                "required": ["name", "date"],
                "eval_pipeline": {
                    "name": {"preprocess": ["norm_str"], "metric": ["exact_match"]},
                    "date": {"preprocess": ["norm_date"], "metric": ["date_near"]},
                },
            },
        }
    )
    gold = GoldTable(["name", "date"], [("a", "unknown"), ("b", "2019")], ["Name", "Date"])
    answer = table(gold, [["a", "not yet"], ["b", "2019"]])
    results = []
    for corrected in (False, True):
        cfg = ScoreConfig(
            "widesearch",
            ExactJudge(),
            IdentityAligner(),
            DateContext(reference=dt.date(2026, 6, 1), corrected=corrected),
            corrected=corrected,
        )
        results.append(score_table(task, gold, answer, cfg))
    assert results[0].score == 1.0  # "not yet" vs "unknown": both unparseable -> 1 officially
    assert results[1].precision_by_row == 0.5


def test_b11_table_without_fence_or_separator_is_still_found(ws: tuple[dict[str, TaskSpec], Path]) -> None:
    """The official pipe fallback reads an unfenced table with no `|---|` line; so must --corrected."""
    tasks, gold_dir = ws

    def bare(gold: GoldTable, *, outer: bool = True) -> str:
        lines = [
            line
            for line in gold_as_markdown(gold).split("\n")
            if not line.startswith(FENCE) and not line.startswith("|---")
        ]
        if not outer:
            lines = [line.strip().strip("|").strip() for line in lines]
        return "Here is the table:\n" + "\n".join(lines) + "\n\nSources: a | b\n"

    official, fixed = both(tasks["ws_en_018"], gold_dir, bare)
    assert official.score == 1.0 and fixed.score == 1.0, fixed.msg
    assert fixed.corrections["B11 table extraction changed"] == 0

    # Without leading pipes the official fallback drops every row's first cell; corrected keeps it.
    official, fixed = both(tasks["ws_en_018"], gold_dir, lambda gold: bare(gold, outer=False))
    assert official.score == 0.0 and fixed.score == 1.0, fixed.msg
    assert fixed.corrections["B11 table extraction changed"] == 1


def test_b11_fallback_ignores_prose_pipes() -> None:
    from amapreduce.evaluation.answer import extract_table_text

    assert extract_table_text("a | b and c | d | e | f", corrected=True) is None  # one line: not a table
    assert extract_table_text("x | y\n\nno pipes here", corrected=True) is None  # fewer than 4 pipes
    text = "|---|---|\n| h1 | h2 |\n| 1 | 2 |"
    assert extract_table_text(text, corrected=True) == "h1|h2\n1|2"


LABEL = "B13 cells read as text like the other table's column"


@pytest.fixture(scope="module")
def calling_codes() -> tuple[TaskSpec, list[list[str]]]:
    task = load_tasks(WORLD_DIR / "tasks.jsonl", "widesearch")["sbx_en_003"]
    with (WORLD_DIR / "gold" / "sbx_en_003.csv").open(newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    assert rows[0][3] == "Calling Code" and rows[1][3].startswith("+")
    return task, rows


def test_b13_one_made_up_calling_code_costs_only_its_row(calling_codes: tuple[TaskSpec, list[list[str]]]) -> None:
    task, rows = calling_codes
    n = len(rows) - 1
    official, fixed = both(task, WORLD_DIR / "gold", lambda gold: table(gold, rows[1:], rows[0]))
    assert official.score == fixed.score == 1.0 and fixed.corrections[LABEL] == 0

    wrong = [list(r) for r in rows]
    wrong[1][3] = "Zorblat"  # the answer's column now reads as text: `+213`, the gold's `213`
    official, fixed = both(task, WORLD_DIR / "gold", lambda gold: table(gold, wrong[1:], wrong[0]))
    assert official.f1_by_row == 0.0 and official.joined == n
    assert official.f1_by_item == pytest.approx(0.75)  # the whole calling-code column misses
    assert fixed.f1_by_row == pytest.approx((n - 1) / n)
    assert fixed.f1_by_item == pytest.approx((4 * n - 1) / (4 * n))
    assert fixed.corrections[LABEL] == n  # every gold calling code read back as written
    assert "B13" in explain_corrections({LABEL: n})


def test_b13_gold_text_column_against_an_all_number_answer(tmp_path: Path) -> None:
    """The reverse: the gold's column is text (`+1-868`), the answer's reads as numbers."""
    task = TaskSpec.model_validate(
        {
            "instance_id": "t",
            "evaluation": {
                "unique_columns": ["country"],
                "required": ["country", "callingcode", "year"],
                "eval_pipeline": {
                    "country": {"preprocess": ["norm_str"], "metric": ["exact_match"]},
                    "callingcode": {"preprocess": ["norm_str"], "metric": ["exact_match"]},
                    "year": {"preprocess": ["norm_str"], "metric": ["exact_match"]},
                },
            },
        }
    )
    (tmp_path / "t.csv").write_text(
        "Country,Calling Code,Year\nBrazil,+55,2019\nFrance,+33,\nTrinidad,+1-868,2001\n", encoding="utf-8"
    )
    rows = [["Brazil", "+55", "2019"], ["France", "+33", "2020"], ["Trinidad", "+1868", "2001"]]
    official, fixed = both(task, tmp_path, lambda gold: table(gold, rows))
    assert official.f1_by_row == 0.0  # `55` vs `+55`; and the years `2019` vs `2019.0` (B1)
    assert fixed.f1_by_row == pytest.approx(1 / 3)  # Brazil; France's year and the `+1868` differ
    assert fixed.corrections[LABEL] == 3  # the answer's three codes; years are numbers on both sides
    assert fixed.corrections["B1 cells rendered as integers"] == 0  # the answer's years were integers


def test_b13_reconcile_column_rules() -> None:
    from amapreduce.evaluation.answer import reconcile_column

    nums, text = ["55", "nan"], ["+55", "nan"]
    assert reconcile_column(nums, "number", text, ["+55", "x"], "text", None) == (text, ["+55", "x"], 1)
    assert reconcile_column(["x"], "text", None, ["7"], "number", ["007"]) == (["x"], ["007"], 1)
    assert reconcile_column(nums, "number", text, ["55.0"], "number", ["55.0"]) == (nums, ["55.0"], 0)
    assert reconcile_column(nums, "number", text, ["nan"], "other", None) == (nums, ["nan"], 0)


def test_b13_text_reading_keeps_the_b1_rendering_of_a_float_written_as_such() -> None:
    from io import StringIO

    from amapreduce.evaluation.answer import read_table_cells

    cells = read_table_cells(StringIO("k,v\na,-32.0\nb,+7\nc,\nd,0.50\n"), corrected=True)
    assert cells.kinds == ["text", "number"]
    assert cells.cells[1] == ["-32", "7", "nan", "0.5"]
    assert cells.as_text == [None, ["-32", "+7", "nan", "0.50"]]
    assert read_table_cells(StringIO("k,v\na,1\n")).as_text is None  # only read corrected
