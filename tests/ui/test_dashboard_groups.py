"""KV cache groups on the Memory tab (ui/dashboard/groups_view.py and its uses in the headline, the
grid payload and the block tables): pure functions of the stats contract v8, checked directly on
a snapshot shaped as the engine writes it (one local group over 32 tokens, one global group)."""

import numpy as np

from ui.dashboard import groups_view as G
from ui.dashboard import panels, story
from ui.dashboard.grid_payload import grid_payload
from ui.dashboard.kv_math import ModelShape


def _stats(**over):
    st = {
        "block_size": 16,
        "total_blocks": 64,
        "used_blocks": 23,
        "chat_used_blocks": 23,
        "logical_blocks": 23,
        "kv_bytes_per_token": 256,
        "kv_bytes_per_block": 4096,
        "num_sequences": 0,
        "num_idle_sessions": 1,
        "max_model_len": 2048,
        "savings_vs_unshared": 0.0,
        "savings_vs_contiguous": 0.91,
        "pinned_blocks": 0,
        "num_groups": 2,
        "window_released_blocks": 17,
        "full_attention_blocks": 40,
        "savings_vs_full_attention": 0.425,
        "kv_groups": [
            {
                "group": 0,
                "kind": "full",
                "sliding_window": None,
                "layers": [1],
                "used_blocks": 20,
                "held_blocks": 20,
                "released_entries": 0,
                "window_released_blocks": 0,
            },
            {
                "group": 1,
                "kind": "sliding",
                "sliding_window": 32,
                "layers": [0],
                "used_blocks": 3,
                "held_blocks": 3,
                "released_entries": 17,
                "window_released_blocks": 17,
            },
        ],
    }
    st.update(over)
    return st


ONE_GROUP = {
    "num_groups": 1,
    "window_released_blocks": 0,
    "full_attention_blocks": 23,
    "kv_groups": [
        {
            "group": 0,
            "kind": "full",
            "sliding_window": None,
            "layers": [0, 1],
            "used_blocks": 23,
            "held_blocks": 23,
            "released_entries": 0,
            "window_released_blocks": 0,
        }
    ],
}


def test_layer_kinds_and_what_the_window_gave_back():
    ks = G.kinds(_stats())
    assert [k["name"] for k in ks] == ["global (all tokens)", "local (last 32 tokens)"]
    assert [(k["blocks"], k["released_now"], k["given_back"]) for k in ks] == [
        (20, 0, 0),
        (3, 17, 17),
    ]
    assert G.kind_of_group(_stats()) == [0, 1]
    assert G.group_names(_stats()) == ["global (all tokens)", "local (last 32 tokens)"]
    assert (
        G.has_groups(_stats())
        and not G.has_groups(_stats(**ONE_GROUP))
        and G.group_names(_stats(**ONE_GROUP)) == []
    )
    # contiguous caches reserve max length for both layers: 2 x 128 blocks of one layer slot each
    assert G.contiguous_blocks(_stats()) == 256
    assert G.contiguous_blocks(_stats(**ONE_GROUP)) == 128


def test_a_chats_table_by_group_and_the_blocks_a_span_covers():
    seq = {"group_blocks": [20, 3], "num_tokens": 316, "block_table": list(range(23))}
    split = G.table_groups(seq, 16)
    assert split == [
        {"group": 0, "first_logical": 0, "count": 20},
        {"group": 1, "first_logical": 17, "count": 3},
    ]
    assert G.blocks_in_span(split, 15, 19) == 5 + 3  # the local group still holds 17..19
    assert G.blocks_in_span(split, 2, 5) == 4  # given back by the window: global only
    assert G.table_groups({"block_table": [4, 5], "num_tokens": 20}, 16) == [
        {"group": 0, "first_logical": 0, "count": 2}
    ]


def test_the_section_says_it_in_words_with_the_reference_sentence():
    shape = ModelShape("beta", 2, 4, 2, 16, "bfloat16", 2048, layer_windows=(32, 0))
    html = G.groups_html(_stats(), shape, longest_chat=316)
    assert (
        "Gemma-3-1B, an 8,192-token chat: 4 global layers keep all 8,192 tokens, 22 local layers keep the "
        "last 512: 43 MiB instead of 208 MiB, 4.8x less." in html
    )
    # the live model in units that fit: 316 + 32 tokens of one layer each, 128 B per token per layer
    # (2 KV heads x 16 x K and V x 2 bytes), against 2 x 316
    assert (
        "beta, a 316-token chat: 1 global layer keeps all 316 tokens, 1 local layer keeps the last 32: "
        "43.5 KiB instead of 79.0 KiB, 1.8x less" in html
    )
    assert (
        'data-k="full_attention_blocks" data-v="40"' in html
        and 'data-k="window_released_blocks" data-v="17"' in html
    )
    assert (
        'data-k="contiguous_blocks" data-v="256"' in html
        and 'data-k="kind_given_back_1" data-v="17"' in html
    )
    assert G.groups_html(_stats(**ONE_GROUP), shape) == ""


def test_the_headline_adds_the_window_step_and_counts_every_layer_in_contiguous():
    st = _stats()
    html = story.story_html(st, model="beta")
    assert (
        "... and without sliding windows" in html
        and 'data-k="full_attention_blocks" data-v="40"' in html
    )
    assert 'data-k="contiguous_blocks" data-v="256"' in html
    assert "in each of its 2 KV cache groups" in html
    plain = story.story_html({**st, **ONE_GROUP})
    assert "sliding windows" not in plain and "KV cache groups" not in plain


def test_the_grid_payload_carries_each_cells_layer_kind():
    group = [0] * 20 + [1] * 3 + [0] * 41
    snap = {
        "block_size": 16,
        "stats": _stats(),
        "blocks": {
            "state": ["used"] * 23 + ["free"] * 41,
            "ref_count": [1] * 23 + [0] * 41,
            "filled": [16] * 23 + [0] * 41,
            "group": group,
        },
        "sequences": [],
        "pins": [],
    }
    p = grid_payload(snap)
    runs = np.asarray(p["kinds"]["runs"]).reshape(-1, 2)
    assert np.repeat(runs[:, 0], runs[:, 1]).tolist() == group
    assert p["kinds"]["names"] == ["global (all tokens)", "local (last 32 tokens)"] and p["kinds"][
        "counts"
    ] == [20, 3]
    agg = grid_payload(snap, max_cells=16)  # 4 blocks a cell: the kind of most of them
    runs = np.asarray(agg["kinds"]["runs"]).reshape(-1, 2)
    assert np.repeat(runs[:, 0], runs[:, 1]).tolist()[:6] == [0, 0, 0, 0, 0, 1]
    one = dict(snap, stats=_stats(**ONE_GROUP))
    assert "kinds" not in grid_payload(one)


def test_the_selected_table_lists_each_group_and_what_it_gave_back():
    table = [
        {
            "logical": j,
            "physical": j,
            "shared": False,
            "ref_count": 1,
            "filled": 16,
            "state": "used",
        }
        for j in range(23)
    ]
    sel = {
        "key": "c",
        "label": "Hi",
        "state": "idle_session",
        "request_id": None,
        "table": table,
        "num_blocks": 23,
        "num_computed": 316,
        "num_tokens": 316,
        "last_block_filled": 12,
        "frag_tokens": 4,
        "shared_blocks": 0,
        "group_blocks": [20, 3],
    }
    out = panels.tables_html([sel], "c", 16, group_names=G.group_names(_stats()))
    assert (
        'data-k="table_group_0" data-v="20"' in out
        and "group 1 · local (last 32 tokens): 3 blocks, 17 given back" in out
    )
    assert "17→#20" in out and "19→#22" in out  # the local group's blocks keep their logical index
