"""The simulated model of the offline demo: code that plays the manager and the sub-agents.

It is **not an LLM**. It is a smolagents `Model` (a `FunctionModel`) whose replies are decided
by the rules in `amapreduce.demo.plan` from the conversation it is given, so agents, tools,
the mapreduce engine, retries, patch rounds and the reducer all run for real over the sandbox
corpus. Which part it plays follows from the call, as it would for a real model:

* offered the `mapreduce` tool → the **manager**: discover the entities on list pages with
  `web_search`/`crawl_page`, write the decision, call `mapreduce` (plan, then execute, then at
  most one delta follow-up), finish with a one-line summary;
* given a batch prompt (`Sub-questions:`) → a **search sub-agent**: search and read each
  entity's page (all sub-questions at once), answer with JSON rows (`task`, columns, `source`,
  and `quotes`: each cell's infobox line, verbatim from the page it read; derived cells such as
  a rank get no quote);
* offered only the web tools with a plain question → the **single-agent baseline** of the
  benchmark: the same discovery, then every look-up itself, one tool call per step, and a
  markdown table typed in its final answer;
* given the merge prompt of a discovery (its system message's first line is
  `amapreduce.demo.discovery.MERGE_FIRST_LINE`) → the **merge model**: the candidates grouped by
  its folding of names, each group keeping the spelling it prefers.

For a discovery task (`sbx_disc_*`, `amapreduce.demo.discovery`) the manager finds the hub of the
list pages and writes a decision with `discover` (or, with `scouting="sequential"`, reads every
list page itself), and a sub-agent asked to list a page's cities answers one row per listed city,
quoted by its line on the page (no answer limit: the rows are copied off one page).

A sub-agent has a **capacity**, the weakness that makes batching a real decision: its final
answer holds at most about `capacity_cells` output cells (every output column of a row counts,
keys included). Rows past it are cut off as a long LLM output is cut at its token limit (whole
rows, never part of a value; the reply ends after the last whole row). A batch that asks for more
cells than the capacity also crowds the sub-agent's context: every cell asked for beyond the
capacity costs `OVERLOAD_COST` cells of room in the answer, on every attempt of that batch (a
continuation repeats the whole original prompt), with at least one row always answered. A small
seeded jitter (about one answer in eight holds one row fewer) is drawn from the prompt's text, so
runs repeat exactly. So one row per sub-agent is complete but costly, one huge batch is cheap but lossy even
after retries and delta-patch rounds, and the best rows-per-batch depends on the row's width:
16 cells fit 3 rows of 5 columns, 4 of 4, 5 of 3 and 8 of 2.

The manager batches by the rules of `amapreduce.demo.plan`: a fixed default (one row per
sub-agent), exploration when `sample >= 1`, and the plan stage's typed advice (`memory_advice`:
its proposal, accepted with `use_advice: true`, or a hint payload that applies to the draft).

Faults (`FaultPlan`) and a fixed per-call latency can be added for demos and benchmarks; with
`FaultPlan.wrong_values`, a seeded share of a sub-agent's cells (never the entity's own name) is
plausible but wrong, quoted by a made-up line, and recorded in the plan.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from typing import Any

from smolagents.models import ChatMessage, MessageRole

from amapreduce.demo.atlas_reader import Observations
from amapreduce.demo.discovery import (
    MERGE_FIRST_LINE,
    DiscoveryIntent,
    Scouting,
    candidate_rows,
    list_question,
    merge_reply,
    parse_discovery,
)
from amapreduce.demo.faults import FaultPlan, WrongCell
from amapreduce.demo.plan import (
    Column,
    Intent,
    advised_batching,
    column_fact,
    column_specs,
    default_batching,
    explore_batching,
    parse_intent,
    parse_question,
    plan_cap,
    read_column,
    resolve,
    with_batching,
)
from amapreduce.llm.messages import message_text
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply, ToolCall, final_answer, tool_call

__all__ = ["CAPACITY_CELLS", "JITTER_ONE_IN", "OVERLOAD_COST", "SIMULATED_MODEL_ID", "SimulatedAtlasModel", "answer_limit"]

SIMULATED_MODEL_ID = "simulated/sandbox"
CAPACITY_CELLS = 16
"""Output cells a simulated sub-agent's answer holds (see the module docstring)."""
OVERLOAD_COST = 2
"""Cells of answer room lost per cell a batch asks for beyond the capacity. At 2, a batch half
again as large as the capacity leaves room for one row per attempt: retries and patch rounds may
still complete it, but at a cost no smaller batch pays."""
JITTER_ONE_IN = 8
"""About one answer in this many holds one row fewer than its capacity allows."""
_COLUMN_LINE = re.compile(r'^- "(?P<name>[^"]+)"(?: \((?P<type>[^)]*)\))?(?:: (?P<desc>.*))?$', re.MULTILINE)
_NUMBERED = re.compile(r"^(?P<n>\d+)\. ", re.MULTILINE)
_STILL_MISSING = re.compile(r"^- sub-question (?P<n>\d+):", re.MULTILINE)
_CALL_FAULTS = ("error", "rate_limit", "slow")
"""Faults of any call; the manager and the baseline get no `error` (a failed call ends an agent run,
and only the engine retries whole attempts)."""
_ANSWER_FAULTS = ("malformed", "drop")
_ROW_KEYS = ("task", "source", "quotes")
"""Keys of a reply row that are not columns."""
_MADE_UP = ("Northavel", "Port Sarin", "Velmora", "Castrell", "Ondria", "Lake Tamsin")
"""Wrong text values the simulated sub-agent makes up (wrong numbers are the right ones scaled)."""
_MANAGER_CALL = re.compile(r"""['"]name['"]:\s*['"]mapreduce['"]""")


def _task_text(messages: list[ChatMessage]) -> str:
    for m in messages:
        if m.role == MessageRole.USER or m.role == "user":
            return message_text(m).removeprefix("New task:").strip()
    return ""


def _steps_taken(messages: list[ChatMessage]) -> int:
    return sum(1 for m in messages if "Calling tools:" in message_text(m))


def answer_limit(prompt: str, *, columns: int, asked_rows: int, capacity_cells: int | None) -> int | None:
    """Rows a sub-agent's answer to `prompt` can hold (None: no limit).

    `columns` output cells per row, `asked_rows` sub-questions in the batch's original prompt.
    Deterministic in its arguments: the jitter is drawn from the prompt's text.
    """
    if capacity_cells is None:
        return None
    width = max(1, columns)
    overflow = OVERLOAD_COST * max(0, asked_rows * width - capacity_cells)
    rows = max(1, (capacity_cells - overflow) // width)
    digest = hashlib.sha256(f"capacity|{prompt}".encode()).digest()
    if rows > 1 and int.from_bytes(digest[:8], "big") % JITTER_ONE_IN == 0:
        rows -= 1
    return rows


def _render_rows(rows: list[dict[str, Any]], *, cut: bool) -> str:
    """Rows as the JSON answer; a cut answer ends after its last whole row, as at a token limit."""
    if not cut:
        return json.dumps(rows, ensure_ascii=False)
    return "[" + ", ".join(json.dumps(r, ensure_ascii=False) for r in rows) + ","


def _read_rows(answer: str) -> tuple[list[dict[str, Any]], bool]:
    """The rows of an answer `_render_rows` wrote, and whether it was cut."""
    if answer.endswith(","):
        return json.loads(answer[:-1] + "]"), True
    return json.loads(answer), False


def _wrong_value(value: str, rng: random.Random) -> str:
    """A plausible wrong value instead of `value`: a number scaled by 5-40 % either way, a code
    with every letter changed, else a made-up name."""
    if re.fullmatch(r"\d+(\.\d+)?", value):
        number = float(value) * (1 + rng.choice((-1, 1)) * rng.uniform(0.05, 0.4))
        wrong = f"{number:.{len(value.partition('.')[2])}f}" if "." in value else str(max(1, round(number)))
        return wrong if wrong != value else f"{value}1"
    if value.isalpha() and value.isupper() and len(value) <= 4:  # a code: another code of its length
        letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
        return "".join(rng.choice(letters.replace(c, "")) for c in value)
    return rng.choice([name for name in _MADE_UP if name.casefold() != value.casefold()])


class SimulatedAtlasModel(FunctionModel):
    """A deterministic simulated model for the sandbox atlas (see the module docstring).

    Args:
        faults: seeded fault injection (default: none).
        latency_s: fixed sleep per call, standing in for a provider's response time.
        model_id: the id shown in usage and traces.
        capacity_cells: output cells a sub-agent's answer holds (None: unlimited).
        sample: which sample of the model this is, as trial k of an evaluation is sample k-1: 0
            batches by the fixed default, k >= 1 explores (see `amapreduce.demo.plan`). A batching
            hint that applies wins over both.
        scouting: how the manager finds the entities of a discovery task (`sbx_disc_*`):
            `mapreduce` (a decision with `discover`) or `sequential` (it reads every list page
            itself); see `amapreduce.demo.discovery`.
    """

    def __init__(self, *, faults: FaultPlan | None = None, latency_s: float = 0.0, model_id: str = SIMULATED_MODEL_ID,
                 capacity_cells: int | None = CAPACITY_CELLS, sample: int = 0, scouting: Scouting = "mapreduce") -> None:
        if capacity_cells is not None and capacity_cells < 1:
            raise ValueError(f"capacity_cells must be at least 1 (or None for no limit), got {capacity_cells}")
        if sample < 0:
            raise ValueError(f"sample must be 0 or more, got {sample}")
        self.faults = faults or FaultPlan()
        self.latency_s = latency_s
        self.capacity_cells = capacity_cells
        self.sample = sample
        self.scouting = scouting
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
        if texts and texts[0].lstrip().startswith(MERGE_FIRST_LINE):
            role, kinds, reply = "merge", _CALL_FAULTS[1:], merge_reply(texts[-1])
        elif "mapreduce" in info.tools:
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
        rows, cut = _read_rows(answer)
        rng = self.faults.rng(self.faults.seed, key, fault)
        if fault == "drop":
            for row in rows:
                for name in [k for k in row if k not in _ROW_KEYS]:
                    if rng.random() < 0.5:
                        row[name] = ""
            return _render_rows(rows, cut=cut)
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
            found = parse_discovery(task)
            if found is None:
                return final_answer("The simulated model does not know how to plan this question (it only knows the sandbox tasks).")
            return self._discovery_manager(found, obs, texts)
        todo, pages, problem = self._discover(intent, obs)
        if problem is not None:
            return final_answer(problem)
        if todo:
            return todo
        decision = self._decision(task, intent, pages, obs, texts)
        if isinstance(decision, list):
            return decision
        return self._drive(decision, texts)

    def _discovery_manager(self, intent: DiscoveryIntent, obs: Observations, texts: list[str]) -> Reply:
        """A discovery task: the hub page, then a `discover` decision or (sequential scouting)
        every list page read here, in the manager's own context."""
        hub = resolve(obs, intent.hub())
        if hub is None:
            return final_answer(f"The page {intent.hub().title!r} was not found, so the lists of cities are unknown.")
        if isinstance(hub, ToolCall):
            return hub
        if self.scouting == "mapreduce":
            return self._drive(intent.discover_decision(hub, plan_cap(texts)), texts)
        urls = intent.list_urls(hub)
        todo = [tool_call("crawl_page", url=url) for url in urls if url not in obs.pages]
        if todo:
            return todo
        return self._drive(intent.sequential_decision([obs.pages[url] for url in urls], plan_cap(texts)), texts)

    def _drive(self, decision: dict[str, Any], texts: list[str]) -> Reply:
        """Plan, execute, at most one delta follow-up of a matrix decision, then the summary."""
        calls = sum(len(_MANAGER_CALL.findall(t)) for t in texts)
        heads = [json.loads(line) for t in texts for line in t.splitlines() if line.startswith('{"call_stage": "execute"')]
        if calls < 2 and not heads:
            return tool_call("mapreduce", **decision)  # the first call is the plan stage, the second executes
        if not heads:
            return final_answer("The mapreduce tool did not execute the decision; the run trace says why.")
        head = heads[-1]
        missing = [json.loads(line) for t in texts for line in t.splitlines() if line.startswith('{"still_missing":')]
        if not head.get("complete") and missing and calls == 2:
            fill = {k: v for k, v in decision.items() if k != "discover"}  # a discovery's follow-up only fills
            matrix = decision.get("task_matrix")
            width = len(matrix[0]) if matrix else len(decision.get("discover", {}).get("key_columns", [])) or 1
            keys = [list(m["key"].values())[:width] for m in missing[-1]["still_missing"]]
            rows = [r for r in matrix if r in keys] if matrix else keys
            if rows:
                return tool_call("mapreduce", **{**fill, "task_matrix": rows})  # delta follow-up only
        total = head.get("table_rows_total", head.get("rows"))
        state = "complete" if head.get("complete") else f"incomplete ({head.get('missing_cells')} cells missing)"
        return final_answer(f"The table has {total} rows and is {state}; it is rendered from the mapreduce results.")

    def _decision(self, task: str, intent: Intent, pages: list[str], obs: Observations,
                  texts: list[str]) -> dict[str, Any] | list[ToolCall]:
        """The decision to send: its own batching (default or exploration) until the plan stage
        answered, then what its typed advice says (`advised_batching`), if anything."""
        draft = intent.draft(pages, obs)
        if isinstance(draft, list):
            return draft
        cap = plan_cap(texts)
        matrix = draft["task_matrix"]
        own = explore_batching(task, self.sample, matrix, cap) if self.sample else default_batching(matrix, cap)
        for text in reversed(texts):
            for line in text.splitlines():
                if line.startswith('{"call_stage": "plan"'):
                    advised, accept = advised_batching(json.loads(line).get("memory_advice"), draft, cap)
                    if accept:
                        return {**with_batching(draft, own), "use_advice": True}
                    return with_batching(draft, advised or own)
        return with_batching(draft, own)

    # -- sub-agent ------------------------------------------------------------------------------

    @staticmethod
    def _batch(task: str) -> tuple[list[Column], list[tuple[int, str]], set[int] | None]:
        """Columns, numbered sub-questions and (on a continuation) the numbers still missing."""
        original, _, continuation = task.partition("\n---\n")
        head, _, block = original.rpartition("Sub-questions:")
        columns = [
            Column(name=m.group("name"), description=m.group("desc") or "")
            for m in _COLUMN_LINE.finditer(head)
            if m.group("name") not in _ROW_KEYS
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
        listed: list[dict[str, Any]] = []  # candidate rows copied off list pages: no answer limit
        for number, text in questions:
            if wanted is not None and number not in wanted:
                continue
            if (url := list_question(text)) is not None:  # discovery: every row of a list page
                if url in obs.pages:
                    listed += candidate_rows(obs.pages[url], url, number, [c.name for c in columns])
                elif (call := tool_call("crawl_page", url=url)) not in todo:
                    todo.append(call)
                continue
            question = parse_question(text)
            got = question.step(obs) if question is not None else None
            if isinstance(got, list):
                todo += [c for c in got if c not in todo]
            elif got is not None:
                row = {"task": number, **{c.name: read_column(c, got) for c in columns}, "source": got["_url"]}
                quotes = self._quotes(columns, got, row, f"{task}|{number}", text)  # may make cells of `row` wrong
                rows.append({**row, "quotes": quotes})
        if todo:
            return todo
        limit = answer_limit(task, columns=len(columns), asked_rows=len(questions), capacity_cells=self.capacity_cells)
        cut = limit is not None and len(rows) > limit
        return final_answer(_render_rows(listed + (rows[:limit] if cut else rows), cut=cut))

    def _quotes(self, columns: list[Column], facts: dict[str, str], row: dict[str, Any], key: str,
                question: str) -> dict[str, str]:
        """Each answered cell's quote: its infobox line as the page has it (`| Attribute | value |`),
        the entity's name for a name read from the page's title. With `FaultPlan.wrong_values`, a
        seeded share of the other cells is made wrong in `row`, with a made-up quote."""
        quotes: dict[str, str] = {}
        for column in columns:
            attr, value = column_fact(column, facts), str(row[column.name])
            if attr is None or attr in ("Rank", "Continent") or not value:
                continue  # derived from a list page or ranked by the agent: nothing to quote verbatim
            label = "Name" if attr == "_name" else attr
            quotes[column.name] = facts[attr] if attr == "_name" else f"{attr} | {facts[attr]}"
            rng = self.faults.rng(self.faults.seed, "wrong", key, column.name)
            if rng.random() >= self.faults.wrong_values or value.casefold() in question.casefold():
                continue
            wrong = _wrong_value(value, rng)
            row[column.name], quotes[column.name] = wrong, f"{label} | {wrong}"
            self.faults.wrong(WrongCell(source=str(row["source"]), column=column.name, value=wrong))
        return quotes

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
        decision = intent.draft(pages, obs)  # its matrix and template: the baseline does every look-up itself
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
