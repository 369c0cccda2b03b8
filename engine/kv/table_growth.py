"""Building, growing and giving back a sequence's tables over KV cache groups: the mechanics under
the KV manager (engine/kv/kv_cache_manager.py builds the sequence life cycle on them).

Why a file of its own: capacity (how many blocks a step needs in every group, counting what the
same step's window gives back, and which parked sessions to release for it), admission (the tables
a hit plan describes: revived pool blocks, blocks loaded from the tier, or a parked session's
tables adopted) and growth (window release, copy-on-write of a shared partial block, fresh blocks,
hashing full blocks under each group's key) are one rule each, used by every life-cycle call.
Nothing here is public: `TableGrowth` is the manager's base, and its state (pool, layout, parked
sessions, the pending copies, the counters) is the manager's.

Order inside a step (`_grow`): hash what became full, release every group's out-of-window blocks,
and only then copy or allocate, so the blocks the capacity check counted as free are free before
the first one is popped.

A model with linear-attention layers also holds a state slot per sequence
(engine/kv/state_groups.py, `states`): admission attaches or adopts it, `_grow` copies a shared
one before the step writes it and takes wanted checkpoints, `_release_tables` lets it go; the
room checks and chunk ends are the manager's StateHooks (engine/kv/state_hooks.py).
"""

from __future__ import annotations

from engine.errors import KVCacheError
from engine.kv.block_hash import ChainBlock, group_key, walk_blocks
from engine.kv.block_pool import Block, BlockPool
from engine.kv.cache_spec import KVCacheLayout
from engine.kv.group_table import GroupTable
from engine.kv.tier.store import owner_tag
from engine.kv.parking import ParkedSessions
from engine.kv.prefix_hit import HitPlan
from engine.kv.prefix_salt import SharedPrefixSalt


class SeqTables:
    """A running sequence as the manager holds it: its tables per group, computed count, salt,
    owner tag (for the tier) and the chain hashes of its full blocks."""

    __slots__ = (
        "seq_id",
        "tokens",
        "tables",
        "num_computed",
        "salt",
        "session_id",
        "hashes",
        "owner",
    )

    def __init__(self, seq_id, tokens, salt, session_id, tables, owner=None):
        self.seq_id, self.tokens, self.salt, self.session_id = seq_id, tokens, salt, session_id
        # the tier's tag of its private blocks
        self.owner = owner if owner is not None else owner_tag(session_id)
        self.tables: list[GroupTable] = tables
        self.num_computed = 0
        self.hashes: list[int] = []  # token chain hash of each full block already hashed


class TableGrowth:
    pool: BlockPool
    layout: KVCacheLayout
    parked: ParkedSessions
    enable_prefix_caching: bool
    _bs: int
    _pending: list
    _shortfall: tuple
    window_released_blocks: list
    _seqs: dict
    max_model_len: int
    tier_link: object
    prefix_cache_queries: int
    prefix_cache_hits: int
    states: object  # engine/kv/state_groups.StateGroups of a linear-attention model, or None

    def _check_len(self, seq_id, end: int) -> None:
        if end > self.max_model_len:
            raise KVCacheError(
                f"sequence {seq_id!r} would hold {end} tokens, "
                f"past max_model_len={self.max_model_len}"
            )

    def _room_for_hit(self, seq_id, plan: HitPlan, token_ids, num_new_tokens: int) -> bool:
        start = plan.num_blocks * self._bs
        n = max(0, min(num_new_tokens, len(token_ids) - start))
        self._check_len(seq_id, start + n)
        need = len(plan.loads) + len(self.layout.groups) * -(-n // self._bs)
        revived = [b for ps in plan.picks for b in ps if isinstance(b, Block)]
        return self._make_room(need, reserved=revived)

    def _admit(
        self, seq_id, token_ids, plan: HitPlan, datas: dict, num_new_tokens, salt, session_id
    ) -> int:
        """Mutate: revive the pool's blocks, fresh blocks for the loaded ones (their bytes copied
        in before any forward reads them), then the new tokens' slots."""
        bs, pool = self._bs, self.pool
        tables, loaded_blocks, loaded_datas = [], [], []
        seq = SeqTables(seq_id, token_ids, salt, session_id, tables)
        hits = [[b for b in picks if isinstance(b, Block)] for picks in plan.picks]
        for h in hits:  # every group's hits first: a fresh block never evicts one
            pool.touch(h)
        for g, (lo, picks) in enumerate(zip(plan.first, plan.picks)):
            fresh = iter(pool.get_new_blocks(len(picks) - len(hits[g]), g))
            row = []
            for i, x in enumerate(picks, lo):
                if isinstance(x, Block):
                    row.append(x)
                    continue
                b = next(fresh)
                pool.set_filled(b, bs)
                self._register(b, g, plan.chain[i], seq)
                loaded_blocks.append(b)
                loaded_datas.append(datas[x])
                row.append(b)
            tables.append(GroupTable(row, released=lo))
        seq.hashes = [c.hash for c in plan.chain]
        cached, start = plan.cached, plan.num_blocks * bs
        seq.num_computed = start
        self._seqs[seq_id] = seq
        if self.states is not None:
            # a fresh slot, or the checkpoint's state copied into one; keep one where the KV hit
            # ended and one at the prompt's last block boundary
            load = getattr(plan, "state_load", None)  # a state read from the KV tier
            self.states.attach(
                tables,
                getattr(plan, "state_restore", None),
                load=(load, datas[load.key]) if load is not None else None,
            )
            self.states.want_checkpoint(tables, getattr(plan, "kv_hit_blocks", 0) * bs)
            self.states.want_checkpoint(tables, len(token_ids) // bs * bs)
            num_new_tokens = self.chunk_end(seq_id, start, num_new_tokens)
        self.prefix_cache_queries += len(token_ids)
        self.prefix_cache_hits += start
        self._grow(seq, max(0, min(num_new_tokens, len(token_ids) - start)))
        if loaded_blocks:
            event = {
                "seq_id": seq_id,
                "session_id": session_id,
                "tokens_loaded": start - cached,
                "tokens_cached": cached,
                "tokens_computed": len(token_ids) - start,
            }
            self.tier_link.install(loaded_blocks, loaded_datas, event)
        return start

    def _adopt(self, seq_id, token_ids, plan: HitPlan, num_new_tokens, salt) -> int | None:
        """The owner's parked tables become the sequence's, cut to the common prefix (and, in a
        sliding group, to its window): ownership moves, no reference changes."""
        sess, c, bs = plan.session, plan.cached, self._bs
        n = max(0, min(num_new_tokens, len(token_ids) - c))
        self._check_len(seq_id, c + n)
        tables, dropping = [], []
        for spec, t in zip(self.layout.groups, sess.tables):
            nt = t.copy()
            tail = nt.truncate(-(-c // bs))
            dropping += tail[::-1] + nt.release_front(spec.first_live_block(c, bs))[::-1]
            tables.append(nt)
        need, _ = self._needed(tables, c, n)
        if not self._make_room(need, keep=sess.session_id, dropping=dropping):
            return None
        if self.states is not None:  # the parked slot shared with a fork: room for its copy
            self._state_room(int(self.states.needs_copy(sess.tables)), keep=sess.session_id)
        self.parked.take(sess.session_id)
        self._free_blocks(dropping)
        seq = SeqTables(seq_id, token_ids, salt, sess.session_id, tables)
        seq.hashes, seq.num_computed = sess.hashes[: c // bs], c
        if self.states is not None:  # the parked state is the next turn's
            self.states.adopt(sess.tables, tables)
            self.states.want_checkpoint(tables, len(token_ids) // bs * bs)
        if c % bs:
            for t in tables:
                last = t[-1]
                if last.ref_count == 1 and last.block_hash is None:
                    self.pool.set_filled(last, c % bs)  # the rest is stale
        self._seqs[seq_id] = seq
        self.prefix_cache_queries += len(token_ids)
        self.prefix_cache_hits += c
        self._grow(seq, self.chunk_end(seq_id, c, n))
        return c

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
                dying += t.blocks[: spec.first_live_block(nc, bs) - t.released]
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
        states = self.states  # state groups (engine/kv/state_groups.py), or None
        if states is not None:  # the step writes the state: a shared slot is copied first
            states.writable(seq.tables)
        self._hash_full(seq)  # blocks an accepted draft completed: hashed before release
        pool, bs = self.pool, self._bs
        nc, end = seq.num_computed, seq.num_computed + n
        for g, (spec, t) in enumerate(zip(self.layout.groups, seq.tables)):
            if spec.sliding_window is not None:  # every group's release before any allocation
                dead = t.release_front(spec.first_live_block(nc, bs))
                if dead:
                    self._free_blocks(dead[::-1])
                    self.window_released_blocks[g] += len(dead)
        for g, t in enumerate(seq.tables):
            if nc % bs:
                last = t[-1]
                if last.ref_count >= 2:  # shared partial block: copy-on-write
                    new = pool.get_new_blocks(1, g)[0]
                    self._pending.append((last.block_id, new.block_id))
                    pool.free_blocks((last,))
                    pool.set_filled(new, nc % bs)
                    t.replace_last(new)
                elif last.block_hash is not None:  # adopted full block, tail overwritten
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
        if states is not None:  # a wanted state checkpoint at `end` is taken after this step
            states.reached(seq, end)

    def _register(self, b: Block, group: int, c: ChainBlock, seq) -> None:
        key, parent = group_key(c.hash, group), group_key(c.parent, group)
        shared = c.salt is None and isinstance(seq.salt, SharedPrefixSalt)  # the system prompt
        if (
            self.pool.register(b, key, c.tokens, parent, c.salt)
            and seq.owner is not None
            and not shared
        ):
            b.owner = seq.owner  # the chat's own block (not the shared system prompt)

    def _hash_full(self, seq) -> None:
        """Hash the blocks that are full within num_computed (and the token list); register
        each group's live block under its group's key."""
        if not self.enable_prefix_caching:
            return
        bs, hashes, toks = self._bs, seq.hashes, seq.tokens
        full = min(seq.num_computed, len(toks)) // bs
        for c in walk_blocks(
            toks, seq.salt, bs, start=len(hashes), stop=full, parent=hashes[-1] if hashes else None
        ):
            hashes.append(c.hash)
            for g, t in enumerate(seq.tables):
                if c.index >= t.released:
                    self._register(t[c.index], g, c, seq)

    def _free_blocks(self, blocks: list[Block]) -> None:
        """Drop one reference each (in eviction order) and the copies into blocks now free."""
        self.pool.free_blocks(blocks)
        if self._pending:  # a copy into a block nobody holds any more must not run
            self._pending = [(s, d) for s, d in self._pending if self.pool.blocks[d].ref_count > 0]

    def _release_tables(self, tables: list[GroupTable]) -> None:
        """Tail first, group 0 last: the private tail is evicted before the (likely shared) head.
        The tables' state slot (a model with linear-attention layers) goes with them."""
        self._free_blocks([b for t in reversed(tables) for b in reversed(t.blocks)])
        if self.states is not None:
            self.states.release(tables)
