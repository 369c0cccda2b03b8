"""Pinned prefixes in the KV manager (engine/kv/pinning.py): refcounts, eviction, cap, unpin.
Real manager and pool objects only; no model."""

import pytest

from engine.errors import NoFreeBlocksError
from engine.kv.kv_cache_manager import KVCacheManager
from engine.kv.pinning import PinCapError, PinMissError
from engine.observe.kv_snapshot import kv_stats, take_snapshot

BS = 8


def toks(n, start=0):
    return list(range(start, start + n))


def prefilled(num_blocks=40, prompt=toks(32), **kw):
    """A manager where `prompt` was computed once by a finished request (cached-free now)."""
    m = KVCacheManager(num_blocks, BS, max_model_len=4096, **kw)
    m.add_sequence("prefill", prompt, num_new_tokens=len(prompt))
    m.free("prefill")
    return m


def ref(m, i):
    return m.pool.blocks[i].ref_count


def test_pin_refcounts_with_and_without_conversations():
    m = prefilled(max_pin_fraction=0.5)
    assert kv_stats(m).used_blocks == 0 and kv_stats(m).cached_blocks == 4
    info = m.pins.pin("policy", toks(32))
    assert info.block_ids == (0, 1, 2, 3) and info.num_tokens == 32
    assert [ref(m, i) for i in info.block_ids] == [1, 1, 1, 1]  # held by the app alone
    st = kv_stats(m)
    assert st.used_blocks == 4 and st.pinned_blocks == 4 and st.num_sequences == 0
    # three chats attach: refcount + 1 each, only their own tokens computed
    for k in range(3):
        assert (
            m.add_sequence(f"c{k}", toks(32) + toks(5, 1000 + 10 * k), num_new_tokens=10**9) == 32
        )
        assert m.block_table(f"c{k}")[:4] == [0, 1, 2, 3]
    assert [ref(m, i) for i in info.block_ids] == [4, 4, 4, 4]
    assert kv_stats(m).used_blocks == 4 + 3
    for k in range(3):
        m.free(f"c{k}")
    assert [ref(m, i) for i in info.block_ids] == [1, 1, 1, 1]  # still pinned, no chat open
    snap = take_snapshot(m)
    assert [snap.blocks.state[i] for i in range(5)] == ["pinned"] * 4 + [
        "free"
    ]  # partial tail: no hash
    assert snap.to_json()["pins"] == [
        {"name": "policy", "num_tokens": 32, "block_table": [0, 1, 2, 3]}
    ]


def test_pin_survives_pressure_that_evicts_everything_else():
    m = prefilled(num_blocks=20, prompt=toks(16), max_pin_fraction=0.5)
    m.pins.pin("p", toks(16))  # blocks 0, 1
    m.add_sequence("other", toks(24, 500), num_new_tokens=24)
    m.free("other")  # 3 more cached-free blocks
    assert kv_stats(m).cached_blocks == 3
    m.add_sequence("big", toks(18 * BS, 5000), num_new_tokens=18 * BS)  # every unpinned block
    st = kv_stats(m)
    assert st.free_blocks == 0 and st.cached_blocks == 0 and st.pinned_blocks == 2
    with pytest.raises(NoFreeBlocksError):
        m.add_sequence("more", toks(9, 9000), num_new_tokens=9)
    m.free("big")
    assert m.lookup_prefix(toks(16) + [7]) == 16  # the pinned prompt is still a full hit
    assert m.lookup_prefix(toks(24, 500)) == 0  # the unpinned one was evicted


def test_cap_enforced_and_nothing_changes_on_refusal():
    m = prefilled(num_blocks=40, prompt=toks(40))  # 10% of 40 = 4 blocks
    assert m.pins.max_blocks == 4
    with pytest.raises(PinCapError, match="pin cap"):
        m.pins.pin("too-long", toks(40))  # 5 blocks
    assert kv_stats(m).pinned_blocks == 0 and kv_stats(m).used_blocks == 0
    m.pins.pin("a", toks(24))  # 3 blocks
    with pytest.raises(PinCapError):
        m.pins.check_cap("b", 2 * BS)
    m.pins.check_cap("a", 4 * BS)  # replacing "a" itself is measured without it
    assert isinstance(PinCapError("x"), ValueError)


def test_replace_unpins_old_blocks_fall_back_or_stay_held():
    m = prefilled(max_pin_fraction=0.5)
    m.add_sequence("x", toks(16, 300), num_new_tokens=16)
    m.free("x")
    m.pins.pin("sys", toks(32))
    m.add_sequence("chat", toks(32) + [1, 2, 3], num_new_tokens=10**9)
    m.pins.pin("sys", toks(16, 300))  # replace: the old blocks lose the app's ref
    assert [ref(m, i) for i in (0, 1, 2, 3)] == [1, 1, 1, 1]  # still held by "chat"
    assert m.pins.get("sys").num_tokens == 16
    m.free("chat")
    snap = take_snapshot(m)
    assert [snap.blocks.state[i] for i in (0, 1, 2, 3)] == ["cached"] * 4  # ordinary cached-free
    assert m.pins.unpin("sys")
    assert kv_stats(m).used_blocks == 0 and not m.pins.unpin("sys")


def test_pin_of_uncached_prompt_is_refused_without_change():
    m = prefilled(max_pin_fraction=0.5)
    with pytest.raises(PinMissError):
        m.pins.pin("new", toks(32, 7000))
    assert kv_stats(m).used_blocks == 0 and m.pins.infos() == []


def test_pin_same_blocks_twice_under_two_names_counts_once():
    m = prefilled(max_pin_fraction=0.5)
    m.pins.pin("a", toks(32))
    m.pins.pin("b", toks(16))
    assert kv_stats(m).pinned_blocks == 4 and ref(m, 0) == 2
    m.pins.unpin("a")
    assert ref(m, 0) == 1 and ref(m, 3) == 0 and kv_stats(m).pinned_blocks == 2
