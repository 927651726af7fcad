"""`--corrected`: each fixed bug (B1, B2, B5, B6, B11, B12) changes the score it should, and is counted."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from amapreduce.evaluation.judges import ExactJudge, IdentityAligner
from amapreduce.evaluation.loaders import GoldTable, TaskSpec, gold_as_markdown, load_gold, load_tasks
from amapreduce.evaluation.preprocess import DateContext
from amapreduce.evaluation.score import ScoreConfig, TableResult, score_table

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
