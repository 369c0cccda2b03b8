"""Random operation sequences against a KVCacheManager with a state group (a model with linear-
attention layers), the block machine's rules (tests/engine/kv/test_kv_cache_properties.py: prefix hits
and salts, next turns adopting parked sessions, chunked growth, forks, free / preempt / park,
releasing parked sessions) on a small state pool, checking after every step:

- no leak, refcounts equal holders: every state slot's count is the number of running sequences,
  parked sessions and checkpoints holding it; the free list holds exactly the others; freeing
  everything at the end leaves only the checkpoints, and dropping those every slot;
- contents: the simulated state pool stores, per slot, the token ids the state has consumed (state
  copies run first, as in the runner; a step from position 0 starts from nothing). Every running
  sequence's state must be exactly its computed tokens, every parked session's its tokens, every
  taken checkpoint's the prefix it is keyed on: a missing copy on write, a wrong restore or a
  state adopted at the wrong length shows up as a wrong history;
- a checkpoint is used only on its own live prefix: each restore is checked as it happens (its
  key block is in the pool's prefix cache and is the new sequence's block k - 1, and the
  sequence starts at exactly k blocks).
"""

import os

from hypothesis import event, settings, strategies as st
from hypothesis.stateful import initialize, invariant

from engine.kv.block_hash import group_key
from engine.kv.kv_cache_manager import KVCacheManager
from engine.kv.state_groups import StateGroups
from tests.engine.kv.helpers import BS, MAX_LEN, KVMachine

settings.register_profile("state-ci", max_examples=60, stateful_step_count=60, deadline=None)


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

        def attach(tables, restore=None):  # every restore, checked where it happens
            if restore is not None:
                event("state checkpoint restored")
                k = restore.pos // BS
                b = self.m.pool.cached.get(group_key(restore.key, 0))
                assert b is not None, "a checkpoint used after its block left the pool"
                assert tables[0][k - 1] is b and len(tables[0]) >= k
                assert restore.ready  # its copy is queued before this restore's
            return real_attach(tables, restore)

        self.states.attach = attach

    def speculate(self, data, draft, bonus):  # not a rule here: a state cannot roll back
        pass

    def write(self, seq_id, start, end):
        """The runner's part: state copies (forks, checkpoints), KV, then the step's tokens."""
        for src, dst in self.m.take_state_copies():
            self.sim[dst] = self.sim[src]
            for key, ck in self.states.checkpoints.items():
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


StateMachine.TestCase.settings = settings.get_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "state-ci")
)
TestStatePoolProperties = StateMachine.TestCase
