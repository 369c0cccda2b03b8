"""Viewer scoping of KV snapshots (engine/observe/viewer_scope.py) on snapshots of a real KV manager:
titles instead of ids, and under --auth none of another user's ids or titles."""

import json

from engine.kv.kv_cache_manager import KVCacheManager
from engine.observe.viewer_scope import pin_name_for, scope_snapshot
from engine.observe.kv_snapshot import take_snapshot

BS = 8


def snapshot():
    m = KVCacheManager(64, BS, max_model_len=1024)
    system = list(range(24))
    m.add_sequence("pre", system, num_new_tokens=24)
    m.free("pre")
    m.pins.max_fraction = 0.5
    m.pins.pin(pin_name_for(None), system)
    m.pins.pin(pin_name_for("alice"), system[:16])
    for sid, extra in (
        ("conv-alice-1", [100, 101]),
        ("conv-bob-1", [200, 201, 202]),
        ("demo-1-3", [300]),
    ):
        m.add_sequence(sid + "#0", system + extra, num_new_tokens=10**9, session_id=sid)
        m.park(sid + "#0", sid)
    return take_snapshot(m).to_json()


def test_without_auth_everything_is_titled():
    snap = snapshot()
    out = scope_snapshot(
        snap,
        titles={"conv-alice-1": "Trip to Lisbon", "conv-bob-1": "Taxes"},
        viewer=None,
        own_conv="conv-bob-1",
    )
    titles = sorted(s["title"] for s in out["sequences"])
    assert titles == ["Taxes (this tab)", "Trip to Lisbon", "demo user 3"]
    assert out["stats"] == snap["stats"] and "others" not in out


def test_with_auth_bob_sees_none_of_alices_ids_or_titles():
    snap = snapshot()
    out = scope_snapshot(snap, titles={"conv-bob-1": "Taxes"}, viewer="bob", auth=True)
    text = json.dumps(out)
    assert "conv-alice-1" not in text and "Trip to Lisbon" not in text and "alice" not in text
    assert [s["session_id"] for s in out["sequences"]] == ["conv-bob-1"]
    assert out["others"] == {
        "chats": 2,
        "blocks": 5,
    }  # alice's and the demo user's (3 shared + own)
    assert set(out["owners"]) == {str(b) for b in out["sequences"][0]["block_table"]}
    assert [p["name"] for p in out["pins"]] == ["shared", "another user's prompt"]
    assert out["stats"] == snap["stats"] and out["blocks"] == snap["blocks"]
    alice = scope_snapshot(
        snap, titles={"conv-alice-1": "Trip to Lisbon"}, viewer="alice", auth=True
    )
    assert [p["name"] for p in alice["pins"]] == ["shared", "user:alice"]
    assert "conv-bob-1" not in json.dumps(alice)
