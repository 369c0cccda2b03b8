"""Growing and giving back one holder's tables over KV cache groups: the mechanics under the KV
manager (engine/kv/kv_cache_manager.py builds the sequence life cycle on them).

Why a file of its own: capacity (how many blocks a step needs in every group, counting what the
same step's window gives back, and which parked sessions to release for it) and growth (window
release, copy-on-write of a shared partial block, fresh blocks, hashing full blocks under each
group's key) are one rule each, used by admission, growth and adoption alike. Nothing here is
public: `TableGrowth` is the manager's base, and its state (pool, layout, parked sessions, the
pending copies) is the manager's.

Order inside a step (`_grow`): hash what became full, release every group's out-of-window blocks,
and only then copy or allocate, so the blocks the capacity check counted as free are free before
the first one is popped.
"""
from __future__ import annotations

from engine.kv.block_hash import ChainBlock, group_key, walk_blocks
from engine.kv.block_pool import Block, BlockPool
from engine.kv.cache_spec import KVCacheLayout
from engine.kv.group_table import GroupTable
from engine.kv.parking import ParkedSessions
from engine.kv.prefix_salt import SharedPrefixSalt


class TableGrowth:
    pool: BlockPool
    layout: KVCacheLayout
    parked: ParkedSessions
    enable_prefix_caching: bool
    _bs: int
    _pending: list
    _shortfall: tuple
    window_released_blocks: list
    states: object              # engine/kv/state_groups.StateGroups of a linear-attention model, or None

    # ---- capacity -----------------------------------------------------------------------
    def _needed(self, tables: list[GroupTable], nc: int, n: int) -> tuple[int, list[Block]]:
        """(blocks to pop so tokens [nc, nc+n) have slots in every group, CoW included; the
        blocks the window releases when that step is scheduled, which may free some)."""
        if n <= 0:
            return 0, []
        bs, need, dying = self._bs, 0, []
        for spec, t in zip(self.layout.groups, tables):
            need += -(-(nc + n) // bs) - len(t)
            if nc % bs and t[-1].ref_count >= 2:
                need += 1
            if spec.sliding_window is not None:
                dying += t.blocks[:spec.first_live_block(nc, bs) - t.released]
        return need, dying

    def _make_room(self, need: int, reserved=(), keep=None, dropping=()) -> bool:
        """Ensure `need` blocks can be popped without evicting `reserved` (about to be revived),
        counting `dropping` (blocks about to lose one ref); release parked blocks LRU (never
        `keep`) only if required and only when that suffices. False (and no state change) when
        even that is not enough; `_shortfall` then says (needed, available)."""
        pool = self.pool
        avail = pool.num_free - sum(1 for b in reserved if b.ref_count == 0)
        avail += sum(1 for b in dropping if b.ref_count == 1)
        if need <= avail:
            return True
        reserved, drops, victims = set(reserved), dict.fromkeys(dropping, 1), []
        for sess in self.parked:
            if sess.session_id == keep:
                continue
            victims.append(sess.session_id)
            for b in sess.blocks():
                k = drops[b] = drops.get(b, 0) + 1
                if k == b.ref_count and b not in reserved:
                    avail += 1
            if avail >= need:
                break
        if avail < need:
            self._shortfall = (need, avail)
            return False
        for sid in victims:
            self.parked.release(sid)
        return True

    # ---- growing the tables -------------------------------------------------------------
    def _grow(self, seq, n: int) -> None:
        """Give tokens [num_computed, num_computed+n) slots in every group, after releasing what
        the window no longer shows the step's first query; capacity already checked."""
        if n <= 0:
            return
        states = self.states        # state groups (engine/kv/state_groups.py), or None
        if states is not None:      # the step writes the state: a shared slot is copied first
            states.writable(seq.tables)
        self._hash_full(seq)        # blocks an accepted draft completed: hashed before release
        pool, bs = self.pool, self._bs
        nc, end = seq.num_computed, seq.num_computed + n
        for g, (spec, t) in enumerate(zip(self.layout.groups, seq.tables)):
            if spec.sliding_window is not None:     # every group's release before any allocation
                dead = t.release_front(spec.first_live_block(nc, bs))
                if dead:
                    self._free_blocks(dead[::-1])
                    self.window_released_blocks[g] += len(dead)
        for g, t in enumerate(seq.tables):
            if nc % bs:
                last = t[-1]
                if last.ref_count >= 2:                     # shared partial block: copy-on-write
                    new = pool.get_new_blocks(1, g)[0]
                    self._pending.append((last.block_id, new.block_id))
                    pool.free_blocks((last,))
                    pool.set_filled(new, nc % bs)
                    t.replace_last(new)
                elif last.block_hash is not None:           # adopted full block, tail overwritten
                    pool.drop_hash(last)
            extra = -(-end // bs) - len(t)
            if extra > 0:
                t.extend(pool.get_new_blocks(extra, g))
            last_i = (end - 1) // bs
            for i in range(nc // bs, last_i):
                if t[i].filled != bs:
                    pool.set_filled(t[i], bs)
            pool.set_filled(t[last_i], end - last_i * bs)
        seq.num_computed = end
        self._hash_full(seq)
        if states is not None:      # a wanted state checkpoint at `end` is taken after this step
            states.reached(seq.tables, end, seq.hashes)

    def _register(self, b: Block, group: int, c: ChainBlock, seq) -> None:
        if self.pool.register(b, group_key(c.hash, group), c.tokens, group_key(c.parent, group), c.salt) \
                and seq.owner is not None and not (c.salt is None and isinstance(seq.salt, SharedPrefixSalt)):
            b.owner = seq.owner             # the chat's own block (not the shared system prompt)

    def _hash_full(self, seq) -> None:
        """Hash the blocks that are full within num_computed (and the token list); register
        each group's live block under its group's key."""
        if not self.enable_prefix_caching:
            return
        bs, hashes, toks = self._bs, seq.hashes, seq.tokens
        full = min(seq.num_computed, len(toks)) // bs
        for c in walk_blocks(toks, seq.salt, bs, start=len(hashes), stop=full,
                             parent=hashes[-1] if hashes else None):
            hashes.append(c.hash)
            for g, t in enumerate(seq.tables):
                if c.index >= t.released:
                    self._register(t[c.index], g, c, seq)

    def _free_blocks(self, blocks: list[Block]) -> None:
        """Drop one reference each (in eviction order) and the copies into blocks now free."""
        self.pool.free_blocks(blocks)
        if self._pending:       # a copy into a block nobody holds any more must not run
            self._pending = [(s, d) for s, d in self._pending if self.pool.blocks[d].ref_count > 0]

    def _release_tables(self, tables: list[GroupTable]) -> None:
        """Tail first, group 0 last: the private tail is evicted before the (likely shared) head.
        The tables' state slot (a model with linear-attention layers) goes with them."""
        self._free_blocks([b for t in reversed(tables) for b in reversed(t.blocks)])
        if self.states is not None:
            self.states.release(tables)
