"""Property test: random fork / free / append sequences shaped like beam search, run through the
same reshape_beams the engine uses, against the real KVCacheManager.

After every step: each block's refcount equals the number of live block tables holding it, the
free list and counters agree, every beam reads back exactly its own tokens from a simulated KV pool
(so a missing or extra copy-on-write shows), and the copies handed to the runner equal the forks
made inside a partial block. At the end, freeing the beams returns every block.
"""

from collections import Counter

from hypothesis import event, given, settings, strategies as st

from engine.core.beam_search import reshape_beams
from engine.kv.kv_cache_manager import KVCacheManager
from engine.observe.kv_snapshot import kv_stats

BS = 8


class _B:
    def __init__(self, seq_id, token_ids):
        self.seq_id, self.token_ids = seq_id, token_ids


class _Sim:
    def __init__(self, num_blocks, caching):
        self.m = KVCacheManager(num_blocks, BS, max_model_len=4096, enable_prefix_caching=caching)
        self.kv = [None] * (num_blocks * BS)
        self.next_id = 0
        self.copies = 0

    def new_id(self):
        self.next_id += 1
        return self.next_id

    def write(self, b, start, end):
        """The runner's part of a step: pending copies first, then the new tokens' KV."""
        copies = self.m.take_pending_copies()
        self.copies += len(copies)
        for src, dst in copies:
            self.kv[dst * BS : (dst + 1) * BS] = self.kv[src * BS : (src + 1) * BS]
        for pos, slot in zip(range(start, end), self.m.slots_for(b.seq_id, start, end)):
            self.kv[slot] = b.token_ids[pos]

    def check(self, beams):
        m = self.m
        holders = Counter(bid for b in beams for bid in m.block_table(b.seq_id))
        for blk in m.pool.blocks:
            assert blk.ref_count == holders.get(blk.block_id, 0), blk
        assert len(list(m.pool.iter_free())) == m.pool.num_free == m.num_blocks - len(holders)
        assert kv_stats(m).to_json()["shared_blocks"] == sum(1 for c in holders.values() if c >= 2)
        for b in beams:
            n = m.num_computed(b.seq_id)
            assert [self.kv[s] for s in m.slots_for(b.seq_id, 0, n)] == b.token_ids[:n], "wrong KV"


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    k=st.integers(1, 4),
    prompt=st.lists(st.integers(0, 2), min_size=1, max_size=40),
    steps=st.integers(1, 30),
    caching=st.booleans(),
)
def test_beam_shaped_fork_free_append_never_leaks(data, k, prompt, steps, caching):
    sim = _Sim(num_blocks=128, caching=caching)
    m = sim.m
    root = _B(sim.new_id(), list(prompt))
    m.add_sequence(root.seq_id, root.token_ids, num_new_tokens=len(prompt))
    sim.write(root, 0, len(prompt))
    beams = [root]
    for _ in range(steps):
        width = data.draw(st.integers(1, k), label="beams kept")
        picks = [
            (data.draw(st.integers(0, len(beams) - 1)), data.draw(st.integers(0, 2)))
            for _ in range(width)
        ]
        first = picks[0][0]
        picks.sort(key=lambda p: p[0] != first)  # any order is legal; vary it a little
        parent_ctx = {b.seq_id: m.num_computed(b.seq_id) for b in beams}
        copies_before = sim.copies

        def new_child(parent):
            return _B(sim.new_id(), list(parent.token_ids))

        beams, forked, freed = reshape_beams(m, beams, picks, new_child)
        if freed:
            event("a beam without children freed")
        divergences = sum(1 for parent, _ in forked if parent_ctx[parent.seq_id] % BS)
        for b in beams:  # the next engine step: one token per beam
            nc = m.num_computed(b.seq_id)
            m.allocate_slots(b.seq_id, len(b.token_ids) - nc)
            sim.write(b, nc, len(b.token_ids))
        assert sim.copies - copies_before == divergences
        if divergences:
            event("copy-on-write of a partial block")
        if (
            data.draw(st.integers(0, 9), label="preempt") == 0
        ):  # recompute one beam, like the scheduler
            b = data.draw(st.sampled_from(beams))
            m.preempt(b.seq_id)
            cached = m.add_sequence(b.seq_id, b.token_ids, num_new_tokens=len(b.token_ids))
            event("beam recomputed, prefix reused" if cached else "beam recomputed from scratch")
            sim.write(b, cached, len(b.token_ids))
        sim.check(beams)
    for b in beams:
        m.free(b.seq_id)
    assert m.num_used_blocks == 0 and m.pool.num_free == m.num_blocks
    assert all(blk.ref_count == 0 for blk in m.pool.blocks)
