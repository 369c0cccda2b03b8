"""Per-tick cost of the Memory tab at GPU pool size, manager only (no model): the engine-thread
part (kv_snapshot), the caller's part (to_json), the dashboard render of one tick, and the bytes a
tick sends, for a 350k-block pool (an H200's worth of SmolLM2 KV) and for a 3,000-block one.

    .venv/bin/python -m loadgen.bench_snapshot_tick [--blocks 350000 3000] [--seqs 256] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time


class _SnapLLM:
    """Just what the dashboard reads from an engine: a snapshot and the model's shape."""

    def __init__(self, snap):
        self.snap = snap

    def latest_snapshot(self):
        return self.snap

    def model_info(self):
        from types import SimpleNamespace
        return SimpleNamespace(name="SmolLM2-135M", num_layers=30, num_attention_heads=9, num_kv_heads=3,
                               head_dim=64, dtype="float32", max_model_len=32768, max_num_seqs=256)


def _fill(m, blocks: int, seqs: int):
    per_seq = min(32768, blocks * 16 * 3 // 4 // seqs)
    shared = list(range(1, 1 + 512))                      # a shared 32-block system prompt
    for i in range(seqs):
        ids = shared + [100_000 + i * per_seq + j for j in range(per_seq - len(shared))]
        m.add_sequence(i, ids, num_new_tokens=len(ids), session_id=f"s{i}")


def measure(blocks: int, seqs: int, repeat: int) -> dict:
    from engine.kv_cache_manager import KVCacheManager
    from ui.dashboard import page as D
    m = KVCacheManager(blocks, 16, max_model_len=32768, kv_bytes_per_token=46080)
    _fill(m, blocks, seqs)
    snap_t, json_t, render_t, sizes = [], [], [], []
    for k in range(repeat):
        t0 = time.perf_counter()
        snap = m.kv_snapshot()
        t1 = time.perf_counter()
        d = snap.to_json()
        d["time"] = 1000.0 + k
        t2 = time.perf_counter()
        st = d["stats"]
        st["max_model_len"] = 32768
        state = D.DashboardState(_SnapLLM(d))
        t3 = time.perf_counter()
        v = state.view(d, None, None)
        t4 = time.perf_counter()
        snap_t.append(t1 - t0)
        json_t.append(t2 - t1)
        render_t.append(t4 - t3)
        sizes.append({k2: len(v[k2]) for k2 in ("story", "headline", "grid", "tables")})
    med = lambda xs: round(1000 * statistics.median(xs), 1)  # noqa: E731
    return {"blocks": blocks, "sequences": seqs, "used_blocks": m.num_used_blocks,
            "engine_thread_kv_snapshot_ms": med(snap_t), "to_json_ms": med(json_t),
            "dashboard_render_ms": med(render_t), "html_bytes": sizes[-1]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, nargs="+", default=[350_000, 3_000])
    p.add_argument("--seqs", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    for b in a.blocks:
        print(json.dumps(measure(b, min(a.seqs, max(1, b // 64)), a.repeat)))


if __name__ == "__main__":
    main()
