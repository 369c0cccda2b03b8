"""Put a script first in the page's <head>, before any of Gradio's own scripts run.

Why not Gradio's `head=`: Gradio adds that to the page from its front end, after its modules have
loaded, and a module that took a reference to a browser function while loading (as the status
tracker does to `requestAnimationFrame`) never sees what that script changes. This pure ASGI
middleware edits the one HTML response that matters, the page at "/", as it leaves the server;
every other response (the event streams included) passes through untouched.
"""

from __future__ import annotations

MAX_PAGE_BYTES = 8 * 2**20  # the page is ~100 kB (it carries Gradio's config); never buffer more


class HeadFirst:
    def __init__(self, app, script: str, path: str = "/"):
        self.app, self.script, self.path = app, script.encode(), path

    async def __call__(self, scope, receive, send):
        if (
            scope["type"] != "http"
            or scope.get("method") != "GET"
            or scope.get("path") != self.path
        ):
            return await self.app(scope, receive, send)
        start: dict | None = None
        chunks: list[bytes] = []
        passing = False  # not HTML, or too big: the rest goes out as it comes

        async def edit(message):
            nonlocal start, passing
            if passing:
                return await send(message)
            if message["type"] == "http.response.start":
                start = message
                ctype = dict(start.get("headers", [])).get(b"content-type", b"")
                if not ctype.startswith(b"text/html"):
                    passing = True
                    await send(start)
                return
            if message["type"] != "http.response.body":
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                if sum(map(len, chunks)) > MAX_PAGE_BYTES:
                    passing = True
                    await send(start)
                    await send(
                        {"type": "http.response.body", "body": b"".join(chunks), "more_body": True}
                    )
                return
            body = b"".join(chunks).replace(b"<head>", b"<head>" + self.script, 1)
            headers = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        return await self.app(scope, receive, edit)
