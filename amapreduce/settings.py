"""Configuration enters here and nowhere else.

Library code receives settings objects; only `load_settings` reads the environment, and only
when the CLI (or a caller) asks for it. Nothing is read at import time.

Precedence (highest first): explicit overrides (CLI flags) > environment (`AMAPREDUCE_*`) >
the defaults below.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from amapreduce.errors import ConfigError

__all__ = ["ENV_PREFIX", "Settings", "load_settings"]

ENV_PREFIX = "AMAPREDUCE_"


class Settings(BaseModel):
    """Run-level settings shared by the CLI commands."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int = Field(default=8, ge=1, le=1024)
    """Sub-agents running at once (`AMAPREDUCE_WORKERS`)."""
    max_attempts: int = Field(default=3, ge=1, le=20)
    """Attempts per batch: the first plus retries (`AMAPREDUCE_MAX_ATTEMPTS`; the paper's 2 retries)."""
    batch_timeout_s: float = Field(default=900.0, gt=0)
    """Deadline of one sub-agent attempt in seconds (`AMAPREDUCE_BATCH_TIMEOUT_S`)."""
    patch_rounds: int = Field(default=2, ge=0, le=10)
    """Delta-patch rounds after the map (`AMAPREDUCE_PATCH_ROUNDS`)."""
    max_batches: int = Field(default=50, ge=1)
    """Largest batch plan accepted, as the paper's prompt demands (`AMAPREDUCE_MAX_BATCHES`)."""
    max_tool_calls: int = Field(default=4, ge=1)
    """`mapreduce` tool calls allowed per manager run (`AMAPREDUCE_MAX_TOOL_CALLS`)."""
    runs_dir: Path = Path("runs")
    """Where run directories are written (`AMAPREDUCE_RUNS_DIR`)."""
    memory_store: Path = Path("memory_store/default")
    """Default experiential-memory namespace (`AMAPREDUCE_MEMORY_STORE`)."""
    cache_dir: Path = Path(".amapreduce-cache")
    """Search/crawl cache folder (`AMAPREDUCE_CACHE_DIR`)."""


def load_settings(
    environ: Mapping[str, str] | None = None, **overrides: Any
) -> Settings:
    """Build `Settings` from the environment plus explicit overrides.

    Args:
        environ: the environment to read; `os.environ` when None.
        **overrides: values that win over the environment (None values are ignored).

    Raises:
        ConfigError: a variable or override has an invalid value; the message names it.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name in Settings.model_fields:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None and raw != "":
            values[name] = raw
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        source = "override" if field in overrides else f"`{ENV_PREFIX}{field.upper()}`"
        raise ConfigError(
            f"setting `{field}` is invalid ({source}): {err['msg']}, got {err.get('input')!r}. "
            f"Fix the value or unset it to use the default."
        ) from None
