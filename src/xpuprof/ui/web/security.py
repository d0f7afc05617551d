"""Who may talk to the server, and the headers every answer carries.

- **Loopback by default.** Bound to a loopback address without a token, the server answers
  only requests whose ``Host`` is a loopback name (``127.0.0.1``, ``localhost``, ``[::1]``):
  a web page elsewhere cannot reach it through DNS rebinding. Any other address needs a token
  (:func:`check_bind` refuses to start without one).
- **A token**, when given, is needed by every request: ``Authorization: Bearer TOKEN``, or
  ``?token=TOKEN`` once (the answer sets it as an HttpOnly, SameSite=Strict cookie and, for a
  page, redirects to the same address without it, so that it leaves the address bar and the
  history). Compared in constant time (:func:`hmac.compare_digest`). No token: 401; a wrong
  one: 403.
- **Headers**: a Content-Security-Policy that runs only the server's own scripts (an
  injected ``onerror=`` attribute or inline script would not run even if escaping failed),
  no framing, no referrer (the token never leaks in a Referer), ``nosniff``.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from xpuprof.core.errors import XpuprofError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

COOKIE = "xpuprof_token"
#: The shortest token accepted: a guessable secret on a network address is no protection.
MIN_TOKEN = 16
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if host.strip("[]").lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse, before anything listens, a non-loopback address without a token, and a token
    too short to protect anything."""
    if token is not None and len(token) < MIN_TOKEN:
        raise XpuprofError(
            f"--token: at least {MIN_TOKEN} characters (make one with: python -c "
            "'import secrets; print(secrets.token_urlsafe())')"
        )
    if not is_loopback(host) and not token:
        raise XpuprofError(
            f"--host {host}: not a loopback address; serving traces on the network needs "
            "--token (or XPUPROF_UI_TOKEN), which every request must then carry"
        )


def _host_name(headers: dict[bytes, bytes]) -> str:
    host = headers.get(b"host", b"").decode("latin-1").strip().lower()
    if host.startswith("["):  # [::1]:8765
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class Guard:
    """ASGI middleware: the token (when the server has one), the loopback ``Host`` check
    (when it has none) and the security headers on every answer."""

    def __init__(self, app: Any, token: str | None) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        api = scope.get("path", "").startswith("/api/")
        if self.token is None:
            if _host_name(headers) not in LOOPBACK_NAMES:
                await _refuse(send, 403, "this server answers only loopback host names", api)
                return
            await self.app(scope, receive, _with_headers(send, []))
            return
        given, from_query = self._given(scope, headers)
        if given is None:
            await _refuse(send, 401, "this server needs its token (?token=… or "
                                     "Authorization: Bearer …)", api)  # fmt: skip
            return
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            await _refuse(send, 403, "wrong token", api)
            return
        extra = []
        if from_query:
            extra.append((b"set-cookie", f"{COOKIE}={self.token}; HttpOnly; SameSite=Strict; "
                                         "Path=/".encode()))  # fmt: skip
            if not api and scope.get("method") == "GET":  # the token leaves the address bar
                await _redirect(send, _without_token(scope), extra)
                return
        await self.app(scope, receive, _with_headers(send, extra))

    @staticmethod
    def _given(scope: Scope, headers: dict[bytes, bytes]) -> tuple[str | None, bool]:
        """The token the request carries (header, then query, then cookie), and whether it
        came in the query."""
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth[:7].lower() == "bearer ":
            return auth[7:].strip(), False
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if "token" in query:
            return query["token"], True
        cookie = SimpleCookie()
        try:
            cookie.load(headers.get(b"cookie", b"").decode("latin-1"))
        except Exception:  # a malformed Cookie header: no token from it
            return None, False
        morsel = cookie.get(COOKIE)
        return (morsel.value if morsel is not None else None), False


def _without_token(scope: Scope) -> str:
    query = [(k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                                          keep_blank_values=True) if k != "token"]  # fmt: skip
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if raw else quote(scope.get("path", "/"))
    return path + ("?" + urlencode(query) if query else "")


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", []), *HEADERS, *extra]
        await send(message)

    return wrapped


async def _refuse(send: Send, status: int, message: str, api: bool) -> None:
    """A short answer without the app: JSON ``{"error": …}`` for the API, text for a page."""
    if api:
        body, kind = json.dumps({"error": message}).encode(), b"application/json"
    else:
        body, kind = f"{status}: {message}\n".encode(), b"text/plain; charset=utf-8"
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode()),
                            *HEADERS]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


async def _redirect(send: Send, location: str, extra: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": 303,
                "headers": [(b"location", location.encode("latin-1", "replace")),
                            (b"content-length", b"0"), *HEADERS, *extra]})  # fmt: skip
    await send({"type": "http.response.body", "body": b""})
