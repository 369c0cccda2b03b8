"""View-model of the dashboard on a hand-built snapshot whose numbers are worked out by hand.

Pool: 12 blocks of 4 tokens, 46,080 B/token (SmolLM2-135M fp32), max_model_len 32.
  A  running (seq "r1#0", session "a"): 10 tokens, table [0, 1, 2]   (block 2 holds 2 tokens)
  B  idle session "b":                   9 tokens, table [0, 1, 3]   (block 3 holds 1 token)
  C  running (seq "r3#0", no session):   4 tokens, table [4]
  blocks 0, 1 shared by A and B (ref 2); 5, 6 cached-free; 7..11 free.
"""

import re

import pytest

from ui.dashboard import panels as H
from ui.dashboard import view as V
from tests.ui.snapshots import BPT, busy_snapshot, hand_snapshot, make_snapshot


def test_hand_snapshot_is_consistent_and_matches_the_sample_builder():
    snap = hand_snapshot()
    assert V.consistency_problems(snap) == []
    built = make_snapshot(
        12,
        4,
        [
            {
                "key": "a",
                "seq_id": "r1#0",
                "state": "running",
                "num_computed": 10,
                "table": [0, 1, 2],
            },
            {"key": "b", "state": "idle_session", "num_computed": 9, "table": [0, 1, 3]},
            {
                "key": "r3",
                "seq_id": "r3#0",
                "session_id": None,
                "state": "running",
                "num_computed": 4,
                "table": [4],
            },
        ],
        cached=[5, 6],
        max_model_len=32,
    )
    for k in (
        "used_blocks",
        "free_blocks",
        "cached_blocks",
        "shared_blocks",
        "logical_blocks",
        "used_tokens",
        "internal_fragmentation_tokens",
        "savings_vs_unshared",
        "savings_vs_contiguous",
    ):
        assert built["stats"][k] == snap["stats"][k], k
    assert built["blocks"] == snap["blocks"]


def test_grid_cells_states_refcounts_and_hover():
    grid = V.grid_model(hand_snapshot())
    assert grid["per_cell"] == 1 and not grid["aggregated"]
    assert [c.kind for c in grid["cells"]] == list("sspppcc") + ["f"] * 5
    assert [c.label for c in grid["cells"][:5]] == ["2", "2", "", "", ""]
    assert grid["counts"] == {"f": 5, "c": 2, "p": 3, "s": 2, "n": 0}
    t0 = grid["cells"][0].title
    assert "block 0" in t0 and "ref_count 2" in t0 and "4/4 tokens" in t0
    assert "held by a, b" in t0  # running seq r1#0 is shown as its session "a"
    assert "held by r3#0" in grid["cells"][4].title  # no session: the sequence id
    assert (
        grid["cells"][3].title.startswith("block 3 · private")
        and "1/4 tokens" in grid["cells"][3].title
    )
    assert "cached" in grid["cells"][5].title and grid["cells"][9].title == "block 9 · free"


def test_grid_html_draws_refcounts_and_highlights_a_conversation():
    snap = hand_snapshot()
    convs = V.conversations(snap)
    hl = V.highlight_blocks(convs, "b")
    assert hl == {0, 1, 3}
    html = H.grid_html(V.grid_model(snap), hl)
    cells = re.findall(r'<i class="?([a-z]+(?: h)?)"?(?: title="[^"]*")?>([^<]*)</i>', html)
    assert len(cells) == 12
    assert cells[0] == ("s h", "2") and cells[2] == ("p", "") and cells[3] == ("p h", "")
    assert "12 blocks, one cell per block" in html


def test_grid_aggregates_when_the_pool_is_larger_than_the_grid():
    snap = busy_snapshot(num_blocks=10_000, users=8)
    grid = V.grid_model(snap, max_cells=4096)
    assert grid["aggregated"] and grid["per_cell"] == 3
    assert len(grid["cells"]) == 3334
    first = grid["cells"][0]  # blocks 0-2: system-prompt prefix held by all 8
    assert (first.first, first.last, first.kind, first.label, first.mix) == (
        0,
        2,
        "s",
        "8",
        (0, 0, 0, 3, 0),
    )
    assert sum(sum(c.mix) for c in grid["cells"]) == 10_000
    assert grid["cells"][-1].first == 9999 and grid["cells"][-1].last == 9999
    html = H.grid_html(grid)
    assert "each cell aggregates 3 blocks" in html and "10,000 blocks" in html
    # 1 ref-less mix: the most common kind wins, ties go to the more interesting kind
    mixed = make_snapshot(
        4, 16, [{"key": "x", "state": "running", "num_computed": 20, "table": [1, 2]}]
    )
    g = V.grid_model(mixed, max_cells=2)
    assert [(c.kind, c.mix) for c in g["cells"]] == [("p", (1, 0, 1, 0, 0)), ("p", (1, 0, 1, 0, 0))]


def test_block_tables_mark_shared_blocks_and_last_block_fill():
    convs = V.conversations(hand_snapshot())
    assert [c["key"] for c in convs] == ["a", "r3#0", "b"]  # running first, then idle
    a = convs[0]
    assert [(e["logical"], e["physical"], e["shared"], e["ref_count"]) for e in a["table"]] == [
        (0, 0, True, 2),
        (1, 1, True, 2),
        (2, 2, False, 1),
    ]
    assert (a["last_block_filled"], a["frag_tokens"], a["shared_blocks"]) == (2, 2, 2)
    assert convs[2]["frag_tokens"] == 3 and convs[1]["frag_tokens"] == 0
    assert V.choices(convs) == [("a", "a"), ("b", "b"), ("r3#0", "r3#0")]  # (title or id, key)
    html = H.tables_html(convs, "a", 4)
    assert "Block table of a" in html and "2/4 filled → 2 slots of internal fragmentation" in html
    assert "0→#0×2" in html and "2→#2 2/4" in html
    assert "All live block tables (3)" in html
    assert (
        "That conversation holds no blocks now"
    )  # no id echoed back in H.tables_html(convs, "gone", 4)


def test_sharing_savings_and_headline_numbers():
    snap = hand_snapshot()
    sav = V.sharing_savings(snap)
    assert sav == {
        "ref_sum": 7,
        "used_blocks": 5,
        "saved_blocks": 2,
        "saved_bytes": 2 * 4 * BPT,
        "unshared_blocks": 7,
        "contiguous_blocks": 24,
    }
    items = {it["key"]: it for it in V.headline(snap, hit_last_min=0.5, tokens_per_s=12.5)}
    assert items["used_blocks"]["text"] == "5 / 12"
    assert items["used_blocks"]["sub"] == "41.7% · 900 KiB of 2.11 MiB · peak 6"
    assert items["kv_capacity_tokens"]["text"] == "48 tok"
    assert items["free_tokens"]["value"] == 28
    assert items["saved_blocks"]["text"] == "2 blocks" and "360 KiB" in items["saved_blocks"]["sub"]
    assert items["savings_vs_unshared"]["text"] == "28.6%"
    assert items["savings_vs_contiguous"]["text"] == "79.2%"
    assert "24 blocks" in items["savings_vs_contiguous"]["sub"]
    assert items["internal_fragmentation_tokens"]["text"] == "5 tok"
    assert items["internal_fragmentation_tokens"]["sub"].startswith("25.0% of used slots")
    assert items["hit_rate_run"]["text"] == "75.0%" and items["hit_rate_minute"]["text"] == "50.0%"
    assert items["running"]["text"] == "2 / 1" and items["num_preemptions"]["value"] == 1
    assert items["tokens_per_s"]["text"] == "12.5 tok/s"
    html = H.headline_html(list(items.values()), V.preemption_rows(snap))
    assert 'data-k="used_blocks" data-v="5"' in html
    assert "r2 (r2#0): 37 tokens to recompute" in html


def test_headline_without_traffic_shows_dashes_not_zero_division():
    snap = make_snapshot(8, 16, [])
    items = {it["key"]: it for it in V.headline(snap)}
    assert items["hit_rate_run"]["text"] == "–" and items["tokens_per_s"]["text"] == "–"
    assert items["savings_vs_unshared"]["text"] == "0.0%"
    assert "No live sequences" in H.tables_html([], None, 16)


def test_consistency_check_catches_a_wrong_stat():
    snap = hand_snapshot()
    snap["stats"]["shared_blocks"] = 3
    snap["owners"][2] = []
    bad = V.consistency_problems(snap)
    assert any("shared_blocks" in b for b in bad) and any("block 2" in b for b in bad)


def test_json_round_trip_owner_keys_still_work():
    import json

    snap = json.loads(json.dumps(hand_snapshot()))
    assert V.consistency_problems(snap) == []
    assert "held by a, b" in V.grid_model(snap)["cells"][1].title


def test_lazy_block_table_reads_like_a_list_of_entries():
    snap = hand_snapshot()
    a = next(c for c in V.conversations(snap) if c["key"] == "r1#0" or c["session_id"] == "a")
    t = a["table"]
    assert len(t) == 3 and t[-1] == t[2] == {
        "logical": 2,
        "physical": 2,
        "shared": False,
        "ref_count": 1,
        "filled": 2,
        "state": "used",
    }
    assert [e["physical"] for e in t[:2]] == [0, 1] and list(t) == [t[0], t[1], t[2]]
    with pytest.raises(IndexError):
        t[3]
