"""The Memory tab's KV-tier parts on snapshots of a real KV manager with a real file tier: the
tier panel's numbers, the event feed's "resumed from disk" and swap lines, and viewer scoping
(under --auth another user's tier load is counted, never named)."""

import json

from tests.engine.kv.tier_sim import manager_with_tier, run_turn
from ui.dashboard.events import diff_events
from engine.observe.viewer_scope import scope_snapshot
from ui.dashboard.tier_panel import TierRates, tier_html
from engine.observe.kv_snapshot import take_snapshot


def _evict_and_reload(tmp_path):
    m, io = manager_with_tier(tmp_path, num_blocks=8)
    toks = list(range(100, 141))
    run_turn(m, io, "conv-alice-1#0", toks, session="conv-alice-1")
    m.park("conv-alice-1#0", "conv-alice-1")
    m.parked.release("conv-alice-1")  # tab closed; blocks are cached, then evicted
    run_turn(m, io, "other#0", list(range(500, 561)))
    m.free("other#0")
    prev = take_snapshot(m).to_json()
    run_turn(m, io, "conv-alice-1#1", toks + [7, 8], session="conv-alice-1")
    return m, prev, take_snapshot(m).to_json()


def test_feed_says_resumed_from_disk_with_the_title_and_counts(tmp_path):
    m, prev, snap = _evict_and_reload(tmp_path)
    titles = {"conv-alice-1": "Trip to Lisbon"}
    lines = diff_events(
        scope_snapshot(prev, titles=titles, viewer=None),
        scope_snapshot(snap, titles=titles, viewer=None),
    )
    ev = snap["tier_events"][-1]
    assert ev["tokens_loaded"] == 40 and ev["tokens_computed"] == 3
    assert "chat 'Trip to Lisbon' resumed from disk: 40 tokens loaded, 3 computed" in lines
    m.free("conv-alice-1#1")


def test_another_users_tier_load_is_not_named(tmp_path):
    m, prev, snap = _evict_and_reload(tmp_path)
    bob = scope_snapshot(snap, titles={}, viewer="bob", auth=True)
    assert "conv-alice-1" not in json.dumps(bob["tier_events"])
    lines = diff_events(scope_snapshot(prev, titles={}, viewer="bob", auth=True), bob)
    assert "a chat resumed from disk: 40 tokens loaded, 3 computed" in lines
    m.free("conv-alice-1#1")


def test_swap_preemption_line(tmp_path):
    m, io = manager_with_tier(tmp_path, num_blocks=8)
    run_turn(m, io, "s#0", list(range(33)))
    prev = take_snapshot(m).to_json()
    m.preempt("s#0")
    lines = diff_events(prev, take_snapshot(m).to_json())
    assert any("swapped 32 tokens out to the KV tier, recomputing 1" in x for x in lines)


def test_tier_panel_shows_pool_and_tier_side_by_side(tmp_path):
    m, prev, snap = _evict_and_reload(tmp_path)
    rates = TierRates()
    rates.update(prev["time"], prev["stats"])
    r = rates.update(prev["time"] + 2.0, snap["stats"])
    assert (
        r["tier_hits_blocks"]
        == (snap["stats"]["tier_hits_blocks"] - prev["stats"]["tier_hits_blocks"]) / 2
    )
    html = tier_html(snap["stats"], r)
    st = snap["stats"]
    assert "KV tier (disk)" in html and f"{st['tier_blocks']:,} blocks, " in html
    assert (
        f"· {st['tier_loaded_tokens']:,} from the tier" in html and st["tier_loaded_tokens"] == 40
    )
    assert (
        html.count("<tr title=") == 6 and "integrity check" in html
    )  # every row explained on hover
    assert "Off" in tier_html({"kv_bytes_per_block": 1, "prefix_cache_hits": 0}, {})
    m.free("conv-alice-1#1")


def test_metrics_carry_the_tier(tmp_path):
    from routes.metrics import prometheus_text
    from tests.ui.helpers import parse

    m, prev, snap = _evict_and_reload(tmp_path)
    p = parse(prometheus_text(snap))
    v = {k: x[0] for k, x in p["values"].items()}
    st = snap["stats"]
    assert snap["version"] >= 5
    assert v["paged_chat_kv_tier_blocks"] == st["tier_blocks"] > 0
    assert v["paged_chat_kv_tier_loaded_tokens_total"] == 40
    assert v["paged_chat_kv_tier_writebacks_blocks_total"] == st["tier_writebacks_blocks"] > 0
    assert (
        v["paged_chat_kv_tier_bytes"] == st["tier_bytes"]
        and p["meta"]["paged_chat_kv_tier_hits_blocks_total"]["type"] == "counter"
    )
    m.free("conv-alice-1#1")
