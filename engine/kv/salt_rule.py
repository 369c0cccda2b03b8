"""The one rule for the prefix-cache salt of every request, whichever path submits it (#29.2).

Why one place: the salt is what keeps one user's text from being confirmed by another through
prefix-cache hits (`cached_tokens`, "N/M prompt tokens from cache", `/metrics` hit counters).
A path that forgets it reopens the oracle for everything it caches: beam search once did
(`cache_salt=None`), and an API key holder could confirm alice's beam-searched text. So every
path (a chat turn, n > 1, beam search, regenerate / continue, the /v1 API, the demo users) asks
`principal_salt` who it acts for, and `prompt_salt` turns that into the request's salt:

- without --auth there is one local user: chats and the API share the cache (salt None);
- under --auth each login is its own principal (`user:NAME`) and API callers are another
  (`api:NAME`, one name per key holder when keys are named, else `default`);
- the demo load's simulated users are always their own principal (`demo`), so their synthetic
  chats never mix with a real user's beyond the system prompt;
- in every case the leading system messages stay unsalted (`SharedPrefixSalt`), so a system
  prompt is stored once for everyone. Pins hold only such system prefixes, which is why
  `engine/front/pin_api.py` pins them unsalted: the same hashes this rule gives those blocks.
"""

from __future__ import annotations

from engine.kv.prefix_salt import SharedPrefixSalt
from engine.text.session_prompt import shared_system_tokens

KINDS = ("user", "api", "demo")


def principal_salt(kind: str, name: str = "", *, multi_user: bool) -> str | None:
    """The salt of one principal. multi_user: the server has logins (--auth)."""
    if kind not in KINDS:
        raise ValueError(f"unknown principal kind {kind!r} (expected one of {', '.join(KINDS)})")
    if kind == "demo":
        return "demo"
    if not multi_user:
        return None  # the one local user: chats and the API share the cache
    return f"{kind}:{name or 'default'}"


def prompt_salt(
    tokenizer, messages: list[dict] | None, ids: list[int], salt
) -> SharedPrefixSalt | None:
    """The salt a request with prompt `ids` is hashed under: `salt` (from `principal_salt`) for
    everything after the leading system messages of `messages`; those stay shared. No messages
    (a raw completion prompt): nothing is spared."""
    if salt is None:
        return None
    if isinstance(salt, SharedPrefixSalt):
        return salt
    shared = shared_system_tokens(tokenizer, messages, ids) if messages else 0
    return SharedPrefixSalt(str(salt), shared)
