"""State groups: who holds which state slot, copy-on-write, and state checkpoints for prefix hits.

A model with linear-attention layers (Qwen3.5) has, beside its KV cache groups, one *state group*:
all its Gated DeltaNet layers, whose per-sequence state lives in one slot of the state pool
(engine/kv/state_pool.py). The KV manager calls this owner at a few points of a sequence's life
(engine/kv/kv_cache_manager.py) and holders are the manager's own table lists (one list of
GroupTables per running sequence or parked session), so the state follows the blocks everywhere
they go without a second id space:

- admission: a fresh slot (state from zero), or a checkpoint's state copied into a fresh slot
  (a prefix hit), or the parked session's slot itself (its next turn; ownership moves);
- fork (n > 1, beams): the child shares the parent's slot; the first step that writes either one
  copies it first (copy on write: `writable`);
- free, preemption (recompute: the state is dropped with the blocks), release of a parked session:
  the holder's reference goes (`release`, from the manager's one table-release path);
- park: the slot stays with the tables (the parked session holds it).

Prefix hits: KV blocks can be shared at any block boundary, a recurrent state only where it was
kept. A hit of k blocks is usable only if a *checkpoint* holds the state after exactly those k
blocks (or k = 0, or the owner's parked state at exactly the common prefix). Checkpoints are
keyed by the chain hash of their last block (the same hash that names the block in the prefix
cache: it covers every token before, and the salt), so a checkpoint answers only the prefix it
was taken on, and it is used only when that block is a live pool hit: its prefix blocks are in
the pool. A checkpoint whose block left the pool is dropped (`prune`). Which boundaries are kept:
docs/DESIGN.md ("State groups").

Taking a checkpoint: the scheduler ends a prefill chunk at the boundary (`chunk_end`); when the
step that reaches it is scheduled, a slot is set aside and the copy (the sequence's slot -> the
checkpoint) is deferred to the next step's plan, whose copies run before its forward: after the
step that computed the boundary, before anything moves the state past it. The checkpoint serves
hits from then on ("ready"): a restore is queued after the copy that fills it, and a plan's copies
run in order. Every destination is a slot handed out when its copy is queued, so a slot freed and
handed out again is only written by copies queued after the ones that still read it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from engine.kv.block_hash import group_key
from engine.kv.state_pool import StatePool


@dataclass
class Checkpoint:
    slot: int
    pos: int  # tokens the state has seen (a block boundary)
    key: int  # chain hash of the block that ends at pos
    uses: int = 0  # prefix hits it served
    ready: bool = False  # its copy is in a plan (restores queued after it read the right state)


class StateGroups:
    def __init__(self, num_slots: int, block_size: int, *, bytes_per_slot: int = 0):
        self.pool = StatePool(num_slots)
        self.bs = block_size
        self.bytes_per_slot = bytes_per_slot
        self._holders: dict[int, list] = {}  # id(tables) -> [tables, slot]
        self._pending: list[tuple[int, int]] = []  # copies the next plan runs before its forward
        self._deferred: list[
            tuple[int, int]
        ] = []  # checkpoint copies: after the step that reached them
        self.checkpoints: OrderedDict[int, Checkpoint] = (
            OrderedDict()
        )  # key -> checkpoint, LRU first
        self._wanted: dict[int, list] = {}  # id(tables) -> boundaries to checkpoint at, ascending
        self.take_checkpoints = True
        self.checkpoints_taken = 0
        self.checkpoint_hits = 0
        self.checkpoints_dropped = 0
        self.cow_copies = 0

    # ---- holders --------------------------------------------------------------------------
    def slot_of(self, tables) -> int:
        h = self._holders.get(id(tables))
        return h[1] if h is not None else 0

    def holds(self, tables) -> bool:
        return id(tables) in self._holders

    def attach(self, tables, restore: Checkpoint | None = None) -> int:
        """A new sequence's slot: fresh (its first step starts from a zero state), or holding a
        checkpoint's state (copied before the first forward). The caller checked `num_free`."""
        slot = self.pool.allocate()
        self._holders[id(tables)] = [tables, slot]
        if restore is not None:
            self._pending.append((restore.slot, slot))
            restore.uses += 1
            self.checkpoint_hits += 1
            self.checkpoints.move_to_end(restore.key)
        return slot

    def adopt(self, old_tables, new_tables) -> None:
        """A parked session's state becomes its next turn's (ownership moves, no copy)."""
        h = self._holders.pop(id(old_tables))
        self._holders[id(new_tables)] = [new_tables, h[1]]

    def share(self, parent_tables, child_tables) -> None:
        """A fork reads its parent's state until one of them writes (copy on write)."""
        slot = self.slot_of(parent_tables)
        self.pool.incref(slot)
        self._holders[id(child_tables)] = [child_tables, slot]

    def release(self, tables) -> None:
        """The holder's reference goes (free, preemption, a parked session released)."""
        h = self._holders.pop(id(tables), None)
        self._wanted.pop(id(tables), None)
        if h is not None:
            self.pool.decref(h[1])

    def needs_copy(self, tables) -> bool:
        """The holder's slot is shared: a step that writes it needs a slot of its own first."""
        return self.pool.ref[self.slot_of(tables)] > 1

    def writable(self, tables) -> None:
        """Before a step writes the holder's state: copy a shared slot (the caller made room)."""
        h = self._holders[id(tables)]
        if self.pool.ref[h[1]] > 1:
            new = self.pool.allocate()
            self._pending.append((h[1], new))
            self.pool.decref(h[1])
            h[1] = new
            self.cow_copies += 1

    # ---- plan ---------------------------------------------------------------------------------
    def take_pending_copies(self) -> list[tuple[int, int]]:
        """The copies this step's plan runs before its forward, in order (a restore may read a
        checkpoint an earlier copy of the same list fills); checkpoint copies deferred by this
        step's scheduling become the next step's, and their checkpoints usable."""
        out, self._pending, self._deferred = self._pending, self._deferred, []
        dsts = {dst for _, dst in self._pending}
        for ck in self.checkpoints.values():
            if ck.slot in dsts:
                ck.ready = True
        return out

    # ---- checkpoints --------------------------------------------------------------------------
    def want_checkpoint(self, tables, pos: int) -> None:
        """Keep the holder's state after `pos` tokens (a block boundary) once a step reaches it
        (not when `take_checkpoints` is off: the bench's "no checkpoints" side)."""
        if self.take_checkpoints and pos > 0 and pos % self.bs == 0:
            w = self._wanted.setdefault(id(tables), [])
            if pos not in w:
                w.append(pos)
                w.sort()

    def wanted_pos(self, tables, after: int = 0) -> int | None:
        """The first wanted boundary past `after` (where the next prefill chunk should end)."""
        return next((p for p in self._wanted.get(id(tables), ()) if p > after), None)

    def reached(self, tables, end: int, hashes: list) -> None:
        """A step computing up to `end` was scheduled for the holder: at the wanted boundary,
        set a slot aside and defer the copy into it (see the module docstring). `hashes`: the
        holder's chain hashes so far (the checkpoint's key is its last block's). Without a free
        slot (the caller made room when it could) the checkpoint is not taken."""
        w = self._wanted.get(id(tables))
        if not w or end < w[0]:
            return
        passed = [p for p in w if p <= end]
        del w[: len(passed)]
        if not w:
            del self._wanted[id(tables)]
        pos = passed[-1]
        if end != pos or len(hashes) < pos // self.bs:
            return
        key = hashes[pos // self.bs - 1]
        if key in self.checkpoints or not self.pool.num_free:
            return
        slot = self.pool.allocate()
        self._deferred.append((self.slot_of(tables), slot))
        self.checkpoints[key] = Checkpoint(slot, pos, key)
        self.checkpoints_taken += 1

    def find(self, chain, k_max: int) -> tuple[int, Checkpoint | None]:
        """The largest k <= k_max with a checkpoint after chain blocks [0, k) (0, None if none)."""
        for k in range(k_max, 0, -1):
            ck = self.checkpoints.get(chain[k - 1].hash)
            if ck is not None and ck.ready and ck.pos == k * self.bs:
                return k, ck
        return 0, None

    def drop(self, key: int) -> None:
        ck = self.checkpoints.pop(key, None)
        if ck is not None:
            self._cancel_copies_into(ck.slot)
            self.pool.decref(ck.slot)
            self.checkpoints_dropped += 1

    def _cancel_copies_into(self, slot: int) -> None:
        """A checkpoint dropped before its deferred copy was handed out: the copy must not run a
        step later into a slot that may hold someone else's state by then. (A copy already in
        `_pending` runs before any use of the slot queued after it, so it is harmless, and a
        restore queued after it may still read it.)"""
        self._deferred = [c for c in self._deferred if c[1] != slot]

    def prune(self, block_pool) -> None:
        """Drop the checkpoints whose last block is no longer in the pool's prefix cache (its
        prefix may be gone: a checkpoint is never used past its blocks)."""
        for key in [k for k in self.checkpoints if block_pool.cached.get(group_key(k, 0)) is None]:
            self.drop(key)

    def has_checkpoint(self, key: int) -> bool:
        return key in self.checkpoints

    def reclaimable(self, block_pool, pinned) -> list[int]:
        """Checkpoint keys that may be dropped to free slots, in order: the dead (their block left
        the pool), then those whose block no pin holds (`pinned(block)`), least recently used
        first."""
        dead, live = [], []
        for key in self.checkpoints:
            b = block_pool.cached.get(group_key(key, 0))
            if b is None:
                dead.append(key)
            elif not pinned(b):
                live.append(key)
        return dead + live

    # ---- observability ------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counters for KVStats (engine/observe/kv_contract.py)."""
        held = [h[1] for h in self._holders.values()]
        shared = sum(1 for s in set(held) if self.pool.ref[s] > 1)
        return dict(
            state_slots_total=self.pool.num_slots - 1,
            state_slots_used=self.pool.num_used,
            state_slots_free=self.pool.num_free,
            state_slots_shared=shared,
            state_bytes_per_slot=self.bytes_per_slot,
            state_checkpoints=len(self.checkpoints),
            state_checkpoint_hits=self.checkpoint_hits,
            state_checkpoints_taken=self.checkpoints_taken,
            state_cow_copies=self.cow_copies,
            state_peak_used_slots=self.pool.peak_used,
        )
