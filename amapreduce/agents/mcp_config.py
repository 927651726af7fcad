"""The MCP config file of `--mcp CONFIG` (`AMAPREDUCE_MCP`): read, validated, checked.

The format is the one Claude Desktop and Cursor users already have::

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/data"],
                  "env": {"SOME_KEY": "..."}},
        "docs":  {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer ..."}}}}

A server with `command` is started as a subprocess and spoken to over its stdin/stdout; a server
with `url` is reached over streamable HTTP. Both also accept `type` (`stdio`, or `http` /
`streamable-http`), `disabled` and our `timeout` (seconds one call may take; default 60).
Anything else is refused with its name (`extra="forbid"`), so a typo is not silently a server
without its arguments; the legacy HTTP+SSE transport is refused with what to use instead.
Reading the file needs no `mcp` package, so a bad config is refused before anything starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from amapreduce.errors import ConfigError
from amapreduce.settings import is_credential_name
from amapreduce.trace import register_secrets

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "HttpServer",
    "McpConfig",
    "McpServer",
    "StdioServer",
    "check_mcp_config",
    "load_mcp_config",
    "register_config_secrets",
    "require_mcp",
]

DEFAULT_TIMEOUT_S = 60.0
"""Seconds one tool call, or the start of one server, may take unless its entry says `timeout`."""

_INSTALL_HINT = "MCP tools need the `mcp` extra: pip install 'amapreduce[mcp]'"
_CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie")


class _Server(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: float = Field(default=DEFAULT_TIMEOUT_S, gt=0, allow_inf_nan=False)
    """Seconds one tool call may take, and the server's start (our key; not in Claude Desktop's format)."""
    disabled: bool = False
    """Leave the server out (the key Claude Desktop/Cline configs use to switch a server off)."""


class StdioServer(_Server):
    """A server started as a subprocess, spoken to over its stdin/stdout."""

    type: Literal["stdio"] = "stdio"
    command: str = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    """Variables added to the SDK's minimal environment (`PATH`, `HOME`, ...)."""
    cwd: Path | None = None

    def where(self) -> str:
        """The command line, for messages."""
        return " ".join([self.command, *self.args])


class HttpServer(_Server):
    """A server reached over streamable HTTP."""

    type: Literal["http", "streamable-http", "streamableHttp"] = "http"
    url: str
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.match(r"https?://[^/\s]+", value):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value

    def where(self) -> str:
        """The URL, for messages."""
        return self.url


McpServer = StdioServer | HttpServer


class McpConfig(BaseModel):
    """The servers of an MCP config file, by name (disabled ones included)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    servers: dict[str, McpServer]
    source: str = ""
    """The file the config came from, for messages."""

    def enabled(self) -> dict[str, McpServer]:
        """The servers to start."""
        return {name: server for name, server in self.servers.items() if not server.disabled}


def _server(entry: object) -> McpServer:
    """One `mcpServers` entry, told apart by `command` (stdio) or `url` (HTTP)."""
    if not isinstance(entry, dict):
        raise ValueError(f"must be an object with `command` (stdio) or `url` (streamable HTTP), got {entry!r}")
    if entry.get("type") == "sse" or str(entry.get("url", "")).rstrip("/").endswith("/sse"):
        raise ValueError("the legacy HTTP+SSE transport is not supported; use the server's streamable HTTP "
                         "endpoint (usually .../mcp) or start it over stdio")
    if "command" in entry and "url" in entry:
        raise ValueError("give either `command` (stdio) or `url` (streamable HTTP), not both")
    if "url" in entry:
        return HttpServer.model_validate(entry)
    if "command" in entry:
        return StdioServer.model_validate(entry)
    raise ValueError("needs `command` (a stdio server) or `url` (a streamable HTTP server)")


def load_mcp_config(path: Path | str) -> McpConfig:
    """Read and validate an MCP config file (`{"mcpServers": {...}}`).

    Raises:
        ConfigError: the file is missing or not JSON, or an entry is invalid; the one-line
            message names the file, the server and the field.
    """
    where = f"MCP config {str(path)!r}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist. Give --mcp (or AMAPREDUCE_MCP) a JSON file "
                          '{"mcpServers": {"NAME": {"command": ..., "args": [...]}}}.') from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where} cannot be read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}.") from None
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise ConfigError(f'{where} must be a JSON object with an "mcpServers" object, as Claude Desktop and '
                          'Cursor write it: {"mcpServers": {"NAME": {"command": ..., "args": [...]}}}.')
    unknown = sorted(set(data) - {"mcpServers"})
    if unknown:
        raise ConfigError(f"{where}: unknown top-level key {unknown[0]!r}; only \"mcpServers\" is read.")
    servers: dict[str, McpServer] = {}
    for name, entry in data["mcpServers"].items():
        try:
            servers[name] = _server(entry)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            hint = " (unknown key)" if err["type"] == "extra_forbidden" else ""
            raise ConfigError(f"{where}: server {name!r}: `{field}`{hint}: {err['msg']}.") from None
        except ValueError as exc:
            raise ConfigError(f"{where}: server {name!r}: {exc}.") from None
    return McpConfig(servers=servers, source=str(path))


def check_mcp_config(path: Path | str) -> McpConfig:
    """`load_mcp_config`, plus what can be checked without starting a server: the `mcp` extra is
    installed and every stdio command exists. Run before a run directory is made (exit 2).

    Raises:
        ConfigError: as `load_mcp_config`, or the extra is missing, or a command is not found.
    """
    import shutil

    config = load_mcp_config(path)
    require_mcp()
    for name, server in config.enabled().items():
        if isinstance(server, StdioServer) and shutil.which(server.command) is None:
            raise ConfigError(f"MCP config {config.source!r}: server {name!r}: command {server.command!r} "
                              "was not found (not a file, and not on PATH).")
    return config


def require_mcp() -> None:
    """Refuse MCP tools without the `mcp` package, saying which extra brings it."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ConfigError(_INSTALL_HINT) from None


def register_config_secrets(servers: Mapping[str, McpServer]) -> None:
    """Register the credential-looking `env` values and header values of `servers` for redaction."""
    values: list[str] = []
    for server in servers.values():
        if isinstance(server, StdioServer):
            values += [v for k, v in server.env.items() if is_credential_name(k)]
        else:
            for key, value in server.headers.items():
                if key.lower() in _CREDENTIAL_HEADERS or is_credential_name(key):
                    values += [value, value.split(" ", 1)[-1]]  # `Bearer TOKEN`: the token alone too
    register_secrets(values)
