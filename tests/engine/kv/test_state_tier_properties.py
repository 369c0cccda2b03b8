"""Random operation sequences against a KVCacheManager with a state group AND a file-backed KV tier
(the state machine of tests/engine/kv/state_machine.py plus the tier's restart, graceful
stop and delete rules), checking after every step, besides everything the state machine checks:

- a state entry is never loaded without all its prefix blocks: every state read from the tier is
  checked where it lands (the new sequence's blocks [0, k) are in its table, hashed on the chain
  the state's key names, their simulated KV is the prompt's tokens, and it starts at exactly k
  blocks), and its bytes are the prompt's first k blocks of tokens;
- every state entry in the tier holds exactly the history its key names: its simulated state is
  the token list whose chain hash is the entry's parent (the block it ends), whose last block is
  the entry's tokens; so a state written from a slot that had moved on, or too early (before its
  checkpoint's copy ran), shows as a wrong history;
- the tier cap holds: the index equals the files, its byte count the files' sizes, never above
  the capacity, not even right after a write;
- deleting a conversation leaves none of its states (nor blocks) in the tier.

The simulated state pool stores per slot the token ids the state consumed; the tier stores a slot
as MAX_LEN int64s (-1 padded).
"""

import os
import shutil
import tempfile
from array import array

from hypothesis import event, settings, strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from engine.kv.block_hash import walk_blocks
from engine.kv.kv_cache_manager import KVCacheManager
from engine.kv.tier.store import KVTier, owner_tag
from engine.kv.state_groups import StateGroups
from tests.engine.kv.helpers import BS, FP, MAX_LEN, _IO, _MeasuredStore
from tests.engine.kv.state_machine import StateMachine

settings.register_profile("state-tier-ci", max_examples=40, stateful_step_count=50, deadline=None)


def _encode(tokens) -> bytes:
    return array("q", list(tokens) + [-1] * (MAX_LEN - len(tokens))).tobytes()


def _decode(data) -> tuple:
    return tuple(t for t in array("q", bytes(data)) if t != -1)


class _StateIO:
    """The runner's LinearState as the tier sees it: a slot's simulated history, fixed size."""

    slot_nbytes = MAX_LEN * 8

    def __init__(self, machine):
        self.mc = machine

    def slot_bytes(self, slot):
        return _encode(self.mc.sim[slot] or ())


class StateTierMachine(StateMachine):
    @initialize(
        num_blocks=st.integers(16, 40), num_slots=st.integers(3, 12), cap_entries=st.integers(4, 40)
    )
    def setup(self, num_blocks, num_slots, cap_entries):
        self.folder = tempfile.mkdtemp(prefix="statetier-prop-")
        self.cap = cap_entries * (BS * 8 + 300) + 2 * (MAX_LEN * 8 + 300)
        self.num_blocks, self.num_slots = num_blocks, num_slots
        self._new_manager()

    def _new_manager(self):
        self.states = StateGroups(self.num_slots, BS)
        self.m = KVCacheManager(
            self.num_blocks, BS, max_model_len=MAX_LEN, kv_bytes_per_token=8, states=self.states
        )
        self.kv = [None] * (self.num_blocks * BS)
        self.sim = [None] * self.num_slots
        self.running, self.idle, self.next_id = {}, {}, getattr(self, "next_id", 0)
        self.materialized = []
        self.tier = KVTier(_MeasuredStore(self.folder), FP, self.cap)
        self.m.attach_tier(self.tier, _IO(self), state_io=_StateIO(self))
        real_attach = self.states.attach

        def attach(tables, restore=None, load=None):
            if load is not None:  # a state read from the tier: all its prefix blocks are here
                ck, data = load
                k = ck.pos // BS
                sid = next(s for s, q in self.m._seqs.items() if q.tables is tables)
                toks, seq = self.running[sid], self.m._seqs[sid]
                assert seq.num_computed == ck.pos and len(tables[0]) >= k
                assert seq.hashes[k - 1] == ck.key and _decode(data) == tuple(toks[: ck.pos])
                for i in range(k):  # (their KV is installed after this; contents_match_tokens
                    assert tables[0][i].block_hash == seq.hashes[i]  # checks it after the step)
                event("state loaded from the tier")
            if restore is not None:
                assert restore.ready and tables[0][restore.pos // BS - 1].block_hash == restore.key
                event("state checkpoint restored")
            return real_attach(tables, restore, load)

        self.states.attach = attach

    def write(self, seq_id, start, end):
        """The runner's part: state copies and tier loads in order, KV, then the step's tokens."""
        # a checkpoint's copy is in this list iff it was ready before the take (a dropped one's
        # copy may still run into its slot, handed out again: that does not fill the new one)
        ready = [ck for ck in self.states.checkpoints.values() if ck.ready]
        for src, dst in self.m.take_state_copies():
            self.sim[dst] = self.sim[src] if isinstance(src, int) else _decode(src)
            for ck in ready:
                if ck.slot == dst and not any(c is ck for c in self.materialized):
                    self.materialized.append(ck)
        super(StateMachine, self).write(seq_id, start, end)
        if end > start:
            slot = self.m.step_state(seq_id)[0]
            before = self.sim[slot] if start else ()
            assert start == 0 or len(before) == start, f"state of {seq_id}: {len(before)}, {start}"
            self.sim[slot] = tuple(before) + tuple(self.running[seq_id][start:end])

    # ---- the tier's rules ------------------------------------------------------------------
    @precondition(lambda self: len(self.tier))
    @rule(save=st.booleans())
    def restart(self, save):
        """The process ends (after a graceful stop's save, or not) and a new one starts."""
        if save:
            self.m.tier_link.save_pool(self.m.pool, 5.0, holders=self.m.holders())
        before = {(i.block_hash, i.token_ids) for i, _, _ in self.tier.entries()}
        self._new_manager()
        assert {(i.block_hash, i.token_ids) for i, _, _ in self.tier.entries()} == before
        if self.tier.state_entries:
            event("restart with states in the tier")

    @rule(session=st.sampled_from(["s0", "s1", "s2"]))
    def delete_conversation(self, session):
        self.m.forget_owner(session)
        self.idle.pop(session, None)
        assert all(o != owner_tag(session) for _, _, o in self.tier.entries())

    @invariant()
    def tier_states_hold_their_history(self):
        t = self.tier
        entries = t.entries()
        names = {f"{i.block_hash:016x}" for i, _, _ in entries}
        assert _MeasuredStore(self.folder).names_on_disk() == names
        folder = self.folder
        on_disk = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        assert t.bytes == on_disk <= self.cap and t.store.peak <= self.cap
        n_states = 0
        for ident, n, _ in entries:
            meta, data = t._parse(t.store.read(t._name(ident.block_hash)), with_data=True)
            if meta.get("kind") != "state":
                assert n == BS * 8 and array("q", data).tolist() == list(ident.token_ids)
                continue
            n_states += 1
            hist = _decode(data)
            assert len(hist) % BS == 0 and hist[-BS:] == ident.token_ids, "a state off its block"
            chains = [list(walk_blocks(list(hist), salt, BS)) for salt in (None, "x")]
            assert any(
                c[-1].hash == ident.parent_hash and repr(c[-1].salt) == ident.salt for c in chains
            ), "a state entry whose history is not its key's prefix"
        assert n_states == t.state_entries
        if n_states:
            event("states in the tier")
        if self.m.tier_link.swap_preemptions:
            event("preempted to the tier with a state")

    def teardown(self):
        try:
            super().teardown()
        finally:
            if hasattr(self, "folder"):
                shutil.rmtree(self.folder, ignore_errors=True)


StateTierMachine.TestCase.settings = settings.get_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "state-tier-ci")
)
TestStateTierProperties = StateTierMachine.TestCase
