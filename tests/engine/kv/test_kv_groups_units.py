"""KV cache groups in small pieces: the per-layer-kind arithmetic (engine/observe/kv_groups.py)
on the shipped Gemma-3-1B shape, the v8 contract of a two-group pool (per-block group, per-group
stats, compact and full JSON round trips), the layout's bounds and a pin over groups. Pure: no
model runs."""

import json

from engine.kv.cache_spec import KVCacheLayout
from engine.kv.kv_cache_manager import KVCacheManager
from engine.observe.kv_contract import KVSnapshot
from engine.observe.kv_groups import group_rows, kv_arithmetic, window_line
from engine.observe.kv_snapshot import kv_stats, take_snapshot


def test_gemma_3_1b_arithmetic_from_its_shipped_config():
    from pathlib import Path
    from transformers import Gemma3TextConfig
    from engine.exec.models.decoder_spec import describe

    raw = json.loads(
        (Path(__file__).parents[3] / "engine/exec/configs/gemma-3-1b.json").read_text()
    )
    cfg = Gemma3TextConfig(**{k: v for k, v in raw.items() if not k.startswith("_")})
    windows = [s.window for s in describe(cfg).layers]
    assert windows.count(None) == 4 and windows.count(512) == 22
    a = kv_arithmetic(
        windows,
        kv_heads=1,
        head_dim=256,
        dtype_bytes=2,
        context_tokens=8192,
        max_model_len=32768,
        name="Gemma-3-1B",
    )
    assert (
        a["bytes"] == (4 * 8192 + 22 * 512) * 1024 and a["full_attention_bytes"] == 26 * 8192 * 1024
    )
    assert a["sentence"] == (
        "Gemma-3-1B, an 8,192-token chat: 4 global layers keep all 8,192 tokens, "
        "22 local layers keep the last 512: 43 MiB instead of 208 MiB, 4.8x less"
    )
    assert round(a["saving_vs_contiguous"], 1) == 19.3
    short = kv_arithmetic(windows, kv_heads=1, head_dim=256, dtype_bytes=2, context_tokens=300)
    assert short["sentence"].startswith(
        "A 300-token chat: 4 global layers keep all 300 tokens, 22 local"
    )
    assert "nothing to give back yet" in short["sentence"]
    layout = KVCacheLayout.from_layer_windows(windows)
    assert layout.pool_layers == 4 and layout.num_groups == 7 and layout.padded_slots == 2
    assert [g.sliding_window for g in layout.groups] == [None] + [512] * 6


def test_a_two_group_pool_in_the_contract():
    layout = KVCacheLayout.from_layer_windows([None, 16, 16, None])  # P = 2: full, sliding 16
    m = KVCacheManager(40, 8, max_model_len=200, layout=layout)
    toks = list(range(100))
    m.add_sequence("a#0", toks, num_new_tokens=40)
    m.allocate_slots("a#0", 40)  # the step from 40 releases blocks before 25
    m.park("a#0", "chat-a")
    m.add_sequence("b#0", toks[:60] + [7] * 10, num_new_tokens=70)
    st = kv_stats(m)
    assert st.num_groups == 2 and [g["kind"] for g in st.kv_groups] == ["full", "sliding"]
    assert st.window_released_blocks == 3 and st.kv_groups[1]["released_entries"] == 3 + 5
    assert sum(g["used_blocks"] for g in st.kv_groups) == st.used_blocks
    assert st.full_attention_blocks > st.logical_blocks
    snap = take_snapshot(m, request_of=lambda s: s.split("#")[0])
    full = snap.to_json()
    assert full["version"] == 9 and len(full["blocks"]["group"]) == 40
    for s in full["sequences"]:
        assert len(s["block_table"]) == sum(s["group_blocks"])
        groups = [full["blocks"]["group"][b] for b in s["block_table"]]
        assert groups == [0] * s["group_blocks"][0] + [1] * s["group_blocks"][1]
    back = KVSnapshot.from_json(json.loads(json.dumps(snap.to_json(compact=True))))
    assert (
        back.blocks.group == full["blocks"]["group"]
        and back.blocks.state == full["blocks"]["state"]
    )
    rows = group_rows(full["stats"])
    assert [r["kind"] for r in rows] == ["global (all tokens)", "local (last 16)"]
    assert "without sliding windows" in window_line(full["stats"])


def test_layout_bounds_and_a_pin_over_groups():
    layout = KVCacheLayout.from_layer_windows([None, 16, 16, None])
    assert layout.layer_kv == ((0, 0), (0, 1), (1, 1), (1, 0)) and layout.pool_layers == 2
    # a lone sequence must fit: the full group's blocks + a chunk's worth of window in the other
    assert layout.max_tokens(40, 8, 32) == 8 * (40 - 7)  # 33 + min(n, ceil(47/8)+1 = 7)
    assert KVCacheLayout.single(30).max_tokens(100, 16, 512) == 1600  # one full group: the pool
    assert (
        KVCacheLayout.single(2, 32).max_tokens(10, 8, 16) > 10_000
    )  # windows alone: no pool bound
    m = KVCacheManager(40, 8, max_model_len=200, layout=layout, max_pin_fraction=0.2)
    prompt = list(range(40))
    m.add_sequence("p", prompt, num_new_tokens=40)
    m.free("p")  # prefilled, cached
    assert m.pins.blocks_for(40) == 5 + 2  # every full block + the window's
    info = m.pins.pin("sys", prompt)
    assert info.num_tokens == 40 and len(info.block_ids) == 7
    assert [m.pool.blocks[i].group for i in info.block_ids] == [0] * 5 + [1] * 2
    for i in range(10):  # pressure: other chats evict the rest
        m.add_sequence(f"o{i}", [1000 + i] * 30, num_new_tokens=30)
        m.free(f"o{i}")
    assert m.lookup_prefix(prompt + [7, 7, 7]) == 40  # the pin still serves the hit
    m.pins.unpin("sys")
    assert kv_stats(m).used_blocks == 0
