"""The KV cache manager's side of the second tier: one owner for the connection and its counters.

Why a separate object: the manager decides *which* blocks move (admission, eviction, preemption,
parking); this link does the moving and remembers what moved. It holds the tier (engine/kv/tier/store.py:
the store and its index), the pool-slab I/O that reads and writes a block's bytes as the pool holds
them (scales included for a quantized pool), the policy that prices a load or a swap against a
recompute (engine/kv/tier/policy.py), and the counters the dashboard and metrics show. The
manager keeps no tier state of its own: without a tier it has no link, and every counter reads 0.

Failures here are never the manager's: a write that fails costs a later recompute, a read that
fails (torn, corrupt) is dropped and the tokens are computed instead. Reads and capacity checks come
before the manager changes any state (plan before mutate).
"""

from __future__ import annotations

import logging
import time
from collections import deque

from engine.kv.block_pool import Block
from engine.kv.tier.store import BlockIdentity, KVTier
from engine.kv.tier.policy import TierPolicy

log = logging.getLogger("paged_chat.engine")


def identity_of(b: Block) -> BlockIdentity:
    return BlockIdentity.of(b.block_hash, b.parent_hash, b.token_ids, b.salt)


class TierLink:
    def __init__(
        self,
        tier: KVTier,
        io,
        block_size: int,
        kv_bytes_per_token: int,
        policy: TierPolicy | None = None,
    ):
        """io: read(block_id) -> bytes, write(block_id, bytes) on the pool's slab."""
        self.tier, self.io, self.policy = tier, io, policy or TierPolicy()
        self._bs, self._bytes_per_token = block_size, kv_bytes_per_token
        self.loaded_tokens = 0  # prompt tokens served by loads (also prefix-cache hits)
        self.swap_preemptions = 0
        self.tokens_swapped_out = 0
        self.load_events: deque = deque(maxlen=50)  # {seq_id, session_id, tokens_loaded, ...}
        self.states = None  # engine/kv/tier/state_entries.StateTier (a model with linear attention)

    @property
    def block_bytes(self) -> int:
        return self._bytes_per_token * self._bs

    # ---- the policy's clock ---------------------------------------------------------------
    def new_step(self) -> None:
        """The engine starts a step: a fresh per-step budget of tier loads."""
        self.policy.new_step()

    def observe_compute(self, tokens: int, seconds: float) -> None:
        """A step computed `tokens` in `seconds`: what a recompute costs, against which a load
        or a swap is priced (engine/kv/tier/policy.py)."""
        self.policy.observe_compute(tokens, seconds)

    # ---- writing blocks out -------------------------------------------------------------
    def write_back(self, b: Block) -> None:
        """Pool eviction hook: keep the block's bytes in the tier (never raises into the pool)."""
        try:
            ident = identity_of(b)
            if not self.tier.has(ident):
                self.tier.put(ident, self.io.read(b.block_id), owner=b.owner, reason="writeback")
        except Exception:  # the tier is an optimisation: a failure costs a recompute only
            log.exception("KV tier write-back failed")

    def write_through(self, blocks, reason: str) -> int:
        """Write the hashed (full, computed) ones of `blocks`; returns how many are in the tier
        afterwards."""
        n = 0
        for b in blocks:
            if b.block_hash is None:
                continue
            ident = identity_of(b)
            try:
                ok = self.tier.has(ident) or self.tier.put(
                    ident, self.io.read(b.block_id), owner=b.owner, reason=reason
                )
            except Exception:
                log.exception("KV tier write failed")
                ok = False
            n += bool(ok)
        return n

    def swap_out(self, blocks: list[Block], tokens: int, state=None) -> int:
        """A preempted sequence's hashed blocks (every KV cache group's), when the policy finds
        writing (the ones not yet in the tier) and loading them back cheaper than recomputing
        their `tokens`. Returns the tokens whose KV is now in the tier (0: recompute). `state`
        (engine/kv/tier/state_entries.StateWrite): a hybrid model's state after those tokens, priced as
        the blocks its bytes fill and written first (without it the blocks serve nothing)."""
        new = sum(1 for b in blocks if not self.tier.has(identity_of(b)))
        extra = 0
        if state is not None and not self.tier.has(state.ident):
            extra = -(-self.states.nbytes // max(1, self.block_bytes))
        t = self.tier
        if (
            not blocks
            or not t.has_room((new + extra) * self.block_bytes)
            or not self.policy.should_swap(
                new + extra, len(blocks) + extra, self._bs, t.write_s_per_block, t.load_s_per_block
            )
        ):
            return 0
        if state is not None and not self.states.put(state, "swap"):
            return 0
        written = self.write_through(blocks, reason="swap")
        swapped = tokens * written // len(blocks) // self._bs * self._bs
        self.swap_preemptions += bool(swapped)
        self.tokens_swapped_out += swapped
        return swapped

    def save_pool(self, pool, budget_s: float = 5.0, holders=None) -> dict:
        """A graceful stop (issue 47): keep the pool's computed blocks in the tier so the next start
        serves them from there. Chat sessions and pins are written through already; what only the
        pool held (the blocks of finished API requests, cached but never evicted) would be lost.
        Blocks held now first, then cached ones, most recently freed first, until `budget_s`;
        then a hybrid model's states (engine/kv/tier/state_entries.StateTier.save; `holders`: the
        manager's running and parked views). Returns {"saved", "already", "left", "seconds"}
        (states under "states")."""
        t0 = time.monotonic()
        out = {"saved": 0, "already": 0, "left": 0}
        held = (b for b in pool.blocks.built() if b.ref_count > 0 and b.block_hash is not None)
        for src in (held, pool.iter_cached_newest()):
            for b in src:
                if time.monotonic() - t0 > budget_s:
                    out["left"] += 1
                    continue
                ident = identity_of(b)
                if self.tier.has(ident):
                    out["already"] += 1
                    continue
                try:
                    ok = self.tier.put(
                        ident, self.io.read(b.block_id), owner=b.owner, reason="shutdown"
                    )
                except Exception:  # a full or failing tier: these blocks are recomputed later
                    log.exception("KV tier save at shutdown failed")
                    ok = False
                out["saved" if ok else "left"] += 1
        if self.states is not None and holders is not None:
            out["states"] = self.states.save(holders, max(0.0, budget_s - (time.monotonic() - t0)))
        out["seconds"] = round(time.monotonic() - t0, 3)
        return out

    def delete_owner(self, owner) -> int:
        return self.tier.delete_owner(owner)

    # ---- loading blocks back ------------------------------------------------------------
    def read_one(self, ident: BlockIdentity) -> bytes | None:
        """A planned block's bytes (engine/kv/prefix_hit.py plans which), or None when it is gone
        or fails its check (the tier then drops it, so the next plan does without it)."""
        return self.tier.get(ident)

    def install(self, blocks: list[Block], datas: list[bytes], event: dict) -> None:
        """Write loaded bytes into the fresh pool blocks (before any forward reads them) and
        count them; `event` describes the admission for the dashboard."""
        for b, d in zip(blocks, datas):
            self.io.write(b.block_id, d)
        self.tier.note_loaded(len(datas))
        self.policy.loaded_this_step += len(datas)
        self.loaded_tokens += len(datas) * self._bs
        self.load_events.append(dict(event, kind=self.tier.kind, time=time.time()))

    # ---- observability ------------------------------------------------------------------
    def stats(self) -> dict:
        t = self.tier.stats()
        return dict(
            tier_kind=t.kind,
            tier_blocks=t.blocks,
            tier_bytes=t.bytes,
            tier_capacity_bytes=t.capacity_bytes,
            tier_hits_blocks=t.hits_blocks,
            tier_writes_blocks=t.writes_blocks,
            tier_writebacks_blocks=t.writebacks_blocks,
            tier_swapouts_blocks=t.swapouts_blocks,
            tier_dropped_corrupt=t.dropped_corrupt,
            tier_evicted_blocks=t.evicted_blocks,
            tier_deleted_blocks=t.deleted_blocks,
            tier_restored_blocks=t.restored_blocks,
        )
