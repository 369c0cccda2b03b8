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

Priority is the operator's (issue 48.1): each key has a class, `--api-priority` for all or
`NAME:KEY:PRIORITY` for one; a call's own `priority` field may only lower it (a larger number),
never rise above it, so a key holder cannot claim to go before the chat users.
"""

from __future__ import annotations

import hmac
import os
import re

from engine.core.tenancy import KEYLESS_API_TENANT as KEYLESS_TENANT
from routes.openai.errors import APIError

ENV_KEYS = "PAGED_CHAT_API_KEYS"


def keys_from_env(environ=None) -> list[str]:
    raw = (environ if environ is not None else os.environ).get(ENV_KEYS, "")
    return [k.strip() for k in raw.split(",") if k.strip()]


_KEY_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,40}")
_PRIORITY = re.compile(r"-?[0-9]{1,4}")
PRIORITY_RANGE = (-1000, 1000)  # vLLM's field, as routes/openai/schemas.py accepts it


def split_named_key(value: str, index: int) -> tuple[str, str]:
    """`--api-key name:key` -> (name, key); a plain key is named "api-key-<index>" (1-based), so
    the scheduler and /metrics never see the secret itself."""
    name, key, _ = parse_key(value, index)
    return name, key


def parse_key(value: str, index: int) -> tuple[str, str, int | None]:
    """`[NAME:]KEY` or `NAME:KEY:PRIORITY` -> (name, key, the key's class or None for the default).
    A PRIORITY is read only after a valid NAME and a non-empty KEY, as an integer in -1000..1000;
    a named key whose own text ends in ':<integer>' must therefore be given with its PRIORITY."""
    name, sep, rest = value.partition(":")
    if not (sep and rest and _KEY_NAME.fullmatch(name)):
        return f"api-key-{index}", value, None
    key, sep2, prio = rest.rpartition(":")
    if sep2 and key and _PRIORITY.fullmatch(prio):
        p = int(prio)
        if not PRIORITY_RANGE[0] <= p <= PRIORITY_RANGE[1]:
            raise ValueError(f"--api-key {name}:...: PRIORITY must be in -1000..1000, got {p}")
        return name, key, p
    return name, rest, None


def effective_priority(asked: int | None, operator_class: int) -> int:
    """The priority a call runs at: its own field may lower it (a larger number), never raise it
    above the class the operator gave its key (lower first, as vLLM's)."""
    return operator_class if asked is None else max(int(asked), operator_class)


class ApiAccess:
    def __init__(
        self,
        api_keys: list[str] | None = None,
        *,
        require_key: bool = False,
        default_priority: int = 1,
    ):
        named = [parse_key(k, i + 1) for i, k in enumerate(k for k in (api_keys or []) if k)]
        self.keys = [k for _, k, _ in named]
        self.key_names = [n for n, _, _ in named]  # each key's tenant (core/fairness.py)
        self.default_priority = int(default_priority)
        self.key_priority = {n: p for n, _, p in named if p is not None}
        self.require_key = require_key or bool(self.keys)

    def priority_class(self, tenant: str) -> int:
        """The operator's class for a caller: its key's own PRIORITY, else --api-priority."""
        return self.key_priority.get(tenant, self.default_priority)

    def tenant_of(self, headers) -> str:
        """Who is calling, for fair scheduling: the matching key's name; "api" when no key is needed.
        Call after check() passed."""
        if not self.keys:
            return KEYLESS_TENANT
        token = headers.get("authorization", "").partition(" ")[2].strip()
        found = KEYLESS_TENANT
        for name, k in zip(self.key_names, self.keys):  # no early exit, as in check()
            if hmac.compare_digest(token.encode(), k.encode()):
                found = name
        return found

    def check(self, headers) -> None:
        """headers: any mapping with case-insensitive .get (Starlette's Headers). Raises APIError(401)."""
        if not self.require_key:
            return
        if not self.keys:
            raise APIError(
                401,
                "this server requires an API key, but none is configured: start it with "
                "--api-key KEY (or set PAGED_CHAT_API_KEYS)",
                code="invalid_api_key",
            )
        header = headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise APIError(
                401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key"
            )
        ok = False
        for k in self.keys:  # no early exit: constant work per request
            ok |= hmac.compare_digest(token.encode(), k.encode())
        if not ok:
            raise APIError(401, "incorrect API key provided", code="invalid_api_key")


def add_cors(app, allowed_origins: list[str] | None) -> None:
    """Allow the named origins only; with none, no CORS middleware at all (same-origin only)."""
    origins = [o.rstrip("/") for o in (allowed_origins or []) if o]
    if not origins:
        return
    from fastapi.middleware.cors import CORSMiddleware

    app.add_middleware(
        CORSMiddleware,
        allow_origins=origins,
        allow_methods=["GET", "POST", "OPTIONS"],
        allow_headers=["Authorization", "Content-Type"],
        allow_credentials=False,
    )
