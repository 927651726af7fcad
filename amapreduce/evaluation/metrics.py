"""Cell metrics of the official scorer (docs/scorer-rules.md §5), with `--corrected` fixes.

Each metric takes the preprocessed response and target strings and returns `(score, msg)` like
the official functions, so the per-row detail CSV can carry the same messages. `llm_judge` is
not here: it is scored a whole column at a time by a judge (amapreduce.evaluation.judges).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import urlparse

from amapreduce.evaluation.preprocess import DateContext

__all__ = [
    "DETERMINISTIC_METRICS",
    "MetricError",
    "MetricSet",
    "exact_match",
    "in_match",
    "number_near",
    "number_near_corrected",
    "url_match",
]

DETERMINISTIC_METRICS = ("exact_match", "number_near", "date_near", "url_match", "in_match")

# Official pattern, including its accidental `$-_` character range.
_URL_RE = re.compile(r"http[s]?://(?:[a-zA-Z]|[0-9]|[$-_@.&+]|[!*\\(\\),]|(?:%[0-9a-fA-F][0-9a-fA-F]))+")

Score = tuple[float, str]


class MetricError(Exception):
    """A metric failed the way the official code fails (e.g. `number_near` without criterion).

    The scorer turns it into the official "evaluator error" zero for the whole task.
    """


def exact_match(response: str, target: str) -> Score:
    """1 when equal ignoring case."""
    if response.lower() == target.lower():
        return 1.0, f"exact match, response: {response}, target: {target}"
    return 0.0, f"exact not match, response: {response}, target: {target}"


def in_match(response: str, target: str) -> Score:
    """1 when the response is a substring of the target (registered, used by no task)."""
    if response in target:
        return 1.0, f"response in target, response: {response}, target: {target}"
    return 0.0, f"response not in target, response: {response}, target: {target}"


def url_match(response: str, target: str) -> Score:
    """1 when the sets of hosts of the `http(s)://` URLs on both sides are equal (paths ignored)."""
    resp_hosts = {urlparse(u).netloc for u in _URL_RE.findall(response)}
    target_hosts = {urlparse(u).netloc for u in _URL_RE.findall(target)}
    if resp_hosts == target_hosts:
        return 1.0, f"url match, response: {response}, target: {target}"
    return 0.0, f"url not match, response: {response}, target: {target}"


def _to_number(text: str, *, percent: bool = True) -> float | None:
    try:
        if percent and "%" in text:
            return float(text.replace("%", "")) / 100.0
        return float(text.replace("%", "") if not percent else text)
    except (ValueError, TypeError):
        return None


def number_near(response: str, target: str, criterion: float | None) -> Score:
    """Official: relative tolerance against the gold value, inclusive; `%` sides divided by 100.

    Raises:
        MetricError: both sides parse and `criterion` is None (the official `TypeError`, bug D2).
    """
    resp = _to_number(response)
    tgt = _to_number(target)
    if resp is None or tgt is None:
        if resp is None and tgt is None and response == target:
            return 1.0, f"number equal, response: {response}, target: {target}"
        return 0.0, f"number not convertable, response: {resp}, target: {tgt}"
    if criterion is None:
        raise MetricError("TypeError: unsupported operand type(s) for *: 'float' and 'NoneType'")
    if abs(resp - tgt) <= abs(tgt) * criterion:
        return 1.0, f"number near in range {criterion * 100}%, response: {resp}, target: {tgt}"
    return 0.0, f"number not near, response: {resp}, target: {tgt}"


def number_near_corrected(response: str, target: str, criterion: float | None) -> Score:
    """B11 fix: when only one side carries `%`, also compare the plain numbers (25% vs 25)."""
    score, msg = number_near(response, target, criterion)
    if score == 1.0 or (("%" in response) == ("%" in target)):
        return score, msg
    resp = _to_number(response, percent=False)
    tgt = _to_number(target, percent=False)
    if resp is not None and tgt is not None and criterion is not None:
        if abs(resp - tgt) <= abs(tgt) * criterion:
            return 1.0, f"number near ignoring a one-sided %, response: {resp}, target: {tgt}"
    return score, msg


class MetricSet:
    """The deterministic metrics bound to one date context and one mode (official or corrected)."""

    def __init__(self, dates: DateContext, *, corrected: bool = False) -> None:
        self.dates = dates
        self.corrected = corrected
        self._near = number_near_corrected if corrected else number_near
        self._simple: dict[str, Callable[[str, str], Score]] = {
            "exact_match": exact_match,
            "url_match": url_match,
            "in_match": in_match,
            "date_near": self.date_near,
        }

    def date_near(self, response: str, target: str) -> Score:
        """Official: both unparseable -> 1 (B6); corrected: then 1 only if the texts are equal."""
        try:
            resp = self.dates.parse(response)
        except Exception:  # the official code catches everything here; so must we
            resp = None
        try:
            tgt = self.dates.parse(target)
        except Exception:
            tgt = None
        if resp is None or tgt is None:
            if resp is None and tgt is None:
                if self.corrected and response.lower() != target.lower():
                    return 0.0, f"neither is a date and they differ, response: {response}, target: {target}"
                return 1.0, f"date near, response: {response}, target: {target}"
            return 0.0, f"date not convertable, response: {response}, target: {target}"
        if abs((resp - tgt).days) <= 31:
            return 1.0, f"date near, response: {resp}, target: {tgt}"
        return 0.0, f"date not near, response: {resp}, target: {tgt}"

    def known(self, name: str) -> bool:
        """Whether `name` is a deterministic metric (llm_judge is handled by a judge)."""
        return name in self._simple or name == "number_near"

    def score(self, name: str, response: str, target: str, criterion: object) -> Score:
        """Score one cell with metric `name`; `criterion` is used by `number_near` only."""
        if name == "number_near":
            crit = None if criterion is None else float(criterion)  # type: ignore[arg-type]
            return self._near(response, target, crit)
        return self._simple[name](response, target)
