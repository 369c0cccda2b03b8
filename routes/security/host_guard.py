"""DNS-rebinding guard and API-docs removal for the FastAPI app that serves the page.

A page on evil.example can make the victim's browser resolve evil.example to 127.0.0.1 and then
read our answers as same-origin: the only thing that differs is the Host header. So on a loopback
bind we answer only requests whose Host is a loopback name (localhost, *.localhost, 127.0.0.0/8,
::1) or one the operator named with --allowed-host; anything else gets 421 Misdirected Request
before any route runs. On a non-loopback bind the set of valid names is unknown, so the check is
on only when --allowed-host names are given (then: loopback names, the bind address and those).

The guard is plain ASGI (not a Starlette BaseHTTPMiddleware) so it also covers websockets and
streaming responses without buffering them.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable

DOCS_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")


def is_loopback_host(host: str) -> bool:
    """True for localhost, *.localhost, and loopback IP literals (v4 or v6)."""
    host = host.strip().lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_host_header(value: str) -> str | None:
    """'example.com:8080' -> 'example.com'; '[::1]:7860' -> '::1'. None when malformed."""
    value = value.strip().lower()
    if not value or any(c in value for c in " /\\@?#"):
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1 :] and not value[end + 1 :].startswith(":")):
            return None
        host, port = value[1:end], value[end + 2 :]
    elif value.count(":") > 1:
        return None  # bare IPv6 without brackets is not a valid Host header
    else:
        host, _, port = value.partition(":")
    if port and not port.isdigit():
        return None
    return host.rstrip(".") or None


class HostGuard:
    """ASGI middleware: refuse requests whose Host header is not an allowed name (421)."""

    def __init__(
        self,
        app,
        allowed_hosts: Iterable[str] = (),
        allow_loopback: bool = True,
        live_hosts: set | None = None,
    ):
        self.app = app
        self.allowed = {
            h.strip().lower().rstrip(".").strip("[]") for h in allowed_hosts if h.strip()
        }
        self.allow_loopback = allow_loopback
        self.live = live_hosts if live_hosts is not None else set()  # grows at run time (--share)

    def host_allowed(self, host: str | None) -> bool:
        if host is None:
            return False
        host = host.lower()
        return (
            host in self.allowed
            or host in self.live
            or (self.allow_loopback and is_loopback_host(host))
        )

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        raw = [v for k, v in scope.get("headers", []) if k == b"host"]
        host = split_host_header(raw[0].decode("latin-1")) if len(raw) == 1 else None
        if self.host_allowed(host):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = (
            b"Misdirected request: this server answers only to its own host names "
            b"(start it with --allowed-host NAME to add one).\n"
        )
        await send(
            {
                "type": "http.response.start",
                "status": 421,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def remove_api_docs(app) -> None:
    """Drop FastAPI's /docs, /redoc and /openapi.json: they need no login, list every route, and
    the schema of the mounted Gradio app does not even build (it answered 500)."""
    app.router.routes[:] = [
        r for r in app.router.routes if getattr(r, "path", None) not in DOCS_PATHS
    ]
    app.docs_url = app.redoc_url = app.openapi_url = None
    from fastapi import FastAPI

    for route in app.router.routes:  # the mounted Gradio app is a FastAPI app as well
        sub = getattr(route, "app", None)
        if sub is not app and isinstance(sub, FastAPI):
            remove_api_docs(sub)


def install_security(
    app,
    bind_host: str = "127.0.0.1",
    allowed_hosts: Iterable[str] = (),
    auth=None,
    share_hosts: set | None = None,
) -> None:
    """Everything this module and routes/security/auth.py add to the app; call once, before serving.

    auth: the callable credentials object from routes.security.auth (or None); with it, /login attempts
    are throttled per user and client address. share_hosts: a set the --share link's host name is
    added to once the tunnel is open (routes/share.py); the Host guard reads it live."""
    allowed = [h for h in (allowed_hosts or ()) if h]
    remove_api_docs(app)
    if auth is not None:
        from routes.security.login_guard import LoginThrottleMiddleware

        app.add_middleware(
            LoginThrottleMiddleware,
            throttle=getattr(auth, "throttle", None),
            budget=getattr(auth, "budget", None),
        )
    if is_loopback_host(bind_host):
        app.add_middleware(HostGuard, allowed_hosts=allowed, live_hosts=share_hosts)
    elif allowed:
        app.add_middleware(HostGuard, allowed_hosts=allowed + [bind_host], live_hosts=share_hosts)
