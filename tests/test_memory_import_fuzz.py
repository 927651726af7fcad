"""`memory import` of hostile files (issue 17, items 6 and 9): one `error:` line, exit 2, nothing written.

The probe behind the issue fed 50 malformed files to `memory import`; 9 ended in a traceback
(binary, invalid UTF-8 and UTF-16 files; deep nesting; a 4,300-digit integer; a score of 2^63; a
record `trace` of the wrong shape). Each of those is pinned below, then a fuzz battery (derandomized,
so the same examples run everywhere) feeds random bytes and mutated export lines: the command
exits 0, or 2 with exactly one `error:` line naming the file, and on exit 2 the store is unchanged
(compared by a full SQL dump). The CLI runs with strict UTF-8 output streams (`run_cli`), as a
terminal's would be.
"""

from __future__ import annotations

import itertools
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amapreduce.memory.io import MAX_NESTING
from amapreduce.memory.schema import DB_NAME
from amapreduce.memory.store import MAX_SCORE
from tests.test_fuzz_inputs import HOSTILE, assert_clean_outcome, json_values, run_cli

FUZZ = settings(
    max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)

HEADER = {"type": "header", "format": "amapreduce-memory", "version": 1, "encoder": "hashing:64"}
RECORD = {"type": "record", "id": "r-new", "query": "Which rivers cross Bern?", "label": True,
          "decision": {"rows": 3, "cols": 2, "strategy": "per_atom"}, "metrics": {"score": 1.0},
          "task_id": "t9", "trace": {"batches": 3, "retries": 0}}
HINT = {"type": "hint", "id": "h-new", "text": "Batch rivers by canton.", "score": 2, "provenance": ["r-new"]}
KEYS = sorted({*HEADER, *RECORD, *HINT, "provenance_questions", "created_at", "bogus"})


def lines(*objs: Any) -> str:
    return "".join(json.dumps(obj) + "\n" for obj in objs)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding one record and one hint, imported through the CLI."""
    folder = tmp_path_factory.mktemp("template") / "store"
    export = folder.parent / "seed.jsonl"
    export.write_text(lines(HEADER, {**RECORD, "id": "r-old", "query": "Which lakes border Zurich?"},
                            {**HINT, "id": "h-old", "provenance": ["r-old"]}), encoding="utf-8")
    code, _, err = run_cli(["memory", "import", str(export), "--store", str(folder), "--encoder", "hashing:64"])
    assert code == 0, err
    return folder


_copies = itertools.count()


def fresh_store(template: Path) -> Path:
    """A copy of the template store in a folder of its own."""
    folder = template.parent / f"copy-{next(_copies)}"
    shutil.copytree(template, folder)
    return folder


def dump(folder: Path) -> list[str]:
    """Every row of the store as SQL, read without writing."""
    conn = sqlite3.connect(f"file:{folder / DB_NAME}?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


READERS = (["list"], ["stats"], ["show", "r-new"], ["show", "h-new"], ["search", "Which rivers?", "--no-project"])
"""What a user runs after an import; whatever it took in, each must answer cleanly."""


def import_bytes(template: Path, data: bytes, name: str = "in.jsonl") -> tuple[int, str, str, bool]:
    """`memory import` of a file holding `data` into a fresh copy of the template: (exit code,
    stdout, stderr, whether the store is unchanged). After an import that passed, the read-only
    commands must read the store cleanly too."""
    store = fresh_store(template)
    path = store.parent / f"{store.name}-{name}"
    path.write_bytes(data)
    before = dump(store)
    code, out, err = run_cli(["memory", "import", str(path), "--store", str(store)])
    unchanged = dump(store) == before
    if code == 0:
        for argv in READERS:
            read = run_cli(["memory", *argv, "--store", str(store), "--json"])
            assert_clean_outcome(*read)
            assert read[0] == 0 or "no record or hint" in read[2], (argv, read)
    shutil.rmtree(store)
    return code, out, err, unchanged


def assert_refused(outcome: tuple[int, str, str, bool], *phrases: str) -> str:
    code, out, err, unchanged = outcome
    assert_clean_outcome(code, out, err)
    assert code == 2, err
    assert unchanged
    for phrase in phrases:
        assert phrase in err, err
    return err


# -- the nine files that printed tracebacks -----------------------------------------------------------


@pytest.mark.parametrize(("data", "phrases"), [
    (b"\x00\x01\x02\xff\xfe binary \x80\x81", ["in.jsonl:1:", "not UTF-8"]),
    (lines(HEADER).encode() + b'{"type": "hint", "id": "h", "text": "caf\xe9", "score": 1}\n', ["in.jsonl:2:", "0xe9"]),
    (lines(HEADER, RECORD).encode("utf-16"), ["in.jsonl:1:", "UTF-16"]),
    (lines(HEADER).encode() + b"[" * 100_000 + b"]" * 100_000 + b"\n", ["in.jsonl:2:", f"deeper than {MAX_NESTING}"]),
    (b'{"type": "hint", "id": "h", "text": "t", "score": 1, "m": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001 + b"\n",
     ["in.jsonl:1:", "nested"]),
    (b'{"type": "hint", "id": "h", "text": "t", "score": ' + b"9" * 5000 + b"}\n", ["in.jsonl:1:", "4,300 digits"]),
    (lines({**HINT, "provenance": [], "score": 2**63}).encode(), ["in.jsonl:1:", "field `score`", f"{MAX_SCORE}"]),
    (lines({**HINT, "provenance": [], "score": -(2**63)}).encode(), ["in.jsonl:1:", "field `score`"]),
    (lines(HEADER, {**RECORD, "trace": {"batches": "many"}}).encode(), ["in.jsonl:2:", "field `trace.batches`"]),
    (lines(HEADER, {**RECORD, "trace": [1, 2]}).encode(), ["in.jsonl:2:", "field `trace`"]),
    (lines(HEADER, {**RECORD, "trace": {"steps": 4}}).encode(), ["in.jsonl:2:", "field `trace.steps`"]),
    (lines(HEADER, {**RECORD, "metrics": {"score": "high"}}).encode(), ["in.jsonl:2:", "metric `score`"]),
    (lines(HEADER, {**RECORD, "metrics": {"f1_by_row": 10**400}}).encode(), ["in.jsonl:2:", "metric `f1_by_row`"]),
], ids=["binary", "invalid-utf8", "utf16", "deep-array", "deep-object", "5000-digits", "score-2^63", "score--2^63",
        "trace-field", "trace-list", "trace-unknown-key",
        "metric-text", "metric-huge"])
def test_each_malformed_file_is_one_error_line_and_writes_nothing(template: Path, data: bytes, phrases: list[str]) -> None:
    assert_refused(import_bytes(template, data), *phrases)


def test_a_file_of_one_deep_json_list_is_refused_as_the_reference_format(template: Path) -> None:
    err = assert_refused(import_bytes(template, b"[" * 100_000 + b"]" * 100_000, name="insights.json"))
    assert f"deeper than {MAX_NESTING}" in err


def test_a_score_out_of_range_in_insights_json_names_the_entry(template: Path) -> None:
    data = json.dumps([{"rule": "ok", "score": 1}, {"rule": "too much", "score": 10**30}]).encode()
    assert_refused(import_bytes(template, data, name="insights.json"), "insights.json[2]", "field `score`")


def test_errors_found_while_storing_name_their_line(template: Path) -> None:
    """A repeated id and an empty hint are only found against the store: still one line, with its number."""
    twice = lines(HEADER, RECORD, {**RECORD, "query": "again"})
    assert_refused(import_bytes(template, twice.encode()), "in.jsonl:3:", "already exists")
    blank = lines(HEADER, {**HINT, "provenance": [], "text": " \t "})
    assert_refused(import_bytes(template, blank.encode()), "in.jsonl:2:")


def test_a_malformed_file_creates_no_store(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\xff\xfe\x00")
    code, out, err = run_cli(["memory", "import", str(bad), "--store", str(tmp_path / "new")])
    assert_clean_outcome(code, out, err)
    assert code == 2 and not (tmp_path / "new").exists()


def test_lone_surrogates_are_imported_as_replacement_characters(template: Path) -> None:
    store = fresh_store(template)
    path = store.parent / "surrogates.jsonl"
    path.write_text(lines(HEADER, {**RECORD, "query": "split emoji \ud83d here"},
                          {**HINT, "text": "Batch \udfff by canton."}), encoding="utf-8")
    code, out, err = run_cli(["memory", "import", str(path), "--store", str(store), "--json"])
    assert_clean_outcome(code, out, err)
    assert code == 0 and json.loads(out)["records"] == 1
    code, out, err = run_cli(["memory", "show", "h-new", "--store", str(store), "--json"])
    assert code == 0 and json.loads(out)["text"] == "Batch \ufffd by canton."
    code, out, err = run_cli(["memory", "show", "r-new", "--store", str(store), "--json"])
    assert code == 0 and json.loads(out)["query"] == "split emoji \ufffd here"


def test_a_line_separator_inside_a_string_is_not_a_line_break(template: Path) -> None:
    """Exports are written with `ensure_ascii=False`, so U+2028 may stand in a string as it is."""
    text = (json.dumps(HEADER) + "\n" + json.dumps({**HINT, "provenance": [], "text": "one\u2028two"}, ensure_ascii=False)
            + "\n")
    code, out, err, unchanged = import_bytes(template, text.encode("utf-8"))
    assert code == 0 and not unchanged, err


# -- the battery ------------------------------------------------------------------------------------


@st.composite
def export_lines(draw: st.DrawFn) -> dict[str, Any]:
    """A valid header, record or hint line with up to three keys replaced, removed or added."""
    line = dict(draw(st.sampled_from([HEADER, RECORD, HINT])))
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        key = draw(st.sampled_from(KEYS))
        if draw(st.booleans()):
            line[key] = draw(st.one_of(json_values, st.sampled_from(HOSTILE)))
        else:
            line.pop(key, None)
    return line


raw_lines = st.sampled_from([
    "", "   ", "not json", "[]", "null", '{"type": "record"', "\ufeff" + json.dumps(HEADER),
    json.dumps(HINT) + " trailing", '{"type": "hint", "id": "h", "text": "t", "score": 1e999}',
])


@st.composite
def export_files(draw: st.DrawFn) -> bytes:
    """One to five lines (mutated export lines, or raw text), in one of several encodings."""
    parts = draw(st.lists(st.one_of(export_lines().map(json.dumps), raw_lines), min_size=1, max_size=5))
    text = "\n".join(parts) + draw(st.sampled_from(["", "\n", "\r\n"]))
    encoding = draw(st.sampled_from(["utf-8", "utf-8", "utf-8", "utf-8-sig", "utf-16", "latin-1"]))
    return text.encode(encoding, errors="replace")


def assert_clean_import(outcome: tuple[int, str, str, bool]) -> None:
    code, out, err, unchanged = outcome
    assert_clean_outcome(code, out, err)
    if code == 2:
        assert unchanged and "in.jsonl" in err, err
    else:
        assert out.startswith("imported ")


@FUZZ
@given(data=export_files())
def test_mutated_export_files_import_or_fail_in_one_line(template: Path, data: bytes) -> None:
    assert_clean_import(import_bytes(template, data))


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes_import_or_fail_in_one_line(template: Path, data: bytes) -> None:
    assert_clean_import(import_bytes(template, data))


@FUZZ
@given(doc=json_values)
def test_random_json_documents_import_or_fail_in_one_line(template: Path, doc: Any) -> None:
    assert_clean_import(import_bytes(template, json.dumps(doc).encode()))


def test_the_fuzzed_lines_import_unmutated(template: Path) -> None:
    """The mutations start from lines that import: a refusal above is the mutation's doing."""
    code, out, err, unchanged = import_bytes(template, lines(HEADER, RECORD, HINT).encode())
    assert code == 0 and not unchanged and out.startswith("imported 1 record and 1 hint"), err
