"""The Memory tab's headline sentence and bars (ui/dashboard/story.py), its event feed
(ui/dashboard/events.py) and the demo-load cap, on snapshots of a real KV manager."""

import re
import time

from engine.kv.kv_cache_manager import KVCacheManager
from ui.dashboard import demo_users
from ui.dashboard.demo_users import DemoLoad
from tests.ui.fake_engine import FakeLLM
from ui.dashboard.events import EventFeed, diff_events
from ui.dashboard.story import story_html, story_numbers
from engine.observe.kv_snapshot import kv_stats, take_snapshot

BS = 16


def manager():
    m = KVCacheManager(400, BS, max_model_len=8192, kv_bytes_per_token=46080)
    system = list(range(320))  # a 20-block shared prompt
    m.add_sequence("pre", system, num_new_tokens=320)
    m.free("pre")
    m.pins.pin("shared", system)
    return m, system


def with_engine_fields(d):
    d["stats"]["max_model_len"] = 8192
    return d


def test_sentence_numbers_come_from_the_stats_contract():
    m, system = manager()
    for k in range(16):
        m.add_sequence(
            f"u{k}#0",
            system + list(range(1000 + 40 * k, 1030 + 40 * k)),
            num_new_tokens=10**9,
            session_id=f"u{k}",
        )
    snap = with_engine_fields(take_snapshot(m).to_json())
    st = snap["stats"]
    html = story_html(st)
    got = dict(re.findall(r'data-k="([a-z_]+)" data-v="([^"]+)"', html))
    assert (
        int(got["chat_used_blocks"]) == st["chat_used_blocks"] == st["used_blocks"] == 20 + 16 * 2
    )
    assert int(got["unshared_blocks"]) == st["logical_blocks"] == 16 * 22
    assert float(got["saved_frac"]) == st["savings_vs_unshared"] > 0.8
    assert int(got["contiguous_blocks"]) == 16 * 512 and int(got["total_blocks"]) == 400
    assert int(got["pinned_blocks"]) == 20
    assert "16 chats hold" in html and "this whole pool, so only 0 chats would fit" in html
    n = story_numbers(st)
    widths = [float(w) for w in re.findall(r'kvb-bar [^"]+" style="width:([\d.]+)%', html)]
    assert (
        widths[2] == 100.0
        and abs(widths[0] / widths[1] - n["used_blocks"] / n["unshared_blocks"]) < 1e-2
    )


def test_no_chats_sentence_still_shows_the_pool_and_the_pin():
    m, system = manager()
    st = with_engine_fields(take_snapshot(m).to_json())["stats"]
    html = story_html(st)
    assert "No chats are open yet" in html and 'data-k="pinned_blocks" data-v="20"' in html
    assert (
        st["used_blocks"] == 20 and st["chat_used_blocks"] == 0 and st["savings_vs_unshared"] == 0.0
    )
    m.add_sequence(
        "other#0", list(range(5000, 5040)), num_new_tokens=10**9
    )  # a chat not on the pin
    st = kv_stats(m)
    assert st.chat_used_blocks == 3 and st.savings_vs_unshared == 0.0  # not negative


def test_event_feed_names_pins_forks_frees_and_sharing():
    m, system = manager()
    feed = EventFeed()
    first = take_snapshot(m).to_json()
    lines = feed.update(first)
    assert lines == ["pinned prompt 'shared' (20 blocks, never evicted)"]
    m.add_sequence("beam#0", system + [5, 6, 7], num_new_tokens=10**9)
    s1 = take_snapshot(m).to_json()
    s1["sequences"][0]["request_id"] = "beam"
    m.fork("beam#0", "beam#1", system + [5, 6, 7])
    m.fork("beam#0", "beam#2", system + [5, 6, 7])
    s2 = take_snapshot(m).to_json()
    for s in s2["sequences"]:
        s["request_id"] = "beam"
    lines = diff_events(s1, s2)
    assert "beam forked: 3 beams/samples share 21 blocks (copy-on-write on divergence)" in lines
    assert "pinned block 0 now held by 4 holders" in lines  # one vocabulary: pinned, not "shared"
    m.free("beam#2")
    s3 = take_snapshot(m).to_json()
    for s in s3["sequences"]:
        s["request_id"] = "beam"
    assert "beam freed 1 beam (2 left)" in diff_events(s2, s3)
    m.pins.unpin("shared")
    assert any(
        x.startswith("unpinned prompt 'shared'")
        for x in diff_events(s3, take_snapshot(m).to_json())
    )


def test_demo_load_is_capped_and_stops_fast():
    llm = FakeLLM(words=[f"w{i} " for i in range(10_000)], pause_s=0.01)
    demo = DemoLoad(llm, "Shared.")
    assert demo.start(10_000) == demo_users.MAX_DEMO_USERS
    assert demo.start(5) == demo_users.MAX_DEMO_USERS  # already at the cap: nobody added
    t0 = time.time()
    assert demo.stop() == demo_users.MAX_DEMO_USERS
    assert demo.running_users() == 0 and time.time() - t0 < 10
