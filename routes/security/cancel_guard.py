"""Owner check in front of Gradio's own routes that take a session hash: `/gradio_api/cancel`
(#12.10), the event stream `/gradio_api/queue/data` and `/gradio_api/heartbeat/<hash>` (#29.5).

Why: Stop's `cancels=` and a closed tab make the browser POST {session_hash, fn_index, event_id}
to /cancel, and Gradio cancels the matching handler without calling any code of ours; likewise
`GET /queue/data?session_hash=` hands out that session's events to whoever asks (bob received 34
events of alice's reply, and her call never completed, because each event goes to one reader).
Our per-tab owner check (ui/chat/guard.py) never sees those routes. This ASGI middleware finds
the session's owner - the TabRegistry's, else the login that used the hash first (a session hash
is bound to the login that first streams or beats with it) - and the asking user from Gradio's
login cookie, and answers 403 when they differ. Every other request passes through untouched.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from urllib.parse import parse_qs

from routes.security.asgi_body import BodyTooLarge, read_body, replaying

MAX_CANCEL_BODY = 64 * 1024  # a cancel call is a few dozen bytes of JSON
MAX_BOUND = 50_000  # session hashes remembered with their first login (oldest dropped)


class SessionBindings:
    """session hash -> the login that first used it (bounded, thread-safe)."""

    def __init__(self, limit: int = MAX_BOUND):
        self.limit, self._owners, self._lock = limit, OrderedDict(), threading.Lock()

    def owner_or_bind(self, session_hash: str, user: str) -> str:
        with self._lock:
            owner = self._owners.setdefault(session_hash, user)
            self._owners.move_to_end(session_hash)
            while len(self._owners) > self.limit:
                self._owners.popitem(last=False)
            return owner


def _stream_hash(scope) -> str | None:
    """The session hash of a GET to the event stream or the heartbeat (None: another route)."""
    if scope["type"] != "http" or scope.get("method") != "GET":
        return None
    path = scope.get("path", "").rstrip("/")
    if path.endswith("/gradio_api/queue/data"):
        values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_hash")
        return values[0] if values else None
    head, sep, tail = path.rpartition("/gradio_api/heartbeat/")
    return tail if sep and tail and "/" not in tail else None


async def _forbidden(send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send(
        {
            "type": "http.response.body",
            "body": b'{"detail": "This browser session belongs to another user."}',
        }
    )


class CancelOwnerGuard:
    def __init__(self, app, tabs, user_of, bindings: SessionBindings | None = None):
        """tabs: the TabRegistry; user_of(scope) -> the logged-in user name or None."""
        self.app, self.tabs, self.user_of = app, tabs, user_of
        self.bindings = bindings or SessionBindings()

    def _owner(self, session_hash: str, user: str | None) -> str | None:
        owner = self.tabs.owner_of(session_hash)
        if owner is None and user:
            owner = self.bindings.owner_or_bind(session_hash, user)
        return owner

    async def __call__(self, scope, receive, send):
        stream_hash = _stream_hash(scope)
        if stream_hash is not None:
            user = self.user_of(scope) or None
            owner = self._owner(stream_hash, user)
            if owner is not None and owner != user:
                return await _forbidden(send)
            return await self.app(scope, receive, send)
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or not scope.get("path", "").rstrip("/").endswith("/gradio_api/cancel")
        ):
            return await self.app(scope, receive, send)
        try:
            body = await read_body(receive, MAX_CANCEL_BODY)
        except BodyTooLarge:
            body = b""  # not a cancel Gradio sends: no session hash, app decides
        if body is None:
            return
        try:
            session_hash = json.loads(body or b"{}").get("session_hash")
        except (ValueError, AttributeError):
            session_hash = None
        user = self.user_of(scope) or None
        owner = self._owner(session_hash, user) if isinstance(session_hash, str) else None
        if owner is not None and owner != user:
            return await _forbidden(send)
        return await self.app(scope, replaying(body, receive), send)


def gradio_user_of(gradio_app):
    """user_of(scope) for a mounted Gradio App: its login cookie -> user name (None: no login)."""

    def user_of(scope) -> str | None:
        cookies = {}
        for k, v in scope.get("headers", []):
            if k == b"cookie":
                for part in v.decode("latin-1").split(";"):
                    name, _, value = part.strip().partition("=")
                    cookies[name] = value
        cid = getattr(gradio_app, "cookie_id", None)
        token = cookies.get(f"access-token-{cid}") or cookies.get(f"access-token-unsecure-{cid}")
        return getattr(gradio_app, "tokens", {}).get(token)

    return user_of


def install_cancel_guard(app, tabs) -> None:
    """Put the guard in front of the Gradio app mounted on FastAPI `app` (with --auth only)."""
    from gradio.routes import App as GradioApp

    gradio_app = next(
        (r.app for r in app.routes if isinstance(getattr(r, "app", None), GradioApp)), None
    )
    if gradio_app is None:
        raise RuntimeError("no mounted Gradio app found to guard")
    app.add_middleware(CancelOwnerGuard, tabs=tabs, user_of=gradio_user_of(gradio_app))
