"""Linear-attention states in the second KV tier: written with their blocks, loaded with them.

Why: a hybrid model's (Qwen3.5's) prefix hit needs the KV of the attention layers AND the state of
the linear ones after exactly the hit's tokens (engine/kv/state_hit.py). Blocks alone in the tier
serve nothing: an evicted prompt, a preempted reply or a chat after a restart would be computed
from token 0 again. So a state is a tier entry too, keyed like the block it ends: the chain hash
of that block under a state marker (engine/kv/block_hash.state_key), its identity the block's
(chain hash as parent, token ids, salt), the state layout in the tier's fingerprint
(engine/kv/tier/file_io.model_fingerprint), the owner tag of its block (deleting a chat deletes
its states). Its bytes are one state slot as held (engine/exec/models/linear_state.py), so a
reload is bit-identical.

Which states are written, at the moments blocks are (docs/DESIGN.md, "Memory that is not KV"):
- park: the parked turn's states on its chain (its boundary checkpoint: the latest block
  boundary it computed; its prompt's checkpoints), and its own slot when it ends on a boundary;
- pin: the checkpoint at the pinned prompt's end;
- preemption, when the policy prefers swapping: the deepest boundary of the sequence with a
  state, and its blocks up to there (past it the KV would be useless without a state);
- a checkpoint dropped for slot room (the pool's eviction write-back, for states);
- a graceful stop: every checkpoint and every holder's boundary-aligned slot.
A lookup continues into the tier: the largest k whose blocks [0, k) the pool or the tier serve
and whose state after them a pool checkpoint or a tier entry holds; the state is read with the
blocks, before anything changes (engine/kv/kv_cache_manager.try_add_sequence).

The bytes are read between steps: a checkpoint's copy may still be queued, so `resolve` names the
slot (or loaded bytes) that holds what the checkpoint will hold (engine/kv/state_groups.py).
"""

from __future__ import annotations

import logging
import time

from engine.kv.block_hash import state_key
from engine.kv.tier.store import BlockIdentity
from engine.kv.prefix_salt import block_salt
from engine.kv.state_groups import Checkpoint

log = logging.getLogger("paged_chat.engine")


def identity(key: int, tokens, salt) -> BlockIdentity:
    """The tier identity of the state after the block whose chain hash is `key`."""
    return BlockIdentity.of(state_key(key), key, tokens, salt)


class StateWrite:
    """One state the tier may take: its identity, where its bytes are, its owner."""

    __slots__ = ("ident", "slot", "owner", "pos")

    def __init__(self, ident: BlockIdentity, slot: int, owner, pos: int):
        self.ident, self.slot, self.owner, self.pos = ident, slot, owner, pos


class StateTier:
    def __init__(self, link, states, state_io, block_size: int):
        """state_io: slot_bytes(slot) -> bytes, slot_nbytes (engine/exec/models/linear_state)."""
        self.link, self.tier, self.states, self.io = link, link.tier, states, state_io
        self.bs = block_size
        self.nbytes = state_io.slot_nbytes
        states.keep_boundaries = True  # the state each holder's whole blocks need

    # ---- loading ------------------------------------------------------------------------
    def find(self, chain, k_max: int, above: int) -> int:
        """The largest k in (above, k_max] whose state after chain blocks [0, k) is in the tier
        and worth reading rather than computing k blocks; 0 if none. Pure."""
        for k in range(k_max, above, -1):
            c = chain[k - 1]
            if self.tier.has(identity(c.hash, c.tokens, c.salt)) and self._worth(k):
                return k
        return 0

    def _worth(self, k: int) -> bool:
        pol, per_block = self.link.policy, self.tier.load_s_per_block
        if not pol.compute_s_per_token or not per_block:
            return True
        blocks = self.nbytes / max(1, self.link.block_bytes)
        return blocks * per_block <= k * self.bs * pol.compute_s_per_token

    def load_of(self, chain, k: int) -> Checkpoint:
        """The checkpoint a state read for chain blocks [0, k) becomes (slot given on attach)."""
        c = chain[k - 1]
        ident = identity(c.hash, c.tokens, c.salt)
        return Checkpoint(
            0, k * self.bs, c.hash, tokens=c.tokens, salt=c.salt, owner=self.tier.owner_of(ident)
        )

    def read(self, ck: Checkpoint) -> bytes | None:
        """Its bytes, verified (None: gone, torn or corrupt; the tier dropped it)."""
        ident = identity(ck.key, ck.tokens, ck.salt)
        data = self.tier.get(ident)
        if data is not None and len(data) != self.nbytes:  # (the fingerprint rules this out)
            self.tier.delete(ident.block_hash)
            return None
        return data

    # ---- writing ------------------------------------------------------------------------
    def _bytes(self, slot: int) -> bytes | None:
        src = self.states.resolve(slot)
        if src is None or isinstance(src, (bytes, bytearray)):
            return src
        return self.io.slot_bytes(src)

    def put(self, w: StateWrite, reason: str) -> bool:
        """Write one state (a no-op if the tier has it); False if it cannot be read or stored."""
        if self.tier.has(w.ident):  # already there: put only refreshes its LRU place
            return self.tier.put(w.ident, b"", owner=w.owner, reason=reason)
        try:
            data = self._bytes(w.slot)
            ok = data is not None and self.tier.put(
                w.ident, data, owner=w.owner, reason=reason, kind="state"
            )
        except Exception:  # the tier is an optimisation: a failure costs a recompute only
            log.exception("KV tier state write failed")
            ok = False
        self.states.tier_writes += bool(ok)
        return bool(ok)

    def of_checkpoint(self, key: int) -> StateWrite | None:
        ck = self.states.checkpoints.get(key)
        if ck is None or ck.tokens is None:
            return None
        return StateWrite(identity(key, ck.tokens, ck.salt), ck.slot, ck.owner, ck.pos)

    def _own(self, holder, computed: int) -> StateWrite | None:
        """The holder's own slot, when its computed tokens end exactly at a hashed boundary."""
        k = len(holder.hashes)
        if not k or computed != k * self.bs or not self.states.holds(holder.tables):
            return None
        toks = tuple(holder.tokens[computed - self.bs : computed])
        salt = block_salt(holder.salt, k - 1, self.bs)
        return StateWrite(
            identity(holder.hashes[-1], toks, salt),
            self.states.slot_of(holder.tables),
            holder.tables[0][k - 1].owner,
            computed,
        )

    def write_back(self, key: int) -> None:
        """A checkpoint is about to be dropped for slot room: keep its state in the tier, as the
        pool's eviction keeps a block's KV (not a running holder's boundary checkpoint, which
        moves on anyway)."""
        if self.states.holders_boundary(key):
            return
        w = self.of_checkpoint(key)
        if w is not None:
            self.put(w, "writeback")

    def write_checkpoint(self, key: int, reason: str) -> bool:
        """A pin: the checkpoint at the pinned prompt's end (False: none, or not written)."""
        w = self.of_checkpoint(key)
        return w is not None and self.put(w, reason)

    def write_holder(self, holder, computed: int, reason: str) -> int:
        """Park (and pin): the states on the holder's chain (checkpoints keyed by its hashes) and
        its own slot if it ends on a boundary. Returns how many the tier holds afterwards."""
        n = 0
        own = self._own(holder, computed)
        if own is not None:
            n += self.put(own, reason)
        for h in holder.hashes:
            w = self.of_checkpoint(h)
            if w is not None and (own is None or w.ident != own.ident):
                n += self.put(w, reason)
        return n

    def swap_state(self, seq) -> tuple[int, StateWrite | None]:
        """Preemption: the deepest k (blocks) of the sequence with a state after them: its own slot
        when it ends on a boundary, else the latest checkpoint on its chain, else a state the tier
        has already (then nothing to write). (0, None) when there is none: recompute."""
        own = self._own(seq, seq.num_computed)
        if own is not None:
            return len(seq.hashes), own
        for k in range(len(seq.hashes), 0, -1):
            w = self.of_checkpoint(seq.hashes[k - 1])
            if w is not None and w.pos == k * self.bs and self.states.resolve(w.slot) is not None:
                return k, w
            toks = tuple(seq.tokens[(k - 1) * self.bs : k * self.bs])
            if self.tier.has(
                identity(seq.hashes[k - 1], toks, block_salt(seq.salt, k - 1, self.bs))
            ):
                return k, None
        return 0, None

    def save(self, holders, budget_s: float) -> dict:
        """A graceful stop: every checkpoint (most recently used first) and every holder's own
        boundary-aligned slot, within budget_s. Returns {"saved", "already", "left"}."""
        t0, out = time.monotonic(), {"saved": 0, "already": 0, "left": 0}
        running, parked = holders
        todo = [self._own(h, h.num_computed) for h in running]
        todo += [self._own(p, len(p.tokens)) for p in parked]
        todo += [self.of_checkpoint(k) for k in reversed(list(self.states.checkpoints))]
        for w in (w for w in todo if w is not None):
            if self.tier.has(w.ident):
                out["already"] += 1
            elif time.monotonic() - t0 > budget_s or not self.put(w, "shutdown"):
                out["left"] += 1
            else:
                out["saved"] += 1
        return out
