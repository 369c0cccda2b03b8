"""The block grid as a compact payload for the page's canvas painter (ui/dashboard/grid_canvas.py).

Why: sending the grid as HTML (one element per block) cost ~16 KB per tick at 3,000 blocks and a
full DOM re-layout every second. Neighbouring blocks mostly agree on what the grid shows (state,
ref_count, who holds them, tokens filled), so the grid is sent run-length encoded, and who holds a
block is sent once per distinct *holder set* (e.g. "the pinned prompt + 16 chats" for every block
of a shared system prompt), not once per block. The page decodes the runs and paints a <canvas>;
hovering a cell looks its holder set up in that small table.

Computed with numpy from the snapshot's parallel block arrays and block tables (docs/DESIGN.md,
"KV contract"), never from per-block Python objects, so a 350k-block pool stays cheap. Pure
functions of one snapshot: `decode_runs` expands a payload back to per-block arrays for tests.

Payload (JSON):
  n, per (blocks per cell; > 1 only above max_cells), bs (block size), band (free/cached runs of at
  least this many cells are drawn as one counted band), counts (blocks per kind, KINDS order),
  runs: flat [kind, length, ref_count, holder set (-1: none), filled tokens, ...] in cells,
  sets: [[holder index, ...], ...], names: [holder name, ...],
  hl: flat [first block, count, ...] of the selected conversation (added per viewer),
  kinds (with KV cache groups only): {runs: [layer kind, length, ...] over cells, names, counts}.
Aggregated cells (per > 1): kind = most common kind (ties to the more interesting), ref_count = the
highest, holder set -1, filled = number of blocks in the cell.
"""

from __future__ import annotations

import json

import numpy as np

from ui.dashboard.groups_view import has_groups, kind_of_group, kinds
from ui.dashboard.kv_math import blocks_for
from ui.dashboard.view import KINDS, conversation_key

MAX_CELLS = 4096
BAND_MIN = 24
_STATE_CODE = {"free": 0, "cached": 1, "used": 2, "pinned": 4}  # "used" -> 2 or 3 by ref_count


def _codes(states) -> np.ndarray:
    """Block states (list of strings, per the contract) -> int8 state codes. A dict lookup per
    block via fromiter: ~15 ms at 350k blocks, 2.5x faster than comparing a numpy string array."""
    try:
        return np.fromiter(map(_STATE_CODE.__getitem__, states), dtype=np.int8, count=len(states))
    except KeyError as e:
        raise ValueError(f"unknown block state {e} in the snapshot") from None


def holder_names(snap: dict) -> tuple[list, list, list]:
    """(names, conversation keys, block tables) of every holder: visible sequences, then pins."""
    names, keys, tables = [], [], []
    for s in snap.get("sequences", []):
        names.append(str(s.get("title") or conversation_key(s)))
        keys.append(conversation_key(s))
        tables.append(s["block_table"])
    for p in snap.get("pins") or []:
        names.append(f"pinned prompt '{p['name']}'")
        keys.append(f"pin:{p['name']}")
        tables.append(p["block_table"])
    return names, keys, tables


def _holder_sets(n: int, tables: list) -> tuple[np.ndarray, list]:
    """Per block, the id of its set of holders (-1: no holder), and each set's holder indices.
    A set is identified by a sum of random 64-bit tags of its holders (collisions: ~2^-64)."""
    lens = np.fromiter((len(t) for t in tables), dtype=np.int64, count=len(tables))
    if not len(tables) or lens.sum() == 0:
        return np.full(n, -1, dtype=np.int64), []
    blk = np.concatenate([np.asarray(t, dtype=np.int64) for t in tables if len(t)])
    who = np.repeat(np.arange(len(tables), dtype=np.int64), lens)
    tags = np.random.default_rng(1234).integers(1, 2**63, size=len(tables), dtype=np.uint64)
    key = np.zeros(n, dtype=np.uint64)
    np.add.at(key, blk, tags[who])
    held = key != 0
    uniq, first, inv = np.unique(key[held], return_index=True, return_inverse=True)
    set_id = np.full(n, -1, dtype=np.int64)
    set_id[held] = inv
    rep_blocks = np.flatnonzero(held)[first]  # one block per set
    order = np.argsort(blk, kind="stable")
    sb, sw = blk[order], who[order]
    lo, hi = np.searchsorted(sb, rep_blocks), np.searchsorted(sb, rep_blocks, side="right")
    sets = [sw[a:b].tolist() for a, b in zip(lo.tolist(), hi.tolist())]
    return set_id, sets


def _runs(*cols: np.ndarray) -> list:
    """Run-length encode equal consecutive rows of (kind, ref, set, filled) -> flat list."""
    kind = cols[0]
    n = len(kind)
    if n == 0:
        return []
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for c in cols:
        change[1:] |= c[1:] != c[:-1]
    starts = np.flatnonzero(change)
    lengths = np.diff(np.append(starts, n))
    out = np.empty((len(starts), 5), dtype=np.int64)
    out[:, 0], out[:, 1] = kind[starts], lengths
    for j, c in enumerate(cols[1:], start=2):
        out[:, j] = c[starts]
    return out.ravel().tolist()


def grid_payload(snap: dict, max_cells: int = MAX_CELLS) -> dict:
    """The viewer-independent part of the grid payload for one snapshot (see module doc)."""
    b = snap["blocks"]
    kind = _codes(b["state"])
    n = len(kind)
    ref = np.asarray(b["ref_count"], dtype=np.int64)
    filled = np.asarray(b["filled"], dtype=np.int64)
    kind[(kind == 2) & (ref >= 2)] = 3
    kind[(kind == 2) & (ref == 0)] = 0  # defensive: "used" with no holder reads as free
    counts = np.bincount(kind, minlength=len(KINDS)).tolist()
    names, _, tables = holder_names(snap)
    per = max(1, blocks_for(n, max_cells))
    if per == 1:
        set_id, sets = _holder_sets(n, tables)
        runs = _runs(kind.astype(np.int64), ref, set_id, filled)
    else:
        cells = blocks_for(n, per)
        pad = cells * per - n
        k = np.concatenate([kind, np.full(pad, -1, dtype=np.int8)]).reshape(cells, per)
        mix = np.stack([(k == j).sum(axis=1) for j in range(len(KINDS))], axis=1)
        top = np.argmax(mix * 8 + np.arange(len(KINDS)), axis=1)
        r = np.concatenate([ref, np.zeros(pad, dtype=np.int64)]).reshape(cells, per).max(axis=1)
        size = np.full(cells, per, dtype=np.int64)
        size[-1] = per - pad
        runs = _runs(top.astype(np.int64), r, np.full(cells, -1, dtype=np.int64), size)
        sets = []
    out = {
        "n": n,
        "per": per,
        "bs": snap["block_size"],
        "band": BAND_MIN,
        "counts": counts,
        "runs": runs,
        "sets": sets,
        "names": names,
    }
    kinds = kind_payload(snap, per)
    if kinds is not None:
        out["kinds"] = kinds
    return out


def kind_payload(snap: dict, per: int) -> dict | None:
    """With KV cache groups (issue 45): each cell's layer kind, for the grid's "colour by layer
    kind" (ui/dashboard/groups_view.py): runs [kind, length, ...] over cells (aggregated cells: the
    kind
    of most of their blocks), the kinds' names and their blocks in use. None with one group."""
    st = snap.get("stats") or {}
    group = snap["blocks"].get("group")
    if group is None or not has_groups(st):
        return None
    of_group = np.asarray(kind_of_group(st) or [0], dtype=np.int64)
    k = of_group[np.clip(np.asarray(group, dtype=np.int64), 0, len(of_group) - 1)]
    if per > 1:
        cells = blocks_for(len(k), per)
        pad = cells * per - len(k)
        kk = np.concatenate([k, np.full(pad, -1, dtype=np.int64)]).reshape(cells, per)
        counts = np.stack([(kk == j).sum(axis=1) for j in range(len(of_group))], axis=1)
        k = np.argmax(counts, axis=1)
    change = np.flatnonzero(np.diff(k, prepend=-2) != 0)
    lengths = np.diff(np.append(change, len(k)))
    ks = kinds(st)
    return {
        "runs": np.stack([k[change], lengths], axis=1).ravel().tolist(),
        "names": [x["name"] for x in ks],
        "counts": [x["blocks"] for x in ks],
    }


def highlight_ranges(blocks) -> list:
    """Sorted block ids -> flat [first, count, ...] ranges (the selected conversation's blocks)."""
    ids = np.unique(np.asarray(list(blocks), dtype=np.int64))
    if not len(ids):
        return []
    starts = np.flatnonzero(np.diff(ids, prepend=ids[0] - 2) != 1)
    lengths = np.diff(np.append(starts, len(ids)))
    return np.stack([ids[starts], lengths], axis=1).ravel().tolist()


def with_highlight(payload: dict, blocks) -> str:
    """The JSON sent to one viewer: the shared payload plus that viewer's highlighted blocks."""
    return json.dumps(dict(payload, hl=highlight_ranges(blocks)), separators=(",", ":"))


def decode_runs(payload: dict) -> dict:
    """Runs -> per-cell arrays {kind, ref, set, filled} (what the painter draws; for tests)."""
    r = np.asarray(payload["runs"], dtype=np.int64).reshape(-1, 5)
    lengths = r[:, 1]
    return {
        "kind": np.repeat(r[:, 0], lengths),
        "ref": np.repeat(r[:, 2], lengths),
        "set": np.repeat(r[:, 3], lengths),
        "filled": np.repeat(r[:, 4], lengths),
    }
