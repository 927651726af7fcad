"""A fuzz battery for the files users and models hand us (issue 17, item 9): decisions through
`mapreduce plan`, answer files and prediction lines through `eval score`. Whatever the input,
the command answers with exit 0, or exit 2 and exactly one `error:` line: never a traceback,
never another exit code.

Output goes to strict UTF-8 streams, as a terminal's would: a lone surrogate that reached the
console would raise here as it did for users. The examples are derandomized (the same ones on
every machine and run) and few (a few hundred in all), so the battery stays fast and CI stays
deterministic; the memory-import battery lives with the memory store's tests.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amapreduce._text import is_clean
from amapreduce.cli.app import main

FUZZ = settings(
    max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)

# -- building blocks -------------------------------------------------------------------------------

HOSTILE = [
    "\ud800", "\ud83d", "\udfff", "\ud83d\ude00", "\u200b", "\u200d", "\ufeff", "\u3164", "\x00", "\x1b[31m",
    "__0__", "__1__", "__\uff10__", "__\u0660__", "__" + "9" * 40 + "__", "[/x]", ":smile:", "\n", "|", "`", "\\",
]
"""Strings that broke, or could break, a parser, a validator or a writer."""

texts = st.one_of(st.text(max_size=12), st.sampled_from(HOSTILE), st.lists(st.sampled_from(HOSTILE), max_size=4).map("".join))
numbers = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6),
    st.sampled_from([0, 1, 2, 1000, 1001, 10_000, 10_001, 2**63, 10**18, 10**400, -(10**30)]),
    st.floats(allow_nan=True, allow_infinity=True),
)
leaves = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4), max_leaves=16
)

VALID_DECISION: dict[str, Any] = {
    "task_matrix": [["France", "Europe"], ["Japan", "Asia"], ["Kenya", "Africa"]],
    "template": "Capital of __0__ (__1__)?",
    "json_schema": {"type": "object", "properties": {"country": {}, "continent": {}, "capital": {}}},
    "batch_strategy": {"type": "by_attr", "attribute_index": 1, "max_group_size": 2, "rationale": "by continent"},
    "batch_size": 2,
    "key_columns": ["country"],
}
FIELDS = [*VALID_DECISION, "matrix_columns", "rows_per_task", "unknown"]
STRATEGY_FIELDS = ["type", "attribute_index", "attribute_name", "max_group_size", "groups", "chunk_size", "rationale"]


@st.composite
def mutated_decisions(draw: st.DrawFn) -> dict[str, Any]:
    """The valid decision with one to three fields replaced, deleted or added, cells and strategy
    included, or a hostile string appended to its text (which mostly keeps it valid, so the plan
    is printed with that string in it)."""
    doc = json.loads(json.dumps(VALID_DECISION))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        where = draw(st.sampled_from(["field", "strategy", "cell", "delete", "append", "append"]))
        if where == "append":
            hostile = draw(st.sampled_from(HOSTILE))
            target = draw(st.sampled_from(["template", "rationale", "cell", "column"]))
            if target == "template" and isinstance(doc.get("template"), str):
                doc["template"] += hostile
            elif target == "rationale" and isinstance(doc.get("batch_strategy"), dict):
                doc["batch_strategy"]["rationale"] = f"why {hostile}"
            elif target == "column" and isinstance(doc.get("json_schema"), dict):
                doc["json_schema"].get("properties", {})[f"extra{hostile}"] = {}
            elif target == "cell":
                doc["task_matrix"] = [["France" + hostile, "Europe"], ["Japan", "Asia" + hostile]]
        elif where == "field":
            doc[draw(st.sampled_from(FIELDS))] = draw(json_values)
        elif where == "strategy" and isinstance(doc.get("batch_strategy"), dict):
            doc["batch_strategy"][draw(st.sampled_from(STRATEGY_FIELDS))] = draw(json_values)
        elif where == "cell" and isinstance(doc.get("task_matrix"), list) and doc["task_matrix"]:
            row = draw(st.integers(min_value=0, max_value=len(doc["task_matrix"]) - 1))
            if isinstance(doc["task_matrix"][row], list) and doc["task_matrix"][row]:
                doc["task_matrix"][row][0] = draw(leaves)
        else:
            doc.pop(draw(st.sampled_from(FIELDS)), None)
    return doc


def as_json_text(value: Any) -> str:
    """`value` as a JSON file's text; ASCII escapes carry lone surrogates, as a model writes them."""
    return json.dumps(value)


raw_documents = st.one_of(
    st.text(alphabet='{}[]",:0123456789.eE-+ \\utrfalsn\uff10\u200b', max_size=80),
    st.sampled_from([
        "[" * 50_000 + "]" * 50_000,
        '{"a": ' * 5_000 + "1" + "}" * 5_000,
        '{"batch_size": ' + "9" * 5_000 + "}",
        '{"task_matrix": [["\\ud800"]], "template": "__0__", "json_schema": ["\\udfff"]}',
        "\ufeff{}",
        "",
        "NaN",
    ]),
)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`main(argv)` with stdout and stderr as strict UTF-8 streams; (exit code, out, err)."""
    raw_out, raw_err = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(raw_out, encoding="utf-8", errors="strict")
    err = io.TextIOWrapper(raw_err, encoding="utf-8", errors="strict")
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    out.flush()
    err.flush()
    return code, raw_out.getvalue().decode("utf-8"), raw_err.getvalue().decode("utf-8")


def assert_clean_outcome(code: int, out: str, err: str, *, ok_writes_stderr: bool = False) -> None:
    """Exit 0, or exit 2 with one `error:` line and nothing on stdout."""
    assert "Traceback" not in err
    assert code in (0, 2), (code, err)
    if code == 2:
        assert out == "" and err.startswith("error: ") and len(err.splitlines()) == 1, err
    elif not ok_writes_stderr:
        assert err == ""
    assert is_clean(out) and is_clean(err)


# -- decisions -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def plan_text(folder: Path, text: str, *, as_json: bool) -> tuple[int, str, str]:
    path = folder / "decision.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return run_cli(["mapreduce", "plan", str(path), *(["--json"] if as_json else [])])


@FUZZ
@given(doc=mutated_decisions(), as_json=st.booleans())
def test_mutated_decisions_plan_or_fail_in_one_line(fuzz_dir: Path, doc: dict[str, Any], as_json: bool) -> None:
    code, out, err = plan_text(fuzz_dir, as_json_text(doc), as_json=as_json)
    assert_clean_outcome(code, out, err)
    if code == 0 and as_json:
        assert json.loads(out)["num_rows"] >= 1


@FUZZ
@given(doc=json_values, as_json=st.booleans())
def test_random_json_documents_plan_or_fail_in_one_line(fuzz_dir: Path, doc: Any, as_json: bool) -> None:
    code, out, err = plan_text(fuzz_dir, as_json_text(doc), as_json=as_json)
    assert_clean_outcome(code, out, err)


@FUZZ
@given(text=raw_documents)
def test_raw_texts_plan_or_fail_in_one_line(fuzz_dir: Path, text: str) -> None:
    code, out, err = plan_text(fuzz_dir, text, as_json=False)
    assert_clean_outcome(code, out, err)


def test_the_fuzzed_decision_is_valid_unmutated(fuzz_dir: Path) -> None:
    """The mutations start from a decision that plans: a failure above is the mutation's doing."""
    code, out, err = plan_text(fuzz_dir, as_json_text(VALID_DECISION), as_json=True)
    assert code == 0 and err == "" and json.loads(out)["num_rows"] == 3


# -- answer files ----------------------------------------------------------------------------------

EVALUATION = {
    "unique_columns": ["country"],
    "required": ["country", "capital", "population"],
    "eval_pipeline": {
        "country": {"preprocess": ["norm_str"], "metric": ["exact_match"]},
        "capital": {"preprocess": ["norm_str"], "metric": ["exact_match"]},
        "population": {"preprocess": ["extract_number"], "metric": ["number_near"], "criterion": 0.1},
    },
}


@pytest.fixture(scope="module")
def benchmark(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-task benchmark (tasks jsonl and gold folder) in the WideSearch format."""
    root = tmp_path_factory.mktemp("bench")
    task = {"instance_id": "t1", "query": "Countries", "evaluation": json.dumps(EVALUATION), "language": "en"}
    (root / "tasks.jsonl").write_text(json.dumps(task) + "\n", encoding="utf-8")
    (root / "gold").mkdir()
    (root / "gold" / "t1.csv").write_text(
        "Country,Capital,Population\nFrance,Paris,68000000\nSpain,Madrid,48000000\n", encoding="utf-8"
    )
    (root / "pred").mkdir()
    return root


cells = st.one_of(st.text(max_size=10), st.sampled_from([*HOSTILE, "nan", "NA", "-", '"', "1e400", "9" * 400]))
markdown_tables = st.builds(
    lambda header, rows, fence: (fence[0] + "\n| " + " | ".join(header) + " |\n|---|---|---|\n"
                                 + "\n".join("| " + " | ".join(r) + " |" for r in rows) + "\n" + fence[1]),
    st.one_of(st.just(["Country", "Capital", "Population"]), st.lists(cells, min_size=0, max_size=4)),
    st.lists(st.lists(cells, min_size=0, max_size=5), max_size=4),
    st.sampled_from([("```markdown", "```"), ("```md", "```"), ("", ""), ("```markdown", "")]),
)
answers = st.one_of(
    markdown_tables.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=120),
    st.text(alphabet="|-: \n`markdown\"'\\\ud83d", max_size=120).map(lambda t: t.encode("utf-8", "surrogatepass")),
)


def score(benchmark: Path, source: list[str], corrected: bool) -> tuple[int, str, str]:
    return run_cli([
        "eval", "score", "--tasks", str(benchmark / "tasks.jsonl"), "--gold-dir", str(benchmark / "gold"),
        *source, "--out", str(benchmark / "results.json"), "--details", str(benchmark / "details"),
        *(["--corrected"] if corrected else []),
    ])


@FUZZ
@given(answer=answers, corrected=st.booleans())
def test_answer_files_score_or_fail_in_one_line(benchmark: Path, answer: bytes, corrected: bool) -> None:
    (benchmark / "pred" / "t1.md").write_bytes(answer)
    code, out, err = score(benchmark, ["--pred-dir", str(benchmark / "pred")], corrected)
    assert_clean_outcome(code, out, err, ok_writes_stderr=True)
    if code == 0:
        assert json.loads((benchmark / "results.json").read_text(encoding="utf-8"))["per_task"]["t1"]


prediction_lines = st.one_of(
    st.builds(lambda response, trial: json.dumps({"instance_id": "t1", "trial": trial, "response": response}),
              st.one_of(st.none(), texts, markdown_tables), st.one_of(numbers, texts)),
    json_values.map(json.dumps),
    st.sampled_from(['{"instance_id": "t1", "trial": 1, "response": "' + "[" * 50_000 + '"}', "[" * 50_000]),
)


prediction_files = st.one_of(
    st.lists(prediction_lines, min_size=1, max_size=3).map(lambda lines: ("\n".join(lines) + "\n").encode()),
    st.binary(max_size=80),
)


@FUZZ
@given(content=prediction_files)
def test_prediction_lines_score_or_fail_in_one_line(benchmark: Path, content: bytes) -> None:
    (benchmark / "pred.jsonl").write_bytes(content)
    code, out, err = score(benchmark, ["--pred-jsonl", str(benchmark / "pred.jsonl")], False)
    assert_clean_outcome(code, out, err, ok_writes_stderr=True)
