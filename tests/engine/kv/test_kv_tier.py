"""The second KV tier's store and index (engine/kv/tier/store.py) on a real folder: permissions, the
checksum and identity checks, the fingerprint folder, LRU capacity, reopen after a restart,
deleting a conversation's blocks; and the manager's use of it with a simulated pool."""

import os
import stat

import pytest

from engine.kv.tier.store import BlockIdentity, FileStore, KVTier, MemoryStore, owner_tag
from engine.kv.prefix_salt import SharedPrefixSalt
from engine.observe.kv_snapshot import kv_stats
from tests.engine.kv.tier_sim import FP, manager_with_tier, run_turn, tier_at


def ident(h, toks=(1, 2, 3, 4), parent=None, salt=None):
    return BlockIdentity.of(h, parent, toks, salt)


def test_folder_0700_files_0600_and_roundtrip(tmp_path):
    old = os.umask(0o022)
    try:
        t = tier_at(tmp_path / "t")
        assert t.put(ident(7), b"x" * 100, owner="u")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "t").st_mode) == 0o700
    files = os.listdir(tmp_path / "t")
    assert len(files) == 1 and stat.S_IMODE(os.stat(tmp_path / "t" / files[0]).st_mode) == 0o600
    assert t.get(ident(7)) == b"x" * 100
    assert t.get(ident(7, toks=(9, 9, 9, 9))) is None  # same hash, other tokens: never served
    assert t.get(ident(7, salt="alice")) is None  # same hash, other salt
    assert t.stats().hits_blocks == 1


@pytest.mark.parametrize("damage", ["flip_data", "flip_header", "truncate"])
def test_corrupt_or_torn_file_is_detected_and_dropped(tmp_path, damage):
    t = tier_at(tmp_path)
    t.put(ident(5), bytes(range(200)))
    path = tmp_path / f"{5:016x}.kv"
    raw = bytearray(path.read_bytes())
    if damage == "flip_data":
        raw[-3] ^= 0xFF
    elif damage == "flip_header":
        raw[20] ^= 0x01
    else:
        raw = raw[: len(raw) // 2]
    path.write_bytes(bytes(raw))
    assert t.get(ident(5)) is None
    assert t.stats().dropped_corrupt == 1 and len(t) == 0 and not path.exists()


def test_reopen_finds_blocks_and_other_fingerprints_never_load(tmp_path):
    t = tier_at(tmp_path)
    for h in range(3):
        t.put(ident(h, toks=(h,) * 4), bytes([h]) * 64, owner=owner_tag("conv"))
    again = tier_at(tmp_path)
    assert again.restored == 3 and again.bytes == _disk_bytes(tmp_path) == t.bytes
    assert again.get(ident(1, toks=(1,) * 4)) == bytes([1]) * 64
    other = tier_at(tmp_path, fp="0" * 24)  # same folder, another model: nothing is used
    assert other.restored == 0 and other.get(ident(2, toks=(2,) * 4)) is None


def test_leftover_tmp_file_of_a_crash_is_removed(tmp_path):
    tier_at(tmp_path).put(ident(1), b"a" * 10)
    (tmp_path / "00000000000000ff.kv.tmp").write_bytes(b"half")
    assert tier_at(tmp_path).restored == 1 and not (tmp_path / "00000000000000ff.kv.tmp").exists()


def _disk_bytes(folder) -> int:
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


class _MeasuredStore(FileStore):
    """A real FileStore that records the folder's size right after every write (the new file and
    every old one are on disk at that moment)."""

    def __init__(self, folder):
        super().__init__(folder)
        self.sizes = []

    def write(self, name, payload):
        super().write(name, payload)
        self.sizes.append(_disk_bytes(self.folder))


def test_capacity_is_lru_and_never_exceeded(tmp_path):
    one = len(tier_at(tmp_path / "probe")._payload(ident(0), b"z" * 100, None))  # a file's size
    store = _MeasuredStore(str(tmp_path / "t"))
    t = KVTier(store, FP, 3 * one)
    for h in range(3):
        t.put(ident(h), b"z" * 100)
    t.get(ident(0))  # 0 is now the most recently used
    t.put(ident(3), b"z" * 100)
    assert [e[0].block_hash for e in t.entries()] == [2, 0, 3]
    assert store.names_on_disk() == {f"{h:016x}" for h in (0, 2, 3)}
    # issue 48.7: the folder never holds more than the cap, not even right after a write (the
    # old order wrote the 4th file, then shrank: 4 files for a moment)
    assert store.sizes == [one, 2 * one, 3 * one, 3 * one]
    assert t.bytes == _disk_bytes(store.folder) == 3 * one
    assert not t.put(ident(9), b"z" * (3 * one))  # bigger than the whole tier


def test_delete_owner_removes_only_that_conversations_files(tmp_path):
    t = tier_at(tmp_path)
    t.put(ident(1), b"a", owner=owner_tag("c1"))
    t.put(ident(2), b"b", owner=owner_tag("c2"))
    t.put(ident(3), b"c", owner=None)  # shared (system prompt)
    assert t.delete_owner("c1") == 1
    assert FileStore(str(tmp_path)).names_on_disk() == {f"{2:016x}", f"{3:016x}"}


def test_memory_store_is_not_persistent():
    t = KVTier(MemoryStore(), FP, 1000, kind="host")
    t.put(ident(1), b"q" * 10)
    assert t.get(ident(1)) == b"q" * 10 and t.stats().kind == "host"


def test_evicted_blocks_come_back_from_the_tier_with_their_exact_content(tmp_path):
    m, io = manager_with_tier(tmp_path, num_blocks=6)
    a = list(range(100, 141))  # 41 tokens: 5 full blocks + 1
    assert run_turn(m, io, "a", a) == 0
    m.free("a")
    b = list(range(500, 541))  # evicts all of a's cached blocks
    run_turn(m, io, "b", b)
    m.free("b")
    assert m.tier_link.tier.stats().writebacks_blocks == 5
    assert run_turn(m, io, "a2", a) == 40  # every full block loaded, the last token computed
    assert [io.kv[s] for s in m.slots_for("a2", 0, 41)] == a
    assert kv_stats(m).tier_loaded_tokens == 40
    m.free("a2")


def test_salted_blocks_stay_salted_in_the_tier(tmp_path):
    m, io = manager_with_tier(tmp_path, num_blocks=6)
    toks = list(range(41))
    run_turn(m, io, "x", toks, salt="alice")
    m.free("x")
    run_turn(m, io, "y", list(range(900, 941)))
    m.free("y")
    assert run_turn(m, io, "bob", toks, salt="bob") == 0  # another user: no hit, even from disk
    m.free("bob")
    run_turn(m, io, "z", list(range(700, 741)))
    m.free("z")
    assert run_turn(m, io, "alice", toks, salt="alice") == 40
    m.free("alice")


def test_swap_on_preempt_then_resume_loads_instead_of_recomputing(tmp_path):
    m, io = manager_with_tier(tmp_path, num_blocks=6)
    toks = list(range(33))
    run_turn(m, io, "s", toks)
    lost = m.preempt("s")
    assert lost == 1  # 4 full blocks swapped out, 1 token to redo
    ev = m.preemption_events[-1]
    assert ev["mode"] == "swap" and ev["tokens_swapped"] == 32
    run_turn(m, io, "other", list(range(300, 341)))  # the pool forgets everything
    m.free("other")
    assert run_turn(m, io, "s", toks) == 32
    assert [io.kv[s] for s in m.slots_for("s", 0, 33)] == toks
    m.free("s")


def test_delete_conversation_removes_its_private_blocks_from_pool_and_disk(tmp_path):
    m, io = manager_with_tier(tmp_path, num_blocks=16)
    system = list(range(16))  # 2 shared blocks
    salt = SharedPrefixSalt("alice", 16)
    toks = system + list(range(50, 75))
    run_turn(m, io, "t1", toks, session="conv", salt=salt)
    m.park("t1", "conv")  # write-through: 5 blocks on disk
    names = FileStore(str(tmp_path)).names_on_disk()
    assert len(names) == 5
    m.forget_owner("conv")
    left = FileStore(str(tmp_path)).names_on_disk()
    assert len(left) == 2  # only the shared system prompt's blocks
    assert all(b.owner is None for b in m.pool.cached.values())
    assert {f"{b.block_hash:016x}" for b in m.pool.cached.values()} == left


def test_a_graceful_stop_keeps_the_pools_cached_blocks_and_a_restart_loads_them(tmp_path):
    """Issue 47: a finished request's blocks are only cached in the pool; save_pool (run when the
    engine stops) writes them, newest first, and a new manager on the same folder loads them."""
    m, io = manager_with_tier(tmp_path, num_blocks=16)
    a, b = list(range(100, 141)), list(range(300, 325))  # 5 and 3 full blocks
    run_turn(m, io, "a", a)
    m.free("a")
    run_turn(m, io, "b", b)
    m.free("b")
    assert m.tier_link.tier.stats().blocks == 0  # nothing evicted, nothing written yet
    newest = list(m.pool.iter_cached_newest())  # the reverse of eviction order: a finished
    assert len(newest) == 8 and newest[0].token_ids == tuple(b[:8])  # request frees tail first
    assert m.tier_link.save_pool(m.pool, budget_s=0.0)["left"] == 8  # no time: nothing written
    got = m.tier_link.save_pool(m.pool, budget_s=5.0)
    assert (got["saved"], got["already"], got["left"]) == (8, 0, 0)
    m2, io2 = manager_with_tier(tmp_path, num_blocks=16)  # the next start
    assert run_turn(m2, io2, "a2", a) == 40
    assert [io2.kv[s] for s in m2.slots_for("a2", 0, 41)] == a
