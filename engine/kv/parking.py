"""Parked sessions: the blocks a chat holds between two turns, under its owner id.

Why an owner of its own: parking is a table of its own (owner id -> the finished turn's tokens,
block tables per KV cache group, salt and chain hashes), with its own order (least recently
parked first: the first to give its blocks back under memory pressure) and its own operations
(park, release, adopt). The KV manager hands a finished sequence over (`KVCacheManager.park`),
adopts an entry when that owner's next turn is admitted, and asks for victims when the pool is
short; the engine releases and lists entries here directly (engine/core/llm_engine.py). Which
chat sessions exist and their life cycle belong to the session table (engine/core/sessions.py),
which hands its session id to the engine as the owner id.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterator

from engine.kv.group_table import GroupTable


class Parked:
    """A finished turn's KV kept for its owner: its computed tokens, one table per KV cache
    group, the salt it was hashed under and the chain hashes of its full blocks. `session_id`
    names the owner id as the session table hands it over."""

    __slots__ = ("session_id", "tokens", "tables", "salt", "hashes")

    def __init__(
        self, session_id, tokens: list[int], tables: list[GroupTable], salt, hashes: list[int]
    ):
        self.session_id, self.tokens, self.tables = session_id, tokens, tables
        self.salt, self.hashes = salt, hashes

    def blocks(self):
        """Every live block of every group (each table tail first, group 0 last)."""
        for t in reversed(self.tables):
            yield from reversed(t.blocks)


class ParkedSessions:
    """owner id -> Parked, least recently parked first. `release_tables` gives a table list's
    blocks back to the pool (the manager's one release path, which also drops copy-on-write
    copies into blocks nobody holds any more)."""

    def __init__(self, release_tables: Callable[[list[GroupTable]], None]):
        self._d: OrderedDict = OrderedDict()
        self._release_tables = release_tables

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, owner) -> bool:
        return owner in self._d

    def __iter__(self) -> Iterator[Parked]:
        """The entries, least recently parked first."""
        return iter(list(self._d.values()))

    def owners(self) -> list:
        """Owner ids with parked blocks, least recently parked first."""
        return list(self._d)

    def get(self, owner) -> Parked | None:
        return self._d.get(owner) if owner is not None else None

    def put(self, entry: Parked) -> None:
        """Park `entry` under its owner, releasing what that owner had parked before."""
        self.release(entry.session_id)
        self._d[entry.session_id] = entry

    def take(self, owner) -> Parked:
        """Remove the entry without releasing its blocks: their references move to the caller
        (the owner's next turn adopts them)."""
        return self._d.pop(owner)

    def release(self, owner) -> bool:
        """Give the blocks parked under `owner` back to the pool; False if it has none."""
        entry = self._d.pop(owner, None)
        if entry is None:
            return False
        self._release_tables(entry.tables)
        return True
