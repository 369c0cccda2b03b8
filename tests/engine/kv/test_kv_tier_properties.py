"""Random add / append / fork / free / preempt / park / evict / load / corrupt / restart / delete
sequences against KVCacheManager with a file-backed KV tier, checking after every step:

- everything tests/engine/kv/test_kv_cache_properties.py checks (refcounts, free list, cached map,
  counters, and the simulated pool: every slot holds the token whose KV it should hold, so a block
  loaded from the tier with the wrong bytes shows);
- the tier: its index equals the files on disk, its byte count equals the files' sizes and stays
  within capacity, the folder never held more than the capacity right after any write (issue
  48.7), every entry's bytes are exactly its block's token ids, salted chains keep their salt, and
  a corrupted file is dropped when read, never loaded.
The simulated pool is a list of token ids; the tier stores a block's slots as int64 bytes.
"""
import os
import random
import shutil
import tempfile
from array import array

from hypothesis import event, settings, strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from engine.kv.kv_cache_manager import KVCacheManager
from engine.kv.kv_tier import FileStore, KVTier
from tests.engine.kv.test_kv_cache_properties import BS, MAX_LEN, KVMachine

settings.register_profile("tier-ci", max_examples=80, stateful_step_count=100, deadline=None)
FP = "ab" * 12


class _IO:
    def __init__(self, machine):
        self.mc = machine

    def read(self, bid):
        return array("q", [-1 if t is None else t for t in self.mc.kv[bid * BS:(bid + 1) * BS]]).tobytes()

    def write(self, bid, data):
        self.mc.kv[bid * BS:(bid + 1) * BS] = array("q", data).tolist()


class _MeasuredStore(FileStore):
    """The real FileStore; the folder's largest size right after a write is kept."""
    peak = 0

    def write(self, name, payload):
        super().write(name, payload)
        size = sum(os.path.getsize(os.path.join(self.folder, f)) for f in os.listdir(self.folder))
        self.peak = max(self.peak, size)


class TierMachine(KVMachine):
    @initialize(num_blocks=st.integers(12, 32), cap_blocks=st.integers(4, 40))
    def setup(self, num_blocks, cap_blocks):
        self.folder = tempfile.mkdtemp(prefix="kvtier-prop-")
        self.cap = cap_blocks * (BS * 8 + 300)     # a file: ~64 B of KV + its header
        self.num_blocks = num_blocks
        self._new_manager()
        self.running, self.idle, self.next_id = {}, {}, 0

    def _new_manager(self):
        self.m = KVCacheManager(self.num_blocks, BS, max_model_len=MAX_LEN, kv_bytes_per_token=8)
        self.kv = [None] * (self.num_blocks * BS)
        self.tier = KVTier(_MeasuredStore(self.folder), FP, self.cap)
        self.m.attach_tier(self.tier, _IO(self))

    @precondition(lambda self: len(self.tier))
    @rule()
    def restart(self):
        """The process ends (nothing is freed: the pool is simply gone) and a new one starts."""
        before = {(i.block_hash, i.token_ids) for i, _, _ in self.tier.entries()}
        self._new_manager()
        self.running, self.idle = {}, {}
        assert {(i.block_hash, i.token_ids) for i, _, _ in self.tier.entries()} == before
        assert self.tier.restored == len(before)
        event("restart with tier blocks")

    @precondition(lambda self: len(self.tier))
    @rule(r=st.randoms(use_true_random=False))
    def corrupt_a_file(self, r: random.Random):
        ident, _, _ = r.choice(self.tier.entries())
        path = os.path.join(self.folder, f"{ident.block_hash:016x}.kv")
        raw = bytearray(open(path, "rb").read())
        raw[r.randrange(len(raw))] ^= 1 << r.randrange(8)
        open(path, "wb").write(bytes(raw))
        assert self.tier.get(ident) is None, "a corrupted tier file was served"
        assert ident.block_hash not in self.tier
        event("corrupted file dropped")

    @rule(session=st.sampled_from(["s0", "s1", "s2"]))
    def delete_conversation(self, session):
        self.m.forget_owner(session)
        self.idle.pop(session, None)
        from engine.kv.kv_tier import owner_tag
        assert all(o != owner_tag(session) for _, _, o in self.tier.entries())
        assert all(b.owner != owner_tag(session) or b.ref_count for b in self.m.pool.cached.values())

    @invariant()
    def tier_is_consistent(self):
        t = self.tier
        st_ = t.stats()
        for name, n in (("tier load", st_.loads_blocks), ("tier write-back", st_.writebacks_blocks),
                        ("tier swap-out", st_.swapouts_blocks), ("tier LRU eviction", st_.evicted_blocks),
                        ("tier delete", st_.deleted_blocks)):
            if n:
                event(name)
        entries = t.entries()
        assert FileStore(self.folder).names_on_disk() == {f"{i.block_hash:016x}" for i, _, _ in entries}
        on_disk = sum(os.path.getsize(os.path.join(self.folder, f)) for f in os.listdir(self.folder))
        assert t.bytes == on_disk <= self.cap and t.store.peak <= self.cap
        for ident, n, _ in entries:
            assert n == BS * 8
        # bytes are exactly the block's tokens (read without disturbing the LRU order via the store)
        for ident, _, _ in entries[:4]:
            payload = t.store.read(t._name(ident.block_hash))
            meta, data = t._parse(payload, with_data=True)
            assert array("q", data).tolist() == list(ident.token_ids)

    def teardown(self):
        try:
            super().teardown()
        finally:
            if hasattr(self, "folder"):
                shutil.rmtree(self.folder, ignore_errors=True)


TierMachine.TestCase.settings = settings.get_profile(os.environ.get("KV_TIER_HYPOTHESIS_PROFILE", "tier-ci"))
TestKVTierProperties = TierMachine.TestCase
