"""The typed KV contract (engine/observe/kv_contract.py) on a real KVCacheManager: versioned JSON that
round-trips, stats that agree with the per-block arrays, sharing savings, and the one preemption
log carrying victim and tokens lost."""

import json

from engine.kv.kv_cache_manager import KVCacheManager
from engine.observe.kv_contract import SCHEMA, VERSION, KVSnapshot, KVStats
from engine.observe.kv_snapshot import kv_stats, take_snapshot


def _manager():
    m = KVCacheManager(32, 16, max_model_len=256, kv_bytes_per_token=100)
    shared = list(range(1, 33))  # two full blocks shared by both
    m.add_sequence("a#0", shared + [100, 101, 102], num_new_tokens=35, session_id="conv-a")
    m.add_sequence("b#0", shared + [200], num_new_tokens=33)
    return m


def test_json_is_versioned_and_round_trips():
    snap = take_snapshot(_manager(), request_of=lambda s: s.split("#")[0])
    d = json.loads(json.dumps(snap.to_json()))
    assert d["schema"] == SCHEMA and d["version"] == VERSION
    back = KVSnapshot.from_json(d)
    assert (
        back.stats == snap.stats and back.blocks == snap.blocks and back.sequences == snap.sequences
    )
    assert back.owners == snap.owners and {s.request_id for s in back.sequences} == {"a", "b"}


def test_stats_agree_with_the_block_arrays_and_count_sharing():
    snap = take_snapshot(_manager())
    st, refs = snap.stats, snap.blocks.ref_count
    assert st.used_blocks == sum(1 for r in refs if r) == 4 and st.shared_blocks == 2
    assert st.logical_blocks == sum(len(s.block_table) for s in snap.sequences) == 6
    assert st.shared_tokens_saved == (6 - 4) * 16 == snap.to_json()["stats"]["shared_tokens_saved"]
    assert set(KVStats.__dataclass_fields__) <= set(snap.to_json()["stats"])


def test_one_preemption_log_with_victim_and_tokens_lost():
    m = _manager()
    assert m.preempt("b#0") == 33
    ev = take_snapshot(m, request_of=lambda s: s.split("#")[0]).preemption_events
    assert [(e.request_id, e.seq_id, e.tokens_lost) for e in ev] == [("b", "b#0", 33)]
    assert kv_stats(m).num_preemptions == 1


def test_a_newer_version_is_refused():
    d = take_snapshot(_manager()).to_json()
    d["version"] = VERSION + 1
    try:
        KVSnapshot.from_json(d)
    except ValueError as e:
        assert "paged-chat.kv" in str(e)
    else:
        raise AssertionError("a newer snapshot version must not be read silently")


def test_every_v3_field_is_still_produced_with_its_type():
    d = json.loads(json.dumps(take_snapshot(_manager()).to_json()))
    assert {
        "schema",
        "version",
        "time",
        "block_size",
        "num_blocks",
        "stats",
        "blocks",
        "owners",
        "sequences",
        "preemption_events",
        "pins",
    } <= set(d)
    assert all(
        isinstance(d["blocks"][k], list) and len(d["blocks"][k]) == 32
        for k in ("state", "ref_count", "filled")
    )
    assert d["blocks"]["state"][:5] == ["used"] * 4 + ["free"] and d["owners"]["0"] == [
        "a#0",
        "b#0",
    ]
    assert {"block_table", "shared"} <= set(d["sequences"][0]) and d["sequences"][0]["shared"][
        :3
    ] == [True, True, False]


def test_compact_form_reads_back_to_the_same_snapshot_and_v3_is_still_read():
    snap = take_snapshot(_manager(), request_of=lambda s: s.split("#")[0])
    full, compact = snap.to_json(), json.loads(json.dumps(snap.to_json(compact=True)))
    assert compact["compact"] and "blocks" not in compact and "owners" not in compact
    assert compact["block_runs"]["start"] == [0, 2, 3, 4] and compact["block_runs"]["length"] == [
        2,
        1,
        1,
        28,
    ]
    back = KVSnapshot.from_json(compact)
    assert (
        back.blocks == snap.blocks
        and back.sequences == snap.sequences
        and back.owners == snap.owners
    )
    v3 = {k: v for k, v in full.items() if k != "block_runs"}
    v3["version"] = 3
    assert KVSnapshot.from_json(v3).blocks == snap.blocks


def test_a_snapshot_read_late_shows_its_own_time():
    """The engine thread only copies; building the lists later must not see later changes."""
    m = _manager()
    snap = take_snapshot(m)
    m.allocate_slots("b#0", 40)  # grows b's table, CoW of nothing, new blocks
    m.free("a#0")
    assert snap.blocks.ref_count[:5] == [2, 2, 1, 1, 0] and len(snap.sequences) == 2
    assert [s.block_table for s in snap.sequences] == [[0, 1, 2], [0, 1, 3]]


def test_a_snapshot_copies_and_pickles_like_plain_data():
    import copy
    import pickle

    snap = take_snapshot(_manager())
    for other in (copy.deepcopy(snap), pickle.loads(pickle.dumps(snap)), copy.copy(snap)):
        assert other == snap and other.to_json()["blocks"] == snap.to_json()["blocks"]
