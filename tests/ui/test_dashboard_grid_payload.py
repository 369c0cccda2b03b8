"""The grid's run-length payload (ui/dashboard/grid_payload.py) decodes back to exactly what the
snapshot says, block by block: kind, ref_count, tokens filled and holders (checked against the
snapshot's own `owners` and pins), and aggregated cells agree with the per-cell HTML model."""

import json

import numpy as np
import pytest

from tests.ui.snapshots import busy_snapshot, hand_snapshot, make_snapshot
from ui.dashboard import view as V
from ui.dashboard.grid_payload import (
    decode_runs,
    grid_payload,
    highlight_ranges,
    holder_names,
    with_highlight,
)


def holders_from_payload(p, cells):
    return [
        sorted(p["names"][h] for h in p["sets"][s]) if s >= 0 else [] for s in cells["set"].tolist()
    ]


def test_hand_snapshot_runs_are_exact():
    p = grid_payload(hand_snapshot())
    # blocks 0-1 shared by A and B (ref 2, full); 2: A, 2 tokens; 3: B, 1 token; 4: C, full;
    # 5-6 cached-free (4 tokens each); 7-11 free
    runs = np.asarray(p["runs"]).reshape(-1, 5)
    assert runs[:, [0, 1, 2, 4]].tolist() == [
        [3, 2, 2, 4],
        [2, 1, 1, 2],
        [2, 1, 1, 1],
        [2, 1, 1, 4],
        [1, 2, 0, 4],
        [0, 5, 0, 0],
    ]
    assert runs[-1, 3] == runs[-2, 3] == -1
    assert p["counts"] == [5, 2, 3, 2, 0] and p["per"] == 1 and p["n"] == 12
    cells = decode_runs(p)
    assert holders_from_payload(p, cells)[:5] == [["a", "b"], ["a", "b"], ["a"], ["b"], ["r3#0"]]


def test_busy_pool_decodes_to_the_snapshot_block_by_block():
    snap = busy_snapshot(3000, 32)
    snap["pins"] = [{"name": "shared", "num_tokens": 32, "block_table": [0, 1]}]
    for b in (0, 1):
        snap["blocks"]["state"][b] = "pinned"
    p = grid_payload(snap)
    cells = decode_runs(p)
    b = snap["blocks"]
    want_kind = [V.KINDS.index(V.kind_of(s, r)) for s, r in zip(b["state"], b["ref_count"])]
    assert cells["kind"].tolist() == want_kind
    assert cells["ref"].tolist() == b["ref_count"] and cells["filled"].tolist() == b["filled"]
    names = {
        s["seq_id"] if s.get("seq_id") is not None else s["session_id"]: s.get("title")
        or V.conversation_key(s)
        for s in snap["sequences"]
    }
    owners = V.owners_by_block(snap)
    want = [
        sorted(
            [str(names[o]) for o in owners.get(i, [])]
            + (["pinned prompt 'shared'"] if i < 2 else [])
        )
        for i in range(3000)
    ]
    assert holders_from_payload(p, cells) == want
    # compact: far fewer runs than blocks, and a few KB as JSON
    assert len(p["runs"]) // 5 < 200 and len(with_highlight(p, ())) < 4000


def test_aggregated_cells_agree_with_the_cell_model():
    snap = busy_snapshot(9000, 48)
    p = grid_payload(snap, max_cells=4096)
    old = V.grid_model(snap, max_cells=4096)
    assert p["per"] == old["per_cell"] == 3
    cells = decode_runs(p)
    assert [V.KINDS[k] for k in cells["kind"].tolist()] == [c.kind for c in old["cells"]]
    assert [str(r) if r >= 2 else "" for r in cells["ref"].tolist()] == [
        c.label for c in old["cells"]
    ]
    assert cells["filled"].sum() == 9000  # blocks per cell, the last one short


def test_highlight_ranges_and_json():
    assert highlight_ranges([7, 3, 4, 5, 9, 10]) == [3, 3, 7, 1, 9, 2]
    assert highlight_ranges([]) == []
    snap = make_snapshot(
        8, 16, [{"key": "a", "state": "idle_session", "num_computed": 40, "table": [2, 3, 6]}]
    )
    got = json.loads(with_highlight(grid_payload(snap), [2, 3, 6]))
    assert got["hl"] == [2, 2, 6, 1] and got["names"] == ["a"]


def test_holders_include_pins_after_sequences():
    snap = make_snapshot(
        8, 16, [{"key": "a", "state": "idle_session", "num_computed": 20, "table": [0, 1]}]
    )
    snap["sequences"][0]["title"] = "Trip to Lisbon"
    snap["pins"] = [{"name": "shared", "num_tokens": 16, "block_table": [0]}]
    names, keys, tables = holder_names(snap)
    assert names == ["Trip to Lisbon", "pinned prompt 'shared'"] and keys == ["a", "pin:shared"]
    assert tables == [[0, 1], [0]]


def test_an_unknown_block_state_is_a_clear_error():
    snap = hand_snapshot()
    snap["blocks"]["state"][3] = "zombie"
    with pytest.raises(ValueError, match="unknown block state 'zombie'"):
        grid_payload(snap)
