"""Random operation sequences against a KVCacheManager with several KV cache groups (a
full-attention group and sliding-window groups of two widths, or sliding groups only), checking
after every step:

- no leak: every block's ref_count equals the number of tables (all groups, running and parked)
  holding it, each held block belongs to the group of the table that holds it, the free list and
  counters agree, and freeing everything at the end returns every block;
- the window: after a step scheduled from position s, a sliding group's table has released exactly
  the blocks wholly before s - W + 1 (no layer of the group can read them again), its plan entries
  for them are NULL_BLOCK, and every block it still holds has a position some query can read;
- contents: the simulated pool stores (group, token) per slot (CoW copies run first, as in the
  runner); every live position of every table holds its own token written by its own group, so a
  prefix hit (pool, or a parked session adopted) that handed out a freed or reused block, a block
  of another group, or a missing copy-on-write, shows up as a wrong slot.
The rules are the one-group machine's (tests/engine/kv/test_kv_cache_properties.py): add with prefix
hits and salts, next turns adopting parked sessions, chunked growth, speculative steps with
rollback, forks, free / preempt / park, releasing parked sessions.
"""

import os
import shutil
import tempfile
from array import array

from hypothesis import event, settings, strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from engine.kv.cache_spec import NULL_BLOCK, KVCacheLayout
from engine.kv.kv_cache_manager import KVCacheManager
from engine.kv.tier.store import FileStore, KVTier
from engine.observe.kv_snapshot import kv_stats
from tests.engine.kv.helpers import BS, FP, MAX_LEN, KVMachine, TierMachine

settings.register_profile("kv-groups-ci", max_examples=100, stateful_step_count=60, deadline=None)
settings.register_profile(
    "kv-groups-long", max_examples=1000, stateful_step_count=100, deadline=None
)

LAYOUTS = {
    # layers 0, 3 full; 1, 2 window 12; 4, 5 window 20 -> P = 2: groups full, 20, 12
    "mixed": KVCacheLayout.from_layer_windows([None, 12, 12, None, 20, 20]),
    # Mistral-like: every layer the same window -> one sliding group (group 0 is sliding)
    "sliding": KVCacheLayout.from_layer_windows([13, 13]),
}


class GroupsMachine(KVMachine):
    @initialize(num_blocks=st.integers(24, 96), layout=st.sampled_from(sorted(LAYOUTS)))
    def setup(self, num_blocks, layout):
        self.layout = LAYOUTS[layout]
        self.m = KVCacheManager(num_blocks, BS, max_model_len=MAX_LEN, layout=self.layout)
        self.kv = [None] * (num_blocks * BS)  # simulated pool: (group, token id) per slot
        self.running: dict[int, list[int]] = {}
        self.idle: dict[str, list[int]] = {}
        self.next_id = 0
        self.last_start: dict[int, int] = {}  # seq id -> start of its last step with tokens
        event(f"layout {layout}")

    def store(self, seq_id, start, tokens):
        end = start + len(tokens)
        if end > start:
            self.last_start[seq_id] = start
            tables = self.m._seqs[seq_id].tables
            if any(t.released for t in tables):
                event("window released blocks")
                if start and start == self.m.num_computed(seq_id) - len(tokens) and self._admitting:
                    event("prefix hit past the window")
        for g, slots in enumerate(self.m.step_kv(seq_id, start, end)[1]):
            for pos, slot in zip(range(start, end), slots):
                self.kv[slot] = (g, tokens[pos - start])

    _admitting = False

    def _add(self, tokens, num_new, session, salt):
        self._admitting = True
        try:
            super()._add(tokens, num_new, session, salt)
        finally:
            self._admitting = False

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.running)))
        child = self.next_id
        self.next_id += 1
        self.running[child] = list(self.running[parent])
        self.m.fork(parent, child, self.running[child])
        if parent in self.last_start:
            self.last_start[child] = self.last_start[parent]

    # ---- invariants ----------------------------------------------------------------------
    def _tables(self):
        m = self.m
        out = [(("seq", s), m._seqs[s].tables) for s in self.running]
        out += [(("session", p.session_id), p.tables) for p in m.parked]
        return out

    @invariant()
    def pool_is_consistent(self):
        m, pool = self.m, self.m.pool
        holders = [0] * pool.num_blocks
        for _, tables in self._tables():
            assert len(tables) == self.layout.num_groups
            for g, t in enumerate(tables):
                for b in t.blocks:
                    holders[b.block_id] += 1
                    assert b.group == g and pool.groups[b.block_id] == g, (
                        "a block held in another group"
                    )
        assert [b.ref_count for b in pool.blocks] == holders
        free = list(pool.iter_free())
        assert all(b.ref_count == 0 for b in free)
        assert len(free) == pool.num_free == holders.count(0)
        for h, b in pool.cached.items():
            assert b.block_hash == h
            assert self.kv[b.block_id * BS : (b.block_id + 1) * BS] == [
                (b.group, t) for t in b.token_ids
            ]
        st_ = kv_stats(m)
        assert st_.used_blocks == sum(1 for n in holders if n)
        assert st_.logical_blocks == sum(len(t.blocks) for _, ts in self._tables() for t in ts)
        assert [g["used_blocks"] for g in st_.kv_groups] == [
            sum(1 for b in pool.blocks if b.ref_count and b.group == g)
            for g in range(self.layout.num_groups)
        ]

    @invariant()
    def contents_match_tokens(self):
        m = self.m
        for sid, toks in self.running.items():
            nc = m.num_computed(sid)
            tables, _ = m.step_kv(sid, nc, nc)
            for g, (spec, t) in enumerate(zip(self.layout.groups, m._seqs[sid].tables)):
                assert len(t) == -(-nc // BS)
                start = self.last_start.get(sid)
                if spec.sliding_window is not None and start is not None:
                    assert t.released == spec.first_live_block(start, BS), (
                        f"group {g}: released {t.released} blocks after a step from {start}"
                    )
                if spec.sliding_window is None:
                    assert t.released == 0
                assert tables[g][: t.released] == [NULL_BLOCK] * t.released
                live = [b.block_id for b in t.blocks]
                assert tables[g][t.released :] == live
                for p in range(t.released * BS, nc):
                    slot = t[p // BS].block_id * BS + p % BS
                    assert self.kv[slot] == (g, toks[p]), f"group {g} position {p} of {sid}"
        assert m.parked.owners() == list(self.idle)
        for sess in m.parked:
            for g, t in enumerate(sess.tables):
                for p in range(t.released * BS, len(sess.tokens)):
                    assert self.kv[t[p // BS].block_id * BS + p % BS] == (g, sess.tokens[p])
            assert len(sess.hashes) == len(sess.tokens) // BS

    def teardown(self):
        if not hasattr(self, "m"):
            return
        for sid in list(self.running):
            self.m.free(sid)
        for s in list(self.idle):
            assert self.m.parked.release(s)
        st_ = kv_stats(self.m)
        assert (
            st_.used_blocks == 0 and st_.free_blocks == self.m.num_blocks and st_.used_tokens == 0
        )


GroupsMachine.TestCase.settings = settings.get_profile(
    os.environ.get("KV_GROUPS_HYPOTHESIS_PROFILE", "kv-groups-ci")
)
TestKVGroupsProperties = GroupsMachine.TestCase


# ---- the second tier, per group ---------------------------------------------------------------
class _GroupIO:
    """A block's slots as int64 bytes, (group, token) coded as group * 1000 + token."""

    def __init__(self, machine):
        self.mc = machine

    def read(self, bid):
        vals = [
            -1 if x is None else x[0] * 1000 + x[1] for x in self.mc.kv[bid * BS : (bid + 1) * BS]
        ]
        return array("q", vals).tobytes()

    def write(self, bid, data):
        self.mc.kv[bid * BS : (bid + 1) * BS] = [
            None if v < 0 else (v // 1000, v % 1000) for v in array("q", data).tolist()
        ]


class GroupsTierMachine(GroupsMachine):
    """The groups machine with a file tier behind the pool: evicted blocks written back, hits
    continued in the tier and loaded into fresh blocks of their own group, swap on preemption,
    write-through on park, restarts, corrupted files, deleted conversations."""

    @initialize(
        num_blocks=st.integers(24, 64),
        layout=st.sampled_from(sorted(LAYOUTS)),
        cap_blocks=st.integers(4, 60),
    )
    def setup(self, num_blocks, layout, cap_blocks):
        self.folder = tempfile.mkdtemp(prefix="kvtier-groups-")
        self.layout, self.num_blocks, self.cap = LAYOUTS[layout], num_blocks, cap_blocks * BS * 8
        self._new_manager()
        self.running, self.idle, self.next_id, self.last_start = {}, {}, 0, {}

    def _new_manager(self):
        self.m = KVCacheManager(
            self.num_blocks, BS, max_model_len=MAX_LEN, layout=self.layout, kv_bytes_per_token=8
        )
        self.kv = [None] * (self.num_blocks * BS)
        self.tier = KVTier(FileStore(self.folder), FP, self.cap)
        self.m.attach_tier(self.tier, _GroupIO(self))

    restart = TierMachine.restart
    corrupt_a_file = TierMachine.corrupt_a_file
    delete_conversation = TierMachine.delete_conversation

    @invariant()
    def tier_holds_each_group_s_own_tokens(self):
        t = self.tier
        if t.stats().loads_blocks:
            event("tier load")
        entries = t.entries()
        assert FileStore(self.folder).names_on_disk() == {
            f"{i.block_hash:016x}" for i, _, _ in entries
        }
        # the cap counts what the store holds: each entry's file (header, checksum, bytes)
        assert t.bytes == sum(e.stored for e in t._index.values()) <= self.cap
        assert all(e.stored > e.nbytes for e in t._index.values())
        for ident, _, _ in entries[:6]:
            meta, data = t._parse(t.store.read(t._name(ident.block_hash)), with_data=True)
            vals = array("q", data).tolist()
            assert len({v // 1000 for v in vals}) == 1, "a tier block mixes groups"
            assert [v % 1000 for v in vals] == list(ident.token_ids)

    def teardown(self):
        try:
            super().teardown()
        finally:
            if hasattr(self, "folder"):
                shutil.rmtree(self.folder, ignore_errors=True)


GroupsTierMachine.TestCase.settings = settings.get_profile(
    os.environ.get("KV_GROUPS_HYPOTHESIS_PROFILE", "kv-groups-ci")
)
TestKVGroupsTierProperties = GroupsTierMachine.TestCase
