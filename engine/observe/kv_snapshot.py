"""Stats and snapshots of a KV manager, assembled here (the manager only keeps its counters).

`kv_stats(m)` and `take_snapshot(m, request_of)` read the manager's public views: `holders()`
(running sequences and parked sessions with their per-group tables), the pool's counters and
C arrays, the pins, the tier link and the counters. Nothing here imports engine/kv (a lower floor
may not): the manager is read as a value with those attributes.

The engine thread's share of a snapshot is copies only, so that a dashboard tick on an H200-sized
pool (350k blocks) costs the engine about a millisecond between two steps: the pool's per-block C
arrays (memcpy), one array("i") of block ids per live table (from the ids list each table keeps up
to date, engine/kv/group_table.py), the pins, the preemption log and the counters. Everything a
reader wants as Python lists (block states, ref counts, `shared` flags, `owners`) is derived from
those copies later, lazily, on the reader's thread (engine/observe/kv_columns.py,
engine/observe/kv_contract.py). The copies are private to the snapshot.
"""

from __future__ import annotations

import time
from array import array

import numpy as np

from engine.observe.kv_contract import (
    BlockArrays,
    KVSnapshot,
    KVStats,
    LazySequenceViews,
    PreemptionEvent,
    StateSlotView,
    TierLoadEvent,
)


def _group_used(m) -> list[int]:
    """Used blocks per KV cache group (numpy over the pool's columns: no Block is walked)."""
    n = m.layout.num_groups
    if n == 1:
        return [m.pool.num_used]
    ref = np.frombuffer(m.pool.ref_counts, dtype=np.intc)
    grp = np.frombuffer(m.pool.groups, dtype=np.int8)
    return np.bincount(grp[ref > 0].astype(np.int64), minlength=n)[:n].tolist()


def _groups(m, holders: list) -> list[dict]:
    used = _group_used(m)
    out = []
    for g, spec in enumerate(m.layout.groups):
        tables = [h.tables[g] for h in holders]
        out.append(
            {
                "group": g,
                "kind": spec.kind,
                "sliding_window": spec.sliding_window,
                "layers": list(spec.layers),
                "used_blocks": used[g],
                "held_blocks": sum(len(t.blocks) for t in tables),
                "released_entries": sum(t.released for t in tables),
                "window_released_blocks": m.window_released_blocks[g],
            }
        )
    return out


def kv_stats(m) -> KVStats:
    """Counters for metrics and the dashboard; O(live tables)."""
    pool, bs, layout = m.pool, m.block_size, m.layout
    running, parked = (list(h) for h in m.holders())
    holders = running + parked
    used = pool.num_used
    logical = sum(len(t.blocks) for h in holders for t in h.tables)
    full_attention = sum(len(t) for h in holders for t in h.tables)
    # a contiguous cache reserves max_model_len for every layer of every live sequence (in blocks
    # of the pool's P layer slots: num_layers / P of them per position; 1 for one group)
    contiguous = -(
        -len(holders) * -(-m.max_model_len // bs) * layout.num_layers // layout.pool_layers
    )
    chat_used = used - m.pins.num_pin_only_blocks  # what the live tables hold
    link = m.tier_link
    tier = (
        dict(
            swap_preemptions=link.swap_preemptions,
            tokens_swapped_out=link.tokens_swapped_out,
            tier_loaded_tokens=link.loaded_tokens,
            **link.stats(),
        )
        if link is not None
        else {}
    )
    return KVStats(
        block_size=bs,
        total_blocks=pool.num_blocks,
        free_blocks=pool.num_free,
        used_blocks=used,
        cached_blocks=pool.num_cached_free,
        shared_blocks=pool.num_shared - m.pins.num_pinned_shared,  # not pinned (issue 47)
        peak_used_blocks=max(pool.peak_used, used),
        logical_blocks=logical,
        kv_bytes_per_token=m.kv_bytes_per_token,
        kv_bytes_per_block=m.kv_bytes_per_token * bs,
        kv_capacity_tokens=pool.num_blocks * bs,
        used_tokens=pool.num_used_tokens,
        prefix_cache_queries=m.prefix_cache_queries,
        prefix_cache_hits=m.prefix_cache_hits,
        num_preemptions=m.num_preemptions,
        savings_vs_unshared=1 - chat_used / logical if logical else 0.0,
        savings_vs_contiguous=1 - chat_used / contiguous if contiguous else 0.0,
        num_sequences=len(running),
        num_idle_sessions=len(parked),
        internal_fragmentation_tokens=used * bs - pool.num_used_tokens,
        usage=used / pool.num_blocks,
        pinned_blocks=m.pins.num_pinned_blocks,
        max_pinned_blocks=m.pins.max_blocks,
        chat_used_blocks=chat_used,
        tokens_recomputed_after_preempt=m.tokens_recomputed_after_preempt,
        spec_rollbacks=m.spec_rollbacks,
        spec_rolled_back_slots=m.spec_rolled_back_slots,
        num_groups=layout.num_groups,
        window_released_blocks=sum(m.window_released_blocks),
        full_attention_blocks=full_attention,
        savings_vs_full_attention=1 - chat_used / full_attention if full_attention else 0.0,
        kv_groups=_groups(m, holders),
        state_groups=m.states.stats() if m.states is not None else {},
        **tier,
    )


def _table_ids(holder) -> array:
    """A private copy of the holder's live block ids, group 0 first (array slices: memcpys)."""
    tables = holder.tables
    if len(tables) == 1:
        return tables[0].ids[tables[0].released :]
    out = array("i")
    for t in tables:
        out.extend(t.ids[t.released :])
    return out


def _raw(holder, state: str, num_computed: int, seq_id, request_id, bs: int) -> tuple:
    t0 = holder.tables[0]
    last = num_computed - (len(t0) - 1) * bs if len(t0) else 0
    return (
        seq_id,
        holder.session_id,
        state,
        len(holder.tokens),
        num_computed,
        _table_ids(holder),
        request_id,
        last,
        [len(t.blocks) for t in holder.tables],
        sum(t.released for t in holder.tables),
    )


def take_snapshot(m, request_of=lambda seq_id: None) -> KVSnapshot:
    """Running sequences first, then parked sessions (LRU first)."""
    running, parked = m.holders()
    bs = m.block_size
    raw = [_raw(s, "running", s.num_computed, s.seq_id, request_of(s.seq_id), bs) for s in running]
    raw += [_raw(s, "idle_session", len(s.tokens), None, None, bs) for s in parked]
    ref, filled, hashed = m.pool.columns()
    groups = m.pool.group_column() if m.layout.num_groups > 1 else None
    pins = m.pins.views()
    pinned = {
        b for p in pins for b in p.block_table
    }  # an app pin is its own state (engine/kv/pinning.py)
    link = m.tier_link
    return KVSnapshot(
        time=time.time(),
        block_size=bs,
        num_blocks=m.pool.num_blocks,
        stats=kv_stats(m),
        blocks=BlockArrays.from_columns(ref, filled, hashed, pinned, groups),
        sequences=LazySequenceViews(raw, ref, bs),
        pins=pins,
        preemption_events=[
            PreemptionEvent(request_id=request_of(e["seq_id"]), **e) for e in m.preemption_events
        ],
        tier_events=[
            TierLoadEvent(request_id=request_of(e["seq_id"]), **e)
            for e in (link.load_events if link is not None else ())
        ],
        state_slots=_state_slots(m),
    )


def _state_slots(m) -> list:
    """The held state slots and who holds each (a model with linear-attention layers; else [])."""
    st = m.states
    if st is None:
        return []
    running, parked = m.holders()  # fresh views: take_snapshot's parked iterator is spent
    who: dict[int, list] = {}
    for s in running:
        who.setdefault(st.slot_of(s.tables), []).append((s.seq_id, s.num_computed))
    for p in parked:
        who.setdefault(st.slot_of(p.tables), []).append((p.session_id, len(p.tokens)))
    out = []
    for slot, hs in sorted(who.items()):
        out.append(
            StateSlotView(
                slot,
                st.pool.ref[slot],
                [h for h, _ in hs],
                max(n for _, n in hs),
                st.bytes_per_slot,
            )
        )
    for ck in st.checkpoints.values():
        out.append(
            StateSlotView(
                ck.slot, st.pool.ref[ck.slot], ["checkpoint"], ck.pos, st.bytes_per_slot, ck.uses
            )
        )
    return out
