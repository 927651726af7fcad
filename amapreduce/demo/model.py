"""The simulated model of the offline demo: code that plays the manager and the sub-agents.

It is **not an LLM**. It is a smolagents `Model` (a `FunctionModel`) whose replies are decided
by the rules in `amapreduce.demo.plan` from the conversation it is given, so agents, tools,
the mapreduce engine, retries, patch rounds and the reducer all run for real over the sandbox
corpus. Which part it plays follows from the call, as it would for a real model:

* offered the `mapreduce` tool → the **manager**: discover the entities on list pages with
  `web_search`/`crawl_page`, write the decision, call `mapreduce` (plan, then execute, then at
  most one delta follow-up), finish with a one-line summary;
* given a batch prompt (`Sub-questions:`) → a **search sub-agent**: search and read each
  entity's page (all sub-questions at once), answer with JSON rows (`task`, columns, `source`);
* offered only the web tools with a plain question → the **single-agent baseline** of the
  benchmark: the same discovery, then every look-up itself, one tool call per step, and a
  markdown table typed in its final answer.

Faults (`FaultPlan`) and a fixed per-call latency can be added for demos and benchmarks.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any

from smolagents.models import ChatMessage, MessageRole

from amapreduce.demo.atlas import Observations
from amapreduce.demo.faults import FaultPlan
from amapreduce.demo.plan import (
    Column,
    Intent,
    column_specs,
    parse_intent,
    parse_question,
    read_column,
    resolve,
)
from amapreduce.llm.messages import message_text
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply, ToolCall, final_answer, tool_call

__all__ = ["SIMULATED_MODEL_ID", "SimulatedAtlasModel"]

SIMULATED_MODEL_ID = "simulated/sandbox"
_COLUMN_LINE = re.compile(r'^- "(?P<name>[^"]+)"(?: \((?P<type>[^)]*)\))?(?:: (?P<desc>.*))?$', re.MULTILINE)
_NUMBERED = re.compile(r"^(?P<n>\d+)\. ", re.MULTILINE)
_STILL_MISSING = re.compile(r"^- sub-question (?P<n>\d+):", re.MULTILINE)
_CALL_FAULTS = ("error", "rate_limit", "slow")
"""Faults of any call; the manager and the baseline get no `error` (a failed call ends an agent run,
and only the engine retries whole attempts)."""
_ANSWER_FAULTS = ("malformed", "drop")
_MANAGER_CALL = re.compile(r"""['"]name['"]:\s*['"]mapreduce['"]""")


def _task_text(messages: list[ChatMessage]) -> str:
    for m in messages:
        if m.role == MessageRole.USER or m.role == "user":
            return message_text(m).removeprefix("New task:").strip()
    return ""


def _steps_taken(messages: list[ChatMessage]) -> int:
    return sum(1 for m in messages if "Calling tools:" in message_text(m))


class SimulatedAtlasModel(FunctionModel):
    """A deterministic simulated model for the sandbox atlas (see the module docstring).

    Args:
        faults: seeded fault injection (default: none).
        latency_s: fixed sleep per call, standing in for a provider's response time.
        model_id: the id shown in usage and traces.
    """

    def __init__(self, *, faults: FaultPlan | None = None, latency_s: float = 0.0, model_id: str = SIMULATED_MODEL_ID) -> None:
        self.faults = faults or FaultPlan()
        self.latency_s = latency_s
        super().__init__(self._reply, model_id=model_id)

    # -- dispatch -------------------------------------------------------------------------------

    def _reply(self, messages: list[ChatMessage], info: ModelInfo) -> Reply:
        if self.latency_s:
            time.sleep(self.latency_s)
        texts = [message_text(m) for m in messages]
        task = _task_text(messages)
        obs = Observations.parse(texts[1:])
        reply: Reply
        kinds: tuple[str, ...]
        if "mapreduce" in info.tools:
            role, kinds, reply = "manager", _CALL_FAULTS[1:], self._manager(task, obs, texts)
        elif "Sub-questions:" in task:
            role, kinds, reply = "subagent", _CALL_FAULTS, self._subagent(task, obs)
        elif "web_search" in info.tools:
            role, kinds, reply = "baseline", _CALL_FAULTS[1:], self._baseline(task, obs)
        else:
            return "The simulated model only plays the manager and the search agents of the sandbox demo."
        answer = reply.arguments.get("answer") if isinstance(reply, ToolCall) and reply.name == "final_answer" else None
        if role == "subagent" and isinstance(answer, str):
            kinds = kinds + _ANSWER_FAULTS  # only a final answer can be malformed or short of cells
        key = f"{role}|{hashlib.sha256(task.encode()).hexdigest()[:16]}|{_steps_taken(messages)}"
        fault = self.faults.draw(key, kinds)
        self.faults.apply(fault)  # errors, 429s and slow calls
        if fault in _ANSWER_FAULTS and isinstance(answer, str):
            return final_answer(self._spoil(answer, fault, key))
        return reply

    def _spoil(self, answer: str, fault: str | None, key: str) -> str:
        """The final answer with cells dropped, or malformed (never with a wrong value)."""
        rows = json.loads(answer)
        rng = self.faults.rng(self.faults.seed, key, fault)
        if fault == "drop":
            for row in rows:
                for name in [k for k in row if k not in ("task", "source")]:
                    if rng.random() < 0.5:
                        row[name] = ""
            return json.dumps(rows, ensure_ascii=False)
        # Malformed: prose with no JSON at all, or a reply cut off after k whole rows (as at an
        # output-token limit). Never a cut inside a value: that would be a wrong, not a missing, cell.
        k = rng.randrange(len(rows) + 1)
        if k == 0:
            return "I have read every page and will now write the rows as JSON."
        return "Rows found so far:\n[" + ", ".join(json.dumps(r, ensure_ascii=False) for r in rows[:k]) + ","

    # -- manager --------------------------------------------------------------------------------

    @staticmethod
    def _discover(intent: Intent, obs: Observations) -> tuple[list[ToolCall], list[str], str | None]:
        """(tool calls still needed, list pages read, why the entities cannot be found)."""
        pages: list[str] = []
        todo: list[ToolCall] = []
        for need in intent.list_needs():
            got = resolve(obs, need)
            if got is None:
                return [], [], f"The list page {need.title!r} was not found, so the entities are unknown."
            if isinstance(got, ToolCall):
                todo.append(got)
            else:
                pages.append(got)
        return todo, pages, None

    def _manager(self, task: str, obs: Observations, texts: list[str]) -> Reply:
        intent = parse_intent(task)
        if intent is None:
            return final_answer("The simulated model does not know how to plan this question (it only knows the sandbox tasks).")
        todo, pages, problem = self._discover(intent, obs)
        if problem is not None:
            return final_answer(problem)
        if todo:
            return todo
        decision = intent.decision(pages, obs)
        if isinstance(decision, list):
            return decision
        calls = sum(len(_MANAGER_CALL.findall(t)) for t in texts)
        heads = [json.loads(line) for t in texts for line in t.splitlines() if line.startswith('{"call_stage": "execute"')]
        if calls < 2 and not heads:
            return tool_call("mapreduce", **decision)  # the first call is the plan stage, the second executes
        if not heads:
            return final_answer("The mapreduce tool did not execute the decision; the run trace says why.")
        head = heads[-1]
        missing = [json.loads(line) for t in texts for line in t.splitlines() if line.startswith('{"still_missing":')]
        if not head.get("complete") and missing and calls == 2:
            width = len(decision["task_matrix"][0])
            keys = [list(m["key"].values())[:width] for m in missing[-1]["still_missing"]]
            rows = [r for r in decision["task_matrix"] if r in keys]
            if rows:
                return tool_call("mapreduce", **{**decision, "task_matrix": rows})  # delta follow-up only
        total = head.get("table_rows_total", head.get("rows"))
        state = "complete" if head.get("complete") else f"incomplete ({head.get('missing_cells')} cells missing)"
        return final_answer(f"The table has {total} rows and is {state}; it is rendered from the mapreduce results.")

    # -- sub-agent ------------------------------------------------------------------------------

    @staticmethod
    def _batch(task: str) -> tuple[list[Column], list[tuple[int, str]], set[int] | None]:
        """Columns, numbered sub-questions and (on a continuation) the numbers still missing."""
        original, _, continuation = task.partition("\n---\n")
        head, _, block = original.rpartition("Sub-questions:")
        columns = [
            Column(name=m.group("name"), description=m.group("desc") or "")
            for m in _COLUMN_LINE.finditer(head)
            if m.group("name") not in ("task", "source")
        ]
        marks = list(_NUMBERED.finditer(block))
        questions = [
            (int(m.group("n")), block[m.end() : marks[k + 1].start() if k + 1 < len(marks) else len(block)].strip())
            for k, m in enumerate(marks)
        ]
        wanted = {int(n) for n in _STILL_MISSING.findall(continuation)} if continuation else None
        return columns, questions, wanted

    def _subagent(self, task: str, obs: Observations) -> Reply:
        columns, questions, wanted = self._batch(task)
        todo: list[ToolCall] = []
        rows: list[dict[str, Any]] = []
        for number, text in questions:
            if wanted is not None and number not in wanted:
                continue
            question = parse_question(text)
            got = question.step(obs) if question is not None else None
            if isinstance(got, list):
                todo += [c for c in got if c not in todo]
            elif got is not None:
                rows.append({"task": number, **{c.name: read_column(c, got) for c in columns}, "source": got["_url"]})
        if todo:
            return todo
        return final_answer(json.dumps(rows, ensure_ascii=False))

    # -- single-agent baseline (benchmark) ------------------------------------------------------

    def _baseline(self, task: str, obs: Observations) -> Reply:
        intent = parse_intent(task)
        if intent is None:
            return final_answer("The simulated model does not know how to answer this question.")
        todo, pages, problem = self._discover(intent, obs)
        if problem is not None:
            return final_answer(problem)
        if todo:
            return todo[0]  # one look-up per step: no parallelism
        decision = intent.decision(pages, obs)
        if isinstance(decision, list):
            return decision[0]
        columns = column_specs(intent.columns)
        forced = len(decision["task_matrix"][0])
        lines = ["| " + " | ".join(c.name for c in columns) + " |", "|" + "---|" * len(columns)]
        for row, question in zip(decision["task_matrix"], intent.questions(decision), strict=True):
            got = question.step(obs)
            if isinstance(got, list):
                return got[0]
            cells = list(row) + [read_column(c, got) if got else "" for c in columns[forced:]]
            lines.append("| " + " | ".join(cells) + " |")
        return final_answer("```markdown\n" + "\n".join(lines) + "\n```")
