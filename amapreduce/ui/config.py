"""`amapreduce ui`: what the server shows and where it listens (`UIConfig`), checked before it starts.

Its own module because both the application (`ui.app`) and the pages (`ui.routes`, which read it
from the request) need it, and the application builds its routes from the pages.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from amapreduce.errors import ConfigError, UserError
from amapreduce.ui.security import is_loopback

__all__ = ["MIN_TOKEN_LENGTH", "UIConfig"]

MIN_TOKEN_LENGTH = 16
"""A token shorter than this is refused: it guards run traces and memory edits on a network."""


class UIConfig(BaseModel):
    """What the server shows and where it listens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runs_dir: Path
    """The folder of run directories (the Runs page)."""
    memory: Path
    """The memory store folder (the Memory page)."""
    evals: tuple[Path, ...] = ()
    """`eval run` output folders (the Evaluation pages)."""
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    token: str | None = None
    """Required unless `host` is loopback; every request must then carry it."""
    plot_dir: Path
    """Where the Evaluation pages draw the report's plots (a cache folder of the server)."""

    def check(self) -> None:
        """Refuse an unsafe or impossible configuration before anything listens.

        Raises:
            ConfigError: a non-loopback host without a token, or a token that is too short.
            UserError: an `--eval` folder that does not exist.
        """
        if self.token is not None and len(self.token) < MIN_TOKEN_LENGTH:
            raise ConfigError(f"--token must be at least {MIN_TOKEN_LENGTH} characters, got {len(self.token)}. "
                              "Use a long random one, e.g. the output of `python -c \"import secrets; "
                              "print(secrets.token_urlsafe())\"`.")
        if not is_loopback(self.host) and self.token is None:
            raise ConfigError(f"--host {self.host} listens beyond this machine: give --token TOKEN (or set "
                              "AMAPREDUCE_UI_TOKEN), which every request must then carry; or keep the default "
                              "--host 127.0.0.1.")
        missing = [str(p) for p in self.evals if not p.is_dir()]
        if missing:
            raise UserError(f"--eval {missing[0]} is not a folder. Pass the --out folder of `amapreduce eval run`.")
