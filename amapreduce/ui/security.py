"""What keeps `amapreduce ui` safe to leave running: who may ask, which paths it may read, which
writes it accepts.

Why each rule:

* Loopback only by default, and the `Host` header checked there: a page on another site can make
  the browser send requests to `127.0.0.1` (or, through DNS rebinding, to a name that resolves to
  it); refusing every `Host` but the loopback names keeps such pages out.
* Any other bind needs a token, and every request carries it (a cookie set from `?token=` on the
  first visit, or `Authorization: Bearer`): the pages show run traces and memory contents.
* Memory edits are POST forms carrying a per-process CSRF token that only our own pages show.
* URL parts never become paths outside the folders the server was given (`contained`).
* No page runs a script: the Content-Security-Policy allows none, so even a value that escaped
  the templates' autoescaping could not execute.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

__all__ = [
    "LOOPBACK_NAMES",
    "MAX_FORM_BYTES",
    "TOKEN_COOKIE",
    "Guard",
    "check_csrf",
    "contained",
    "is_loopback",
    "new_secret",
    "parse_form",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
TOKEN_COOKIE = "amapreduce_ui_token"
MAX_FORM_BYTES = 64 * 1024
"""The largest memory-edit form accepted: a hint is a few sentences."""

_HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; "
     b"frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


def new_secret() -> str:
    """A fresh random token (CSRF tokens; tests)."""
    return secrets.token_urlsafe(32)


def is_loopback(host: str) -> bool:
    """Whether binding to `host` keeps the server on this machine."""
    name = host.strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _host_name(header: str) -> str:
    """The name part of a `Host` header (`[::1]:8765` → `::1`, `localhost:80` → `localhost`)."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0].lower()
    return header.rsplit(":", 1)[0].lower() if header.count(":") == 1 else header.lower()


class Guard:
    """ASGI middleware: the Host check (loopback binds), the token (any other bind, or when
    given) and the security headers on every response."""

    def __init__(self, app: ASGIApp, *, token: str | None, loopback: bool, bound_host: str) -> None:
        self.app = app
        self.token = token
        self.hosts = (LOOPBACK_NAMES | {bound_host.strip("[]").lower()}) if loopback else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        headers = Headers(scope=scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, text, extra = refusal
            await send_with_headers({"type": "http.response.start", "status": status,
                                     "headers": [(b"content-type", b"text/plain; charset=utf-8"), *extra]})
            await send_with_headers({"type": "http.response.body", "body": text.encode()})
            return
        await self.app(scope, receive, send_with_headers)

    def _refusal(self, scope: Scope, headers: Headers) -> tuple[int, str, list[tuple[bytes, bytes]]] | None:
        """Why this request is turned away (status, text, headers), or None to let it through."""
        if self.hosts is not None and _host_name(headers.get("host", "")) not in self.hosts:
            return 400, ("refused: this server answers only requests addressed to the loopback host "
                         "(127.0.0.1, localhost or ::1)."), []
        if self.token is None:
            return None
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer ") and _same(auth[7:].strip(), self.token):
            return None
        cookie = SimpleCookie(headers.get("cookie", ""))
        if TOKEN_COOKIE in cookie and _same(cookie[TOKEN_COOKIE].value, self.token):
            return None
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = dict(query).get("token")
        if _same(given, self.token) and scope.get("method") in ("GET", "HEAD"):
            # The first visit: keep the token in a cookie and drop it from the address bar.
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            raw = scope.get("raw_path") or quote(scope.get("path", "/")).encode()
            location = "/" + raw.decode("latin-1").lstrip("/") + (f"?{rest}" if rest else "")  # never `//host`
            cookie_value = f"{TOKEN_COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"
            return 303, "", [(b"location", location.encode("utf-8")), (b"set-cookie", cookie_value.encode())]
        return 401, ("refused: this server needs its token. Open it with ?token=TOKEN (the --token or "
                     "AMAPREDUCE_UI_TOKEN it was started with), or send Authorization: Bearer TOKEN."), []


def contained(base: Path, relative: str) -> Path:
    """The folder `relative` names under `base`, refusing anything that leads outside it.

    Absolute paths, `..` parts, backslashes, NUL bytes and symbolic links that resolve outside
    `base` are all refused with 404, the same answer as a folder that does not exist, so the
    reply tells nothing about the rest of the disk.

    Raises:
        HTTPException: 404 for every refused or missing path.
    """
    parts = relative.split("/")
    if (not relative or "\\" in relative or "\x00" in relative or relative.startswith("/")
            or any(p in ("", ".", "..") for p in parts)):
        raise HTTPException(404, f"no such folder: {relative!r}")
    root = base.resolve()
    target = (root / relative).resolve()
    if not target.is_relative_to(root) or target == root or not target.is_dir():
        raise HTTPException(404, f"no such folder: {relative!r}")
    return target


def parse_form(body: bytes) -> dict[str, str]:
    """A urlencoded form body as a dict (the last value of a repeated field wins).

    Raises:
        HTTPException: 413 for a body over `MAX_FORM_BYTES`, 400 for one that is not UTF-8 or
            has too many fields.
    """
    if len(body) > MAX_FORM_BYTES:
        raise HTTPException(413, f"form too large ({len(body)} bytes; at most {MAX_FORM_BYTES}).")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(400, "the form is not UTF-8 text.") from None
    try:
        return dict(parse_qsl(text, keep_blank_values=True, max_num_fields=32))
    except ValueError:
        raise HTTPException(400, "the form has too many fields.") from None


def check_csrf(form: dict[str, str], expected: str) -> None:
    """Refuse a write whose form does not carry this server's CSRF token.

    Raises:
        HTTPException: 403.
    """
    if not _same(form.get("csrf"), expected):
        raise HTTPException(403, "refused: the form's CSRF token is missing or wrong. Reload the page and try again.")
