"""The engine with replies cut short: a cut value never reaches the table; the cells it would
have filled are asked again (the continuation prompt says the reply was cut off) and end up whole."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

from solvers import ENTITY

from amapreduce.decision import Decision
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.result import MapReduceResult
from amapreduce.mapreduce.solver import BatchRequest, SolverReply

COLUMNS = ["country", "capital", "population", "currency"]
TRUTH = {
    "Avaria": {"capital": "Krathbroville", "population": "221809361", "currency": "Komtea thaler"},
    "Borvia": {"capital": "Ostel", "population": "5120", "currency": "Borvian mark"},
    "Celdor": {"capital": "Vinn", "population": "77", "currency": "Celdor crown"},
}


class ScriptedSolver:
    """Answers every sub-question from `TRUTH`; `cut(request, text)` may cut the reply short."""

    def __init__(self, cut: Callable[[BatchRequest, str], str]) -> None:
        self.cut = cut
        self.requests: list[BatchRequest] = []
        self.lock = threading.Lock()

    def solve(self, request: BatchRequest) -> SolverReply:
        with self.lock:
            self.requests.append(request)
        rows = []
        for number, task in enumerate(request.tasks, 1):
            name = ENTITY.search(task).group(1)  # type: ignore[union-attr]
            rows.append({"task": number, **TRUTH[name]})
        # As smolagents hands over a final_answer call whose arguments did not parse: raw text.
        text = json.dumps({"answer": rows})
        return SolverReply(output=self.cut(request, text), usage=Usage(requests=1, input_tokens=10))


def run(solver: ScriptedSolver, names: list[str], batch_size: int) -> MapReduceResult:
    decision = Decision.parse(
        {
            "task_matrix": [[n] for n in names],
            "template": "Find the capital, population and currency of [[__0__]].",
            "json_schema": COLUMNS,
            "batch_size": batch_size,
        }
    )
    return MapReduceEngine(solver, config=EngineConfig(max_attempts=3)).run(decision)


def expected_records(names: list[str]) -> list[dict[str, str]]:
    return [{"country": n, **TRUTH[n]} for n in names]


def test_a_cut_value_is_re_asked_and_the_full_value_lands_in_the_table() -> None:
    def cut_first_attempt(request: BatchRequest, text: str) -> str:
        # The oracle's `truncate` fault: the reply ends inside "Krathbroville".
        return text[: text.index("Krath") + len("Krath")] if request.attempt == 1 else text

    solver = ScriptedSolver(cut_first_attempt)
    result = run(solver, ["Borvia", "Avaria"], batch_size=2)
    assert result.table.records() == expected_records(["Borvia", "Avaria"])
    assert result.summary.complete
    assert len(result.attempts) == 2
    first = result.attempts[0]
    assert first.outcome == "ok" and first.rows == 1 and "cut off" in (first.error or "")
    retry = solver.requests[1].prompt
    assert "the reply was cut off" in retry
    assert (
        "sub-question 2: still missing" in retry and "sub-question 1:" not in retry.split("Still missing:")[1]
    )


def test_a_reply_cut_before_any_closed_row_is_retried_with_the_reason() -> None:
    def cut_first_attempt(request: BatchRequest, text: str) -> str:
        return text[: text.index("2218") + 4] if request.attempt == 1 else text  # inside the number

    solver = ScriptedSolver(cut_first_attempt)
    result = run(solver, ["Avaria"], batch_size=1)
    assert result.table.records() == expected_records(["Avaria"])
    assert [a.outcome for a in result.attempts] == ["parse_error", "ok"]
    assert "the reply was cut off" in solver.requests[1].prompt


def first_reply_cut_at(position: int) -> Callable[[BatchRequest, str], str]:
    def cut(request: BatchRequest, text: str) -> str:
        return text[:position] if request.attempt == 1 else text

    return cut


def test_no_cut_value_ever_reaches_the_table_wherever_the_reply_is_cut() -> None:
    names = list(TRUTH)
    reply_length = len(json.dumps({"answer": [{"task": k, **TRUTH[n]} for k, n in enumerate(names, 1)]}))
    whole = {v for facts in TRUTH.values() for v in facts.values()} | set(TRUTH)
    for cut in range(reply_length):  # the first reply cut at every position, the retry whole
        solver = ScriptedSolver(first_reply_cut_at(cut))
        result = run(solver, names, batch_size=3)
        assert result.table.records() == expected_records(names), cut
        for row in result.table.rows:
            for cell in row.cells.values():
                assert cell.value in whole and set(cell.alternatives) <= whole, (cut, cell)
