"""The Python API of enrichment: `amapreduce.enrich(df, columns=[...])`, a list in, the same list with columns out.

Apart from `api` only for size: it takes the same keywords as `ask` (read into `Settings` by the
same `api._settings`, over the environment and the defaults), runs `amapreduce enrich`'s session
(`enrichment.run_enrichment`), and raises a failed or interrupted run as `ask` does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from amapreduce.api import RunResult, _in_a_thread, _returned, _settings
from amapreduce.errors import UserError

if TYPE_CHECKING:
    import pandas as pd
    from pydantic import SecretStr

    from amapreduce.progress import ProgressSink

__all__ = ["enrich", "enrich_async"]


def enrich(
    data: pd.DataFrame | str | os.PathLike[str],
    *,
    columns: Sequence[str] | Mapping[str, Any],
    key: str | Sequence[str] | None = None,
    instructions: str | None = None,
    evidence: bool = False,
    batch_size: int | None = None,
    model: str | None = None,
    api_base: str | None = None,
    api_key: str | SecretStr | None = None,
    search: str | None = None,
    workers: int | Literal["auto"] | None = None,
    memory: str | os.PathLike[str] | bool | None = None,
    max_cost: float | None = None,
    max_tokens: int | None = None,
    runs_dir: str | os.PathLike[str] | None = None,
    show_progress: bool | None = False,
    on_progress: ProgressSink | None = None,
    **settings: Any,
) -> pd.DataFrame:
    """Enrich a list you already have, as `amapreduce enrich` does: each row becomes one
    sub-question, `columns` are found for it, and the list comes back with them added.

    Args:
        data: the rows (a DataFrame), or the path of a list file (.csv, .tsv, .xlsx, .parquet,
            .jsonl, .json; refused over `Settings.enrich_max_file_mb`).
        columns: the columns to add: names, or a map of name to `{"description": ...}`.
        key: the column(s) that name each row (default: the first column whose values name every
            row once).
        instructions: extra guidance for every sub-agent.
        evidence: also add, after each new column `c`, `c status`, `c source`, `c quote` and
            `c evidence`.
        batch_size: rows per sub-agent (default: 16 cells per sub-agent over the row's width).
        model, api_base, api_key, search, workers, memory, max_cost, max_tokens, runs_dir,
            show_progress, on_progress, **settings: as for `ask`.

    Returns:
        The input rows in their order, every input column as given, then the new columns (None where
        not found) and `enrich_status` (`complete`, `partial`, `failed`; no row is ever left out).
        `attrs` holds `run_dir` and `status` (`complete`, `incomplete`, `stopped: ...`).

    Raises:
        UserError: bad input (no such column, a repeated or blank key, an empty or too large file,
            a column already in the list), before any model call and with no run directory made.
        EstimateOverBudget: even the low end of the run's estimate costs more than `max_cost`
            (refused before any model call, no run directory made; the message holds the numbers).
        ConfigError, RunError, KeyboardInterrupt: as for `ask`.
    """
    import pandas as pd

    from amapreduce.enrichment import EnrichRequest, read_list, run_enrichment
    from amapreduce.memory.schema import memory_store_for

    named = {"model": model, "api_base": api_base, "api_key": api_key, "search": search, "workers": workers,
             "max_cost": max_cost, "max_tokens": max_tokens, "runs_dir": runs_dir}
    config = _settings(named, settings)
    if isinstance(data, pd.DataFrame):
        frame, label = data, "enrich"
    elif isinstance(data, str | os.PathLike):
        frame, label = read_list(Path(data), max_mb=config.enrich_max_file_mb), f"enrich-{Path(data).stem}"
    else:
        raise UserError(f"data must be a DataFrame or the path of a list file, got {type(data).__name__}.")
    keys = [key] if isinstance(key, str) else key
    request = EnrichRequest.of(frame, columns, key_columns=keys, instructions=instructions, batch_size=batch_size,
                               label=label)
    request.decision()  # a cell the template cannot take is refused here, before anything runs
    store = memory_store_for(memory if isinstance(memory, bool | None) else Path(memory), config.memory_store,
                             named="memory=")
    done = run_enrichment(request, config, memory_store=store, show_progress=show_progress, on_progress=on_progress)
    _returned(RunResult(done.outcome))
    out = done.frame(evidence=evidence)
    out.attrs.update(run_dir=str(done.outcome.run_dir.path), status=str(done.outcome.status))
    return out


enrich_async = _in_a_thread(enrich)
