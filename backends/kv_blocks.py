"""`ReplicaBlocks`: what one engine's KV-event stream says its prefix cache holds, block by block.

Kept per block: the hash and its parent (the prefix tree), the tokens it covers, the medium (GPU /
CPU / disk tier), the salt or other extra hash keys, the layer group and its kind, first-seen /
last-seen, and how often the engine reported it reused. Per prefix tree (a root block and all that
hangs under it): the first token ids, so the page can name a system prompt by its first words.

Why columns and not one object per block: a replica with 10^6 cached blocks must fit in a few
hundred MB (docs/BENCHMARKS.md has the measurement). A dict maps each block's key to a slot; the
fields live in numpy columns indexed by slot, and freed slots are reused. The cross-replica
arithmetic (which blocks several replicas hold) then runs on whole columns at once.

What the events cannot say, so nor can this model: how many requests use a block now (refcounts
are not published), which request's block table points where, and the blocks that are allocated
but not yet full (only full blocks are hashed and announced).
"""

from __future__ import annotations

import time
from array import array

import numpy as np

from backends.kv_events import Cleared, Removed, Stored, Unknown

LABEL_TOKENS = 48  # token ids kept per prefix tree, for its label (not per block)
MASK64 = (1 << 64) - 1
NO_PARENT, LOST_PARENT = -1, -2

_COLUMNS = {
    "gen": np.int32,
    "parent": np.int32,
    "parent_gen": np.int32,
    "root": np.int32,
    "depth": np.int32,
    "children": np.int32,
    "tokens": np.int16,
    "medium": np.int8,
    "group": np.int16,
    "kind": np.int8,
    "salt": np.int32,
    "first": np.float32,
    "last": np.float32,
    "reused": np.int32,
    "h64": np.uint64,
}


def h64(h) -> int:
    """A block hash as 64 bits: vLLM's int hashes already are; bytes hashes (sha256) keep their
    last 8 bytes, as vLLM itself does when it converts them."""
    if isinstance(h, int):
        return h & MASK64
    return int.from_bytes(h[-8:], "big")


class _Interned:
    """Small string/tuple tables (media, kinds, salts): code <-> value, codes never reused."""

    def __init__(self, first=None):
        self.values: list = [first]
        self.codes: dict = {first: 0}

    def code(self, v) -> int:
        c = self.codes.get(v)
        if c is None:
            c = self.codes[v] = len(self.values)
            self.values.append(v)
        return c


class Root:
    """One prefix tree: its first block's hash, its first token ids, and how many blocks it has."""

    __slots__ = ("key", "h64", "tokens", "blocks", "lost_parent", "salt")

    def __init__(self, key, hval: int, tokens, lost_parent: bool, salt: int):
        self.key, self.h64, self.blocks = key, hval, 0
        self.tokens = array("i", tokens[:LABEL_TOKENS]) if tokens else None
        self.lost_parent, self.salt = lost_parent, salt


class ReplicaBlocks:
    """Apply decoded events (backends/kv_events.py) in order; read columns and counters."""

    def __init__(self, max_blocks: int = 4_000_000, capacity: int = 1024, clock=time.time):
        self.max_blocks, self.clock, self.epoch = max_blocks, clock, clock()
        self.cols = {k: np.zeros(capacity, dtype=t) for k, t in _COLUMNS.items()}
        self.slot: dict = {}  # block key -> slot
        self.free: list[int] = list(range(capacity - 1, -1, -1))
        self.roots: dict[int, Root] = {}  # root id -> Root
        self.root_of_key: dict = {}  # a root's key -> root id
        self.root_by_h64: dict[int, int] = {}  # its hash (64 bits) -> root id
        self._next_root = 0
        self.media, self.kinds, self.salts = _Interned(), _Interned(), _Interned(())
        self.block_size: int | None = None
        self.counts = {
            "stored": 0,
            "removed": 0,
            "cleared": 0,
            "unknown": 0,
            "reused": 0,
            "removed_unknown": 0,
            "dropped_over_limit": 0,
        }
        self.unknown_kinds: dict[str, int] = {}

    # ---- keys and slots ------------------------------------------------------------------------
    def key(self, h, medium: int, group: int | None):
        """Same hash in another medium or layer group is another block (vLLM removes them apart)."""
        if not medium and not group:
            return h
        if isinstance(h, int):
            return h | (medium << 64) | ((group or 0) << 72)
        return h + bytes((medium, (group or 0) & 0xFF))

    def _grow(self) -> None:
        n = len(self.cols["gen"])
        for k, col in self.cols.items():
            new = np.zeros(2 * n, dtype=col.dtype)
            new[:n] = col
            self.cols[k] = new
        self.free.extend(range(2 * n - 1, n - 1, -1))

    def __len__(self) -> int:
        return len(self.slot)

    # ---- applying events -----------------------------------------------------------------------
    def apply(self, ev) -> None:
        if isinstance(ev, Stored):
            self._stored(ev)
        elif isinstance(ev, Removed):
            self._removed(ev)
        elif isinstance(ev, Cleared):
            self.clear()
            self.counts["cleared"] += 1
        elif isinstance(ev, Unknown):
            self.counts["unknown"] += 1
            if len(self.unknown_kinds) < 32 or ev.kind in self.unknown_kinds:
                self.unknown_kinds[ev.kind] = self.unknown_kinds.get(ev.kind, 0) + 1

    def _stored(self, ev: Stored) -> None:
        now = np.float32(self.clock() - self.epoch)
        c = self.cols
        medium, group = self.media.code(ev.medium), ev.group
        kind = self.kinds.code(ev.kind)
        self.block_size = ev.block_size
        n = len(ev.hashes)
        per = len(ev.token_ids) // n if n and len(ev.token_ids) >= n else ev.block_size
        parent_key = None if ev.parent is None else self.key(ev.parent, medium, group)
        for i, h in enumerate(ev.hashes):
            k = self.key(h, medium, group)
            s = self.slot.get(k)
            extra = ev.extra_keys[i] if ev.extra_keys and i < len(ev.extra_keys) else None
            if s is not None:  # reported again: reused from the cache
                c["last"][s] = now
                c["reused"][s] += 1
                self.counts["reused"] += 1
                parent_key = k
                continue
            if len(self.slot) >= self.max_blocks:
                self.counts["dropped_over_limit"] += n - i
                return
            if not self.free:
                self._grow()
                c = self.cols
            s = self.free.pop()
            self.slot[k] = s
            c["gen"][s] = abs(int(c["gen"][s])) + 1  # > 0 while live; a new value per reuse
            p = self.slot.get(parent_key) if parent_key is not None else None
            salt = self.salts.code(tuple(_plain(x) for x in extra)) if extra else 0
            if p is not None:
                c["parent"][s], c["parent_gen"][s] = p, c["gen"][p]
                c["root"][s], c["depth"][s] = c["root"][p], c["depth"][p] + 1
                c["children"][p] += 1
                salt = salt or int(c["salt"][p])  # a salt covers the blocks after it
            else:
                lost = parent_key is not None  # its parent was never seen (or is gone)
                c["parent"][s], c["parent_gen"][s] = (LOST_PARENT if lost else NO_PARENT), 0
                c["root"][s] = self._root(
                    parent_key if lost else k,
                    h if not lost else ev.parent,
                    None if lost else ev.token_ids[i * per : (i + 1) * per],
                    lost,
                    salt,
                )
                c["depth"][s] = 0
            self.roots[int(c["root"][s])].blocks += 1
            c["children"][s], c["tokens"][s] = 0, min(per, 32767)
            c["medium"][s], c["group"][s], c["kind"][s] = medium, group or 0, kind
            c["salt"][s], c["first"][s], c["last"][s], c["reused"][s] = salt, now, now, 0
            c["h64"][s] = h64(h)
            self.counts["stored"] += 1
            parent_key = k

    def _root(self, key, h, tokens, lost: bool, salt: int) -> int:
        r = self.root_of_key.get(key)
        if r is None:
            r = self.root_of_key[key] = self._next_root
            self._next_root += 1
            self.roots[r] = Root(key, h64(h), tokens, lost, salt)
            self.root_by_h64[self.roots[r].h64] = r
        return r

    def _removed(self, ev: Removed) -> None:
        medium = self.media.code(ev.medium)
        c = self.cols
        for h in ev.hashes:
            s = self.slot.pop(self.key(h, medium, ev.group), None)
            if s is None:
                self.counts["removed_unknown"] += 1  # stored before we listened
                continue
            p = int(c["parent"][s])
            if p >= 0 and c["gen"][p] == c["parent_gen"][s]:
                c["children"][p] -= 1
            r = int(c["root"][s])
            root = self.roots[r]
            root.blocks -= 1
            if root.blocks <= 0:
                del self.roots[r]
                self.root_of_key.pop(root.key, None)
                if self.root_by_h64.get(root.h64) == r:
                    del self.root_by_h64[root.h64]
            c["gen"][s] = -c["gen"][s]  # free: a child's parent_gen no longer matches it
            self.free.append(s)
            self.counts["removed"] += 1

    def clear(self) -> None:
        g = self.cols["gen"]
        np.negative(np.abs(g), out=g)
        self.slot.clear()
        self.roots.clear()
        self.root_of_key.clear()
        self.root_by_h64.clear()
        n = len(self.cols["gen"])
        self.free = list(range(n - 1, -1, -1))

    # ---- reading -------------------------------------------------------------------------------
    def live_slots(self) -> np.ndarray:
        return np.fromiter(self.slot.values(), dtype=np.int64, count=len(self.slot))

    def nbytes(self) -> int:
        """Numpy columns only (the key map is Python objects; docs/BENCHMARKS.md measures both)."""
        return sum(col.nbytes for col in self.cols.values())


def _plain(x):
    """An extra key as something hashable (msgpack gives lists for tuples)."""
    return tuple(_plain(y) for y in x) if isinstance(x, list) else x
