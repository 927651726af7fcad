"""`amapreduce ui`: the Starlette application and the uvicorn server (its configuration, `UIConfig`,
is `ui.config`).

Why server-rendered pages (Jinja2, autoescaped) and no JavaScript: the pages are tables,
charts drawn as SVG and a few forms, which HTML does on its own; with no script there is no
build step, nothing fetched from a CDN, and the Content-Security-Policy can forbid every script
(`ui.security`). Live runs refresh with a `<meta http-equiv="refresh">`.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from amapreduce.errors import UserError
from amapreduce.memory import StoreError
from amapreduce.ui.config import UIConfig
from amapreduce.ui.security import Guard, is_loopback, new_secret

if TYPE_CHECKING:
    import uvicorn

__all__ = ["bind", "create_app", "make_server", "serve"]

_HERE = Path(__file__).parent


def _templates() -> Jinja2Templates:
    """The page templates, every value HTML-escaped (a cell holding `<script>` is shown as text)."""
    env = Environment(loader=FileSystemLoader(_HERE / "templates"), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = _num
    return Jinja2Templates(env=env)


def _num(value: Any, digits: int = 3) -> str:
    """A number for a table cell: integers as they are, floats rounded; `—` for none."""
    if value is None or isinstance(value, bool):
        return "—" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits if abs(value) < 1000 else min(digits, 1)}f}"  # a token count needs no 3 decimals
    return str(value)


async def _error_page(request: Request, exc: Exception) -> Response:
    """Refusals and bad requests as a page: the status, and the message (escaped)."""
    if isinstance(exc, HTTPException):
        status, message = exc.status_code, str(exc.detail)
    elif isinstance(exc, StoreError):
        status, message = 404, str(exc)
    else:
        status, message = 400, str(exc)
    templates: Jinja2Templates = request.app.state.templates
    return templates.TemplateResponse(request, "error.html", {"status": status, "message": message,
                                                              "section": "error"}, status_code=status)


def create_app(config: UIConfig, *, csrf_token: str | None = None) -> Starlette:
    """The application for `config` (checked first; see `UIConfig.check`).

    Args:
        config: what to serve.
        csrf_token: the token memory forms must carry (default: a fresh random one per process).
    """
    from amapreduce.ui.routes import ROUTES

    config.check()
    app = Starlette(
        routes=ROUTES,
        middleware=[Middleware(Guard, token=config.token, loopback=is_loopback(config.host),
                               bound_host=config.host)],
        exception_handlers={HTTPException: _error_page, UserError: _error_page, StoreError: _error_page},
    )
    app.state.config = config
    app.state.csrf = csrf_token or new_secret()
    app.state.templates = _templates()
    return app


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host:port` (port 0: any free port).

    Raises:
        UserError: the address cannot be used (taken, unknown host, no permission).
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc}. Check --host.") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}. Choose another --port.") from None
    return sock


def make_server(config: UIConfig) -> uvicorn.Server:
    """The uvicorn server of `config`'s application.

    Access logging is off: a first visit's URL carries the token (`?token=`), which must not land
    in a log.
    """
    import uvicorn

    app = create_app(config)
    return uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, server_header=False,
                                         proxy_headers=False))


def serve(config: UIConfig, *, announce: Any = print) -> None:
    """Serve until interrupted (Ctrl-C).

    Args:
        config: what to serve and where.
        announce: called with the line that says where the server listens.
    """
    server = make_server(config)
    sock = bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    how = " (open it with ?token=TOKEN once)" if config.token else ""
    announce(f"amapreduce ui: serving http://{shown}:{port}/{how}; Ctrl-C stops.")
    server.run(sockets=[sock])
