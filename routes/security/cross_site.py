"""Tell requests sent by another site's page apart from the local user's own (#29.6).

Why: the Host guard stops DNS rebinding, but a page on `evil.example` can still fire no-cors
requests at `http://127.0.0.1:7860` (it cannot read the answers). Each wrong key or password it
sends counted against 127.0.0.1, the address the local user shares, so the page could keep the
user's own correct key and login throttled (44 of 45 right-key polls got 429). Browsers say who
sent a request: `Sec-Fetch-Site` (sent to loopback and https origins by every current browser) and
`Origin` (on every POST). Such a request is refused before anything is checked or counted.

Non-browser clients (curl, the openai package, gradio_client) send neither header: they are the
local user's tools and are judged by their credentials as before.
"""

from __future__ import annotations

from urllib.parse import urlsplit

FOREIGN_FETCH_SITES = ("cross-site", "same-site")  # same-site: another port of the same host, too
DEFAULT_PORTS = {"http": 80, "https": 443}


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k == name:
            return v.decode("latin-1").strip()
    return None


def _origin_authority(origin: str) -> str | None:
    try:
        parts = urlsplit(origin)
        port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return f"{parts.hostname.lower()}:{port}"


def _host_authority(host: str, scheme: str) -> str:
    name, _, port = (
        host.lower().rpartition(":")
        if host.rsplit(":", 1)[-1].isdigit()
        else (host.lower(), "", "")
    )
    return f"{name.strip('[]')}:{port or DEFAULT_PORTS.get(scheme, 80)}"


def foreign_origin(scope, allowed_origins=()) -> str | None:
    """Why this request comes from another site's page (None: it does not, or it is allowed).

    allowed_origins: origins the operator allowed (`--allowed-origin`, CORS): their pages count
    as clients of their own and are judged by their credentials."""
    origin = _header(scope, b"origin")
    if origin and origin.rstrip("/") in {o.rstrip("/") for o in allowed_origins}:
        return None
    site = (_header(scope, b"sec-fetch-site") or "").lower()
    if site in FOREIGN_FETCH_SITES:
        return f"sent by a page of another site (Sec-Fetch-Site: {site})"
    if site in ("same-origin", "none") or not origin:
        return None
    if origin == "null":
        return "sent by a page without an origin (sandboxed or local file)"
    host = _header(scope, b"host") or ""
    mine = _host_authority(host, scope.get("scheme", "http"))
    if _origin_authority(origin) != mine:
        return f"sent by a page of another origin ({origin[:80]})"
    return None
