"""The KV manager's side of state groups: room for state slots, chunk ends at checkpoints, and what
a step's plan reads (engine/kv/state_groups.py owns the slots; this is the manager's glue).

Why a mixin of its own: the manager's life cycle (engine/kv/kv_cache_manager.py) and its table
mechanics (engine/kv/table_growth.py) are the KV cache groups' code; a model without
linear-attention layers has `states = None` and none of this runs. The manager calls these at the
points where a state slot is needed (admission, a step that writes a shared slot, adoption) and
the scheduler at the two places a step's shape is decided (`chunk_end`, the plan's `step_state` and
`take_state_copies`).
"""

from __future__ import annotations

from engine.kv.block_hash import group_key


class StateHooks:
    states: object  # engine/kv/state_groups.StateGroups, or None

    def _state_room(self, n: int, keep=None, dry: bool = False, restore=None) -> bool:
        """`n` free state slots: checkpoints no pin holds go first (dead ones, then least recently
        used; never `restore`, the one a hit is about to copy), then parked sessions LRU (never
        `keep`). False, with nothing released, if even that is not enough (`_shortfall` says so);
        dry=True only answers."""
        st = self.states
        if st is None or n <= 0 or st.pool.num_free >= n:
            return True
        pinned_ids = self.pins.pinned_ids()
        drops = [
            k
            for k in st.reclaimable(self.pool, lambda b: b.block_id in pinned_ids)
            if restore is None or k != restore.key
        ]
        free, victims = st.pool.num_free + len(drops), []
        for sess in self.parked:
            if free >= n:
                break
            if (
                sess.session_id != keep
                and st.holds(sess.tables)
                and st.pool.ref[st.slot_of(sess.tables)] == 1
            ):
                victims.append(sess.session_id)
                free += 1
        if free < n:
            self._shortfall = (n, free)
            return False
        if not dry:
            states_tier = self.tier_link.states if self.tier_link is not None else None
            for key in drops:
                if st.pool.num_free >= n:
                    break
                if states_tier is not None:  # the tier keeps it, as an evicted block's KV
                    states_tier.write_back(key)
                st.drop(key)
            for sid in victims:
                if st.pool.num_free >= n:
                    break
                self.parked.release(sid)
        return True

    def chunk_end(self, seq_id, start: int, n: int) -> int:
        """How many of the n tokens from `start` one step should compute: a prefill chunk ends at
        a wanted state checkpoint (engine/kv/state_groups.py) so the state there can be kept."""
        if self.states is None or n <= 1:
            return n
        seq = self._seqs.get(seq_id)
        pos = self.states.wanted_pos(seq.tables, start) if seq is not None else None
        return pos - start if pos is not None and start < pos < start + n else n

    def step_state(self, seq_id) -> tuple[int, ...]:
        """A scheduled row's state slot per state group (() for a model without them)."""
        return () if self.states is None else (self.states.slot_of(self._get(seq_id).tables),)

    def take_state_copies(self) -> list[tuple[int, int]]:
        return [] if self.states is None else self.states.take_pending_copies()

    def checkpoint_block(self, key: int):
        """The pool block a checkpoint's key names (group 0), or None."""
        return self.pool.cached.get(group_key(key, 0))
