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
- free, preemption (recompute, or a swap to the KV tier with a state: engine/kv/tier/state_entries.py),
  release of a parked session: the holder's reference goes (`release`, from the manager's one
  table-release path);
- park: the slot stays with the tables (the parked session holds it).

Prefix hits: KV blocks can be shared at any block boundary, a recurrent state only where it was
kept. A hit of k blocks is usable only if a *checkpoint* holds the state after exactly those k
blocks (or k = 0, or the owner's parked state at exactly the common prefix). Checkpoints are
keyed by the chain hash of their last block (the same hash that names the block in the prefix
cache: it covers every token before, and the salt), so a checkpoint answers only the prefix it
was taken on, and it is used only when the hit's plan serves that block and every one before it
(pool hits, or blocks the KV tier loads with it). A checkpoint whose block left the pool is the
first dropped for slot room (`reclaimable`; its state goes to the tier first, if any). Which
boundaries are kept: docs/DESIGN.md ("Memory that is not KV").

Taking a checkpoint: the scheduler ends a prefill chunk at the boundary (`chunk_end`); when the
step that reaches it is scheduled, a slot is set aside and the copy (the sequence's slot -> the
checkpoint) is deferred to the next step's plan, whose copies run before its forward: after the
step that computed the boundary, before anything moves the state past it. The checkpoint serves
hits from then on ("ready"): a restore is queued after the copy that fills it, and a plan's copies
run in order. Every destination is a slot handed out when its copy is queued, so a slot freed and
handed out again is only written by copies queued after the ones that still read it.

The KV tier (engine/kv/tier/state_entries.py) keeps states outside the pool, keyed like the block they end.
Two things here serve it: a state read back from the tier enters the same ordered list of copies
(its bytes in the place of a source slot, so it lands after every copy queued before it and
before any that reads it), and, while a tier is attached, each holder keeps a *boundary*
checkpoint: the state at the latest block boundary it computed, replaced at the next one
(`keep_boundaries`). A sequence rarely stops at a block boundary, but its KV goes to the tier in
whole blocks: the boundary checkpoint is the state those blocks need when the sequence is parked
or preempted to the tier. `resolve` says which bytes a slot will hold once the queued copies
have run (between two steps: what the tier writes).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from engine.kv.block_hash import group_key
from engine.kv.prefix_salt import block_salt
from engine.kv.state_pool import StatePool


@dataclass
class Checkpoint:
    slot: int
    pos: int  # tokens the state has seen (a block boundary)
    key: int  # chain hash of the block that ends at pos
    uses: int = 0  # prefix hits it served
    ready: bool = False  # its copy is in a plan (restores queued after it read the right state)
    tokens: tuple | None = None  # the last block's token ids and salt (the tier's identity check)
    salt: object = None
    owner: str | None = (
        None  # its block's owner tag (a chat's private state; engine/kv/tier/store.py)
    )
    boundary: bool = False  # a holder's latest-boundary checkpoint, replaced at its next one


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
        self._boundary: dict[int, int] = {}  # id(tables) -> key of its boundary checkpoint
        self.take_checkpoints = True
        self.keep_boundaries = (
            False  # set while a KV tier is attached (engine/kv/tier/state_entries.py)
        )
        self.tier_loads = 0  # states read back from the KV tier
        self.tier_writes = 0  # states written to it
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

    def attach(self, tables, restore: Checkpoint | None = None, load=None) -> int:
        """A new sequence's slot: fresh (its first step starts from a zero state), or holding a
        checkpoint's state (copied before the first forward). The caller checked `num_free`.
        `load`: (Checkpoint without a slot, bytes) read from the KV tier: with a second free slot
        it becomes a checkpoint (the next chat on that prefix copies it from the pool) restored
        like any other, else its bytes go straight into the sequence's slot."""
        slot = self.pool.allocate()
        self._holders[id(tables)] = [tables, slot]
        if load is not None:
            ck, data = load
            self.tier_loads += 1
            if not self.pool.num_free or ck.key in self.checkpoints:
                self._pending.append((data, slot))
                return slot
            ck.slot, ck.ready = self.pool.allocate(), True  # its load is queued before the restore
            self._pending.append((data, ck.slot))
            self.checkpoints[ck.key] = ck
            restore = ck
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
        if id(old_tables) in self._boundary:
            self._boundary[id(new_tables)] = self._boundary.pop(id(old_tables))

    def share(self, parent_tables, child_tables) -> None:
        """A fork reads its parent's state until one of them writes (copy on write)."""
        slot = self.slot_of(parent_tables)
        self.pool.incref(slot)
        self._holders[id(child_tables)] = [child_tables, slot]

    def release(self, tables) -> None:
        """The holder's reference goes (free, preemption, a parked session released)."""
        h = self._holders.pop(id(tables), None)
        self._wanted.pop(id(tables), None)
        self._boundary.pop(id(tables), None)  # its boundary checkpoint stays, as any other
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

    def resolve(self, slot: int):
        """What `slot` will hold once the queued copies have run, as it can be read now (between
        two steps): the slot whose bytes those are, or the bytes of a queued tier load; None
        while a copy into it waits for a forward that has not run (a checkpoint taken this pass)."""
        if any(dst == slot for _, dst in self._deferred):
            return None
        ops, i = self._pending, len(self._pending)
        while True:
            j = next((j for j in range(i - 1, -1, -1) if ops[j][1] == slot), None)
            if j is None:
                return slot
            src = ops[j][0]
            if not isinstance(src, int):
                return src
            slot, i = src, j

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

    def reached(self, seq, end: int) -> None:
        """A step computing up to `end` was scheduled for the holder `seq` (its tables, chain
        hashes, tokens, salt): at the wanted boundary, set a slot aside and defer the copy into it
        (see the module docstring); the checkpoint's key is the chain hash of the block it ends.
        While a tier is attached, every boundary also replaces the holder's boundary checkpoint.
        Without a free slot (the caller made room when it could) a checkpoint is not taken."""
        tables = seq.tables
        w = self._wanted.get(id(tables))
        if w and end >= w[0]:
            passed = [p for p in w if p <= end]
            del w[: len(passed)]
            if not w:
                del self._wanted[id(tables)]
            pos = passed[-1]
            if end == pos and len(seq.hashes) >= pos // self.bs:
                ck = self._take(seq, pos)
                if ck is not None:
                    ck.boundary = False  # wanted: it outlives the holder's next boundary
        if self.keep_boundaries and end % self.bs == 0 and len(seq.hashes) >= end // self.bs > 0:
            key = seq.hashes[end // self.bs - 1]
            old = self._boundary.pop(id(tables), None)
            ck = self.checkpoints.get(old) if old is not None and old != key else None
            if ck is not None and ck.boundary and not ck.uses:
                self.drop(old)  # passed: its state is behind the holder now
            if key not in self.checkpoints:
                ck = self._take(seq, end)
                if ck is not None:
                    ck.boundary = True
                    self._boundary[id(tables)] = key

    def _take(self, seq, pos: int) -> Checkpoint | None:
        k = pos // self.bs
        key = seq.hashes[k - 1]
        if key in self.checkpoints:
            return self.checkpoints[key]
        if not self.pool.num_free:
            return None
        slot = self.pool.allocate()
        self._deferred.append((self.slot_of(seq.tables), slot))
        ck = Checkpoint(
            slot,
            pos,
            key,
            tokens=tuple(seq.tokens[pos - self.bs : pos]),
            salt=block_salt(seq.salt, k - 1, self.bs),
            owner=seq.tables[0][k - 1].owner,
        )
        self.checkpoints[key] = ck
        self.checkpoints_taken += 1
        return ck

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

    def holders_boundary(self, key: int) -> bool:
        """The checkpoint is a running or parked holder's current boundary checkpoint."""
        return key in self._boundary.values()

    def drop_owner(self, tag) -> None:
        """A deleted conversation's private checkpoints go (never written to the tier after)."""
        for key in [k for k, ck in self.checkpoints.items() if tag is not None and ck.owner == tag]:
            self.drop(key)

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
            state_tier_loads=self.tier_loads,
            state_tier_writes=self.tier_writes,
        )
