"""KVCacheManager behaviour, in the spirit of vLLM's prefix-caching tests (real objects only)."""

import json
import sys

import pytest

from engine.kv import block_hash
from engine.errors import KVCacheError, NoFreeBlocksError
from engine.kv.kv_cache_manager import KVCacheManager
from engine.observe.kv_snapshot import kv_stats, take_snapshot

BS = 8


def mgr(num_blocks=10, **kw):
    kw.setdefault("max_model_len", 1024)
    return KVCacheManager(num_blocks, BS, **kw)


def refs(m):
    return [b.ref_count for b in m.pool.blocks]


def free_ids(m):
    return [b.block_id for b in m.pool.iter_free()]


def toks(n, start=0):
    return list(range(start, start + n))


def add_all(m, sid, t, **kw):
    return m.add_sequence(sid, t, num_new_tokens=10**9, **kw)


def test_invalid_block_size_and_pool():
    for bs in (0, 4, 12, 256):
        with pytest.raises(ValueError):
            KVCacheManager(10, bs, max_model_len=64)
    with pytest.raises(ValueError):
        KVCacheManager(0, 16, max_model_len=64)


def test_deterministic_ids_and_slots():
    m = mgr()
    assert add_all(m, "a", toks(20)) == 0
    assert m.block_table("a") == [0, 1, 2] and m.num_computed("a") == 20
    assert add_all(m, "b", toks(3, 100)) == 0
    assert m.block_table("b") == [3]
    assert m.slots_for("a", 17, 18) == [2 * BS + 1]
    assert m.slots_for("a", 6, 10) == [6, 7, 8, 9]
    assert m.slots_for("b", 0, 3) == [24, 25, 26]


def test_hits_only_on_full_blocks_and_shared_refcounts():
    m = mgr()
    add_all(m, "a", toks(20))  # blocks 0,1 full (hashed), 2 partial
    assert m.lookup_prefix(toks(20) + [99]) == 16  # the partial block is never a hit
    assert add_all(m, "b", toks(20) + [99]) == 16
    assert add_all(m, "c", toks(17)) == 16
    assert m.block_table("b")[:2] == m.block_table("c")[:2] == [0, 1]
    assert refs(m)[:2] == [3, 3]  # ref_count == number of tables
    assert kv_stats(m).to_json()["shared_blocks"] == 2
    st = kv_stats(m).to_json()
    assert st["prefix_cache_queries"] == 20 + 21 + 17 and st["prefix_cache_hits"] == 32


def test_free_count_conservation_and_eviction_order():
    m = mgr()
    add_all(m, "a", toks(20))  # 0, 1, 2(partial)
    add_all(m, "b", toks(16) + toks(9, 50))  # hits 0,1; new 3(full), 4(partial)
    assert m.num_free_blocks == 5
    m.free("a")
    m.free("b")
    assert m.num_free_blocks == 10 and m.num_used_blocks == 0
    assert all(r == 0 for r in refs(m))
    # Hashless partial blocks and never-used blocks first, then b's private tail, shared head last.
    assert free_ids(m) == [4, 2, 5, 6, 7, 8, 9, 3, 1, 0]
    st = kv_stats(m).to_json()
    assert st["cached_blocks"] == 3 and st["used_tokens"] == 0 and st["logical_blocks"] == 0


def test_full_hit_is_capped_to_leave_one_token():
    m = mgr()
    add_all(m, "a", toks(16))
    m.free("a")
    assert m.lookup_prefix(toks(16)) == 8  # (16-1)//8 blocks
    assert add_all(m, "b", toks(16)) == 8
    assert m.block_table("b") == [0, 2]  # block 1 recomputed into a fresh block
    assert m.num_computed("b") == 16
    assert m.lookup_prefix(toks(17)) == 16


def test_hit_revives_cached_block_from_middle_of_free_list():
    m = mgr(6)
    add_all(m, "x", toks(8, 500))  # block 0
    add_all(m, "a", toks(9))  # 1 (hashed), 2 (partial)
    add_all(m, "y", toks(8, 700))  # block 3
    for s in ("x", "y", "a"):
        m.free(s)
    assert free_ids(m) == [2, 4, 5, 0, 3, 1]
    add_all(m, "b", toks(8, 500) + [1])  # hit on block 0, in the middle
    assert m.block_table("b") == [0, 2]
    assert free_ids(m) == [4, 5, 3, 1]
    assert kv_stats(m).to_json()["cached_blocks"] == 2


def test_reused_evicted_block_loses_hash_and_is_no_longer_a_hit():
    m = mgr(3)
    add_all(m, "a", toks(17))  # 0,1 hashed, 2 partial
    m.free("a")
    assert m.lookup_prefix(toks(17)) == 16
    add_all(m, "b", toks(17, 100))  # needs 3 blocks: evicts everything
    assert sorted(m.block_table("b")) == [0, 1, 2]
    assert m.pool.blocks[0].block_hash != block_hash.hash_block_tokens(None, tuple(toks(8)), None)
    m.free("b")
    assert m.lookup_prefix(toks(17)) == 0
    assert m.lookup_prefix(toks(17, 100)) == 16


def state(m):
    tables = {s: m.block_table(s) for s in list(m._seqs)}
    return (
        refs(m),
        free_ids(m),
        dict(m.pool.cached),
        kv_stats(m).to_json(),
        m.parked.owners(),
        tables,
        [m.num_computed(s) for s in tables],
    )


def test_failed_allocation_changes_nothing():
    m = mgr(6)
    add_all(m, "a", toks(17))  # 0,1,2
    m.free("a")  # free list [2,3,4,5,1,0]; 0,1 cached
    add_all(m, "b", toks(20, 300))  # takes 2, 3, 4
    m.park("b", "s")
    before = state(m)
    with pytest.raises(NoFreeBlocksError) as e:  # 2 hits + 5 new; 1 free + 3 from session
        m.add_sequence("c", toks(16) + toks(38, 900), num_new_tokens=100)
    assert (e.value.needed, e.value.available) == (5, 4)
    assert state(m) == before and not m.has_sequence("c")
    add_all(m, "d", toks(8, 50))  # takes 5, the only never-used block
    before = state(m)
    with pytest.raises(NoFreeBlocksError) as e:  # 6 new; 2 cached-free + 3 from session
        m.allocate_slots("d", 48)
    assert (e.value.needed, e.value.available) == (6, 5)
    assert state(m) == before
    m.allocate_slots("d", 40)  # 5 fit: the idle session is released
    assert m.parked.owners() == [] and m.num_free_blocks == 0


def test_copy_on_write_exactly_once():
    m = mgr()
    parent = toks(20)
    add_all(m, "p", parent)
    child = list(parent)
    m.fork("p", "c", child)
    assert refs(m)[:3] == [2, 2, 2] and m.take_pending_copies() == []
    child.append(7)
    m.allocate_slots("c", 1)
    assert m.take_pending_copies() == [(2, 3)]
    assert m.take_pending_copies() == []
    assert m.block_table("p") == [0, 1, 2]
    assert m.block_table("c") == [0, 1, 3]
    assert refs(m)[:4] == [2, 2, 1, 1]
    parent.append(8)
    m.allocate_slots("p", 1)  # block 2 is private now: no second copy
    child.extend([1, 2, 3])
    m.allocate_slots("c", 3)
    assert m.take_pending_copies() == [] and m.block_table("p") == [0, 1, 2]
    assert kv_stats(m).to_json()["used_tokens"] == 16 + 5 + 8


def test_pending_copy_dropped_when_destination_is_freed():
    m = mgr()
    t = toks(12)
    add_all(m, "p", t)
    m.fork("p", "c", list(t) + [1])
    m.allocate_slots("c", 1)
    m.preempt("c")
    assert m.take_pending_copies() == []


def test_hash_collision_is_never_a_hit(monkeypatch):
    monkeypatch.setattr(block_hash, "hash_block_tokens", lambda parent, t, salt: 42)
    m = mgr()
    add_all(m, "a", toks(24))
    m.free("a")
    assert m.lookup_prefix(toks(24, 1)) == 0  # same hash, other tokens
    assert m.lookup_prefix(toks(24)) == 8  # only the one truly registered block
    assert add_all(m, "b", toks(24, 1)) == 0


def test_collision_with_other_parent_is_never_a_hit(monkeypatch):
    monkeypatch.setattr(block_hash, "hash_block_tokens", lambda parent, t, salt: hash(t))
    m = mgr()
    a, b = toks(8), toks(8, 40)
    add_all(m, "x", a + b + [1])
    m.free("x")
    assert m.lookup_prefix(a + b + [1]) == 16
    assert m.lookup_prefix(b + b + [1]) == 0  # b's block sits at another position


def test_cache_salt_separates_caches():
    m = mgr()
    add_all(m, "a", toks(17), cache_salt="alice")
    assert m.lookup_prefix(toks(17)) == 0
    assert m.lookup_prefix(toks(17), cache_salt="bob") == 0
    assert m.lookup_prefix(toks(17), cache_salt="alice") == 16


def test_prefix_caching_disabled():
    m = mgr(enable_prefix_caching=False)
    add_all(m, "a", toks(17))
    m.park("a", "s")
    assert m.parked.owners() == [] and m.num_used_blocks == 0
    assert m.lookup_prefix(toks(17)) == 0 and m.pool.cached == {}


def run_turn(m, sid, tokens, new, session=None):
    """Prefill then decode `new` tokens the way the engine does; the last one is not computed."""
    cached = add_all(m, sid, tokens, session_id=session)
    for i in range(new):
        tokens.append(1000 + i)
        if i < new - 1:
            m.allocate_slots(sid, 1)
    return cached


def test_session_park_and_adopt_reuses_to_the_token():
    m = mgr(12)
    turn1 = toks(13)
    run_turn(m, "t1", turn1, 9)  # 13 + 8 computed = 21 tokens, 3 blocks
    table = m.block_table("t1")
    m.park("t1", "chat")
    assert m.parked.owners() == ["chat"] and m.num_used_blocks == 3
    turn2 = turn1 + toks(5, 200)  # prompt includes the uncomputed last token
    assert m.lookup_prefix(turn2) == 16  # blocks only
    assert m.lookup_prefix(turn2, session_id="chat") == 21
    assert run_turn(m, "t2", turn2, 1, session="chat") == 21
    assert m.block_table("t2")[:3] == table and m.parked.owners() == []
    assert refs(m)[:3] == [1, 1, 1]  # ownership moved, no extra refs
    st = kv_stats(m).to_json()
    assert st["prefix_cache_hits"] == 21 and st["logical_blocks"] == st["used_blocks"] == 4


def test_session_divergence_frees_tail_and_unhashes_overwritten_block():
    m = mgr(12)
    t = toks(28)
    add_all(m, "a", t)  # 0,1,2 hashed, 3 partial
    m.park("a", "s")
    edited = toks(20) + [7, 7, 7]
    assert add_all(m, "b", edited, session_id="s") == 20
    assert m.block_table("b") == [0, 1, 2]
    assert m.pool.blocks[3].ref_count == 0  # the session's tail went back
    assert m.lookup_prefix(t) == 16  # block 2 was overwritten: no stale hit
    assert m.take_pending_copies() == []


def test_session_shared_partial_block_is_copied():
    m = mgr(12)
    t = toks(12)
    add_all(m, "a", t)
    m.fork("a", "child", list(t))
    m.park("a", "s")
    assert add_all(m, "b", t + [5, 5], session_id="s") == 12
    assert m.take_pending_copies() == [(1, 2)]
    assert m.block_table("child") == [0, 1] and m.block_table("b") == [0, 2]


def test_idle_sessions_released_lru_under_pressure():
    m = mgr(8)
    for s in ("s1", "s2", "s3"):
        add_all(m, s, toks(12, ord(s[1]) * 100))  # 2 blocks each
        m.park(s, s)
    assert m.num_free_blocks == 2
    with pytest.raises(NoFreeBlocksError):  # 9 blocks can never fit: nothing released
        add_all(m, "big", toks(72, 5000))
    assert m.parked.owners() == ["s1", "s2", "s3"]
    add_all(m, "x", toks(25, 7000))  # 4 blocks: releases s1 only
    assert m.parked.owners() == ["s2", "s3"]
    # Reusing s2 (the LRU one) while short of blocks: s3 goes, s2 is adopted, not released.
    assert add_all(m, "y", toks(12, 5000) + toks(20, 9000), session_id="s2") == 12
    assert m.parked.owners() == [] and m.block_table("y")[:2] == [2, 3]


def test_session_reuse_of_identical_tokens_leaves_one_token():
    m = mgr()
    t = toks(16)
    add_all(m, "a", t)
    m.park("a", "s")
    assert m.lookup_prefix(t, session_id="s") == 15
    assert add_all(m, "b", list(t), session_id="s") == 15
    assert m.block_table("b") == [0, 1] and m.num_computed("b") == 16
    assert m.take_pending_copies() == []  # private block: rewritten in place
    assert m.lookup_prefix(t + [1]) == 16  # unhashed before the write, rehashed after


def test_copy_on_write_counts_toward_capacity():
    m = mgr(3)
    t = toks(12)
    add_all(m, "a", t)
    m.fork("a", "b", t + toks(8, 50))
    before = state(m)
    with pytest.raises(NoFreeBlocksError) as e:  # CoW block + 1 new block, only 1 free
        m.allocate_slots("b", 8)
    assert (e.value.needed, e.value.available) == (2, 1) and state(m) == before
    m.allocate_slots("b", 4)
    assert m.take_pending_copies() == [(1, 2)] and m.block_table("b") == [0, 2]


def test_misuse_errors_name_the_sequence():
    m = mgr(max_model_len=24)
    add_all(m, "a", toks(20))
    with pytest.raises(KVCacheError, match="'a'"):
        add_all(m, "a", toks(3))
    with pytest.raises(KVCacheError, match="max_model_len"):
        m.allocate_slots("a", 5)
    with pytest.raises(KVCacheError, match="'long'"):
        add_all(m, "long", toks(30))
    with pytest.raises(KVCacheError, match="'zz'"):
        m.allocate_slots("zz", 1)
    with pytest.raises(KVCacheError):
        m.fork("a", "a", [])
    with pytest.raises(KVCacheError):
        m.slots_for("a", 24, 25)
    m.free("a")
    with pytest.raises(KVCacheError, match="'a'"):
        m.free("a")
    with pytest.raises(KVCacheError):
        m.preempt(12345)
    assert m.parked.release("nope") is False and m.num_used_blocks == 0


def test_preempt_counts_and_records():
    m = mgr()
    add_all(m, 7, toks(11))
    assert m.preempt(7) == 11
    st = kv_stats(m).to_json()
    assert st["num_preemptions"] == 1 and st["used_blocks"] == 0
    ev = list(m.preemption_events)
    assert ev[0]["seq_id"] == 7 and ev[0]["tokens_lost"] == 11 and ev[0]["time"] > 0


STATS_KEYS = set(
    """block_size total_blocks free_blocks used_blocks cached_blocks shared_blocks
peak_used_blocks logical_blocks kv_bytes_per_token kv_bytes_per_block kv_capacity_tokens used_tokens
prefix_cache_queries prefix_cache_hits num_preemptions savings_vs_unshared savings_vs_contiguous
num_sequences num_idle_sessions internal_fragmentation_tokens""".split()
)


def test_stats_values():
    m = mgr(10, max_model_len=64, kv_bytes_per_token=100)
    assert STATS_KEYS <= set(kv_stats(m).to_json())
    assert (
        kv_stats(m).to_json()["savings_vs_unshared"] == 0
        and kv_stats(m).to_json()["savings_vs_contiguous"] == 0
    )
    t = toks(12)
    add_all(m, "a", t)
    m.fork("a", "b", list(t))
    st = kv_stats(m).to_json()
    assert (st["used_blocks"], st["logical_blocks"], st["shared_blocks"]) == (2, 4, 2)
    assert st["savings_vs_unshared"] == 0.5 and st["savings_vs_contiguous"] == 1 - 2 / 16
    assert st["used_tokens"] == 12 and st["internal_fragmentation_tokens"] == 4
    assert st["kv_bytes_per_block"] == 800 and st["kv_capacity_tokens"] == 80
    m.free("a")
    m.free("b")
    assert (
        kv_stats(m).to_json()["peak_used_blocks"] == 2
        and kv_stats(m).to_json()["cached_blocks"] == 1
    )


def test_snapshot_shape_and_json():
    m = mgr()
    t = toks(12)
    add_all(m, "a", t)
    m.fork("a", "b", list(t))
    m.park("a", "s")
    add_all(m, "c", toks(9, 60))
    m.free("c")
    snap = json.loads(json.dumps(take_snapshot(m).to_json()))
    assert snap["blocks"]["state"][:4] == ["used", "used", "cached", "free"]
    assert snap["blocks"]["ref_count"][:4] == [2, 2, 0, 0]
    assert snap["blocks"]["filled"][:4] == [8, 4, 8, 0]
    assert snap["owners"] == {"0": ["b", "s"], "1": ["b", "s"]}
    run, idle = snap["sequences"]
    assert run["seq_id"] == "b" and run["state"] == "running" and run["shared"] == [True, True]
    assert idle["seq_id"] is None and idle["session_id"] == "s" and idle["state"] == "idle_session"
    assert idle["last_block_filled"] == 4 and idle["block_table"] == [0, 1]


def _snapshot_python_work(num_blocks: int, seq_len: int) -> int:
    """Python events (calls, lines, returns) of one snapshot of 64 sequences of seq_len tokens."""
    m = KVCacheManager(num_blocks, 16, max_model_len=4096)
    for i in range(64):
        m.add_sequence(i, toks(seq_len, i * 10_000), num_new_tokens=seq_len)
    events = [0]

    def trace(frame, event, arg):
        events[0] += 1
        return trace

    sys.settrace(trace)
    try:
        take_snapshot(m).to_json()
    finally:
        sys.settrace(None)
    return events[0]


def test_snapshot_is_cheap_at_10k_blocks():
    """The snapshot's per-block work is numpy's: its Python work is the same for a 1,000-block pool
    as for a 10,000-block one with ten times the blocks held (a per-block Python loop, or a call
    per block, would make it grow ~10x). Counted, not timed, so a busy machine cannot fail it."""
    small, big = _snapshot_python_work(1_000, 240), _snapshot_python_work(10_000, 2_400)
    assert big <= small * 1.05 + 50, (small, big)
