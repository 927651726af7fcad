"""One-line messages for invalid decisions: values shown short, pydantic errors said plainly.

Why a module of its own: the decision model validates, this module words what it found. A
pydantic `ValidationError` lists every problem with a machine location; the user gets the first
one as one line that names its path (`decisions.top10.child.template: ...`), says what is wrong
and what to do, and how many more problems follow.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ValidationError

from amapreduce._text import MAX_CELL_CHARS, cap_text
from amapreduce.decision.discover_spec import DiscoverSpec
from amapreduce.decision.strategy import ByAttr, OpenGroup, OpenStrategy, PerAtom

__all__ = ["CHILD_TAG", "cell_to_str", "describe", "shown"]

CHILD_TAG = "decision"
"""The union tag of an inline `child` decision (a name is the other member); not part of a path."""

_PER_BATCH = "tasks per batch (one sub-agent answers a whole batch in one reply)"
_LIMITS = {
    "batch_size": _PER_BATCH,
    "chunk_size": _PER_BATCH,
    "max_group_size": _PER_BATCH,
    "rows_per_task": "rows per task (one sub-agent answers a task in one reply; list more tasks instead)",
}
"""What each bounded field counts, for the message that refuses a number over its bound."""

_STRATEGY_MODELS: dict[str, tuple[str, type[BaseModel]]] = {
    "per_atom": ("per_atom batch_strategy", PerAtom),
    "by_attr": ("by_attr batch_strategy", ByAttr),
    "open": ("open batch_strategy", OpenStrategy),
}


def shown(value: Any, limit: int = 24) -> str:
    """`value` for a one-line message (a string as it is, anything else as its repr), abbreviated:
    a 4,000-digit number must not fill the screen (nor reach `str(int)`'s 4,300-digit limit)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 80:  # > 24 digits
        return f"a number of about {round(value.bit_length() * math.log10(2)):,} digits"
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def cell_to_str(value: Any, where: str) -> str:
    """A task-matrix cell as text (numbers and booleans written as JSON writes them); a text over
    `_text.MAX_CELL_CHARS` is cut with a marker: it would be sent in every prompt naming its task."""
    if isinstance(value, str):
        return cap_text(value, MAX_CELL_CHARS)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        try:
            return str(value)
        except ValueError:  # an integer beyond `str(int)`'s 4,300-digit limit
            raise ValueError(f"{where} is {shown(value)}; write an entity's name or number as text") from None
    raise ValueError(f"{where} must be a string (or number), got {shown(value, 80)}")


def _own_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The location inside the innermost decision: `(decisions, top10, child, decision, x)` -> `(x,)`.

    Why: an unknown field of a nested decision is a field of *a* decision; the nesting in front of
    it only says which one (the message's path shows that)."""
    while True:
        if len(loc) > 2 and loc[0] == "child" and loc[1] == CHILD_TAG:
            loc = loc[2:]
        elif len(loc) > 2 and loc[0] == "decisions":
            loc = loc[2:]
        else:
            return loc


def _owner(loc: tuple[Any, ...], decision: type[BaseModel]) -> tuple[str, type[BaseModel]]:
    """The model an unknown field was found in, from the error's location.

    Why: listing the Decision's own fields for a typo inside `batch_strategy` sends the reader
    to the wrong place. Locations look like `(batch_strategy, open, groups, 0, field)`.
    """
    loc = _own_loc(loc)
    if len(loc) > 1 and loc[0] == "discover":
        return "discover", DiscoverSpec
    if len(loc) > 2 and loc[0] == "batch_strategy" and loc[1] in _STRATEGY_MODELS:
        if loc[1] == "open" and len(loc) > 4 and loc[2] == "groups":
            return "open group", OpenGroup
        return _STRATEGY_MODELS[loc[1]]
    return "decision", decision


def _loc_part(part: Any) -> str:
    # Keys come from the user; quote anything that is not a plain name so a key holding a
    # newline or a dot cannot break the one-line message or be misread as a path.
    if isinstance(part, int) or (isinstance(part, str) and part.isidentifier()):
        return str(part)
    return repr(part)


def _path(loc: tuple[Any, ...]) -> str:
    parts = [p for i, p in enumerate(loc) if not (p == CHILD_TAG and i > 0 and loc[i - 1] == "child")]
    return ".".join(_loc_part(p) for p in parts if not str(p).startswith("function-"))


def describe(exc: ValidationError, decision: type[BaseModel]) -> str:
    """The first problem of `exc` (raised validating `decision`) as one line, with its path."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = _path(tuple(first["loc"]))
    msg = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "union_tag_invalid":
        tag = (first.get("ctx") or {}).get("tag")
        msg = f"unknown batch strategy {tag!r}; use one of 'per_atom', 'by_attr', 'open'"
    elif first["type"] == "union_tag_not_found":
        msg = "batch strategy has no `type`; give one of 'per_atom', 'by_attr', 'open'"
    elif first["type"] == "less_than_equal" and first["loc"] and first["loc"][-1] in _LIMITS and "discover" not in first["loc"]:
        bound = (first.get("ctx") or {}).get("le")
        msg = f"{shown(first.get('input'))} is too large; at most {bound:,} {_LIMITS[first['loc'][-1]]}"
    elif first["type"] in ("less_than_equal", "greater_than_equal") and first["loc"][-1:] == ("max_depth",):
        bound = (first.get("ctx") or {}).get("le", (first.get("ctx") or {}).get("ge"))
        kind = "at most" if first["type"] == "less_than_equal" else "at least"
        msg = f"{shown(first.get('input'))} is out of range; nesting levels (the root is level 1) must be {kind} {bound}"
    elif first["type"] == "model_type" and first["loc"][-2:] == ("child", CHILD_TAG):
        msg = f"{shown(first.get('input'))} is not a child; give the name of one of `decisions` or a decision object"
    elif first["type"] == "extra_forbidden":
        what, model = _owner(tuple(first["loc"]), decision)
        msg = f"unknown field; allowed {what} fields are " + ", ".join(sorted(model.model_fields))
    text = f"invalid decision: {loc + ': ' if loc else ''}{msg}."
    if len(errors) > 1:
        text += f" ({len(errors) - 1} more problem(s) after this one.)"
    return text
