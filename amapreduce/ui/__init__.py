"""amapreduce.ui: `amapreduce ui`, a small browser view of runs, tables, traces, memory and evaluations.

Server-rendered pages (Starlette, Jinja2 with autoescaping, uvicorn), no JavaScript. Needs the
`ui` extra (`pip install 'amapreduce[ui]'`). Safe by default: loopback only, a token for any
other host, CSRF-protected memory edits, URL paths confined to the served folders
(`ui.security`).
"""

from __future__ import annotations

from amapreduce.ui.app import bind, create_app, make_server, serve
from amapreduce.ui.config import UIConfig

__all__ = ["UIConfig", "bind", "create_app", "make_server", "serve"]
