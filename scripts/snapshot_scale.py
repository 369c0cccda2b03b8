"""Measure the KV snapshot contract at GPU scale on a manager-only pool (no model): kv_snapshot()
(engine-thread part), to_json() and json.dumps (caller's thread), at 350k blocks by default.

    .venv/bin/python scripts/snapshot_scale.py [--blocks 350000] [--seqs 256] [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kv_cache_manager import KVCacheManager  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=350_000)
    p.add_argument("--seqs", type=int, default=256)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    m = KVCacheManager(a.blocks, 16, max_model_len=32768, kv_bytes_per_token=46080)
    build = time.perf_counter() - t0
    per_seq = min(32768, a.blocks * 16 * 3 // 4 // a.seqs)    # fill ~75% of the pool
    shared = list(range(1, 1 + 512))                            # a shared 32-block system prompt
    for i in range(a.seqs):
        ids = shared + [100_000 + i * per_seq + j for j in range(per_seq - len(shared))]
        m.add_sequence(i, ids, num_new_tokens=len(ids))
    snap_t, json_t, dumps_t, size = [], [], [], 0
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        snap = m.kv_snapshot()
        t1 = time.perf_counter()
        d = snap.to_json()
        t2 = time.perf_counter()
        text = json.dumps(d)
        t3 = time.perf_counter()
        snap_t.append(t1 - t0), json_t.append(t2 - t1), dumps_t.append(t3 - t2)
        size = len(text)
    st = m.kv_stats()
    med = lambda xs: statistics.median(xs) * 1000  # noqa: E731
    print(f"pool {a.blocks} blocks ({build:.2f} s to build), {a.seqs} sequences, {st.used_blocks} used, "
          f"{st.shared_blocks} shared")
    print(f"kv_snapshot() {med(snap_t):.1f} ms · to_json() {med(json_t):.1f} ms · json.dumps {med(dumps_t):.1f} ms "
          f"· {size / 1e6:.1f} MB (medians of {a.repeat})")


if __name__ == "__main__":
    main()
