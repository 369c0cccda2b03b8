"""Micro-benchmark of the KV-cache manager: cost per operation at 1k / 10k / 100k blocks.

Why: the manager runs on the engine thread between forwards, so its per-step cost must not grow
with the pool. Every pool is half filled by 64 background sequences (block_size 16) so the free
list and the prefix-cache map are large. alloc/free/prefix-hit/stats should stay flat;
snapshot walks every block on purpose (the dashboard's grid), so it grows with the pool.

    python bench/block_manager_micro.py [--repeats 5] [--ops 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.kv.kv_cache_manager import KVCacheManager  # noqa: E402
from engine.observe.kv_snapshot import kv_stats, take_snapshot

BS = 16


def setup(num_blocks: int) -> KVCacheManager:
    m = KVCacheManager(num_blocks, BS, max_model_len=1 << 30)
    per_seq = num_blocks // 2 // 64 * BS
    for i in range(64):
        m.add_sequence(("bg", i), list(range(i << 24, (i << 24) + per_seq)), num_new_tokens=per_seq)
    return m


def timed(fn, ops: int) -> float:
    t0 = time.perf_counter()
    fn(ops)
    return (time.perf_counter() - t0) / ops * 1e6


def bench(num_blocks: int, ops: int, repeats: int) -> dict[str, float]:
    m = setup(num_blocks)
    prompts = [list(range(k * 64 + (1 << 30), (k + 1) * 64 + (1 << 30))) for k in range(ops)]
    hit_prompt = list(range(7, 7 + 16 * BS + 1))  # 16 cacheable blocks + 1 token

    def alloc_free(n):  # admit a 64-token prompt (4 blocks, no hit), free it
        for k in range(n):
            m.add_sequence("a", prompts[k], num_new_tokens=64)
            m.free("a")

    def decode_append(n):  # one token per call, as decode does
        toks = [1]
        m.add_sequence("d", toks, num_new_tokens=1)
        for k in range(n):
            if len(toks) == 1024:  # 64 blocks: restart so small pools never run out
                m.free("d")
                toks = [1]
                m.add_sequence("d", toks, num_new_tokens=1)
            toks.append(k)
            m.allocate_slots("d", 1)
        m.free("d")

    def prefix_hit(n):  # 16 blocks revived from the free list, then freed
        m.add_sequence("warm", hit_prompt, num_new_tokens=len(hit_prompt))
        m.free("warm")  # (earlier cases may have evicted them)
        for _ in range(n):
            assert m.add_sequence("h", hit_prompt, num_new_tokens=1 << 20) == 16 * BS
            m.free("h")

    def stats(n):
        for _ in range(n):
            kv_stats(m).to_json()

    def snapshot(n):
        for _ in range(n):
            take_snapshot(m).to_json()

    cases = {
        "add+free (4 blk)": (alloc_free, ops),
        "decode append": (decode_append, ops * 4),
        "prefix hit 16 blk": (prefix_hit, ops),
        "stats": (stats, ops),
        "snapshot": (snapshot, max(3, ops // 200)),
    }
    return {
        name: statistics.median(timed(fn, n) for _ in range(repeats))
        for name, (fn, n) in cases.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    args = ap.parse_args()
    results = {n: bench(n, args.ops, args.repeats) for n in args.sizes}
    names = list(next(iter(results.values())))
    print(
        f"median us per op, block_size {BS}, pool half filled by 64 sequences, "
        f"{args.repeats} repeats"
    )
    print(f"{'operation':<20}" + "".join(f"{n:>12,} blk" for n in args.sizes))
    for name in names:
        print(f"{name:<20}" + "".join(f"{results[n][name]:>16.1f}" for n in args.sizes))


if __name__ == "__main__":
    main()
