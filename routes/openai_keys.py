"""Who may call /v1: API keys, the local-only default, and cross-origin (CORS) policy.

- Keys given (`--api-key`, repeatable, or the PAGED_CHAT_API_KEYS environment variable, comma
  separated): every request needs `Authorization: Bearer <key>`, else 401.
- No key and no login (`--auth`): like the UI, the server is meant for this machine (the default
  bind is 127.0.0.1; app.py warns when it binds elsewhere) and the API is open.
- `--auth` (the UI needs a login) but no key: the API refuses everything with 401, because a
  browser login cannot be sent by API clients and an open API would bypass it.
- CORS: no `Access-Control-Allow-*` headers (so browsers block other origins' pages) unless
  `--allowed-origin` names the origin.
Keys are compared in constant time so a wrong key's timing says nothing about the right one.
"""
from __future__ import annotations

import hmac
import os
import re

from engine.core.tenancy import KEYLESS_API_TENANT as KEYLESS_TENANT
from routes.openai_errors import APIError

ENV_KEYS = "PAGED_CHAT_API_KEYS"


def keys_from_env(environ=None) -> list[str]:
    raw = (environ if environ is not None else os.environ).get(ENV_KEYS, "")
    return [k.strip() for k in raw.split(",") if k.strip()]


_KEY_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,40}")


def split_named_key(value: str, index: int) -> tuple[str, str]:
    """`--api-key name:key` -> (name, key); a plain key is named "api-key-<index>" (1-based), so
    the scheduler and /metrics never see the secret itself."""
    name, sep, key = value.partition(":")
    if sep and key and _KEY_NAME.fullmatch(name):
        return name, key
    return f"api-key-{index}", value


class ApiAccess:
    def __init__(self, api_keys: list[str] | None = None, *, require_key: bool = False):
        named = [split_named_key(k, i + 1) for i, k in enumerate(k for k in (api_keys or []) if k)]
        self.keys = [k for _, k in named]
        self.key_names = [n for n, _ in named]          # the tenant of each key (engine/core/fairness.py)
        self.require_key = require_key or bool(self.keys)

    def tenant_of(self, headers) -> str:
        """Who is calling, for fair scheduling: the matching key's name; "api" when no key is needed.
        Call after check() passed."""
        if not self.keys:
            return KEYLESS_TENANT
        token = headers.get("authorization", "").partition(" ")[2].strip()
        found = KEYLESS_TENANT
        for name, k in zip(self.key_names, self.keys):   # no early exit, as in check()
            if hmac.compare_digest(token.encode(), k.encode()):
                found = name
        return found

    def check(self, headers) -> None:
        """headers: any mapping with case-insensitive .get (Starlette's Headers). Raises APIError(401)."""
        if not self.require_key:
            return
        if not self.keys:
            raise APIError(401, "this server requires an API key, but none is configured: start it with "
                                "--api-key KEY (or set PAGED_CHAT_API_KEYS)", code="invalid_api_key")
        header = headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        ok = False
        for k in self.keys:                       # no early exit: constant work per request
            ok |= hmac.compare_digest(token.encode(), k.encode())
        if not ok:
            raise APIError(401, "incorrect API key provided", code="invalid_api_key")


def add_cors(app, allowed_origins: list[str] | None) -> None:
    """Allow the named origins only; with none, no CORS middleware at all (same-origin only)."""
    origins = [o.rstrip("/") for o in (allowed_origins or []) if o]
    if not origins:
        return
    from fastapi.middleware.cors import CORSMiddleware
    app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST", "OPTIONS"],
                       allow_headers=["Authorization", "Content-Type"], allow_credentials=False)
