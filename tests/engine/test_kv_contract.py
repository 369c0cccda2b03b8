"""The typed KV contract (engine/kv_contract.py) on a real KVCacheManager: versioned JSON that
round-trips, stats that agree with the per-block arrays, sharing savings, and the one preemption
log carrying victim and tokens lost."""
import json

from engine.kv_cache_manager import KVCacheManager
from engine.kv_contract import SCHEMA, VERSION, KVSnapshot, KVStats


def _manager():
    m = KVCacheManager(32, 16, max_model_len=256, kv_bytes_per_token=100)
    shared = list(range(1, 33))                                  # two full blocks shared by both
    m.add_sequence("a#0", shared + [100, 101, 102], num_new_tokens=35, session_id="conv-a")
    m.add_sequence("b#0", shared + [200], num_new_tokens=33)
    return m


def test_json_is_versioned_and_round_trips():
    snap = _manager().kv_snapshot(request_of=lambda s: s.split("#")[0])
    d = json.loads(json.dumps(snap.to_json()))
    assert d["schema"] == SCHEMA and d["version"] == VERSION
    back = KVSnapshot.from_json(d)
    assert back.stats == snap.stats and back.blocks == snap.blocks and back.sequences == snap.sequences
    assert back.owners == snap.owners and {s.request_id for s in back.sequences} == {"a", "b"}


def test_stats_agree_with_the_block_arrays_and_count_sharing():
    snap = _manager().kv_snapshot()
    st, refs = snap.stats, snap.blocks.ref_count
    assert st.used_blocks == sum(1 for r in refs if r) == 4 and st.shared_blocks == 2
    assert st.logical_blocks == sum(len(s.block_table) for s in snap.sequences) == 6
    assert st.shared_tokens_saved == (6 - 4) * 16 == snap.to_json()["stats"]["shared_tokens_saved"]
    assert set(KVStats.__dataclass_fields__) <= set(snap.to_json()["stats"])


def test_one_preemption_log_with_victim_and_tokens_lost():
    m = _manager()
    assert m.preempt("b#0") == 33
    ev = m.kv_snapshot(request_of=lambda s: s.split("#")[0]).preemption_events
    assert [(e.request_id, e.seq_id, e.tokens_lost) for e in ev] == [("b", "b#0", 33)]
    assert m.kv_stats().num_preemptions == 1


def test_a_newer_version_is_refused():
    d = _manager().kv_snapshot().to_json()
    d["version"] = VERSION + 1
    try:
        KVSnapshot.from_json(d)
    except ValueError as e:
        assert "paged-chat.kv" in str(e)
    else:
        raise AssertionError("a newer snapshot version must not be read silently")
