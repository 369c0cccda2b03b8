"""Manager-only cost of a GPU-sized KV pool on this CPU: building KVCacheManager with N blocks (what
LLM start-up spends on the pool's bookkeeping), a chat-like load on it, stats() and snapshot().

    python scripts/measure_pool.py [--blocks 350000] [--json out.json]

Why: at 85% of an H200, SmolLM2's bf16 pool is ~341k blocks; one Python object per block cost
~1 s at start-up and every snapshot walked them all. Medians of --repeat runs are printed.
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


def measure(num_blocks: int, sessions: int = 64, block_size: int = 16) -> dict:
    t0 = time.perf_counter()
    m = KVCacheManager(num_blocks, block_size, max_model_len=8192, kv_bytes_per_token=18432)
    t_build = time.perf_counter() - t0
    system = list(range(1000, 1300))  # a shared 300-token system prompt
    t0 = time.perf_counter()
    for s in range(sessions):
        toks = system + [s * 7 + i for i in range(200)]
        m.add_sequence(f"s{s}", toks, num_new_tokens=len(toks))
    t_admit = time.perf_counter() - t0
    t0 = time.perf_counter()
    st = kv_stats(m).to_json()
    t_stats = time.perf_counter() - t0
    t0 = time.perf_counter()
    snap = take_snapshot(m).to_json()
    t_snap = time.perf_counter() - t0
    t0 = time.perf_counter()
    payload = json.dumps(snap)
    t_json = time.perf_counter() - t0
    for s in range(sessions):
        m.free(f"s{s}")
    return {
        "num_blocks": num_blocks,
        "build_s": t_build,
        "admit_64_sessions_s": t_admit,
        "stats_s": t_stats,
        "snapshot_s": t_snap,
        "snapshot_json_s": t_json,
        "snapshot_json_bytes": len(payload),
        "used_blocks_at_snapshot": st["used_blocks"],
        "free_after": kv_stats(m).to_json()["free_blocks"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=350_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    runs = [measure(a.blocks) for _ in range(a.repeat)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    for k, v in med.items():
        print(f"{k:28s} {v * 1e3:10.2f} ms" if k.endswith("_s") else f"{k:28s} {int(v):>10d}")
    if a.json:
        Path(a.json).write_text(json.dumps({"median": med, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
