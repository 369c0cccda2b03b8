"""GET /api/kv: the KV snapshot (paged-chat.kv v4) as one viewer may see it.

Why its own route module: /metrics is aggregate and may stay open, but the snapshot names
conversations and shows their block tables, so under --auth it needs a login and is scoped to
the caller's own chats (engine/observe/viewer_scope.py; issue 12 item 9). The login is Gradio's: the same
access-token cookie the page uses, resolved through the mounted Gradio app's token table.

Cost (issue 13): at GPU pool sizes a full snapshot is ~13 MB of JSON. `?compact=true` serves the
v4 compact form (block_runs, block_ranges; tens of KB at 350k blocks). Bodies are built once per
snapshot window and reused for every request in it: the unscoped body by the LLM
(`latest_snapshot_bytes`), a scoped one here per (viewer, titles, form).
"""

from __future__ import annotations

import threading

from fastapi import Request  # module level: the route's annotation is resolved from here

from engine.observe.kv_contract import compact_json
from engine.observe.snapshot_cache import json_bytes
from engine.protocol import ServesSnapshotForms
from engine.observe.viewer_scope import scope_snapshot, titles_for

_SCOPED_CACHE_MAX = 64  # viewers x forms kept per snapshot window


def gradio_user(demo, request) -> str | None:
    """The logged-in user of a request to the outer FastAPI app, or None."""
    server = getattr(getattr(demo, "_queue", None), "server_app", None)
    if server is None:
        return None
    cid = getattr(server, "cookie_id", "")
    token = request.cookies.get(f"access-token-{cid}") or request.cookies.get(
        f"access-token-unsecure-{cid}"
    )
    return server.tokens.get(token) if token else None


class _ScopedBodies:
    """Scoped /api/kv bodies of the current shared snapshot, keyed by (viewer, titles, compact):
    a viewer polling faster than the snapshot window, or many tabs of one user, cost one scope
    and one serialization per window. Emptied whenever the shared snapshot changes."""

    def __init__(self):
        self._lock = threading.Lock()
        self._snap = None
        self._bodies: dict = {}

    def get(self, snap: dict, key, build) -> bytes:
        with self._lock:
            if snap is not self._snap:
                self._snap, self._bodies = snap, {}
            body = self._bodies.get(key)
        if body is None:
            body = build()
            with self._lock:
                if snap is self._snap and len(self._bodies) < _SCOPED_CACHE_MAX:
                    self._bodies[key] = body
        return body


def _unscoped_body(llm, fresh: bool, compact: bool) -> bytes:
    if not isinstance(llm, ServesSnapshotForms):  # an engine without the forms (a remote one)
        return json_bytes(
            _maybe_compact(llm.snapshot() if fresh else llm.latest_snapshot(), compact)
        )
    if fresh:
        return json_bytes(llm.kv_snapshot().to_json(compact=compact))
    return llm.latest_snapshot_bytes(compact)


def _maybe_compact(snap: dict, compact: bool) -> dict:
    return (
        compact_json(snap) if compact and "block_runs" in snap and not snap.get("compact") else snap
    )


def register_kv_route(app, llm, *, storage=None, demo=None, auth: bool = False) -> None:
    """Add GET /api/kv (call before mounting Gradio at '/')."""
    from fastapi.responses import JSONResponse, Response

    scoped = _ScopedBodies()

    @app.get("/api/kv")
    def api_kv(request: Request, fresh: bool = False, compact: bool = False) -> Response:
        user = gradio_user(demo, request) if auth else None
        if auth and not user:
            return JSONResponse({"error": "login required"}, status_code=401)
        if storage is None and not auth:
            return Response(_unscoped_body(llm, fresh, compact), media_type="application/json")
        titles = titles_for(storage, user, auth)
        snap = llm.snapshot() if fresh else llm.latest_snapshot()

        def build() -> bytes:
            return json_bytes(
                _maybe_compact(scope_snapshot(snap, titles=titles, viewer=user, auth=auth), compact)
            )

        if fresh:
            return Response(build(), media_type="application/json")
        key = (user, frozenset(titles.items()), compact)
        return Response(scoped.get(snap, key, build), media_type="application/json")
