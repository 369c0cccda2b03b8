"""BlockPool: the free list, reference counts and lazy eviction, tested on real objects."""

import pytest

from engine.kv.block_pool import BlockPool
from engine.errors import KVCacheError, NoFreeBlocksError


def free_ids(pool):
    return [b.block_id for b in pool.iter_free()]


def test_fresh_pool_hands_out_ids_in_order():
    pool = BlockPool(6)
    assert [b.block_id for b in pool.get_new_blocks(3)] == [0, 1, 2]
    assert [b.block_id for b in pool.get_new_blocks(2)] == [3, 4]
    assert free_ids(pool) == [5]
    assert pool.num_free == 1 and pool.num_used == 5


def test_invalid_size():
    with pytest.raises(ValueError):
        BlockPool(0)


def test_over_allocation_raises_without_change():
    pool = BlockPool(4)
    pool.get_new_blocks(3)
    with pytest.raises(NoFreeBlocksError) as e:
        pool.get_new_blocks(2)
    assert (e.value.needed, e.value.available) == (2, 1)
    assert free_ids(pool) == [3]


def test_hashed_blocks_go_to_tail_hashless_to_head():
    pool = BlockPool(6)
    a, b, c = pool.get_new_blocks(3)
    pool.register(a, 11, (1,), None, None)
    pool.register(b, 12, (2,), 11, None)
    pool.free_blocks([c, b, a])  # tail first, as the manager does
    # c holds nothing reusable -> evicted first; then never-used 3..5; then b before a.
    assert free_ids(pool) == [2, 3, 4, 5, 1, 0]
    assert pool.num_cached_free == 2
    assert pool.cached == {11: a, 12: b}


def test_touch_removes_from_middle_in_o1():
    pool = BlockPool(5)
    blocks = pool.get_new_blocks(5)
    for i, b in enumerate(blocks):
        pool.register(b, 100 + i, (i,), None, None)
    pool.free_blocks(blocks)
    pool.touch([blocks[2]])  # revive a block from the middle
    assert free_ids(pool) == [0, 1, 3, 4]
    assert blocks[2].ref_count == 1 and blocks[2].prev is None and blocks[2].next is None
    assert pool.num_cached_free == 4 and pool.num_free == 4
    pool.touch([blocks[0], blocks[4]])  # head and tail ends
    assert free_ids(pool) == [1, 3]


def test_reused_block_loses_hash():
    pool = BlockPool(2)
    a, b = pool.get_new_blocks(2)
    pool.register(a, 7, (1, 2), None, None)
    pool.free_blocks([a])
    assert pool.cached == {7: a} and pool.num_cached_free == 1
    pool.free_blocks([b])  # hashless -> head, evicted before a
    assert [x.block_id for x in pool.get_new_blocks(1)] == [b.block_id]
    assert pool.cached == {7: a}
    (again,) = pool.get_new_blocks(1)
    assert again is a and a.block_hash is None and a.token_ids is None
    assert pool.cached == {} and pool.num_cached_free == 0


def test_shared_counter_and_double_free():
    pool = BlockPool(3)
    (a,) = pool.get_new_blocks(1)
    pool.touch([a])
    pool.touch([a])
    assert a.ref_count == 3 and pool.num_shared == 1
    pool.free_blocks([a])
    pool.free_blocks([a])
    assert pool.num_shared == 0 and a.ref_count == 1
    pool.free_blocks([a])
    assert pool.num_free == 3
    with pytest.raises(KVCacheError):
        pool.free_blocks([a])
    assert pool.num_free == 3 and a.ref_count == 0


def test_register_refuses_taken_hash():
    pool = BlockPool(2)
    a, b = pool.get_new_blocks(2)
    assert pool.register(a, 5, (1,), None, None)
    assert not pool.register(b, 5, (1,), None, None)
    assert b.block_hash is None and pool.cached[5] is a


def test_used_tokens_accounting():
    pool = BlockPool(3)
    a, b = pool.get_new_blocks(2)
    pool.set_filled(a, 8)
    pool.set_filled(b, 3)
    assert pool.num_used_tokens == 11
    pool.register(a, 1, tuple(range(8)), None, None)
    pool.free_blocks([b, a])
    assert pool.num_used_tokens == 0 and b.filled == 0 and a.filled == 8
    pool.touch([a])  # a revived cached block brings its 8 tokens back
    assert pool.num_used_tokens == 8


def built_ids(pool):
    return sorted(b.block_id for b in pool.blocks.built())


def test_gpu_sized_pool_builds_only_the_blocks_it_hands_out():
    """350k blocks (SmolLM2 bf16 at 85% of an H200): construction builds no per-block objects."""
    pool = BlockPool(350_000)
    assert built_ids(pool) == [] and pool.num_free == 350_000
    got = pool.get_new_blocks(3)
    assert [b.block_id for b in got] == [0, 1, 2] and built_ids(pool) == [0, 1, 2]
    state, refs, filled = pool.block_arrays()
    assert (
        len(state) == 350_000 and state[:4] == ["used"] * 3 + ["free"] and refs[:4] == [1, 1, 1, 0]
    )
    assert built_ids(pool) == [0, 1, 2]  # a snapshot does not build the rest


def test_fresh_range_keeps_exact_eviction_order():
    """Hashless frees go before the never-used range, cached frees after it, as with real objects."""
    pool = BlockPool(8)
    a, b, c = pool.get_new_blocks(3)
    pool.register(b, 7, (1,), None, None)
    pool.free_blocks([a])
    pool.free_blocks([b])
    assert free_ids(pool) == [0, 3, 4, 5, 6, 7, 1]
    assert [x.block_id for x in pool.get_new_blocks(2)] == [0, 3]
    assert free_ids(pool) == [4, 5, 6, 7, 1]
    assert pool.blocks[6].ref_count == 0 and free_ids(pool) == [
        4,
        5,
        6,
        7,
        1,
    ]  # looking builds, no move
    assert [x.block_id for x in pool.get_new_blocks(4)] == [4, 5, 6, 7]
    assert free_ids(pool) == [1] and pool.num_cached_free == 1
    assert pool.get_new_blocks(1)[0] is b and b.block_hash is None and pool.cached == {}
    with pytest.raises(NoFreeBlocksError):
        pool.get_new_blocks(1)


def test_block_arrays_match_the_objects():
    pool = BlockPool(10)
    blocks = pool.get_new_blocks(4)
    pool.register(blocks[1], 5, (1,), None, None)
    pool.set_filled(blocks[0], 3)
    pool.touch([blocks[0]])
    pool.free_blocks([blocks[1], blocks[2]])
    state, refs, filled = pool.block_arrays()
    assert refs == [b.ref_count for b in pool.blocks]
    assert filled == [b.filled for b in pool.blocks]
    assert state[:5] == ["used", "cached", "free", "used", "free"]


def test_never_allocated_block_cannot_be_shared():
    pool = BlockPool(4)
    with pytest.raises(KVCacheError, match="never allocated"):
        pool.touch([pool.blocks[2]])
