"""The prefix cache's chained block hash, and the one walk over a token list's full blocks.

Why one file: a block is found in the cache (the manager's prefix lookups, the tier's loads, the
pins) by the hash of its tokens chained on its parent's hash and its salt. Three hand-written
copies of that walk could drift (one forgot the per-block salt rule once); every caller now asks
`walk_blocks` and verifies what it finds against the block's stored tokens, parent and salt, so a
hash collision is never a hit.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Iterator, NamedTuple

from engine.kv.prefix_salt import block_salt


def hash_block_tokens(parent_hash, token_ids: tuple, salt) -> int:
    """Chain hash of one full block (64 bits of blake2b over parent hash, token ids and the salt's
    repr). Stable across processes (Python's hash() of a str salt is not), so the KV tier can key
    its files by it and find them after a restart. Module level so tests can force collisions."""
    h = hashlib.blake2b(
        b"" if parent_hash is None else parent_hash.to_bytes(8, "little", signed=False),
        digest_size=8,
    )
    h.update(array("q", token_ids).tobytes())
    h.update(repr(salt).encode())
    return int.from_bytes(h.digest(), "little")


def group_key(chain_hash: int | None, group: int) -> int | None:
    """The prefix-cache key of a block of KV cache group `group` whose token chain hash is
    `chain_hash` (None: the parent of the first block). Group 0 keys are the chain hashes
    themselves, so a model with one group hashes exactly as before groups existed (and the KV
    tier's files stay valid); another group's key is a 64-bit blake2b of (group, chain hash), and
    its first block's parent is a per-group seed. Why derived keys, not one chain per group: a
    sliding-window group's hit needs only the blocks of the last window, and their keys come
    from the one token chain without hashing the whole prompt again per group."""
    if group == 0:
        return chain_hash
    h = hashlib.blake2b(b"kv-group", digest_size=8)
    h.update(group.to_bytes(2, "little"))
    h.update(b"root" if chain_hash is None else chain_hash.to_bytes(8, "little", signed=False))
    return int.from_bytes(h.digest(), "little")


def state_key(chain_hash: int) -> int:
    """The KV tier's key of the linear-attention state after the block whose chain hash is
    `chain_hash` (engine/kv/tier/state_entries.py): derived like a group key, under its own marker, so a
    state entry never collides with a block of any group and is found from the same chain."""
    h = hashlib.blake2b(b"lin-state", digest_size=8)
    h.update(chain_hash.to_bytes(8, "little", signed=False))
    return int.from_bytes(h.digest(), "little")


class ChainBlock(NamedTuple):
    index: int  # block number in the sequence
    tokens: tuple  # its block_size token ids
    salt: object  # the salt it is hashed with (`block_salt`: None inside a shared prefix)
    hash: int  # hash_block_tokens(parent, tokens, salt)
    parent: int | None  # the previous block's hash (None for the first)


def walk_blocks(
    token_ids,
    salt,
    block_size: int,
    *,
    start: int = 0,
    stop: int | None = None,
    parent: int | None = None,
) -> Iterator[ChainBlock]:
    """The full blocks `start` .. `stop` - 1 of `token_ids` (default: every full block), each with
    its chained hash; `parent` is the hash of block `start - 1`. Lazy: a caller that misses stops
    the walk and pays for no more hashing."""
    end = len(token_ids) // block_size if stop is None else stop
    for i in range(start, end):
        toks = tuple(token_ids[i * block_size : (i + 1) * block_size])
        bsalt = block_salt(salt, i, block_size)
        h = hash_block_tokens(parent, toks, bsalt)
        yield ChainBlock(i, toks, bsalt, h, parent)
        parent = h
