"""Measure the KV snapshot contract at GPU scale on a manager-only pool (no model), per pool size:

- engine thread: `kv_snapshot()` the first time (builds each table's cached id array) and in steady
  state (median over ticks, each after one decode step of every sequence: what a dashboard tick
  costs the engine between two steps);
- reader's thread: `to_json()` and `json.dumps` of the full (v3-compatible) form and of the
  compact form (`to_json(compact=True)`: block_runs instead of per-block lists and owners);
- bytes of each.

The pool is filled to ~75% by `--seqs` sequences that share a 32-block system prompt.

    .venv/bin/python scripts/snapshot_scale.py [--blocks 3000 35000 350000] [--seqs 256] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kv.kv_cache_manager import KVCacheManager  # noqa: E402
from engine.observe.kv_snapshot import kv_stats, take_snapshot


def build(blocks: int, seqs: int) -> KVCacheManager:
    m = KVCacheManager(blocks, 16, max_model_len=32768, kv_bytes_per_token=46080)
    seqs = max(1, min(seqs, blocks // 64))  # small pools: fewer, longer chats
    per_seq = min(32768, blocks * 16 * 3 // 4 // seqs)  # fill ~75% of the pool
    shared = list(range(1, 1 + min(512, per_seq // 2)))  # a shared system prompt (<= 32 blocks)
    for i in range(seqs):
        ids = shared + [100_000 + i * per_seq + j for j in range(per_seq - len(shared))]
        m.add_sequence(i, ids, num_new_tokens=len(ids))
    return m


def decode_step(m: KVCacheManager) -> None:
    """One token for every running sequence (what happens between two dashboard ticks, at least)."""
    running, _ = m.holders()
    for seq in list(running):
        seq.tokens.append(7)
        m.allocate_slots(seq.seq_id, 1)


def measure(blocks: int, seqs: int, repeat: int) -> dict:
    m = build(blocks, seqs)
    t0 = time.perf_counter()
    take_snapshot(m)
    first = time.perf_counter() - t0
    snap_t, json_t, dumps_t, cjson_t, cdumps_t = [], [], [], [], []
    size = csize = 0
    for _ in range(repeat):
        decode_step(m)
        t0 = time.perf_counter()
        snap = take_snapshot(m)
        snap_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        compact = snap.to_json(compact=True)  # the cheap form first: lazily built lists are
        cjson_t.append(time.perf_counter() - t0)  # then charged to the full form, as they should
        t0 = time.perf_counter()
        text = json.dumps(compact)
        cdumps_t.append(time.perf_counter() - t0)
        csize = len(text)
        snap = take_snapshot(m)  # a fresh one: the full form pays every derivation
        t0 = time.perf_counter()
        full = snap.to_json()
        json_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        text = json.dumps(full)
        dumps_t.append(time.perf_counter() - t0)
        size = len(text)
    st = kv_stats(m)
    med = lambda xs: statistics.median(xs) * 1000  # noqa: E731
    return {
        "blocks": blocks,
        "seqs": st.num_sequences,
        "used": st.used_blocks,
        "first_ms": first * 1000,
        "engine_ms": med(snap_t),
        "to_json_ms": med(json_t),
        "dumps_ms": med(dumps_t),
        "bytes": size,
        "compact_to_json_ms": med(cjson_t),
        "compact_dumps_ms": med(cdumps_t),
        "compact_bytes": csize,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, nargs="+", default=[3_000, 35_000, 350_000])
    p.add_argument("--seqs", type=int, default=256)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print the rows as JSON too")
    a = p.parse_args(argv)
    rows = [measure(n, a.seqs, a.repeat) for n in a.blocks]
    print(
        f"medians of {a.repeat} ticks; engine = kv_snapshot() on the engine thread; the rest on the reader's thread"
    )
    print(
        f"{'blocks':>8} {'seqs':>5} {'used':>7} | {'engine 1st':>10} {'engine':>7} | {'to_json':>8} {'dumps':>7} "
        f"{'bytes':>10} | {'compact':>8} {'dumps':>6} {'bytes':>8}"
    )
    for r in rows:
        print(
            f"{r['blocks']:>8,} {r['seqs']:>5} {r['used']:>7,} | {r['first_ms']:>8.2f}ms {r['engine_ms']:>5.2f}ms | "
            f"{r['to_json_ms']:>6.1f}ms {r['dumps_ms']:>5.1f}ms {r['bytes']:>10,} | "
            f"{r['compact_to_json_ms']:>6.1f}ms {r['compact_dumps_ms']:>4.1f}ms {r['compact_bytes']:>8,}"
        )
    if a.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
