"""The state-pool machine: the block machine's rules (tests/engine/kv/helpers.KVMachine) on a
manager with a state group, and the checks every state test shares (tests/engine/kv/
test_state_pool_properties.py runs it; test_state_tier_properties.py adds the tier's rules)."""

from hypothesis import event, strategies as st
from hypothesis.stateful import initialize, invariant

from engine.kv.block_hash import group_key
from engine.kv.kv_cache_manager import KVCacheManager
from engine.kv.state_groups import StateGroups
from tests.engine.kv.helpers import BS, MAX_LEN, KVMachine


class StateMachine(KVMachine):
    @initialize(num_blocks=st.integers(16, 48), num_slots=st.integers(3, 16))
    def setup(self, num_blocks, num_slots):
        self.states = StateGroups(num_slots, BS)
        self.m = KVCacheManager(num_blocks, BS, max_model_len=MAX_LEN, states=self.states)
        self.kv = [None] * (num_blocks * BS)
        self.sim = [None] * num_slots  # simulated state pool: tokens consumed per slot
        self.running, self.idle, self.next_id = {}, {}, 0
        self.materialized: list = []  # checkpoints whose copy has run (by identity)
        real_attach = self.states.attach

        def attach(tables, restore=None, load=None):  # every restore, checked where it happens
            if restore is not None:
                event("state checkpoint restored")
                k = restore.pos // BS
                b = self.m.pool.cached.get(group_key(restore.key, 0))
                assert b is not None, "a checkpoint used after its block left the pool"
                assert tables[0][k - 1] is b and len(tables[0]) >= k
                assert restore.ready  # its copy is queued before this restore's
            return real_attach(tables, restore, load)

        self.states.attach = attach

    def speculate(self, data, draft, bonus):  # not a rule here: a state cannot roll back
        pass

    def write(self, seq_id, start, end):
        """The runner's part: state copies (forks, checkpoints), KV, then the step's tokens."""
        # a checkpoint's copy is in this list iff it was ready before the take (a dropped one's
        # copy may still run into its slot, handed out again: that does not fill the new one)
        ready = [ck for ck in self.states.checkpoints.values() if ck.ready]
        for src, dst in self.m.take_state_copies():
            self.sim[dst] = self.sim[src]
            for ck in ready:
                if ck.slot == dst and not any(c is ck for c in self.materialized):
                    self.materialized.append(ck)
        super().write(seq_id, start, end)
        if end > start:
            slot = self.m.step_state(seq_id)[0]
            before = self.sim[slot] if start else ()
            assert start == 0 or len(before) == start, (
                f"state of {seq_id} has {len(before)} tokens, step from {start}"
            )
            self.sim[slot] = tuple(before) + tuple(self.running[seq_id][start:end])

    @invariant()
    def slots_are_consistent(self):
        st_ = self.states
        holders = [0] * st_.pool.num_slots
        for s in self.running:
            holders[st_.slot_of(self.m._seqs[s].tables)] += 1
        for p in self.m.parked:
            assert st_.holds(p.tables), "a parked session without its state"
            holders[st_.slot_of(p.tables)] += 1
        for ck in st_.checkpoints.values():
            holders[ck.slot] += 1
        assert holders[0] == 0
        assert st_.pool.ref == holders
        assert sorted(st_.pool._free) == [i for i in range(1, len(holders)) if holders[i] == 0]

    @invariant()
    def states_hold_their_tokens(self):
        st_, m = self.states, self.m
        pending = {dst for _, dst in st_._pending}
        for sid, toks in self.running.items():
            nc, slot = m.num_computed(sid), st_.slot_of(m._seqs[sid].tables)
            if slot not in pending and nc:
                assert self.sim[slot] == tuple(toks[:nc]), f"state of {sid}"
        for p in m.parked:
            slot = st_.slot_of(p.tables)
            if slot not in pending:
                assert self.sim[slot] == tuple(p.tokens), f"parked state of {p.session_id}"
        for key, ck in st_.checkpoints.items():
            if any(c is ck for c in self.materialized):
                assert len(self.sim[ck.slot]) == ck.pos

    def teardown(self):
        if not hasattr(self, "m"):
            return
        for sid in list(self.running):
            self.m.free(sid)
        for s in list(self.idle):
            assert self.m.parked.release(s)
        st_ = self.states
        assert st_.pool.num_used == len(st_.checkpoints)
        for key in list(st_.checkpoints):
            st_.drop(key)
        assert st_.pool.num_used == 0 and st_.pool.num_free == st_.pool.num_slots - 1
