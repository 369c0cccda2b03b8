"""One name and one colour per block state on every panel (ui/dashboard/vocabulary.py, issue 26.5),
read back from what the Memory tab renders for one pool: a real KVCacheManager with two chats that
share a pinned system prompt (the case a newcomer saw as "shared blocks 34" beside a legend
"shared: 0, pinned: 34", and the same blocks purple in the grid but orange in the block table)."""

import json
import re

from engine.kv.kv_cache_manager import KVCacheManager
from ui.dashboard import grid_canvas as GC
from ui.dashboard import open_chats as OPEN
from ui.dashboard import panels as H
from ui.dashboard import view as V
from ui.dashboard import vocabulary as VOC
from ui.dashboard.grid_payload import decode_runs
from ui.dashboard.history import History
from ui.dashboard.page import render_base
from engine.observe.kv_snapshot import take_snapshot

BS = 16


def pool_with_a_pinned_prompt():
    m = KVCacheManager(64, BS, max_model_len=1024)
    system = list(range(64))  # 4 blocks, pinned and shared
    for i, sid in enumerate(("a", "b")):
        m.add_sequence(
            f"{sid}#0",
            system + [1000 + 100 * i + k for k in range(20)],
            num_new_tokens=10**9,
            session_id=sid,
        )
    m.pins.pin("shared", system)
    other = [7000 + k for k in range(33)]
    m.add_sequence("x#0", other, num_new_tokens=10**9)  # computed once, then finished:
    m.pins.pin("unused", other[:32])  # 2 pinned blocks no chat holds
    m.free("x#0")
    return take_snapshot(m).to_json()


def numbers(html: str) -> dict:
    return dict(re.findall(r'data-k="([^"]+)" data-v="([^"]*)"', html))


def test_tiles_legend_grid_and_tables_count_and_colour_each_block_the_same_way():
    snap = pool_with_a_pinned_prompt()
    st = snap["stats"]
    # the engine's own counters use the one vocabulary (issue 47): its 4 blocks of ref_count >= 2 are
    # pinned ones, so none is "shared"
    assert st["shared_blocks"] == 0 and st["pinned_blocks"] == 6
    assert sum(1 for r in snap["blocks"]["ref_count"] if r >= 2) == 4
    counts = VOC.counts(snap)
    assert sum(counts.values()) == st["total_blocks"]
    assert counts["pinned"] == 6 and counts["shared"] == 0 and counts["private"] == 4
    base = render_base(snap, History(), None)
    tiles = numbers(base["headline"])
    legend = numbers(H.grid_html(V.grid_model(snap)))  # the HTML grid's legend
    payload = json.loads(base["grid"])  # what the canvas legend and cells paint
    by_code = dict(zip(V.KINDS, payload["counts"]))
    for code, name in VOC.NAMES.items():
        assert int(legend[f"cells_{code}"]) == counts[name] == by_code[code], name
    assert int(tiles["shared_blocks"]) == counts["shared"] == st["shared_blocks"]
    assert int(tiles["pinned_blocks"]) == counts["pinned"]
    assert int(tiles["used_blocks"]) == counts["pinned"] + counts["shared"] + counts["private"]
    # each block's cell is painted in its one state
    cells = decode_runs(payload)["kind"].tolist()
    assert [V.KINDS[k] for k in cells] == [
        VOC.state_of(s, r) for s, r in zip(snap["blocks"]["state"], snap["blocks"]["ref_count"])
    ]
    # the block table shows the pinned blocks as pinned (the grid's colour), not as shared
    table = H.tables_html(base["convs"], "a", BS)
    spans = re.findall(r'<span class="([^"]*)" title="logical (\d+) -> physical (\d+)', table)
    got = {int(phys): cls.split()[0] for cls, _, phys in spans}
    want = {
        b: VOC.state_of(snap["blocks"]["state"][b], snap["blocks"]["ref_count"][b]) for b in got
    }
    assert got == want and set(got.values()) == {"n", "p"}
    assert "4 pinned, 2 private" in table


def test_one_colour_per_state_in_the_theme_legend_and_canvas():
    light = dict(re.findall(r"--kv-([a-z-]+): (#[0-9a-f]{6});", H.THEME_CSS.split(".dark")[0]))
    dark = dict(re.findall(r"--kv-([a-z-]+): (#[0-9a-f]{6});", H.THEME_CSS.split(".dark")[1]))
    for s in VOC.STATES:
        assert light[s.name] == s.light and dark[s.name] == s.dark
        assert H.COLORS[s.code] == f"var(--kv-{s.name})"
    state_colours = [s.light for s in VOC.STATES]
    assert len(set(state_colours)) == len(state_colours)  # no two states share a colour
    bars = {v for k, v in light.items() if k.startswith("bar-")}
    assert bars and not bars & set(state_colours)  # bars never borrow a state's colour
    # the canvas paints kind k with --kv-<name of k> and names it the same in its legend
    assert GC._NAMES == GC._VARS == [VOC.NAMES[k] for k in V.KINDS]


def test_the_first_line_is_short_and_the_used_blocks_are_explained():
    snap = pool_with_a_pinned_prompt()
    base = render_base(snap, History(), None)
    story = base["story"]
    first = re.search(r'<p class="kvs-1">(.*?)</p>', story).group(1)
    text = re.sub(r"<[^>]+>", "", first)
    assert text.startswith("One 64-token system prompt stored once for 2 chats: sharing saves")
    assert len(text.split()) <= 20
    n = numbers(story)
    assert int(n["chat_held_blocks"]) + int(n["pin_only_blocks"]) == snap["stats"]["used_blocks"]
    assert int(n["pin_only_blocks"]) == 2


def test_open_chats_are_counted_as_what_they_are():
    snap = pool_with_a_pinned_prompt()  # sessions "a" and "b" hold blocks
    states = {"a": "open", "b": "generating", "c": "open", "d": "parked"}
    got = OPEN.count(states, snap)
    assert got == {"generating": 1, "live": 1, "parked": 1, "released": 1}
    base = render_base(snap, History(), None, lambda: states)
    n = numbers(base["story"])
    assert int(n["open_chats"]) == 4 and int(n["open_released"]) == 1 and int(n["open_live"]) == 1
