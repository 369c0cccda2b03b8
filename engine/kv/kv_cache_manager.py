"""Paged KV-cache memory manager: the sequence life cycle over KV cache groups, and `step_kv`.

One engine thread calls it, so there are no locks. Every call that needs blocks checks capacity
first (counting the blocks the same step's window releases, then releasing parked blocks, least
recently parked first); when that is not enough the `try_` calls return None / False with no
state change (the scheduler then decides to preempt), and the plain calls raise NoFreeBlocksError.

KV cache groups (engine/kv/cache_spec.py): each sequence holds one block table per group
(engine/kv/group_table.py). A sliding-window group releases a sequence's blocks once no future
query of the group can read them: when a step starting at position s is scheduled, the blocks
wholly before s - W + 1 go back to the pool (their hash kept: they stay revivable for prefix
hits), and the table shows a null entry. The step's START, never its end, so a speculative
rollback (which keeps at least s + 1 positions) never needs a released block. A model whose
layers are all of one kind has one group and behaves exactly as before groups.

Sequences: add_sequence -> allocate_slots* -> free | preempt | park; fork for n > 1 sampling and
beams; rollback for speculative decoding. The step's plan takes each row's tables and slots from
`step_kv` and the copy-on-write copies from `take_pending_copies` (engine/core/scheduler.py).
Reuse: full blocks are hashed as soon as their KV is scheduled (one token chain; each group's key
derived from it, engine/kv/block_hash.group_key); the hit rule over groups is in
engine/kv/prefix_hit.py. With enable_prefix_caching=False nothing is hashed or looked up and park
simply frees.

The manager's neighbours own the rest: parked sessions (engine/kv/parking.py, `parked`: park
hands a finished sequence over, admission adopts it), pins (engine/kv/pinning.py, `pins`), the
second tier's link (engine/kv/tier/link.py, `tier_link`: it moves blocks and owns the tier's
counters and policy), stats and snapshots (engine/observe/kv_snapshot.py reads `holders()`, the
pool and the counters below).
"""

from __future__ import annotations

import logging
import time
from collections import deque

from engine.config import BLOCK_SIZES
from engine.errors import KVCacheError, NoFreeBlocksError
from engine.kv.block_pool import BlockPool
from engine.kv.cache_spec import KVCacheLayout
from engine.kv.tier.store import KVTier, owner_tag
from engine.kv.tier.policy import TierPolicy
from engine.kv.parking import Parked, ParkedSessions
from engine.kv.pinning import DEFAULT_MAX_PIN_FRACTION, PinTable
from engine.kv.prefix_hit import HitPlan, plan_hit
from engine.kv.state_hooks import StateHooks
from engine.kv.table_growth import SeqTables, TableGrowth
from engine.kv.tier.link import TierLink

log = logging.getLogger("paged_chat.engine")


class KVCacheManager(TableGrowth, StateHooks):
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        max_model_len: int,
        layout: KVCacheLayout | None = None,
        kv_bytes_per_token: int = 0,
        enable_prefix_caching: bool = True,
        max_pin_fraction: float = DEFAULT_MAX_PIN_FRACTION,
        states=None,
    ):
        if block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {block_size}")
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.layout = layout or KVCacheLayout.single(1)
        self.pool = BlockPool(num_blocks)
        self._bs = block_size
        self.max_model_len = max_model_len
        self.kv_bytes_per_token = kv_bytes_per_token  # one block's bytes / block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._seqs: dict = {}
        self.parked = ParkedSessions(self._release_tables)
        self.pins = PinTable(self.pool, block_size, self.layout, max_fraction=max_pin_fraction)
        self.tier_link: TierLink | None = None  # second tier, see attach_tier
        self._pending: list[tuple[int, int]] = []
        self._shortfall = (0, 0)  # (needed, available) of the last allocation that failed
        # counters, read by engine/observe/kv_snapshot.kv_stats
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_preemptions = 0
        self.preemption_events: deque = deque(maxlen=50)
        self.tokens_recomputed_after_preempt = 0  # tokens a preemption dropped (recompute)
        self.spec_rollbacks = 0  # speculative steps that gave slots back
        self.spec_rolled_back_slots = 0  # slots of rejected draft tokens given back
        self.window_released_blocks = [0] * self.layout.num_groups  # per group, since start
        # state groups (engine/kv/state_groups.py, engine/kv/state_hooks.py): the state slots of a
        # model with linear-attention layers, held by the same table lists as the blocks; else None
        self.states = states

    def attach_tier(
        self, tier: KVTier, io, policy: TierPolicy | None = None, state_io=None
    ) -> TierLink:
        """Put `tier` behind the pool; returns the link that moves blocks to and from it.
        io: read(block_id) -> bytes, write(block_id, bytes). state_io (a model with linear-attention
        layers): slot_bytes(slot) -> bytes, slot_nbytes: its states go to the tier too
        (engine/kv/tier/state_entries.py)."""
        if not self.enable_prefix_caching:
            raise KVCacheError("a KV tier needs the prefix cache (its keys are the block hashes)")
        self.tier_link = TierLink(tier, io, self._bs, self.kv_bytes_per_token, policy)
        self.pool.on_evict = self.tier_link.write_back
        if self.states is not None and state_io is not None:
            from engine.kv.tier.state_entries import StateTier

            self.tier_link.states = StateTier(self.tier_link, self.states, state_io, self._bs)
        return self.tier_link

    # ---- properties ---------------------------------------------------------------------
    block_size = property(lambda self: self._bs)
    num_blocks = property(lambda self: self.pool.num_blocks)
    num_free_blocks = property(lambda self: self.pool.num_free)
    num_used_blocks = property(lambda self: self.pool.num_used)

    def has_sequence(self, seq_id) -> bool:
        return seq_id in self._seqs

    def holders(self):
        """Read-only views of who holds blocks, for snapshots (engine/observe/kv_snapshot.py):
        the running sequences and the parked sessions (LRU first), each with `tables`, `tokens`,
        `session_id` (and, running, `seq_id` and `num_computed`)."""
        return self._seqs.values(), iter(self.parked)

    def _get(self, seq_id) -> SeqTables:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise KVCacheError(f"unknown sequence {seq_id!r} (never added, or already freed)")
        return seq

    # ---- prefix lookup ------------------------------------------------------------------
    def _plan(self, token_ids, salt, session_id) -> HitPlan:
        if not self.enable_prefix_caching:
            return HitPlan.empty(self.layout, self._bs)
        plan = plan_hit(
            self.layout,
            self._bs,
            self.pool,
            self.tier_link,
            token_ids,
            salt,
            self.parked.get(session_id),
        )
        if self.states is not None:  # a hit needs a state to start from (state_hit.py)
            from engine.kv import state_hit

            plan = state_hit.clamp(
                self.states,
                plan,
                self.layout,
                self._bs,
                lambda: plan_hit(
                    self.layout, self._bs, self.pool, self.tier_link, token_ids, salt, None
                ),
                tier=self.tier_link.states if self.tier_link is not None else None,
            )
        return plan

    def lookup_prefix(self, token_ids, *, cache_salt=None, session_id=None) -> int:
        """Tokens whose KV add_sequence would reuse right now (no state change)."""
        plan = self._plan(token_ids, cache_salt, session_id)
        return plan.cached if plan.session is not None else plan.num_blocks * self._bs

    # ---- sequence lifecycle -------------------------------------------------------------
    def add_sequence(
        self, seq_id, token_ids, *, num_new_tokens, cache_salt=None, session_id=None
    ) -> int:
        """`try_add_sequence` for callers that treat no room as an error: NoFreeBlocksError."""
        cached = self.try_add_sequence(
            seq_id,
            token_ids,
            num_new_tokens=num_new_tokens,
            cache_salt=cache_salt,
            session_id=session_id,
        )
        if cached is None:
            raise NoFreeBlocksError(*self._shortfall)
        return cached

    def try_add_sequence(
        self, seq_id, token_ids, *, num_new_tokens, cache_salt=None, session_id=None
    ) -> int | None:
        """Admit a sequence: reuse its cached prefix (pool, tier, or its owner's parked tables),
        give num_new_tokens more tokens slots. Returns the number of cached tokens, or None when
        the pool cannot hold it even after releasing parked blocks; then nothing changed (plan
        before mutate; tier reads may have happened). Misuse (a known id, no tokens, past
        max_model_len) raises KVCacheError."""
        if seq_id in self._seqs:
            raise KVCacheError(f"sequence {seq_id!r} already exists")
        if len(token_ids) == 0:
            raise KVCacheError(f"sequence {seq_id!r} has no tokens")
        plan, datas = self._plan(token_ids, cache_salt, session_id), {}
        while plan.session is None and (plan.loads or getattr(plan, "state_load", None)):
            # Room for the loads and the new tokens before any read; a read that fails (torn,
            # corrupt: the tier drops it) plans again without it, keeping what was read. A
            # hybrid model's state after the hit is read with its blocks (tier/state_entries.py).
            if not self._state_room(
                1, dry=True, restore=getattr(plan, "state_restore", None)
            ) or not self._room_for_hit(seq_id, plan, token_ids, num_new_tokens):
                return None
            missing = [x for _, _, x in plan.loads if x not in datas]
            for ident in missing:
                d = self.tier_link.read_one(ident)
                if d is None:
                    break
                datas[ident] = d
            else:
                ck = getattr(plan, "state_load", None)
                if ck is None or ck.key in datas:
                    break
                d = self.tier_link.states.read(ck)
                if d is not None:
                    datas[ck.key] = d
                    break
            plan = self._plan(token_ids, cache_salt, session_id)
        if plan.session is not None:
            sess = plan.session
            if self.states is not None and not self._state_room(
                int(self.states.needs_copy(sess.tables)), keep=sess.session_id, dry=True
            ):
                return None
            return self._adopt(seq_id, token_ids, plan, num_new_tokens, cache_salt)
        restore = getattr(plan, "state_restore", None)  # state groups: a checkpoint to copy in
        if not self._state_room(1, dry=True, restore=restore) or not self._room_for_hit(
            seq_id, plan, token_ids, num_new_tokens
        ):
            return None
        if not self._state_room(1, restore=restore):
            return None
        return self._admit(seq_id, token_ids, plan, datas, num_new_tokens, cache_salt, session_id)

    def allocate_slots(self, seq_id, num_new_tokens: int) -> None:
        """`try_allocate_slots` for callers that treat no room as an error: NoFreeBlocksError."""
        if not self.try_allocate_slots(seq_id, num_new_tokens):
            raise NoFreeBlocksError(*self._shortfall)

    def try_allocate_slots(self, seq_id, num_new_tokens: int) -> bool:
        """Slots for the next num_new_tokens tokens (copy-on-write of a shared partial block),
        the blocks this step's window releases counted as free. False when the pool cannot give
        them even after releasing parked blocks; then nothing changed (not even the release),
        and the caller decides what to do (the scheduler preempts)."""
        seq = self._get(seq_id)
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        self._check_len(seq_id, seq.num_computed + num_new_tokens)
        need, dying = self._needed(seq.tables, seq.num_computed, num_new_tokens)
        copy = int(
            self.states is not None and num_new_tokens > 0 and self.states.needs_copy(seq.tables)
        )
        if not self._state_room(copy, dry=True) or not self._make_room(need, dropping=dying):
            return False
        if not self._state_room(copy):  # a shared state slot is copied before the step
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
        is the sequence's own. The window released only blocks before the step's start, which
        `num_computed` is past. Full blocks of accepted drafts are hashed once their tokens are in
        the token list (the next `_grow`, or `park`)."""
        seq = self._get(seq_id)
        nc, bs = seq.num_computed, self._bs
        windowed = [
            (s, t) for s, t in zip(self.layout.groups, seq.tables) if s.sliding_window is not None
        ]
        if not len(seq.hashes) * bs <= num_computed <= nc or any(
            s.first_live_block(num_computed, bs) < t.released for s, t in windowed
        ):
            raise KVCacheError(
                f"sequence {seq_id!r}: cannot roll back to {num_computed} "
                f"(computed {nc}, hashed up to {len(seq.hashes) * bs})"
            )
        if num_computed == nc:
            return 0
        keep = -(-num_computed // bs)
        if any(
            b.ref_count != 1 or b.block_hash is not None
            for t in seq.tables
            for b in t.blocks[keep - t.released :]
        ):
            raise KVCacheError(f"sequence {seq_id!r}: a rolled-back block is shared or cached")
        for t in seq.tables:
            self._free_blocks(t.truncate(keep)[::-1])
            if keep > t.released:
                self.pool.set_filled(t[-1], num_computed - (keep - 1) * bs)
        seq.num_computed = num_computed
        self.spec_rolled_back_slots += nc - num_computed
        self.spec_rollbacks += 1
        return nc - num_computed

    def fork(self, parent_id, child_id, child_token_ids) -> None:
        """Child shares all of the parent's blocks (n > 1 sampling, beams); CoW happens on write."""
        parent = self._get(parent_id)
        if child_id in self._seqs:
            raise KVCacheError(f"sequence {child_id!r} already exists")
        child = SeqTables(
            child_id,
            child_token_ids,
            parent.salt,
            None,
            [t.copy() for t in parent.tables],
            owner=parent.owner,
        )
        child.num_computed, child.hashes = parent.num_computed, list(parent.hashes)
        for t in child.tables:
            self.pool.touch(t.blocks)
        self._seqs[child_id] = child
        if self.states is not None:  # the child reads its parent's state until one writes
            self.states.share(parent.tables, child.tables)

    def free(self, seq_id) -> None:
        seq = self._get(seq_id)
        del self._seqs[seq_id]
        self._release_tables(seq.tables)

    def forget_cached(self, seq_id) -> None:
        """Drop the prefix-cache entries of seq's blocks: after a failed step their KV may never
        have been written, so they must not be served as hits (the chain of later blocks breaks)."""
        seq = self._get(seq_id)
        for t in seq.tables:
            for b in t.blocks:
                self.pool.drop_hash(b)
        if self.states is not None:  # states it checkpointed may be as unwritten as its KV
            for h in seq.hashes:
                self.states.drop(h)
        seq.hashes = []

    def preempt(self, seq_id) -> int:
        """Free the sequence's blocks; returns the tokens whose KV was lost. With a tier, its full
        blocks are swapped out first when the policy finds that cheaper than recomputing them
        (they come back through the ordinary lookup on re-admission; blocks shared with forks are
        one tier entry, so they stay shared). The partial last block is always recomputed."""
        seq = self._get(seq_id)
        swapped = 0
        link = self.tier_link
        if link is not None and link.states is not None:
            # a hybrid model: the blocks up to the deepest boundary with a state, and that state
            k, state = link.states.swap_state(seq)
            blocks = [b for t in seq.tables for b in t.blocks[:k] if b.block_hash is not None]
            swapped = link.swap_out(blocks, k * self._bs, state) if k else 0
        elif link is not None:
            hashed = [[b for b in t.blocks if b.block_hash is not None] for t in seq.tables]
            covered = max(t.released + len(h) for t, h in zip(seq.tables, hashed)) * self._bs
            swapped = link.swap_out([b for h in hashed for b in h], covered)
        mode = "swap" if swapped else "recompute"
        self.free(seq_id)
        lost = max(0, seq.num_computed - swapped)
        self.num_preemptions += 1
        self.tokens_recomputed_after_preempt += lost
        log.info(
            "preempted %s by %s: %d tokens swapped out, %d to recompute",
            seq_id,
            mode,
            swapped,
            lost,
        )
        self.preemption_events.append(
            {
                "seq_id": seq_id,
                "tokens_lost": lost,
                "time": time.time(),
                "mode": mode,
                "tokens_swapped": swapped,
            }
        )
        return lost

    def park(self, seq_id, owner) -> None:
        """Hand a finished sequence's tables to the parked sessions under `owner` for its next
        turn (replacing what that owner had parked); its next add_sequence(session_id=owner)
        adopts them."""
        seq = self._get(seq_id)
        if not self.enable_prefix_caching or owner is None:
            self.free(seq_id)
            return
        self._hash_full(seq)  # full blocks a last speculative step completed
        del self._seqs[seq_id]
        self.parked.release(owner)
        link = self.tier_link
        if link is not None and link.policy.write_through_parked:  # survives eviction and restarts
            link.write_through([b for t in seq.tables for b in t.blocks], reason="park")
            if link.states is not None:  # and the states those blocks need (tier/state_entries.py)
                link.states.write_holder(seq, seq.num_computed, reason="park")
        self.parked.put(
            Parked(owner, list(seq.tokens[: seq.num_computed]), seq.tables, seq.salt, seq.hashes)
        )

    def forget_owner(self, owner) -> int:
        """The owner's conversation is deleted: free its parked blocks, drop the free cached blocks
        it registered as its own from the pool (no write-back) and delete its blocks from the
        tier. Returns the tier entries deleted."""
        self.parked.release(owner)
        tag = owner_tag(owner)
        if self.states is not None:  # its private state checkpoints, before any write-back
            self.states.drop_owner(tag)
        for b in [b for b in self.pool.cached.values() if b.owner == tag]:
            if b.ref_count == 0:
                self.pool.forget_free(b)
            else:  # still held by a fork of it: no longer its private block
                b.owner = None
        return self.tier_link.delete_owner(owner) if self.tier_link is not None else 0

    # ---- what a step reads ---------------------------------------------------------------
    def step_kv(
        self, seq_id, start: int, end: int
    ) -> tuple[tuple[list[int], ...], tuple[list[int], ...]]:
        """A scheduled row's KV, per KV cache group: the sequence's block table (NULL_BLOCK where
        the window released an entry) and the slots of positions [start, end). The scheduler
        copies them into the step's plan (engine/step_plan.py), so execution never asks."""
        seq, bs = self._get(seq_id), self._bs
        tables = tuple(t.ids.tolist() for t in seq.tables)
        for t in seq.tables:
            if start < t.released * bs or end > len(t) * bs:
                raise KVCacheError(f"sequence {seq_id!r} has no slots for [{start}, {end})")
        return tables, tuple(
            [ids[p // bs] * bs + p % bs for p in range(start, end)] for ids in tables
        )

    def block_table(self, seq_id, group: int = 0) -> list[int]:
        """Group `group`'s live block ids, in table order (a view for tests and tools)."""
        return self._get(seq_id).tables[group].live_ids()

    def slots_for(self, seq_id, start: int, end: int, group: int = 0) -> list[int]:
        """Slots of positions [start, end) in one group (a view for tests and tools)."""
        return self.step_kv(seq_id, start, end)[1][group]

    def num_blocks_held(self, seq_id) -> int:
        """Live blocks over every group."""
        return sum(len(t.blocks) for t in self._get(seq_id).tables)

    def num_computed(self, seq_id) -> int:
        return self._get(seq_id).num_computed

    def take_pending_copies(self) -> list[tuple[int, int]]:
        out, self._pending = self._pending, []
        return out
