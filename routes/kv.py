"""GET /api/kv: the KV snapshot (paged-chat.kv v3) as one viewer may see it.

Why its own route module: /metrics is aggregate and may stay open, but the snapshot names
conversations and shows their block tables, so under --auth it needs a login and is scoped to
the caller's own chats (ui/dashboard/scope.py; issue 12 item 9). The login is Gradio's: the same
access-token cookie the page uses, resolved through the mounted Gradio app's token table.
"""
from __future__ import annotations

from fastapi import Request        # module level: the route's annotation is resolved from here

from ui.dashboard.scope import scope_snapshot, titles_for


def gradio_user(demo, request) -> str | None:
    """The logged-in user of a request to the outer FastAPI app, or None."""
    server = getattr(getattr(demo, "_queue", None), "server_app", None)
    if server is None:
        return None
    cid = getattr(server, "cookie_id", "")
    token = request.cookies.get(f"access-token-{cid}") or request.cookies.get(f"access-token-unsecure-{cid}")
    return server.tokens.get(token) if token else None


def register_kv_route(app, llm, *, storage=None, demo=None, auth: bool = False) -> None:
    """Add GET /api/kv (call before mounting Gradio at '/')."""
    from fastapi.responses import JSONResponse

    @app.get("/api/kv")
    def api_kv(request: Request, fresh: bool = False) -> JSONResponse:
        user = gradio_user(demo, request) if auth else None
        if auth and not user:
            return JSONResponse({"error": "login required"}, status_code=401)
        snap = llm.snapshot() if fresh else llm.latest_snapshot()
        if storage is None and not auth:
            return JSONResponse(snap)
        return JSONResponse(scope_snapshot(snap, titles=titles_for(storage, user, auth),
                                           viewer=user, auth=auth))
