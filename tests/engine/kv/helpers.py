"""The block machine: random operation sequences against KVCacheManager over a simulated pool, with
the invariants checked after every step (tests/engine/kv/test_kv_cache_properties.py runs it; the
tier, groups, state-pool and fast-snapshot machines extend it), and the tier machine. Here so that
no test module imports another."""

import os
import random
import shutil
import tempfile
from array import array

from hypothesis import event, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.errors import KVCacheError, NoFreeBlocksError
from engine.kv.block_hash import hash_block_tokens
from engine.kv.kv_cache_manager import KVCacheManager
from engine.kv.tier.store import FileStore, KVTier
from engine.observe.kv_snapshot import kv_stats

# the block machine's example budgets (KV_HYPOTHESIS_PROFILE picks one; the fast-snapshot machine
# reads kv-ci too)
settings.register_profile("kv-ci", max_examples=200, stateful_step_count=100, deadline=None)
settings.register_profile("kv-dev", max_examples=30, stateful_step_count=50, deadline=None)


BS = 8
MAX_LEN = 96
SESSIONS = ["s0", "s1", "s2"]
BASES = [[(i * 7 + k) % 3 for i in range(48)] for k in range(3)]  # shared prompt stems
small_tokens = st.lists(st.integers(0, 3), max_size=12)


class KVMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(16, 48))
    def setup(self, num_blocks):
        self.m = KVCacheManager(num_blocks, BS, max_model_len=MAX_LEN)
        self.kv = [None] * (num_blocks * BS)  # simulated pool: token id stored per slot
        self.running: dict[int, list[int]] = {}  # seq id -> the engine's token list
        self.idle: dict[str, list[int]] = {}  # session -> tokens it pinned
        self.next_id = 0

    # ---- helpers -------------------------------------------------------------------------
    def fingerprint(self):
        m = self.m
        return (
            [b.ref_count for b in m.pool.blocks],
            [b.block_id for b in m.pool.iter_free()],
            {h: b.block_id for h, b in m.pool.cached.items()},
            m.parked.owners(),
            {s: (m.block_table(s), m.num_computed(s)) for s in m._seqs},
            list(m._pending),
            {k: v for k, v in kv_stats(m).to_json().items()},
        )

    def write(self, seq_id, start, end):
        """The runner's part: CoW copies first, then this step's new KV."""
        copies = self.m.take_pending_copies()
        if copies:
            event("copy-on-write")
        for src, dst in copies:
            self.kv[dst * BS : (dst + 1) * BS] = self.kv[src * BS : (src + 1) * BS]
        self.store(seq_id, start, self.running[seq_id][start:end])

    def store(self, seq_id, start, tokens):
        """The forward's KV store: `tokens` at positions start, start + 1, ..."""
        for pos, slot in zip(
            range(start, start + len(tokens)), self.m.slots_for(seq_id, start, start + len(tokens))
        ):
            self.kv[slot] = tokens[pos - start]

    def sync_sessions(self):
        """Idle sessions may be released under pressure; mirror that (never invent one)."""
        live = self.m.parked.owners()
        assert set(live) <= set(self.idle)
        if len(live) < len(self.idle):
            event("idle session released under pressure")
        self.idle = {s: self.idle[s] for s in live}

    def try_op(self, fn):
        before = self.fingerprint()
        try:
            return True, fn()
        except NoFreeBlocksError as e:
            event("NoFreeBlocksError")
            assert e.needed > e.available >= 0
            assert self.fingerprint() == before, "failed allocation changed state"
            return False, None

    # ---- rules ---------------------------------------------------------------------------
    def _add(self, tokens, num_new, session, salt):
        sid = self.next_id
        self.next_id += 1
        before = self.fingerprint()
        expect = self.m.lookup_prefix(tokens, cache_salt=salt, session_id=session)
        assert self.fingerprint() == before, "lookup_prefix changed state"
        assert 0 <= expect <= len(tokens) - 1
        if min(len(tokens), expect + num_new) > MAX_LEN:
            return
        self.running[sid] = tokens
        ok, cached = self.try_op(
            lambda: self.m.add_sequence(
                sid, tokens, num_new_tokens=num_new, cache_salt=salt, session_id=session
            )
        )
        if not ok:
            del self.running[sid]
            return
        assert cached == expect
        if cached:
            event("prefix reuse, partial block" if cached % BS else "prefix reuse, whole blocks")
        self.sync_sessions()
        self.write(sid, cached, self.m.num_computed(sid))

    @rule(
        base=st.sampled_from(range(len(BASES))),
        cut=st.integers(0, 48),
        tail=small_tokens,
        num_new=st.integers(1, 100),
        salt=st.sampled_from([None, None, "x"]),
        session=st.sampled_from([None, *SESSIONS]),
    )
    def add(self, base, cut, tail, num_new, salt, session):
        self._add(BASES[base][:cut] + tail or [0], num_new, session, salt)

    @precondition(lambda self: self.idle)
    @rule(data=st.data(), tail=small_tokens, keep=st.integers(0, 8), num_new=st.integers(1, 100))
    def add_next_turn(self, data, tail, keep, num_new):
        session = data.draw(st.sampled_from(sorted(self.idle)))
        prev = self.idle[session]
        self._add(prev[: max(1, len(prev) - keep)] + tail, num_new, session, None)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), extra=small_tokens, chunk=st.integers(1, 40))
    def allocate(self, data, extra, chunk):
        sid = data.draw(st.sampled_from(sorted(self.running)))
        toks = self.running[sid]
        toks.extend(extra)
        nc = self.m.num_computed(sid)
        n = min(chunk, len(toks) - nc)
        if nc + n > MAX_LEN:
            before = self.fingerprint()
            try:
                self.m.allocate_slots(sid, n)
                raise AssertionError("writing past max_model_len must raise")
            except KVCacheError:
                assert self.fingerprint() == before
            return
        ok, _ = self.try_op(lambda: self.m.allocate_slots(sid, n))
        if ok:
            self.sync_sessions()
            self.write(sid, nc, nc + n)

    @precondition(lambda self: self.running)
    @rule(
        data=st.data(),
        draft=st.lists(st.integers(0, 3), min_size=1, max_size=12),
        bonus=st.integers(0, 3),
    )
    def speculate(self, data, draft, bonus):
        """A speculative step (engine/core/speculation.py): slots for the last token and k drafts,
        all "written", then a random number accepted and the rest rolled back. The drafts never
        enter the token list before they are accepted, as in the engine (which drafts only at
        num_computed == len - 1; here any uncomputed tail may precede the draft)."""
        ready = sorted(s for s, t in self.running.items() if self.m.num_computed(s) < len(t))
        if not ready:
            return
        sid = data.draw(st.sampled_from(ready))
        toks = self.running[sid]
        nc, k = self.m.num_computed(sid), len(draft)
        u = len(toks) - nc  # real tokens scored before the draft
        if nc + u + k > MAX_LEN:
            return
        ok, _ = self.try_op(lambda: self.m.allocate_slots(sid, u + k))
        if not ok:
            return
        self.sync_sessions()
        copies = self.m.take_pending_copies()
        for src, dst in copies:
            self.kv[dst * BS : (dst + 1) * BS] = self.kv[src * BS : (src + 1) * BS]
        self.store(sid, nc, toks[nc:] + draft)
        a = data.draw(st.integers(0, k))
        event(f"speculative: {'all' if a == k else 'some' if a else 'none'} accepted")
        assert self.m.rollback(sid, nc + u + a) == k - a
        toks.extend(draft[:a] + [bonus])
        assert self.m.num_computed(sid) == len(toks) - 1
        for bad in (nc, len(toks) + 1):  # into hashed blocks / past what was computed: refused
            if bad < len(self.m._seqs[sid].hashes) * BS or bad > self.m.num_computed(sid):
                before = self.fingerprint()
                try:
                    self.m.rollback(sid, bad)
                    raise AssertionError("a rollback outside (hashed, computed] must raise")
                except KVCacheError:
                    assert self.fingerprint() == before

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.running)))
        child = self.next_id
        self.next_id += 1
        self.running[child] = list(self.running[parent])
        self.m.fork(parent, child, self.running[child])

    @precondition(lambda self: self.running)
    @rule(data=st.data(), how=st.sampled_from(["free", "preempt", "park"]))
    def finish(self, data, how):
        sid = data.draw(st.sampled_from(sorted(self.running)))
        toks = self.running.pop(sid)
        if how == "free":
            self.m.free(sid)
        elif how == "preempt":
            assert self.m.preempt(sid) >= 0
        else:
            session = data.draw(st.sampled_from(SESSIONS))
            nc = self.m.num_computed(sid)
            self.m.park(sid, session)
            self.idle.pop(session, None)
            self.idle[session] = toks[:nc]
        try:
            self.m.free(sid)
            raise AssertionError("double free must raise")
        except KVCacheError:
            pass

    @rule(session=st.sampled_from(SESSIONS))
    def release_parked(self, session):
        assert self.m.parked.release(session) == (session in self.idle)
        self.idle.pop(session, None)

    # ---- invariants ----------------------------------------------------------------------
    @invariant()
    def pool_is_consistent(self):
        m, pool = self.m, self.m.pool
        tables = {("seq", s): [pool.blocks[i] for i in m.block_table(s)] for s in self.running}
        for sess in m.parked:
            tables[("session", sess.session_id)] = [b for t in sess.tables for b in t.blocks]
        holders = [0] * pool.num_blocks
        for table in tables.values():
            for b in table:
                holders[b.block_id] += 1
        assert [b.ref_count for b in pool.blocks] == holders
        free = list(pool.iter_free())
        assert all(b.ref_count == 0 for b in free)
        assert len(free) == pool.num_free == holders.count(0)
        assert pool.num_free + m.num_used_blocks == pool.num_blocks
        for h, b in pool.cached.items():
            assert b.block_hash == h and hash_block_tokens(b.parent_hash, b.token_ids, b.salt) == h
            assert self.kv[b.block_id * BS : (b.block_id + 1) * BS] == list(b.token_ids)
        st_ = kv_stats(m).to_json()
        assert st_["cached_blocks"] == sum(1 for b in free if b.block_hash is not None)
        assert st_["shared_blocks"] == sum(1 for n in holders if n >= 2)
        assert st_["used_tokens"] == sum(b.filled for b in pool.blocks if b.ref_count)
        assert st_["logical_blocks"] == sum(len(t) for t in tables.values())
        assert st_["internal_fragmentation_tokens"] >= 0

    @invariant()
    def contents_match_tokens(self):
        m = self.m
        for sid, toks in self.running.items():
            nc = m.num_computed(sid)
            assert len(m.block_table(sid)) == -(-nc // BS)
            if nc:  # the last block's fill is what was computed (a rollback resets it)
                assert m.pool.blocks[m.block_table(sid)[-1]].filled == nc - (-(-nc // BS) - 1) * BS
            assert [self.kv[s] for s in m.slots_for(sid, 0, nc)] == toks[:nc]
        assert m.parked.owners() == list(self.idle)
        for sess in m.parked:
            s = sess.session_id
            slots = [
                b.block_id * BS + p % BS
                for p, b in ((p, sess.tables[0][p // BS]) for p in range(len(sess.tokens)))
            ]
            assert [self.kv[x] for x in slots] == sess.tokens == self.idle[s]
            assert len(sess.hashes) == len(sess.tokens) // BS, (
                "a parked full block is not in the prefix cache"
            )

    def teardown(self):
        if not hasattr(self, "m"):
            return
        for sid in list(self.running):
            self.m.free(sid)
        for s in list(self.idle):
            assert self.m.parked.release(s)
        st_ = kv_stats(self.m).to_json()
        assert st_["used_blocks"] == 0 and st_["free_blocks"] == self.m.num_blocks
        assert st_["used_tokens"] == 0 and st_["shared_blocks"] == 0 and not self.m.parked.owners()


# ---- the tier machine: the block machine with a file-backed KV tier --------------------------
FP = "ab" * 12


class _IO:
    def __init__(self, machine):
        self.mc = machine

    def read(self, bid):
        return array(
            "q", [-1 if t is None else t for t in self.mc.kv[bid * BS : (bid + 1) * BS]]
        ).tobytes()

    def write(self, bid, data):
        self.mc.kv[bid * BS : (bid + 1) * BS] = array("q", data).tolist()


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
        self.cap = cap_blocks * (BS * 8 + 300)  # a file: ~64 B of KV + its header
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
        from engine.kv.tier.store import owner_tag

        assert all(o != owner_tag(session) for _, _, o in self.tier.entries())
        assert all(
            b.owner != owner_tag(session) or b.ref_count for b in self.m.pool.cached.values()
        )

    @invariant()
    def tier_is_consistent(self):
        t = self.tier
        st_ = t.stats()
        for name, n in (
            ("tier load", st_.loads_blocks),
            ("tier write-back", st_.writebacks_blocks),
            ("tier swap-out", st_.swapouts_blocks),
            ("tier LRU eviction", st_.evicted_blocks),
            ("tier delete", st_.deleted_blocks),
        ):
            if n:
                event(name)
        entries = t.entries()
        assert FileStore(self.folder).names_on_disk() == {
            f"{i.block_hash:016x}" for i, _, _ in entries
        }
        on_disk = sum(
            os.path.getsize(os.path.join(self.folder, f)) for f in os.listdir(self.folder)
        )
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
