"""Usage and cost per role and per run, prices from LiteLLM's map, and budgets.

Every model call of a run reports to one `UsageMeter`: tokens and dollars by role (manager,
sub-agent, extraction, memory, judge). Prices come from an override table first, then from
LiteLLM's bundled price map (loaded offline); a model with no known price costs `None`, shown
as unknown rather than as a made-up number (the reference charged every model one hard-coded
price). When a budget (`max_cost_usd`, `max_tokens`) is spent, the next call raises
`BudgetExceeded`, which stops the run cleanly and keeps the partial table.

A cost budget cannot see what an unpriced model spends (it counts as $0), so the first call of
such a model under `max_cost_usd` logs one warning naming `AMAPREDUCE_PRICES_FILE` — otherwise
`--max-cost` with a vLLM or llama.cpp model would silently never stop anything.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from amapreduce.errors import BudgetExceeded, ConfigError
from amapreduce.llm.scope import active_scopes
from amapreduce.llm.usage import Usage

__all__ = [
    "Budget",
    "BudgetExceeded",
    "Price",
    "PriceTable",
    "UsageMeter",
    "check_budget",
    "format_cost",
    "format_recorded_cost",
    "litellm_folder",
    "litellm_model_map",
    "litellm_offline",
    "load_price_overrides",
]

log = logging.getLogger(__name__)


class Budget(BaseModel):
    """Limits on one run (None: unlimited)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_cost_usd: float | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, ge=1)


class Price(BaseModel):
    """Dollars per token."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)
    """Price of cached prompt tokens (default: the input price)."""


def litellm_offline() -> None:
    """Make LiteLLM use its bundled price map: at import it otherwise fetches one from the
    network, which hangs or fails offline. Call before anything imports litellm."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


LITELLM_MAP_FILE = "model_prices_and_context_window_backup.json"
"""The model map (prices, context windows) LiteLLM ships and loads offline, in its package folder."""


def litellm_folder() -> Path | None:
    """LiteLLM's package folder, found without importing LiteLLM; None without the `litellm` extra."""
    try:
        spec = importlib.util.find_spec("litellm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def litellm_model_map() -> Mapping[str, Any]:
    """LiteLLM's model map: `litellm.model_cost` once something imported LiteLLM (a LiteLLM model's
    run), else the map it bundles, read as a file. Why not `import litellm`: the import costs
    seconds of CPU before the first call of a run that uses no LiteLLM model (an `--api-base` run)."""
    table = getattr(sys.modules.get("litellm"), "model_cost", None)
    return table if isinstance(table, Mapping) else _bundled_model_map()


@functools.cache
def _bundled_model_map() -> Mapping[str, Any]:
    folder = litellm_folder()
    if folder is None:
        return {}
    try:
        data = json.loads((folder / LITELLM_MAP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # a LiteLLM that keeps its map elsewhere: ask LiteLLM itself
        log.debug("LiteLLM's bundled model map %s is unreadable; importing litellm", folder / LITELLM_MAP_FILE)
        litellm_offline()
        import litellm

        data = litellm.model_cost
    return dict(data) if isinstance(data, Mapping) else {}


def load_price_overrides(path: Path) -> dict[str, Price]:
    """Read a price override table: `{"model_id": {"input": $/token, "output": $/token, "cached_input": ...}}`.

    Raises:
        ConfigError: the file is missing, not JSON, or an entry is not a valid price.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"price table {str(path)!r} does not exist; fix AMAPREDUCE_PRICES_FILE.") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"price table {str(path)!r} is not valid JSON: {exc.msg} at line {exc.lineno}.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"price table {str(path)!r} must map model ids to prices, got {type(data).__name__}.")
    prices: dict[str, Price] = {}
    for model_id, entry in data.items():
        try:
            prices[model_id] = Price.model_validate(entry)
        except ValidationError as exc:
            problem = exc.errors()[0]
            raise ConfigError(
                f"price of {model_id!r} in {str(path)!r} is invalid: {'.'.join(map(str, problem['loc']))} "
                f"{problem['msg']}. Give dollars per token, e.g. {{\"input\": 2.5e-07, \"output\": 2e-06}}."
            ) from None
    return prices


class PriceTable:
    """Prices by model id: overrides first, then prefix prices, then LiteLLM's map (with and
    without the provider prefix).

    Args:
        overrides: prices of exact model ids (with or without the provider prefix), e.g. from
            `load_price_overrides`.
        use_litellm: fall back to LiteLLM's bundled price map.
        by_prefix: prices of every model id that starts with a key. The meter knows no such
            family itself: the code that brings the models supplies it (the simulated models'
            `SIMULATED_PRICES` in `amapreduce.testing.scripted`).
    """

    def __init__(
        self,
        overrides: Mapping[str, Price] | None = None,
        *,
        use_litellm: bool = True,
        by_prefix: Mapping[str, Price] | None = None,
    ) -> None:
        self.overrides = dict(overrides or {})
        self.use_litellm = use_litellm
        self.by_prefix = dict(by_prefix or {})

    def price(self, model_id: str) -> Price | None:
        """The price of `model_id`, or None when unknown."""
        bare = model_id.split("/", 1)[-1]
        for key in (model_id, bare):
            if key in self.overrides:
                return self.overrides[key]
        for prefix, price in self.by_prefix.items():
            if model_id.startswith(prefix):
                return price
        if not self.use_litellm:
            return None
        prices = litellm_model_map()
        for key in (model_id, bare):
            entry = prices.get(key)
            if isinstance(entry, Mapping) and entry.get("input_cost_per_token") is not None:
                return Price(
                    input=float(entry["input_cost_per_token"]),
                    output=float(entry.get("output_cost_per_token") or 0.0),
                    cached_input=entry.get("cache_read_input_token_cost"),
                )
        return None

    def preload(self) -> None:
        """Load LiteLLM's price map now if this table falls back to it. A run calls this before it
        fans out, so the first priced call does not parse it inside a worker thread while the
        other workers wait."""
        if self.use_litellm:
            litellm_model_map()

    def cost(self, model_id: str, usage: Usage) -> float | None:
        """Dollars for `usage` on `model_id`, or None when the price is unknown."""
        price = self.price(model_id)
        if price is None:
            return None
        cached = min(usage.cached_tokens, usage.input_tokens)
        cached_price = price.cached_input if price.cached_input is not None else price.input
        return (usage.input_tokens - cached) * price.input + cached * cached_price + usage.output_tokens * price.output


def format_cost(cost_usd: float | None, unpriced_models: Iterable[str] = (), *, priced_usd: float = 0.0) -> str:
    """A cost as people read it: `$0.0123`, or `unpriced (local/llama)` when a model with no known
    price was used (`cost_usd` is None), with what the priced models cost when that is not zero.

    Why a word and not a number: the calls of an unpriced model are counted as $0, so any dollar
    figure would understate the run, and "$0.0000" reads as "free".
    """
    if cost_usd is not None:
        return f"${cost_usd:.4f}"
    models = ", ".join(sorted(set(unpriced_models)))
    details = [d for d in (models, f"${priced_usd:.4f} for the priced models" if priced_usd > 0 else "") if d]
    return f"unpriced ({'; '.join(details)})" if details else "unpriced"


def format_recorded_cost(cost_usd: object, unpriced_models: object) -> str:
    """A cost as a JSON record holds it (`cost_usd`, `unpriced_models`: a `runs list` row, a usage
    block of `result.json`) in `format_cost`'s words, or empty when the record has no cost (a run
    that recorded no usage). Why here: `runs list` and the web UI show the same records and must
    agree on the words; the values are checked because the records come from files on disk."""
    if isinstance(unpriced_models, list) and unpriced_models:
        return format_cost(None, map(str, unpriced_models))
    if isinstance(cost_usd, bool) or not isinstance(cost_usd, int | float):
        return ""
    return format_cost(float(cost_usd))


def check_budget(budget: Budget, cost_usd: float, tokens: int, *, where: str = "") -> None:
    """Raise `BudgetExceeded` when `cost_usd` or `tokens` have reached `budget`: the one wording of a
    spent budget, for this process's meter and for a Ray cluster's (`where`: " across the cluster")."""
    if budget.max_cost_usd is not None and cost_usd >= budget.max_cost_usd:
        raise BudgetExceeded(
            f"the cost budget of ${budget.max_cost_usd:g} is spent{where} (${cost_usd:.4f}); the run stops with "
            "the rows found so far. Raise --max-cost to go further.",
            kind="cost",
        )
    if budget.max_tokens is not None and tokens >= budget.max_tokens:
        raise BudgetExceeded(
            f"the token budget of {budget.max_tokens} is spent{where} ({tokens} tokens); the run stops with "
            "the rows found so far. Raise --max-tokens to go further.",
            kind="tokens",
        )


class UsageMeter:
    """Thread-safe usage and cost accounting for one run, with an optional budget."""

    def __init__(self, *, budget: Budget | None = None, prices: PriceTable | None = None) -> None:
        self.budget = budget or Budget()
        self.prices = prices or PriceTable()
        self._lock = threading.Lock()
        self._by_role: dict[str, Usage] = {}
        self._unpriced_roles: set[str] = set()
        self.unpriced_models: set[str] = set()
        """Models used without a known price (their calls count as $0 towards the budget)."""
        self._in_flight: dict[int, float] = {}
        self._next_call = 0

    def call_started(self, now: float | None = None) -> int:
        """Note a model call sent now (`time.monotonic()`); return its token for `call_ended`."""
        with self._lock:
            self._next_call += 1
            self._in_flight[self._next_call] = time.monotonic() if now is None else now
            return self._next_call

    def call_ended(self, token: int) -> None:
        """The call of `token` has its reply or its error."""
        with self._lock:
            self._in_flight.pop(token, None)

    def in_flight(self, now: float | None = None) -> tuple[int, float]:
        """Model calls waiting for their reply, and how long the oldest has waited (seconds): what
        progress shows while a slow endpoint computes ("waiting for the model: 1 call in flight for 40 s")."""
        with self._lock:
            if not self._in_flight:
                return 0, 0.0
            oldest = min(self._in_flight.values())
            count = len(self._in_flight)
        return count, max(0.0, (time.monotonic() if now is None else now) - oldest)

    def check(self) -> None:
        """Raise `BudgetExceeded` when the budget is already spent (called before each call)."""
        total = self.total()
        check_budget(self.budget, total.cost_usd, total.total_tokens)

    def would_cross(self, usage: Usage) -> bool:
        """Whether spending `usage` more would reach the budget (what a speculative call, such
        as a straggler's backup, asks before it starts; a spent budget is crossed already)."""
        if self.budget.max_cost_usd is None and self.budget.max_tokens is None:
            return False
        total = self.total() + usage
        try:
            check_budget(self.budget, total.cost_usd, total.total_tokens)
        except BudgetExceeded:
            return True
        return False

    def record(self, role: str, model_id: str, usage: Usage) -> Usage:
        """Add one call's usage (its cost filled in from the price table); return it priced.

        The priced usage is also added to every `usage_scope` open in the caller's context.
        """
        cost = self.prices.cost(model_id, usage)
        priced = Usage(
            requests=usage.requests,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_tokens=usage.cached_tokens,
            cost_usd=cost or 0.0,
            abandoned=usage.abandoned,
        )
        with self._lock:
            self._by_role[role] = self._by_role.get(role, Usage()) + priced
            first_unpriced = cost is None and model_id not in self.unpriced_models
            if cost is None:
                self.unpriced_models.add(model_id)
                self._unpriced_roles.add(role)
        for scope in active_scopes():
            scope.add(role, priced)
        if first_unpriced and self.budget.max_cost_usd is not None:
            log.warning(
                "model %r has no known price, so its calls count as $0 and the cost budget of $%g cannot stop "
                "them; give its price in the JSON file named by AMAPREDUCE_PRICES_FILE "
                '(e.g. {"%s": {"input": 2.5e-07, "output": 2e-06}}) or use --max-tokens.',
                model_id, self.budget.max_cost_usd, model_id,
            )
        return priced

    def by_role(self) -> dict[str, Usage]:
        """Usage per role."""
        with self._lock:
            return dict(self._by_role)

    def total(self) -> Usage:
        """Usage of the whole run."""
        return sum(self.by_role().values(), Usage())

    def unpriced(self) -> list[str]:
        """The models used without a known price, sorted (empty when every call was priced)."""
        with self._lock:
            return sorted(self.unpriced_models)

    def cost_usd(self) -> float | None:
        """Dollars spent by the run, or None when an unpriced model was used: its share is
        unknown, so the priced calls' sum (`total().cost_usd`, what the budget sees) would
        understate it."""
        with self._lock:
            known = not self.unpriced_models
        return self.total().cost_usd if known else None

    def cost_text(self) -> str:
        """The run's cost for people (see `format_cost`): `$0.0123` or `unpriced (model ids)`."""
        return format_cost(self.cost_usd(), self.unpriced(), priced_usd=self.total().cost_usd)

    def to_json(self) -> dict[str, Any]:
        """Per-role and total usage, plus models whose price is unknown.

        The shape is the one `result.json` always had; `cost_usd` is null in the total and in
        each role that used an unpriced model (listed in `unpriced_models`), and a role whose
        models were all priced keeps its cost, so the known part of a mixed run stays readable.
        """
        with self._lock:
            by_role = dict(self._by_role)
            unpriced_roles = set(self._unpriced_roles)
            unpriced = sorted(self.unpriced_models)

        def usage(u: Usage, *, priced: bool) -> dict[str, Any]:
            return {**u.to_json(), **({} if priced else {"cost_usd": None})}

        return {
            "by_role": {role: usage(u, priced=role not in unpriced_roles) for role, u in by_role.items()},
            "total": usage(sum(by_role.values(), Usage()), priced=not unpriced),
            "unpriced_models": unpriced,
        }
