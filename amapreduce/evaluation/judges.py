"""Judges: `llm_judge` columns, header/key alignment, and the DeepWideSearch core-entity check.

Why pluggable: the official scorer calls an LLM for all three (docs/scorer-rules.md §8),
which makes it neither offline nor reproducible. Each role has a deterministic stand-in that
reproduces the published offline numbers (docs/scorer-rules.md §10: exact match, identity or "norm" alignment,
substring entity check) and an LLM variant. The LLM variants send the official prompts at
temperature 0, batch a column per call (chunked for long tables), cache replies on disk by
(prompt, model) (`llm.reply_cache.ReplyCache`), and raise `RunError` when the model fails instead
of scoring 0 (bug B8). Replies are read as the scorers read them (`_modeljson.last_json_object`).
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import TYPE_CHECKING, Any, Protocol

from amapreduce._modeljson import last_json_object
from amapreduce.errors import RunError
from amapreduce.llm.reply_cache import ReplyCache
from amapreduce.prompts import render_prompt

if TYPE_CHECKING:
    from smolagents import Model

__all__ = [
    "Aligner",
    "ColumnJudge",
    "EntityJudge",
    "ExactJudge",
    "IdentityAligner",
    "ModelAligner",
    "ModelClient",
    "ModelEntityJudge",
    "ModelJudge",
    "NormAligner",
    "SubstringEntityJudge",
    "entity_names",
    "loose_form",
    "parse_json_reply",
    "parse_json_reply_lenient",
]

_ENTITY_FENCE_RE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def loose_form(text: str) -> str:
    """NFKC + casefold with all whitespace, Unicode punctuation and symbols removed (docs/scorer-rules.md §10, "norm")."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return "".join(ch for ch in folded if not ch.isspace() and unicodedata.category(ch)[0] not in ("P", "S"))


def parse_json_reply(text: str) -> dict[str, Any] | None:
    """The official `parse_markdown_json`: the last ```` ```json ```` object, else None
    (`_modeljson.last_json_object`)."""
    return last_json_object(text)


def parse_json_reply_lenient(text: str) -> dict[str, Any] | None:
    """The AMapReduce DeepWideSearch `parse_markdown_json` (docs/scorer-rules.md §9, protocol `amapreduce`).

    Why a second parser: that copy accepts replies the official one rejects, and its published
    numbers depend on it. It tries every ```` ```json ```` object from the last back, then the
    raw `{...}` objects of the text from the last `{` back; the first that decodes to an object
    wins (`_modeljson.last_json_object(lenient=True)`). Use `parse_json_reply` for WideSearch and
    the `aidc` protocol.
    """
    return last_json_object(text, lenient=True)


class ModelClient:
    """One smolagents `Model` plus the optional disk cache; `ask(prompt)` returns the reply text.

    Args:
        model: any smolagents `Model`: the judge role's managed model from the one model factory
            (`amapreduce.llm.factory.build_role_model`, budgeted and metered), or a scripted one.
        cache: where replies are cached; None disables caching.
    """

    def __init__(self, model: Model, cache: ReplyCache | None = None) -> None:
        self.model = model
        self.cache = cache
        self.model_id = str(getattr(model, "model_id", None) or type(model).__name__)
        self.calls = 0

    def ask(self, prompt: str) -> str:
        """Send one user message; raise `RunError` if the model fails (never a silent 0)."""
        if self.cache is not None:
            cached = self.cache.get(self.model_id, prompt)
            if cached is not None:
                return cached
        from amapreduce.llm.complete import complete  # the model layer loads only when a model is asked

        self.calls += 1
        try:
            text = complete(self.model, prompt)
        except RunError:
            raise
        except Exception as exc:
            raise RunError(
                f"judge model {self.model_id} failed: {type(exc).__name__}: {exc}. "
                f"Check the model name and credentials, or use --judge exact / --align norm."
            ) from exc
        if self.cache is not None:
            self.cache.put(self.model_id, prompt, text)
        return text


class ColumnJudge(Protocol):
    """Scores one `llm_judge` column: one (score, msg) per joined row, in order."""

    name: str

    def judge_column(
        self, responses: list[str], targets: list[str], criterion: Any
    ) -> list[tuple[float, str]]:
        """Score each (response, target) pair."""
        ...


class ExactJudge:
    """The docs/scorer-rules.md §10 stand-in: the official `exact_match` on the already-preprocessed strings."""

    name = "exact"

    def judge_column(
        self, responses: list[str], targets: list[str], criterion: Any
    ) -> list[tuple[float, str]]:
        """1 when equal ignoring case, else 0."""
        return [
            (1.0, "exact match (judge stand-in)")
            if r.lower() == t.lower()
            else (0.0, "exact not match (judge stand-in)")
            for r, t in zip(responses, targets, strict=True)
        ]


class ModelJudge:
    """`llm_judge_column` through a model: the official prompt, `chunk_size` rows per call.

    Args:
        normalize: map scores to 0/1 as the AMapReduce DeepWideSearch copy does; the official
            WideSearch code uses numeric replies as they are.
        lenient: parse replies with `parse_json_reply_lenient` (the AMapReduce copy) instead of
            the official last-fence-only `parse_json_reply`.
    """

    def __init__(
        self, client: ModelClient, *, chunk_size: int = 100, normalize: bool = False, lenient: bool = False
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.client = client
        self.chunk_size = chunk_size
        self.normalize = normalize
        self.parse = parse_json_reply_lenient if lenient else parse_json_reply
        self.name = client.model_id

    def _score(self, value: Any) -> float:
        if isinstance(value, bool):
            return 1.0 if value else 0.0
        if isinstance(value, int | float):
            return (1.0 if value >= 0.5 else 0.0) if self.normalize else float(value)
        if self.normalize and isinstance(value, str):
            try:
                return 1.0 if float(value.strip()) >= 0.5 else 0.0
            except ValueError:
                return 1.0 if value.strip().lower() in ("true", "yes") else 0.0
        return 0.0

    def judge_column(
        self, responses: list[str], targets: list[str], criterion: Any
    ) -> list[tuple[float, str]]:
        """One call per chunk; a missing idx scores 0, an unparseable reply scores the chunk 0."""
        out: list[tuple[float, str]] = []
        for start in range(0, len(responses), self.chunk_size):
            resp = responses[start : start + self.chunk_size]
            tgt = targets[start : start + self.chunk_size]
            pairs = {
                f"idx_{i}": {"response": r, "target": t}
                for i, (r, t) in enumerate(zip(resp, tgt, strict=True))
            }
            reply = self.client.ask(render_prompt("judge", "column", criterion=criterion, response=pairs))
            scores = self.parse(reply)
            if scores is None:
                out.extend((0.0, "llm judge failed due to parse error") for _ in resp)
                continue
            out.extend(
                (self._score(scores.get(f"idx_{i}", 0)), f"llm judge ({self.name})") for i in range(len(resp))
            )
        return out


class Aligner(Protocol):
    """Maps response strings to reference strings (`primary_key_preprocess`)."""

    name: str

    def align(self, response: list[str], reference: list[str]) -> dict[str, str]:
        """A `{response value: reference value}` map; absent values stay as they are."""
        ...


class IdentityAligner:
    """The docs/scorer-rules.md §10 stand-in: no mapping (headers and keys must already match)."""

    name = "identity"

    def align(self, response: list[str], reference: list[str]) -> dict[str, str]:
        """Always `{}`."""
        return {}


class NormAligner:
    """Map a response string to the one reference string with the same `loose_form` (docs/scorer-rules.md §10)."""

    name = "norm"

    def align(self, response: list[str], reference: list[str]) -> dict[str, str]:
        """Unique-match mapping on loose forms; ambiguous or empty forms are left alone."""
        by_form: dict[str, set[str]] = {}
        for ref in reference:
            form = loose_form(ref)
            if form:
                by_form.setdefault(form, set()).add(ref)
        mapping: dict[str, str] = {}
        for value in response:
            refs = by_form.get(loose_form(value))
            if refs is not None and len(refs) == 1:
                mapping[value] = next(iter(refs))
        return mapping


class ModelAligner:
    """`primary_key_preprocess` through a model: the official prompt with Python list reprs.

    Args:
        lenient: parse replies as the AMapReduce copy does (`parse_json_reply_lenient`).
    """

    def __init__(self, client: ModelClient, *, lenient: bool = False) -> None:
        self.client = client
        self.parse = parse_json_reply_lenient if lenient else parse_json_reply
        self.name = client.model_id

    def align(self, response: list[str], reference: list[str]) -> dict[str, str]:
        """The model's `{origin: transform}` map; an unparseable reply gives `{}` (official)."""
        reply = self.client.ask(render_prompt("judge", "key_align", response=response, reference=reference))
        parsed = self.parse(reply)
        if parsed is None:
            return {}
        return {str(k): str(v) for k, v in parsed.items()}


def entity_names(entity: str) -> list[str]:
    """The entity names of a DeepWideSearch task: the string, or the items of `{"entity": [...]}`."""
    text = entity.strip()
    fenced = _ENTITY_FENCE_RE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return [entity]
    if isinstance(value, dict) and "entity" in value:
        items = value["entity"]
        return [str(i) for i in items] if isinstance(items, list) else [str(items)]
    return [entity]


class EntityJudge(Protocol):
    """DeepWideSearch core-entity check: did the answer identify the task's entity?"""

    name: str

    def judge(self, question: str, response: str, entity: str) -> bool:
        """True for Yes."""
        ...


class SubstringEntityJudge:
    """The docs/scorer-rules.md §10 stand-in: Yes iff some entity name's loose form occurs in the answer's loose form."""

    name = "substring"

    def judge(self, question: str, response: str, entity: str) -> bool:
        """Substring test on loose forms; empty names never match."""
        haystack = loose_form(response)
        return any((form := loose_form(name)) and form in haystack for name in entity_names(entity))


class ModelEntityJudge:
    """The official entity prompt; the verdict is `"yes" in reply.lower()`."""

    def __init__(self, client: ModelClient) -> None:
        self.client = client
        self.name = client.model_id

    def judge(self, question: str, response: str, entity: str) -> bool:
        """Ask the model; True when its reply contains "yes"."""
        reply = self.client.ask(
            render_prompt("judge", "entity", question=question, response=response, entity=entity)
        )
        return "yes" in reply.lower()
