"""The state pool: fixed-size state slots beside the block pool, owned and refcounted like blocks.

Why slots and not blocks: a linear-attention layer (Qwen3.5's Gated DeltaNet) keeps one state per
sequence, the same size at token 10 and at token 100,000: a recurrent matrix per head and the last
few inputs of a short convolution (engine/exec/models/linear_state.py holds the tensors). There is
nothing to page: a sequence holds exactly one slot per state group, however long it is. What paging
gives blocks the pool gives slots: allocated once (never resized), a free list, reference counts
(a fork shares its parent's slot until one of them writes: copy on write), and one number to
watch (free slots).

Holders: running sequences, parked sessions and checkpoints (engine/kv/state_groups.py decides who
holds what); the pool only counts. Slot 0 is never handed out: a row of a model without
linear-attention layers carries no slot, and a stray 0 in a plan is never someone's state.
"""

from __future__ import annotations

from engine.errors import KVCacheError


class StatePool:
    def __init__(self, num_slots: int):
        if num_slots < 2:
            raise ValueError(
                f"a state pool needs at least 2 slots (slot 0 is reserved), got {num_slots}"
            )
        self.num_slots = num_slots
        self.ref = [0] * num_slots
        self._free = list(range(num_slots - 1, 0, -1))  # pop() hands out 1, 2, 3, ... first
        self.peak_used = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Slots someone holds (slot 0 excluded)."""
        return self.num_slots - 1 - len(self._free)

    def allocate(self) -> int:
        """A free slot with one reference; KVCacheError when none is free (callers check first)."""
        if not self._free:
            raise KVCacheError("no free state slot")
        s = self._free.pop()
        self.ref[s] = 1
        self.peak_used = max(self.peak_used, self.num_used)
        return s

    def incref(self, slot: int) -> None:
        if self.ref[slot] < 1:
            raise KVCacheError(f"state slot {slot} is free; it cannot be shared")
        self.ref[slot] += 1

    def decref(self, slot: int) -> bool:
        """Drop one reference; True when that freed the slot."""
        if self.ref[slot] < 1:
            raise KVCacheError(f"state slot {slot} is already free")
        self.ref[slot] -= 1
        if self.ref[slot] == 0:
            self._free.append(slot)
            return True
        return False
