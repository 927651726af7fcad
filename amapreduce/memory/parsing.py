"""Reading the memory model's replies: numbered lists and ADD/EDIT/REMOVE/AGREE operations.

The reference parser silently dropped markdown-bolded operations, any rule not ending with a
period, and credited the *last* hint when an AGREE's text matched nothing (docs/reference-audit.md §3.2). Here the
parser accepts the usual formatting variants, every rejection is reported with its reason, and
numbered operations are mapped to hints strictly by the number shown to the model; an AGREE whose
text plainly quotes a different hint is rejected instead of crediting the wrong one.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

__all__ = ["Operation", "Rejected", "map_operations", "parse_list", "parse_operations"]

_ITEM = re.compile(r"^\s*(?:\d+\s*[.)]|[-*•])\s+(.*\S)\s*$")
_OP = re.compile(
    r"^\s*(?:[-*•]\s*|\d+\s*[.)]\s*)?[*_`]*\s*(ADD|EDIT|REMOVE|AGREE)\b\s*"
    r"(?:(?:rule|hint)?\s*#?\s*(\d+))?\s*[*_`]*\s*[:：.\-–—]\s*(.*?)\s*$",
    re.IGNORECASE,
)
_LABEL = re.compile(r"^(?:new\s+|modified\s+|existing\s+)?(?:rule|hint|insight)\s*\d*\s*:\s*", re.IGNORECASE)


def _clean(text: str) -> str:
    text = text.strip().strip("*_`").strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return " ".join(text.split())


def parse_list(reply: str, limit: int | None = None) -> list[str]:
    """Items of a numbered or bulleted list (continuation lines are joined to their item)."""
    items: list[str] = []
    for line in reply.splitlines():
        match = _ITEM.match(line)
        if match:
            items.append(_clean(match.group(1)))
        elif items and line.strip() and not line.lstrip().startswith("#"):
            items[-1] = f"{items[-1]} {_clean(line)}"
    items = [i for i in items if i]
    return items[:limit] if limit is not None else items


@dataclass(frozen=True, kw_only=True)
class Operation:
    """One parsed operation; `number` is 1-based as shown to the model, `hint_id` once mapped."""

    op: str
    number: int | None
    text: str
    hint_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class Rejected:
    """An operation line that was not applied, and why."""

    line: str
    reason: str


def parse_operations(reply: str) -> tuple[list[Operation], list[Rejected]]:
    """Every operation line in `reply`, in order; lines that look like operations but fail are rejected."""
    ops: list[Operation] = []
    rejected: list[Rejected] = []
    for line in reply.splitlines():
        match = _OP.match(line)
        if not match:
            continue
        op = match.group(1).upper()
        number = int(match.group(2)) if match.group(2) else None
        text = _clean(match.group(3))
        text = _LABEL.sub("", text)
        if op in ("ADD", "EDIT") and not text:
            rejected.append(Rejected(line=line.strip(), reason=f"{op} without rule text"))
            continue
        if op == "ADD":
            number = None
        ops.append(Operation(op=op, number=number, text=text))
    return ops, rejected


def _similar(a: str, b: str) -> float:
    a, b = a.casefold(), b.casefold()
    if a and b and (a in b or b in a):
        return 1.0
    return difflib.SequenceMatcher(None, a, b).ratio()


def map_operations(ops: list[Operation], listed: list[tuple[str, str]], *, max_ops: int
                   ) -> tuple[list[Operation], list[Rejected]]:
    """Bind numbered operations to the listed hints `[(hint_id, text), ...]` (number k → k-th).

    Rules: at most `max_ops` operations; at most one operation per listed hint; numbers out of
    range are rejected; an AGREE/REMOVE without a number binds only to an exactly matching text;
    an AGREE whose text matches another listed hint much better than the numbered one is rejected.
    """
    accepted: list[Operation] = []
    rejected: list[Rejected] = []
    touched: set[str] = set()
    for op in ops:
        line = f"{op.op}{' ' + str(op.number) if op.number else ''}: {op.text}"
        if len(accepted) >= max_ops:
            rejected.append(Rejected(line=line, reason=f"more than {max_ops} operations"))
            continue
        if op.op == "ADD":
            accepted.append(op)
            continue
        index: int | None = None
        if op.number is not None:
            if not 1 <= op.number <= len(listed):
                rejected.append(Rejected(line=line, reason=f"hint number {op.number} is not in the list of {len(listed)}"))
                continue
            index = op.number - 1
            if op.op == "AGREE" and op.text:
                scores = [_similar(op.text, text) for _, text in listed]
                best = max(range(len(listed)), key=lambda i: scores[i])
                if best != index and scores[best] >= 0.8 and scores[index] < 0.5:
                    rejected.append(Rejected(line=line, reason=f"AGREE {op.number} quotes hint {best + 1}, not {op.number}"))
                    continue
        elif op.op != "EDIT":
            exact = [i for i, (_, text) in enumerate(listed) if _similar(op.text, text) == 1.0 and op.text]
            if len(exact) == 1:
                index = exact[0]
        if index is None:
            rejected.append(Rejected(line=line, reason=f"{op.op} names no listed hint"))
            continue
        hint_id = listed[index][0]
        if hint_id in touched:
            rejected.append(Rejected(line=line, reason=f"hint {index + 1} already has an operation"))
            continue
        touched.add(hint_id)
        accepted.append(Operation(op=op.op, number=index + 1, text=op.text, hint_id=hint_id))
    return accepted, rejected
