"""Paged KV-cache memory manager: block tables, prefix cache, parked blocks and copy-on-write.

One engine thread calls it, so there are no locks. Every call that needs blocks checks capacity
first (releasing parked blocks, least recently parked first); when that is not enough the `try_`
calls return None / False with no state change (the scheduler then decides to preempt), and the
plain calls raise NoFreeBlocksError.

Owners, not sessions: between two turns a chat's blocks are parked under an owner id (`park`,
`release_parked`, `parked_owners`, `forget_owner`); which chat sessions exist, their ids and
their life cycle belong to the session table (engine/core/sessions.py), which hands its session
id to the engine as that owner id. The manager keeps no session state beyond the blocks it holds.

Sequences: add_sequence -> allocate_slots* -> free | preempt | park; fork for n > 1 sampling.
Runner: slot / slots_for / block_table / num_computed, take_pending_copies before each forward.
Reuse: full blocks are hashed as soon as their KV is scheduled (chain hash of parent hash, token
ids and cache_salt, verified on lookup); a parked session keeps its whole table, so the next
turn of a chat reuses it down to the token, partial last block included.
With enable_prefix_caching=False nothing is hashed or looked up and park simply frees.
Second tier (engine/kv/kv_tier.py, optional, `attach_tier`): an evicted cached block is written back
to it, a lookup that misses the pool continues the hash chain in it and loads those blocks into
fresh pool blocks, park / pin write their full blocks through (so they survive a restart), and
preempt swaps a sequence's full blocks out when that is cheaper than recomputing them
(engine/kv/kv_tier_policy.py decides). The manager decides which blocks move; the link
(engine/kv/tier_link.py) moves them and owns the tier's counters. Reads and capacity checks happen
before any state changes.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque

from engine.kv.block_hash import walk_blocks
from engine.kv.block_pool import Block, BlockPool
from engine.config import BLOCK_SIZES
from engine.errors import KVCacheError, NoFreeBlocksError
from engine.observe.kv_contract import KVSnapshot, KVStats
from engine.observe.kv_snapshot import take_snapshot
from engine.kv.pinning import DEFAULT_MAX_PIN_FRACTION, PinTable
from engine.kv.prefix_salt import SharedPrefixSalt
from engine.text.common_prefix import common_prefix
from engine.kv.kv_tier import KVTier, owner_tag
from engine.kv.kv_tier_policy import TierPolicy
from engine.kv.tier_link import TierLink

log = logging.getLogger("paged_chat.engine")


class _Seq:
    __slots__ = ("seq_id", "tokens", "table", "num_computed", "salt", "session_id", "hashes", "ids_cache",
                 "owner")

    def __init__(self, seq_id, tokens, salt, session_id, owner=None):
        self.seq_id, self.tokens, self.salt, self.session_id = seq_id, tokens, salt, session_id
        self.owner = owner if owner is not None else owner_tag(session_id)   # tier tag of private blocks
        self.table: list[Block] = []
        self.num_computed = 0
        self.hashes: list[int] = []     # chain hash of each full block already hashed
        self.ids_cache = None           # for snapshots, see engine/observe/kv_snapshot.table_ids


class _Parked:
    """Blocks held for an owner between two turns: a finished sequence's table and computed
    tokens (the owner id is the session table's session id; `session_id` names it that way)."""
    __slots__ = ("session_id", "tokens", "table", "salt", "hashes", "ids_cache")

    def __init__(self, session_id, tokens, table, salt, hashes, ids_cache=None):
        self.session_id, self.tokens, self.table = session_id, tokens, table
        self.salt, self.hashes, self.ids_cache = salt, hashes, ids_cache


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, *, max_model_len: int,
                 kv_bytes_per_token: int = 0, enable_prefix_caching: bool = True,
                 max_pin_fraction: float = DEFAULT_MAX_PIN_FRACTION):
        if block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {block_size}")
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.pool = BlockPool(num_blocks)
        self._bs = block_size
        self.max_model_len = max_model_len
        self.kv_bytes_per_token = kv_bytes_per_token
        self.enable_prefix_caching = enable_prefix_caching
        self._seqs: dict = {}
        self._parked: OrderedDict = OrderedDict()     # owner id -> _Parked, least recently parked first
        self._pending: list[tuple[int, int]] = []
        self._shortfall = (0, 0)                    # (needed, available) of the last allocation that failed
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_preemptions = 0
        self.peak_used_blocks = 0
        self.preemption_events: deque = deque(maxlen=50)
        self.pins = PinTable(self.pool, block_size, max_fraction=max_pin_fraction)
        self.tier_link: TierLink | None = None    # second tier, see attach_tier
        self.tokens_recomputed_after_preempt = 0  # tokens a preemption dropped (recompute)
        self.spec_rollbacks = 0                   # speculative steps that gave slots back (rollback)
        self.spec_rolled_back_slots = 0           # slots of rejected draft tokens given back

    # ---- second tier --------------------------------------------------------------------
    def attach_tier(self, tier: KVTier, io, policy: TierPolicy | None = None) -> TierLink:
        """Put `tier` behind the pool; returns the link that moves blocks to and from it.
        io: read(block_id) -> bytes, write(block_id, bytes)."""
        if not self.enable_prefix_caching:
            raise KVCacheError("a KV tier needs the prefix cache (its keys are the block hashes)")
        self.tier_link = TierLink(tier, io, self._bs, self.kv_bytes_per_token, policy)
        self.pool.on_evict = self.tier_link.write_back
        return self.tier_link

    @property
    def tier(self) -> KVTier | None:
        return self.tier_link.tier if self.tier_link is not None else None

    @property
    def tier_load_events(self):
        """The last admissions that loaded blocks from the tier (for snapshots)."""
        return self.tier_link.load_events if self.tier_link is not None else ()

    def write_through(self, blocks, reason: str = "park") -> int:
        """Write the hashed (full, computed) ones of `blocks` to the tier (a pin, a parked
        chat); returns how many are in the tier afterwards (0 without a tier)."""
        return self.tier_link.write_through(blocks, reason) if self.tier_link is not None else 0

    def new_step(self) -> None:
        """The engine starts a step: a fresh per-step budget of tier loads."""
        if self.tier_link is not None:
            self.tier_link.new_step()

    def forget_owner(self, owner) -> int:
        """The owner's conversation is deleted: free its parked blocks, drop the free cached blocks
        it registered as its own from the pool (no write-back) and delete its blocks from the
        tier. Returns the tier entries deleted."""
        self.release_parked(owner)
        tag = owner_tag(owner)
        for b in [b for b in self.pool.cached.values() if b.owner == tag]:
            if b.ref_count == 0:
                self.pool.forget_free(b)
            else:                       # still held by a fork of it: no longer its private block
                b.owner = None
        return self.tier_link.delete_owner(owner) if self.tier_link is not None else 0

    # ---- properties ---------------------------------------------------------------------
    block_size = property(lambda self: self._bs)
    num_blocks = property(lambda self: self.pool.num_blocks)
    num_free_blocks = property(lambda self: self.pool.num_free)
    num_used_blocks = property(lambda self: self.pool.num_used)

    def has_sequence(self, seq_id) -> bool: return seq_id in self._seqs

    def holders(self):
        """Read-only views of who holds blocks, for snapshots (engine/observe/kv_snapshot.py):
        the running sequences and the parked sessions (LRU first), each with `table`, `tokens`,
        `session_id` (and, running, `seq_id` and `num_computed`)."""
        return self._seqs.values(), self._parked.values()

    def parked_owners(self) -> list:
        """Owner ids with parked blocks, least recently parked first."""
        return list(self._parked)

    def _get(self, seq_id) -> _Seq:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise KVCacheError(f"unknown sequence {seq_id!r} (never added, or already freed)")
        return seq

    def _check_len(self, seq_id, end: int) -> None:
        if end > self.max_model_len:
            raise KVCacheError(f"sequence {seq_id!r} would hold {end} tokens, "
                               f"past max_model_len={self.max_model_len}")

    # ---- prefix lookup ------------------------------------------------------------------
    def _plan(self, token_ids, salt, session_id):
        """(cached tokens, blocks to reuse, parked blocks to adopt or None, identities of the
        blocks to load from the tier after those). Pure (reads the tier's index, no I/O)."""
        if not self.enable_prefix_caching or len(token_ids) < 2:
            return 0, [], None, []
        if not isinstance(token_ids, list):
            token_ids = list(token_ids)
        bs, cached = self._bs, self.pool.cached
        hits: list[Block] = []
        parent = None
        for c in walk_blocks(token_ids, salt, bs, stop=(len(token_ids) - 1) // bs):  # >= 1 token to compute
            b = cached.get(c.hash)
            if b is None or b.token_ids != c.tokens or b.parent_hash != c.parent or b.salt != c.salt:
                break                                   # miss, or a hash collision
            hits.append(b)
            parent = c.hash
        link = self.tier_link
        loads = link.plan_loads(token_ids, salt, len(hits), parent) if link is not None else []
        sess = self._parked.get(session_id) if session_id is not None else None
        if sess is not None and sess.salt == salt:
            common = common_prefix(sess.tokens, token_ids, len(token_ids) - 1)
            if common and common >= (len(hits) + len(loads)) * bs:
                return common, sess.table[:-(-common // bs)], sess, []
        return len(hits) * bs, hits, None, loads

    def lookup_prefix(self, token_ids, *, cache_salt=None, session_id=None) -> int:
        """Tokens whose KV add_sequence would reuse right now (no state change)."""
        cached, _, _, loads = self._plan(token_ids, cache_salt, session_id)
        return cached + len(loads) * self._bs

    # ---- capacity -----------------------------------------------------------------------
    def _needed(self, seq: _Seq, n: int) -> int:
        """Blocks to pop so tokens [num_computed, num_computed+n) have slots, CoW included."""
        if n <= 0:
            return 0
        nc = seq.num_computed
        need = -(-(nc + n) // self._bs) - len(seq.table)
        if nc % self._bs and seq.table[-1].ref_count >= 2:
            need += 1
        return need

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
        for sid, sess in self._parked.items():
            if sid == keep:
                continue
            victims.append(sid)
            for b in sess.table:
                k = drops[b] = drops.get(b, 0) + 1
                if k == b.ref_count and b not in reserved:
                    avail += 1
            if avail >= need:
                break
        if avail < need:
            self._shortfall = (need, avail)
            return False
        for sid in victims:
            self.release_parked(sid)
        return True

    # ---- growing a table ----------------------------------------------------------------
    def _grow(self, seq: _Seq, n: int) -> None:
        """Give tokens [num_computed, num_computed+n) slots; capacity already checked."""
        if n <= 0:
            return
        pool, bs, table = self.pool, self._bs, seq.table
        nc = seq.num_computed
        off = nc % bs
        if off:
            last = table[-1]
            if last.ref_count >= 2:                     # shared partial block: copy-on-write
                new = pool.get_new_blocks(1)[0]
                self._pending.append((last.block_id, new.block_id))
                pool.free_blocks((last,))
                pool.set_filled(new, off)
                table[-1] = new
            elif last.block_hash is not None:           # adopted full block, tail overwritten
                pool.drop_hash(last)
        end = nc + n
        extra = -(-end // bs) - len(table)
        if extra > 0:
            table.extend(pool.get_new_blocks(extra))
        last_i = (end - 1) // bs
        for i in range(nc // bs, last_i):
            if table[i].filled != bs:
                pool.set_filled(table[i], bs)
        pool.set_filled(table[last_i], end - last_i * bs)
        seq.num_computed = end
        self._hash_full(seq)
        self.peak_used_blocks = max(self.peak_used_blocks, pool.num_used)

    def _hash_full(self, seq: _Seq) -> None:
        """Hash and register blocks that are full within num_computed (and the token list)."""
        if not self.enable_prefix_caching:
            return
        bs, hashes, toks = self._bs, seq.hashes, seq.tokens
        full = min(seq.num_computed, len(toks)) // bs
        for c in walk_blocks(toks, seq.salt, bs, start=len(hashes), stop=full,
                             parent=hashes[-1] if hashes else None):
            hashes.append(c.hash)
            b = seq.table[c.index]
            if self.pool.register(b, c.hash, c.tokens, c.parent, c.salt) and seq.owner is not None and \
                    not (c.salt is None and isinstance(seq.salt, SharedPrefixSalt)):
                b.owner = seq.owner         # the chat's own block (not the shared system prompt)

    # ---- sequence lifecycle -------------------------------------------------------------
    def add_sequence(self, seq_id, token_ids, *, num_new_tokens, cache_salt=None,
                     session_id=None) -> int:
        """`try_add_sequence` for callers that treat no room as an error: NoFreeBlocksError."""
        cached = self.try_add_sequence(seq_id, token_ids, num_new_tokens=num_new_tokens,
                                       cache_salt=cache_salt, session_id=session_id)
        if cached is None:
            raise NoFreeBlocksError(*self._shortfall)
        return cached

    def try_add_sequence(self, seq_id, token_ids, *, num_new_tokens, cache_salt=None,
                         session_id=None) -> int | None:
        """Admit a sequence: reuse its cached prefix, give num_new_tokens more tokens slots.
        Returns the number of cached tokens, or None when the pool cannot hold it even after
        releasing parked blocks; then nothing changed (plan before mutate). Misuse (a known id,
        no tokens, past max_model_len) raises KVCacheError."""
        if seq_id in self._seqs:
            raise KVCacheError(f"sequence {seq_id!r} already exists")
        if len(token_ids) == 0:
            raise KVCacheError(f"sequence {seq_id!r} has no tokens")
        cached, prefix, sess, loads = self._plan(token_ids, cache_salt, session_id)
        seq = _Seq(seq_id, token_ids, cache_salt, session_id)
        seq.table, seq.num_computed = list(prefix), cached
        datas: list[bytes] = []
        if loads:
            # Room for the worst case (every planned load succeeds) before any read: a load that
            # fails (torn, corrupt) only shrinks what is needed, so nothing after the reads can
            # fail and undo them. The same release rule as below (never the session revived).
            worst = min(len(loads) * self._bs + max(0, num_new_tokens), len(token_ids) - cached)
            self._check_len(seq_id, cached + worst)
            room = self._make_room(self._needed(seq, worst), keep=sess.session_id,
                                   dropping=sess.table[len(prefix):]) if sess is not None else \
                self._make_room(self._needed(seq, worst), reserved=prefix)
            if not room:
                return None
            datas = self.tier_link.read(loads)              # torn or corrupt: dropped, computed instead
        loaded = len(datas) * self._bs
        n = max(0, min(num_new_tokens, len(token_ids) - cached - loaded))
        self._check_len(seq_id, cached + loaded + n)
        need = self._needed(seq, loaded + n)
        if sess is not None:
            tail = sess.table[len(prefix):]
            if not self._make_room(need, keep=sess.session_id, dropping=tail):
                return None                     # (never after loads: their worst case fit)
            del self._parked[sess.session_id]             # ownership moves to seq: no ref change
            self.pool.free_blocks(tail[::-1])
            seq.hashes = sess.hashes[:cached // self._bs]
            last = prefix[-1]
            if cached % self._bs and last.ref_count == 1 and last.block_hash is None:
                self.pool.set_filled(last, cached % self._bs)   # the rest is stale
        else:
            if not self._make_room(need, reserved=prefix):
                return None
            self.pool.touch(prefix)
            seq.hashes = [b.block_hash for b in prefix]
        self._seqs[seq_id] = seq
        self.prefix_cache_queries += len(token_ids)
        self.prefix_cache_hits += cached + loaded
        self._grow(seq, loaded + n)
        if datas:               # the fresh blocks get the tier's bytes before any forward reads them
            self.tier_link.install(seq.table[len(prefix):len(prefix) + len(datas)], datas,
                                   {"seq_id": seq_id, "session_id": session_id, "tokens_loaded": loaded,
                                    "tokens_cached": cached, "tokens_computed": len(token_ids) - cached - loaded})
        self.peak_used_blocks = max(self.peak_used_blocks, self.pool.num_used)  # if n == 0
        return cached + loaded

    def allocate_slots(self, seq_id, num_new_tokens: int) -> None:
        """`try_allocate_slots` for callers that treat no room as an error: NoFreeBlocksError."""
        if not self.try_allocate_slots(seq_id, num_new_tokens):
            raise NoFreeBlocksError(*self._shortfall)

    def try_allocate_slots(self, seq_id, num_new_tokens: int) -> bool:
        """Slots for the next num_new_tokens tokens (copy-on-write of a shared partial block).
        False when the pool cannot give them even after releasing parked blocks; then nothing
        changed, and the caller decides what to do (the scheduler preempts)."""
        seq = self._get(seq_id)
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        self._check_len(seq_id, seq.num_computed + num_new_tokens)
        if not self._make_room(self._needed(seq, num_new_tokens)):
            return False
        self._grow(seq, num_new_tokens)
        return True

    def rollback(self, seq_id, num_computed: int) -> int:
        """Speculative decoding: keep the KV of the first `num_computed` positions and give back the
        slots past them (rejected draft tokens). Returns the slots rolled back.

        Why it is safe: the verification step gave the draft positions slots through `_grow`, which
        copies a shared partial block before writing and never hashes past the sequence's real
        tokens (drafts are not in them), so every block touched by a draft is private and unhashed;
        blocks wholly past `num_computed` go back to the pool, and the partial last block that stays
        is the sequence's own. Full blocks of accepted drafts are hashed once their tokens are in
        the token list (the next `_grow`, or `park`)."""
        seq = self._get(seq_id)
        nc, bs = seq.num_computed, self._bs
        if not len(seq.hashes) * bs <= num_computed <= nc:
            raise KVCacheError(f"sequence {seq_id!r}: cannot roll back to {num_computed} "
                               f"(computed {nc}, hashed up to {len(seq.hashes) * bs})")
        if num_computed == nc:
            return 0
        keep = -(-num_computed // bs)
        dropped = seq.table[keep:]
        if any(b.ref_count != 1 or b.block_hash is not None for b in dropped):
            raise KVCacheError(f"sequence {seq_id!r}: a rolled-back block is shared or cached")
        del seq.table[keep:]
        self._release(dropped)
        if keep:
            self.pool.set_filled(seq.table[-1], num_computed - (keep - 1) * bs)
        seq.num_computed = num_computed
        self.spec_rolled_back_slots += nc - num_computed
        self.spec_rollbacks += 1
        return nc - num_computed

    def fork(self, parent_id, child_id, child_token_ids) -> None:
        """Child shares all of the parent's blocks (n > 1 sampling); CoW happens on write."""
        parent = self._get(parent_id)
        if child_id in self._seqs:
            raise KVCacheError(f"sequence {child_id!r} already exists")
        child = _Seq(child_id, child_token_ids, parent.salt, None, owner=parent.owner)
        child.table, child.num_computed = list(parent.table), parent.num_computed
        child.hashes = list(parent.hashes)
        self.pool.touch(child.table)
        self._seqs[child_id] = child

    def _release(self, table: list[Block]) -> None:
        """Tail first: the private tail is evicted before the (likely shared) head."""
        self.pool.free_blocks(table[::-1])
        if self._pending:       # a copy into a block nobody holds any more must not run
            self._pending = [(s, d) for s, d in self._pending
                             if self.pool.blocks[d].ref_count > 0]

    def free(self, seq_id) -> None:
        seq = self._get(seq_id)
        del self._seqs[seq_id]
        self._release(seq.table)

    def forget_cached(self, seq_id) -> None:
        """Drop the prefix-cache entries of seq's blocks: after a failed step their KV may never
        have been written, so they must not be served as hits (the chain of later blocks breaks)."""
        seq = self._get(seq_id)
        for b in seq.table:
            self.pool.drop_hash(b)
        seq.hashes = []

    def preempt(self, seq_id) -> int:
        """Free the sequence's blocks; returns the tokens whose KV was lost. With a tier, its full
        blocks are swapped out first when the policy finds that cheaper than recomputing them
        (they come back through the ordinary lookup on re-admission; blocks shared with forks are
        one tier entry, so they stay shared). The partial last block is always recomputed."""
        seq = self._get(seq_id)
        swapped = self.tier_link.swap_out(seq.table) if self.tier_link is not None else 0
        mode = "swap" if swapped else "recompute"
        self.free(seq_id)
        lost = max(0, seq.num_computed - swapped)
        self.num_preemptions += 1
        self.tokens_recomputed_after_preempt += lost
        log.info("preempted %s by %s: %d tokens swapped out, %d to recompute", seq_id, mode, swapped, lost)
        self.preemption_events.append(
            {"seq_id": seq_id, "tokens_lost": lost, "time": time.time(), "mode": mode,
             "tokens_swapped": swapped})
        return lost

    def park(self, seq_id, owner) -> None:
        """Keep a finished sequence's blocks parked under `owner` for its next turn (replacing
        what that owner had parked); its next add_sequence(session_id=owner) reuses them."""
        seq = self._get(seq_id)
        if not self.enable_prefix_caching or owner is None:
            self.free(seq_id)
            return
        self._hash_full(seq)        # full blocks a last speculative step completed
        del self._seqs[seq_id]
        self.release_parked(owner)
        if self.tier_link is not None and self.tier_link.policy.write_through_parked:
            self.tier_link.write_through(seq.table, reason="park")    # survives eviction and restarts
        self._parked[owner] = _Parked(owner, list(seq.tokens[:seq.num_computed]),
                                      seq.table, seq.salt, seq.hashes, seq.ids_cache)

    def release_parked(self, owner) -> bool:
        """Release the blocks parked under `owner`; False if it has none."""
        sess = self._parked.pop(owner, None)
        if sess is None:
            return False
        self._release(sess.table)
        return True

    # ---- what a step reads ---------------------------------------------------------------
    def step_kv(self, seq_id, start: int, end: int) -> tuple[tuple[list[int], ...], tuple[list[int], ...]]:
        """A scheduled row's KV, per KV cache group: the sequence's block table and the slots of
        positions [start, end). The scheduler copies them into the step's plan
        (engine/step_plan.py), so execution never asks the manager."""
        return (self.block_table(seq_id),), (self.slots_for(seq_id, start, end),)

    def slots_for(self, seq_id, start: int, end: int) -> list[int]:
        """Slots of positions [start, end), in one pass."""
        table, bs = self._get(seq_id).table, self._bs
        if start < 0 or end > len(table) * bs:
            raise KVCacheError(f"sequence {seq_id!r} has no slots for [{start}, {end})")
        return [table[p // bs].block_id * bs + p % bs for p in range(start, end)]

    def block_table(self, seq_id) -> list[int]:
        return [b.block_id for b in self._get(seq_id).table]

    def num_blocks_held(self, seq_id) -> int:
        return len(self._get(seq_id).table)

    def num_computed(self, seq_id) -> int:
        return self._get(seq_id).num_computed

    def take_pending_copies(self) -> list[tuple[int, int]]:
        out, self._pending = self._pending, []
        return out

    # ---- observability ------------------------------------------------------------------
    def reset_peak(self) -> None:
        """Start a fresh peak window at the current use."""
        self.peak_used_blocks = self.pool.num_used

    def kv_stats(self) -> KVStats:
        """Counters for metrics and the dashboard; O(live tables)."""
        pool, bs = self.pool, self._bs
        used = pool.num_used
        live = len(self._seqs) + len(self._parked)
        logical = (sum(len(s.table) for s in self._seqs.values())
                   + sum(len(s.table) for s in self._parked.values()))
        contiguous = live * -(-self.max_model_len // bs)
        chat_used = used - self.pins.num_pin_only_blocks     # what the live tables hold
        return KVStats(
            block_size=bs, total_blocks=pool.num_blocks, free_blocks=pool.num_free, used_blocks=used,
            cached_blocks=pool.num_cached_free, shared_blocks=pool.num_shared,
            peak_used_blocks=self.peak_used_blocks, logical_blocks=logical,
            kv_bytes_per_token=self.kv_bytes_per_token, kv_bytes_per_block=self.kv_bytes_per_token * bs,
            kv_capacity_tokens=pool.num_blocks * bs, used_tokens=pool.num_used_tokens,
            prefix_cache_queries=self.prefix_cache_queries, prefix_cache_hits=self.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
            savings_vs_unshared=1 - chat_used / logical if logical else 0.0,
            savings_vs_contiguous=1 - chat_used / contiguous if contiguous else 0.0,
            num_sequences=len(self._seqs), num_idle_sessions=len(self._parked),
            internal_fragmentation_tokens=used * bs - pool.num_used_tokens, usage=used / pool.num_blocks,
            pinned_blocks=self.pins.num_pinned_blocks, max_pinned_blocks=self.pins.max_blocks,
            chat_used_blocks=chat_used, **self._tier_stats())

    def _tier_stats(self) -> dict:
        link = self.tier_link
        out = dict(swap_preemptions=link.swap_preemptions if link else 0,
                   tokens_swapped_out=link.tokens_swapped_out if link else 0,
                   tokens_recomputed_after_preempt=self.tokens_recomputed_after_preempt,
                   tier_loaded_tokens=link.loaded_tokens if link else 0, spec_rollbacks=self.spec_rollbacks,
                   spec_rolled_back_slots=self.spec_rolled_back_slots)
        return dict(out, **link.stats()) if link is not None else out

    def kv_snapshot(self, request_of=lambda seq_id: None) -> KVSnapshot:
        """Per-block arrays and per-table views (engine/observe/kv_contract.py), taken between two steps;
        the engine thread's part only copies (engine/observe/kv_snapshot.py)."""
        return take_snapshot(self, request_of)

    def stats(self) -> dict:
        return self.kv_stats().to_json()

    def snapshot(self) -> dict:
        return self.kv_snapshot().to_json()
