"""The scorer against the measured official numbers (docs/scorer-rules.md §11).

Each expected value below is the official scorer's output with the stand-ins of
docs/scorer-rules.md §10, to 3 decimals (the full tables live here; the page summarises them);
counts-based cases are also checked as exact fractions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from amapreduce.evaluation.judges import ExactJudge, IdentityAligner, NormAligner
from amapreduce.evaluation.loaders import GoldTable, TaskSpec, gold_as_markdown, load_gold, load_tasks
from amapreduce.evaluation.preprocess import DateContext
from amapreduce.evaluation.score import ScoreConfig, TableResult, score_table
from amapreduce.evaluation.summary import summarize

FENCE = "```"
TEN = [
    "ws_en_002",
    "ws_en_004",
    "ws_en_008",
    "ws_en_013",
    "ws_en_018",
    "ws_en_022",
    "ws_en_041",
    "ws_en_053",
    "ws_en_061",
    "ws_en_085",
]

# variant -> per-task "SR/rowF1/itemF1" in TEN order; † evaluator crash (B4), ‡ column mismatch.
ALL_ONE = ["1/1.000/1.000"] * 10
EXPECTED = {
    "gold": ALL_ONE,
    "reorder_cols": ALL_ONE,
    "rename_header_case_space": ALL_ONE,
    "dup_row_exact": ALL_ONE,
    "no_fence": ALL_ONE,
    "drop_row": "0/0.987/0.987 0/0.970/0.970 0/0.980/0.980 0/0.995/0.995 0/0.947/0.947 0/0.974/0.974 0/0.993/0.993 0/0.994/0.994 0/0.980/0.980 0/0.976/0.976".split(),
    "change_cell": "0/0.974/0.996 0/0.941/0.996 0/0.960/0.993 0/0.991/0.997 0/0.900/0.983 0/0.950/0.994 0/0.986/0.998 0/0.988/0.998 0/0.960/0.995 0/0.952/0.990".split(),
    "add_extra_row": "0/0.987/0.987 0/0.971/0.971 0/0.980/0.980 0/0.995/0.995 0/0.952/0.952 0/0.976/0.976 0/0.993/0.993 0/0.994/0.994 0/0.980/0.980 0/0.977/0.977".split(),
    "change_key_cell": "0/0.974/0.974 0/0.941/0.941 0/0.960/0.960 0/0.991/0.991 0/0.900/0.900 0/0.950/0.950 0/0.986/0.986 0/0.988/0.988 0/0.960/0.960 0/0.952/0.952".split(),
    "dup_row_key_case": "0/1.013/1.013 0/1.029/1.029 0/1.020/1.020 0/1.005/1.005 0/1.048/1.048 0/1.024/1.024 0/1.007/1.007 0/1.006/1.006 0/1.020/1.020 0/1.023/1.023".split(),
    "two_tables_first_wrong": ["0/0.000/0.000"] + ["0/0.000/0.000†"] * 8 + ["0/0.000/0.000"],
    "extra_column": ["0/0.000/0.000‡"] * 10,
    "missing_column": ["0/0.000/0.000‡"] * 10,
    "header_punct": ["0/0.000/0.000‡"] * 10,
    "header_underscore": ["0/0.000/0.000‡"] * 10,
}


def render(headers: list[str], rows: list[list[str]], *, fence: bool = True, outer: bool = True) -> str:
    def line(cells: list[str]) -> str:
        body = " | ".join(cells)
        return f"| {body} |" if outer else body

    sep = "|" + "---|" * len(headers) if outer else " | ".join("---" for _ in headers)
    text = "\n".join([line(headers), sep, *(line(r) for r in rows)])
    return f"{FENCE}markdown\n{text}\n{FENCE}" if fence else text


def case_changed(value: str) -> str:
    for candidate in (value.upper(), value.lower()):
        if candidate != value:
            return candidate
    return f"**{value}**"


def variants(task: TaskSpec, gold: GoldTable) -> dict[str, str]:
    heads = list(gold.raw_headers)
    rows = [[" ".join(v.replace("|", "/").splitlines()) for v in row] for row in gold.rows]
    key_idx = [gold.columns.index(c) for c in task.evaluation.unique_columns]
    non_key = [i for i in range(len(heads)) if i not in key_idx]
    out = {"gold": render(heads, rows)}
    out["reorder_cols"] = render(heads[::-1], [r[::-1] for r in rows])
    out["rename_header_case_space"] = render(
        ["  " + h.upper().replace(" ", "   ") + "  " for h in heads], rows
    )
    out["dup_row_exact"] = render(heads, [*rows, list(rows[0])])
    out["no_fence"] = "Here is the table:\n" + render(heads, rows, fence=False) + "\nDone."
    out["drop_row"] = render(heads, rows[:-1])
    changed = [list(r) for r in rows]
    changed[0][non_key[0]] = "zzz wrong value"
    out["change_cell"] = render(heads, changed)
    extra = list(rows[0])
    for k in key_idx:
        extra[k] = "Fictional Entity Zzyzx"
    out["add_extra_row"] = render(heads, [*rows, extra])
    changed = [list(r) for r in rows]
    changed[0][key_idx[0]] = "zzz wrong key"
    out["change_key_cell"] = render(heads, changed)
    dup = list(rows[0])
    for k in key_idx:
        dup[k] = case_changed(dup[k])
    out["dup_row_key_case"] = render(heads, [*rows, dup])
    out["two_tables_first_wrong"] = (
        "Draft:\n" + render(heads, [["TBD"] * len(heads)]) + "\nFinal:\n" + render(heads, rows)
    )
    out["extra_column"] = render([*heads, "Notes"], [[*r, "see source"] for r in rows])
    out["missing_column"] = render(heads[:-1], [r[:-1] for r in rows])
    out["header_punct"] = render([f"{heads[0]} (value)", *heads[1:]], rows)
    out["header_underscore"] = render([h.replace(" ", "_") for h in heads], rows)
    return out


def cell(result: TableResult) -> str:
    mark = "†" if "B4" in result.msg else ("‡" if result.msg.startswith("required_columns") else "")
    return f"{int(result.score)}/{result.f1_by_row:.3f}/{result.f1_by_item:.3f}{mark}"


@pytest.fixture(scope="module")
def ws(benchmark_data: Path) -> tuple[dict[str, TaskSpec], Path]:
    root = benchmark_data / "widesearch"
    return load_tasks(root / "widesearch.jsonl", "widesearch"), root / "widesearch_gold"


def config(aligner: object = None, **kwargs: object) -> ScoreConfig:
    return ScoreConfig(
        "widesearch",
        ExactJudge(),
        aligner or IdentityAligner(),
        DateContext(),
        **kwargs,  # type: ignore[arg-type]
    )


def test_ten_task_perturbation_table(ws: tuple[dict[str, TaskSpec], Path]) -> None:
    tasks, gold_dir = ws
    cfg = config()
    got: dict[str, list[str]] = {}
    for iid in TEN:
        gold = load_gold(gold_dir, tasks[iid])
        for name, text in variants(tasks[iid], gold).items():
            got.setdefault(name, []).append(cell(score_table(tasks[iid], gold, text, cfg)))
    assert got == EXPECTED


def test_norm_alignment_only_rescues_underscored_headers(ws: tuple[dict[str, TaskSpec], Path]) -> None:
    tasks, gold_dir = ws
    cfg = config(NormAligner())
    for iid in TEN:
        gold = load_gold(gold_dir, tasks[iid])
        for name, text in variants(tasks[iid], gold).items():
            expected = ALL_ONE if name == "header_underscore" else EXPECTED[name]
            assert cell(score_table(tasks[iid], gold, text, cfg)) == expected[TEN.index(iid)], (iid, name)


@pytest.mark.parametrize(
    ("iid", "variant", "expected"),
    [
        ("ws_en_018", "drop_row", (1, 9 / 10, 1, 9 / 10)),
        ("ws_en_018", "add_extra_row", (10 / 11, 1, 10 / 11, 1)),
        ("ws_en_018", "change_cell", (9 / 10, 9 / 10, 59 / 60, 59 / 60)),
        ("ws_en_018", "change_key_cell", (9 / 10, 9 / 10, 54 / 60, 54 / 60)),
        ("ws_en_018", "dup_row_key_case", (1, 11 / 10, 1, 11 / 10)),
        ("ws_en_013", "drop_row", (1, 108 / 109, 1, 108 / 109)),
        ("ws_en_013", "change_cell", (108 / 109, 108 / 109, 326 / 327, 326 / 327)),
    ],
)
def test_precision_recall_exact(
    ws: tuple[dict[str, TaskSpec], Path], iid: str, variant: str, expected: tuple[float, ...]
) -> None:
    tasks, gold_dir = ws
    gold = load_gold(gold_dir, tasks[iid])
    result = score_table(tasks[iid], gold, variants(tasks[iid], gold)[variant], config())
    got = (result.precision_by_row, result.recall_by_row, result.precision_by_item, result.recall_by_item)
    assert got == pytest.approx(expected, abs=1e-12)


def test_four_trial_summary(ws: tuple[dict[str, TaskSpec], Path]) -> None:
    tasks, gold_dir = ws
    cfg = config()
    per_task = {}
    for iid in TEN:
        gold = load_gold(gold_dir, tasks[iid])
        texts = variants(tasks[iid], gold)
        per_task[iid] = [
            score_table(tasks[iid], gold, texts[v], cfg).metrics()
            for v in ("gold", "drop_row", "change_cell", "gold")
        ]
    summary = summarize(per_task, ["score", "f1_by_row", "f1_by_item"])
    assert summary["score"] == {"avg_n": 0.5, "max_n": 1.0, "min_n": 0.0}
    assert summary["f1_by_row"]["avg_n"] == pytest.approx(0.9849, abs=5e-5)
    assert summary["f1_by_row"]["max_n"] == 1.0
    assert summary["f1_by_row"]["min_n"] == pytest.approx(0.9602, abs=5e-5)
    assert summary["f1_by_item"]["avg_n"] == pytest.approx(0.9934, abs=5e-5)
    assert summary["f1_by_item"]["min_n"] == pytest.approx(0.9795, abs=5e-5)


def _edge_variants(task: TaskSpec, gold: GoldTable) -> dict[str, str]:
    heads = list(gold.raw_headers)
    rows = [list(r) for r in gold.rows]
    key_idx = [gold.columns.index(c) for c in task.evaluation.unique_columns]
    int_key = next(i for i in key_idx if all(r[i].isdigit() for r in rows))
    text_col = next(i for i in range(len(heads)) if i not in key_idx and not rows[0][i].isdigit())
    out: dict[str, str] = {}
    for marker in ("", "N/A"):
        blank = [list(r) for r in rows]
        blank[0][int_key] = marker
        out[f"int_key_{marker or 'blank'}"] = render(heads, blank)
    piped = [list(r) for r in rows]
    piped[0][text_col] = "A | B"
    out["pipe_in_row_1"] = render(heads, piped)
    out["md_fence"] = render(heads, rows).replace(f"{FENCE}markdown", f"{FENCE}md", 1)
    out["no_fence_no_outer_pipes"] = render(heads, rows, fence=False, outer=False)
    out["fenced_no_outer_pipes"] = render(heads, rows, outer=False)
    bold = [list(r) for r in rows]
    for r in bold:
        for k in key_idx:
            r[k] = f"**{r[k]}**"
    out["bold_keys"] = render(heads, bold)
    br = [list(r) for r in rows]
    br[0][text_col] = "foo<br>bar"
    out["br_cell"] = render(heads, br)
    out["dash_row"] = render(heads, [*rows, ["-"] * len(heads)])
    out["duplicate_header"] = render([heads[0], heads[0], *heads[2:]], rows)
    return out


@pytest.mark.parametrize(("iid", "br_expected"), [("ws_en_022", "0/0.950"), ("ws_en_041", "0/0.986")])
def test_edge_cases(ws: tuple[dict[str, TaskSpec], Path], iid: str, br_expected: str) -> None:
    tasks, gold_dir = ws
    gold = load_gold(gold_dir, tasks[iid])
    got = {
        name: cell(score_table(tasks[iid], gold, text, config()))
        for name, text in _edge_variants(tasks[iid], gold).items()
    }
    assert got["int_key_blank"] == got["int_key_N/A"] == "0/0.000/0.000†"
    assert got["pipe_in_row_1"] == "0/0.000/0.000†"
    for name in ("md_fence", "fenced_no_outer_pipes", "bold_keys", "dash_row"):
        assert got[name] == "1/1.000/1.000", name
    assert got["no_fence_no_outer_pipes"] == "0/0.000/0.000‡"
    assert got["duplicate_header"] == "0/0.000/0.000‡"
    assert got["br_cell"].startswith(br_expected)


def test_float_gold_column_zeroes_filled_years(ws: tuple[dict[str, TaskSpec], Path]) -> None:
    tasks, gold_dir = ws
    task = tasks["ws_en_054"]
    gold = load_gold(gold_dir, task)
    ci = gold.columns.index("completionyear")
    assert sum(r[ci] == "nan" for r in gold.rows) == 8  # the released gold has 8 NA (docs/scorer-rules.md §11)
    # The answer writes whole years ("2022", and 2030 for the gaps): an int column, so "2022"
    # never equals the float gold's "2022.0" (bug B1).
    filled = {"nan": "2030"}
    rows = [
        [(filled.get(v, v.removesuffix(".0")) if i == ci else v) for i, v in enumerate(r)] for r in gold.rows
    ]
    result = score_table(task, gold, render(list(gold.raw_headers), rows), config())
    assert (result.score, result.f1_by_row) == (0.0, 0.0)
    assert result.f1_by_item == pytest.approx(0.80, abs=5e-3)


def test_full_gold_pass(ws: tuple[dict[str, TaskSpec], Path]) -> None:
    tasks, gold_dir = ws
    cfg = config()
    results = []
    for task in tasks.values():
        gold = load_gold(gold_dir, task)
        results.append(score_table(task, gold, gold_as_markdown(gold), cfg))
    assert len(results) == 200
    assert sum(r.score for r in results) == 163
    assert sum(r.score for r in results if r.instance_id.startswith("ws_en")) == 79
    assert sum(r.f1_by_row for r in results) / 200 == pytest.approx(0.9507, abs=5e-5)
    assert sum(r.f1_by_item for r in results) / 200 == pytest.approx(0.9892, abs=5e-5)
    failed = {r.instance_id for r in results if r.score != 1}
    assert "ws_zh_006" in failed and "ws_en_093" in failed


def test_missing_response_and_no_table() -> None:
    task = TaskSpec.model_validate(
        {
            "instance_id": "t1",
            "evaluation": {
                "unique_columns": ["name"],
                "required": ["name", "year"],
                "eval_pipeline": {
                    "name": {"preprocess": ["norm_str"], "metric": ["exact_match"]},
                    "year": {"preprocess": ["norm_str"], "metric": ["exact_match"]},
                },
            },
        }
    )
    gold = GoldTable(["name", "year"], [("A", "2019")], ["Name", "Year"])
    assert score_table(task, gold, None, config()).msg == "response is None"
    assert score_table(task, gold, "no table here", config()).msg == "response_df is None"
    broken = score_table(task, gold, render(["Name", "Year"], [["A", "2019"], ["B", "1 | 2 | 3"]]), config())
    assert broken.msg.startswith("evaluator error") and broken.f1_by_item == 0.0
