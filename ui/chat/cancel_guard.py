"""Owner check in front of Gradio's own `/gradio_api/cancel` route (#12.10).

Why: Stop's `cancels=` and a closed tab make the browser POST {session_hash, fn_index, event_id}
to that route, and Gradio cancels the matching handler without calling any code of ours. Our
per-tab owner check (ui/chat/guard.py) therefore never sees it: a user holding another user's
session hash could end her reply that way. This ASGI middleware reads the body of that one route,
finds the tab's owner in the TabRegistry and the asking user from Gradio's login cookie, and
answers 403 when they differ. Every other request passes through untouched.
"""
from __future__ import annotations

import json

from routes.asgi_body import BodyTooLarge, read_body, replaying

MAX_CANCEL_BODY = 64 * 1024        # a cancel call is a few dozen bytes of JSON


class CancelOwnerGuard:
    def __init__(self, app, tabs, user_of):
        """tabs: the TabRegistry; user_of(scope) -> the logged-in user name or None."""
        self.app, self.tabs, self.user_of = app, tabs, user_of

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" \
                or not scope.get("path", "").rstrip("/").endswith("/gradio_api/cancel"):
            return await self.app(scope, receive, send)
        try:
            body = await read_body(receive, MAX_CANCEL_BODY)
        except BodyTooLarge:
            body = b""                     # not a cancel Gradio sends: no session hash, app decides
        if body is None:
            return
        try:
            session_hash = json.loads(body or b"{}").get("session_hash")
        except (ValueError, AttributeError):
            session_hash = None
        owner = self.tabs.owner_of(session_hash) if isinstance(session_hash, str) else None
        if owner is not None and owner != (self.user_of(scope) or None):
            await send({"type": "http.response.start", "status": 403,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body",
                        "body": b'{"detail": "This browser session belongs to another user."}'})
            return
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
    gradio_app = next((r.app for r in app.routes if hasattr(getattr(r, "app", None), "tokens")), None)
    if gradio_app is None:
        raise RuntimeError("no mounted Gradio app found to guard")
    app.add_middleware(CancelOwnerGuard, tabs=tabs, user_of=gradio_user_of(gradio_app))
