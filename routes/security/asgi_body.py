"""Read an ASGI request body in a middleware, then let the app read it again.

Why: the login throttle (routes/security/auth.py) and Gradio's cancel guard (routes/security/cancel_guard.py) must look
at a POST body before deciding, and the app behind them still expects to receive it. One place also
bounds how much a middleware buffers.
"""

from __future__ import annotations


class BodyTooLarge(Exception):
    pass


async def read_body(receive, limit: int) -> bytes | None:
    """The whole body, or None if the client disconnected; BodyTooLarge past `limit` bytes."""
    body, more = b"", True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        more = message.get("more_body", False)
        if len(body) > limit:
            raise BodyTooLarge(limit)
    return body


def replaying(body: bytes, receive):
    """A receive callable that hands out `body` once, then defers to the real `receive`."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
