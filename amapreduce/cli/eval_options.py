"""The scoring options (`EvalOptions`) the `eval` flags ask for: the benchmark, the judges they name,
built with the settings' model factory, and the protocol. `eval score` (`amapreduce.cli.eval`) and
`eval run` (`amapreduce.cli.eval_run`) both build theirs here, so the two score alike.

Nothing heavy is imported at module level: the evaluation package (pandas, dateparser) and the
model factory load inside the functions, so `amapreduce --help` stays fast.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING

from amapreduce.errors import UserError

if TYPE_CHECKING:
    from smolagents import Model

    from amapreduce.evaluation.judges import ModelClient
    from amapreduce.evaluation.runner import EvalOptions
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.settings import Settings

__all__ = ["options_for", "score_options"]

_BENCHMARKS = ("widesearch", "deepwidesearch")
_PROTOCOLS = ("aidc", "amapreduce")


def _parse_date(value: str | None) -> dt.date | None:
    if value is None:
        return None
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise UserError(f"--reference-date must be YYYY-MM-DD, got {value!r}. Example: 2026-01-01.") from None


def _judge_model(model_id: str, settings: Settings, meter: UsageMeter) -> Model:
    """The judge role's managed model from the one model factory that builds every role's model:
    retries, the provider's rate limits, and every call charged to `meter` (the settings' budget).
    Tests replace this function with a simulated model."""
    from amapreduce.llm.factory import build_role_model

    return build_role_model(settings, "judge", model_id, meter=meter)


def _client(model_id: str, settings: Settings, meter: UsageMeter) -> ModelClient:
    """A judge client for `model_id`, its replies cached under `<cache_dir>/judge`."""
    from amapreduce.evaluation.judges import ModelClient
    from amapreduce.llm.reply_cache import ReplyCache

    return ModelClient(_judge_model(model_id, settings, meter), ReplyCache(settings.cache_dir / "judge"))


def _check_deepwide_only(benchmark: str, protocol: str, entity_judge: str) -> None:
    """Reject DeepWideSearch-only choices with WideSearch instead of ignoring or half-applying them.

    Why an error: WideSearch has no entity check and one protocol, so `--protocol amapreduce`
    or a model `--entity-judge` there would either do nothing or (for the judge scores) make
    the run differ from the official WideSearch scorer without saying so. The defaults
    (`aidc`, `substring`) stay accepted, so a command that spells them out keeps working.
    """
    if benchmark != "widesearch":
        return
    if protocol != "aidc":
        raise UserError(
            f"--protocol is a DeepWideSearch option, got --protocol {protocol} with --benchmark widesearch. "
            "Drop --protocol, or use --benchmark deepwidesearch."
        )
    if entity_judge != "substring":
        raise UserError(
            f"--entity-judge is a DeepWideSearch option, got --entity-judge {entity_judge} with "
            "--benchmark widesearch. Drop --entity-judge, or use --benchmark deepwidesearch."
        )


def _judge_id(judge: str | None, settings: Settings) -> str:
    """The `--judge` in force: the flag, else `AMAPREDUCE_JUDGE_MODEL`, else the offline `exact`.

    Why: the judge is one of the model roles the settings configure; a `judge_model` set in the
    environment must not be silently ignored. `--judge exact` still forces the offline judge, and
    `none` (the settings' "role off" value) means the same.
    """
    if judge is not None:
        return judge
    configured = (settings.judge_model or "").strip()
    return "exact" if not configured or configured.lower() == "none" else configured


def score_options(
    benchmark: str,
    judge: str | None,
    align: str,
    entity_judge: str,
    protocol: str,
    chunk_size: int,
    reference_date: str | None,
    corrected: bool,
    details: Path | None,
    *,
    settings: Settings,
    meter: UsageMeter,
) -> EvalOptions:
    """The scoring options the flags ask for; model judges are built with `settings` and charge
    `meter`."""
    from amapreduce.evaluation import judges
    from amapreduce.evaluation.runner import EvalOptions

    if benchmark not in _BENCHMARKS:
        raise UserError(f"--benchmark must be one of {list(_BENCHMARKS)}, got {benchmark!r}.")
    if protocol not in _PROTOCOLS:
        raise UserError(f"--protocol must be one of {list(_PROTOCOLS)}, got {protocol!r}.")
    if chunk_size < 1:
        raise UserError(
            f"--judge-chunk-size must be >= 1, got {chunk_size}. Use a positive number of rows per call."
        )
    judge = _judge_id(judge, settings)
    for flag, value in (("--judge", judge), ("--align", align), ("--entity-judge", entity_judge)):
        if not value.strip():
            raise UserError(f"{flag} must not be empty. Use a stand-in name or a model id.")
    _check_deepwide_only(benchmark, protocol, entity_judge)
    # Only the AMapReduce DeepWideSearch copy rounds judge scores and parses replies leniently.
    amapreduce_copy = benchmark == "deepwidesearch" and protocol == "amapreduce"
    column_judge: judges.ColumnJudge = (
        judges.ExactJudge()
        if judge == "exact"
        else judges.ModelJudge(
            _client(judge, settings, meter),
            chunk_size=chunk_size,
            normalize=amapreduce_copy,
            lenient=amapreduce_copy,
        )
    )
    aligner: judges.Aligner
    if align == "identity":
        aligner = judges.IdentityAligner()
    elif align == "norm":
        aligner = judges.NormAligner()
    else:
        aligner = judges.ModelAligner(_client(align, settings, meter), lenient=amapreduce_copy)
    entity: judges.EntityJudge = (
        judges.SubstringEntityJudge()
        if entity_judge == "substring"
        else judges.ModelEntityJudge(_client(entity_judge, settings, meter))
    )
    return EvalOptions(
        benchmark=benchmark,  # type: ignore[arg-type]
        judge=column_judge,
        aligner=aligner,
        entity_judge=entity,
        protocol=protocol,  # type: ignore[arg-type]
        reference_date=_parse_date(reference_date),
        corrected=corrected,
        details_dir=details,
        date_cache_dir=settings.cache_dir / "dates",
    )


def options_for(
    benchmark: str, judge: str | None, align: str, reference_date: str | None, *, settings: Settings, meter: UsageMeter
) -> EvalOptions:
    """The scoring options of `eval run`: `eval score`'s defaults for everything it has no flag for,
    so that `eval score` on its answer folders (with the same --judge/--align) gives the same numbers."""
    return score_options(benchmark, judge, align, "substring", "aidc", 100, reference_date, False, None,
                    settings=settings, meter=meter)
