"""Cache salts for the prefix cache: which blocks of a prompt are hashed with which salt.

Why a module of its own: the salt rule (what is shared between users, what is private) is a
security decision (issue 12, the prefix-cache oracle) that readers should find without reading
the whole KV manager. The manager hashes each full block with `block_salt(...)` of its sequence's
salt; everything here is pure.
"""

from __future__ import annotations

from typing import NamedTuple


class SharedPrefixSalt(NamedTuple):
    """A cache salt that spares the first `shared_tokens` tokens (e.g. the shared system prompt).

    Why: a salt per user stops one user from probing another's text through prefix-cache hits,
    but salting the system prompt too would give every user a private copy of it. Blocks that end
    within `shared_tokens` are hashed unsalted (shared by everyone); from the first block that
    holds a later token on, the chain is salted, so nothing after the system prompt is shared.
    """

    salt: str
    shared_tokens: int


def block_salt(salt, block_index: int, block_size: int):
    """The salt block `block_index` is hashed with under the sequence's `salt`."""
    if isinstance(salt, SharedPrefixSalt) and (block_index + 1) * block_size <= salt.shared_tokens:
        return None
    return salt
