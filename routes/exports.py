"""GET /exports/<token>/<name>: an export's download, for its owner only.

Why its own route: Gradio's File output copies a file into Gradio's cache and serves it at
/gradio_api/file=... to anyone logged in who has the URL, so one user's export could be fetched
by another (issue 12 item 12). Here the export never leaves storage/exports.PrivateExports; the
route asks it for the token and the requester's login (the same Gradio cookie /api/kv reads) and
answers 404 alike for a wrong token, someone else's export and an expired one.
"""

from __future__ import annotations

from fastapi import Request  # module level: the route's annotation is resolved from here

from routes.kv import gradio_user

MEDIA_TYPES = {".json": "application/json", ".md": "text/markdown; charset=utf-8"}


def register_export_route(app, exports, *, demo=None, auth: bool = False) -> None:
    """Add GET /exports/{token}/{name} (call before mounting Gradio at '/')."""
    from fastapi.responses import FileResponse, JSONResponse

    @app.get("/exports/{token}/{name}")
    def download(token: str, name: str, request: Request):
        user = gradio_user(demo, request) if auth else None
        export = exports.open(token, user) if (user or not auth) else None
        if export is None or export.name != name:
            return JSONResponse(
                {"error": "no such export (they expire after 15 minutes)"}, status_code=404
            )
        media = MEDIA_TYPES.get(export.path.suffix, "application/octet-stream")
        return FileResponse(
            export.path,
            media_type=media,
            filename=export.name,
            headers={"Cache-Control": "private, no-store", "X-Content-Type-Options": "nosniff"},
        )
