"""Who may act: the action token, browser sessions, CSRF tokens and the same-origin check.

Read pages are open (the dashboard binds loopback by default). An action (every POST) needs
the dashboard started with ``--allow-actions`` and either ``Authorization: Bearer TOKEN`` or a
session cookie obtained by logging in with the token. A cookie is ambient (the browser sends
it with a forged cross-site form too), so a cookie-borne action must also carry the session's
CSRF token and come from this origin; the cookie itself is ``SameSite=Strict`` and HttpOnly.
"""

from __future__ import annotations

import hmac
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from plaita.errors import PlaitaError

#: Name of the session cookie.
SESSION_COOKIE = "plaita_dashboard_session"
#: Sessions kept at once; the oldest is forgotten first (its browser logs in again).
MAX_SESSIONS = 100
#: A token given by the operator must be at least this long (a generated one is 32 characters).
MIN_TOKEN_CHARS = 16
#: Headers on every response: no framing, no sniffing, scripts and styles from this origin only.
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
     b"frame-ancestors 'none'; form-action 'self'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]  # fmt: skip


class Forbidden(PlaitaError):
    """Raised when a request may not perform an action; the message says why (HTTP 403)."""


def generate_token() -> str:
    return secrets.token_urlsafe(24)


@dataclass
class Session:
    session_id: str
    csrf: str


class Guard:
    """Checks actions: enabled, authenticated, and (for cookie sessions) same-origin with a CSRF token."""

    def __init__(self, *, allow_actions: bool, token: str | None) -> None:
        self.allow_actions = allow_actions
        self.token = token
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def token_matches(self, candidate: str) -> bool:
        return self.token is not None and hmac.compare_digest(candidate.encode(), self.token.encode())

    def new_session(self) -> Session:
        session = Session(secrets.token_urlsafe(24), secrets.token_urlsafe(24))
        with self._lock:
            self._sessions[session.session_id] = session
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return session

    def end_session(self, request: Request) -> None:
        with self._lock:
            self._sessions.pop(request.cookies.get(SESSION_COOKIE, ""), None)

    def session(self, request: Request) -> Session | None:
        with self._lock:
            return self._sessions.get(request.cookies.get(SESSION_COOKIE, ""))

    def bearer(self, request: Request) -> bool:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self.token_matches(value.strip())

    def check_origin(self, request: Request) -> None:
        """Refuse a request a browser marked as coming from another site."""
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if request.headers.get("sec-fetch-site") in ("cross-site", "same-site"):
            raise Forbidden("cross-site request refused")
        origin = request.headers.get("origin")
        if origin is not None:
            if origin != own:
                raise Forbidden("cross-site request refused (Origin does not match this dashboard)")
            return
        referer = request.headers.get("referer")
        if referer is not None:
            parts = urlsplit(referer)
            if f"{parts.scheme}://{parts.netloc}" != own:
                raise Forbidden("cross-site request refused (Referer does not match this dashboard)")
            return
        if not self.bearer(request):
            raise Forbidden("request refused: a browser action must send Origin or Referer")

    def check_action(self, request: Request, form_csrf: str | None) -> None:
        """Raise Forbidden unless ``request`` may perform an action."""
        if not self.allow_actions:
            raise Forbidden("this dashboard is read-only: start it with --allow-actions to enable actions")
        self.check_origin(request)
        if self.bearer(request):
            return
        session = self.session(request)
        if session is None:
            raise Forbidden("log in with the dashboard token first (see /login)")
        if not form_csrf or not hmac.compare_digest(form_csrf.encode(), session.csrf.encode()):
            raise Forbidden("missing or wrong CSRF token: reload the page and try again")


class SecurityHeaders:
    """ASGI middleware adding SECURITY_HEADERS to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)
