"""python -m bench --kv-events [--blocks N] [--block-size B] [--chain C] [--per-event E]

The KV-event reader's cost (issue 50): memory of one replica's model holding N cached blocks, and
CPU time per 10^5 events through the whole path a live batch takes (msgpack decode, sequencing,
the block model), plus the cluster arithmetic of the Memory tab over three such replicas.

The events are vLLM's own format (backends/kv_events.encode_batch, the map form vLLM 0.32 sends):
prefix trees of `--chain` blocks of `--block-size` token ids each, `--per-event` blocks per
BlockStored (the whole chain as vLLM publishes a prefill; 1 as it publishes decode), then
BlockRemoved for half the blocks and BlockStored again (eviction churn). Every event counts,
whatever its size, so CPU per 10^5 events depends on blocks per event; per 10^5 blocks too.
Memory is the process's resident-set growth while the model fills (the key map is Python objects,
which numpy's nbytes does not see) and tracemalloc's peak for the same build.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
import tracemalloc

from backends.kv_blocks import MASK64, ReplicaBlocks
from backends.kv_cluster import Replica, cluster_numbers
from backends.kv_events import encode_batch
from backends.kv_feed import Feed


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def payloads(
    n_blocks: int, block_size: int, chain: int, per_event: int | None = None, batch_events: int = 8
):
    """Encoded batches storing n_blocks blocks in prefix trees of `chain` blocks (a chain each),
    `per_event` blocks per BlockStored (a prefill announces many at once; decode one at a time,
    each naming its parent)."""
    per_event = per_event or chain
    out, events, h = [], [], 1
    for start in range(0, n_blocks, chain):
        n = min(chain, n_blocks - start)
        hashes = [(x * 0x9E3779B97F4A7C15) & MASK64 for x in range(h, h + n)]
        tokens = [(start * 7 + k) % 49152 for k in range(n * block_size)]
        for i in range(0, n, per_event):
            events.append(
                {
                    "type": "BlockStored",
                    "block_hashes": hashes[i : i + per_event],
                    "parent_block_hash": hashes[i - 1] if i else None,
                    "token_ids": tokens[i * block_size : (i + per_event) * block_size],
                    "block_size": block_size,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "extra_keys": None,
                    "group_idx": 0,
                    "kv_cache_spec_kind": "full_attention",
                }
            )
            if len(events) == batch_events:
                out.append(encode_batch(events))
                events = []
        h += n
    if events:
        out.append(encode_batch(events))
    return out


def removals(first_hash: int, n: int, per_event: int = 16, batch_events: int = 8):
    out, events = [], []
    for h in range(first_hash, first_hash + n, per_event):
        hs = [
            (x * 0x9E3779B97F4A7C15) & MASK64 for x in range(h, min(h + per_event, first_hash + n))
        ]
        events.append({"type": "BlockRemoved", "block_hashes": hs, "medium": "GPU", "group_idx": 0})
        if len(events) == batch_events:
            out.append(encode_batch(events))
            events = []
    if events:
        out.append(encode_batch(events))
    return out


def feed_all(feed: Feed, batches: list, seq0: int) -> tuple[float, int]:
    events = 0
    t0 = time.process_time()
    for k, p in enumerate(batches):
        feed.live(seq0 + k, p)
    dt = time.process_time() - t0
    events = feed.counts["events"]
    return dt, events


def run(n_blocks: int, block_size: int, chain: int, per_event: int) -> dict:
    batches = payloads(n_blocks, block_size, chain, per_event)
    gc.collect()
    base = rss_bytes()
    blocks = ReplicaBlocks(max_blocks=max(n_blocks * 2, 1024))
    feed = Feed(blocks)
    cpu_fill, ev_fill = feed_all(feed, batches, 0)
    gc.collect()
    rss_fill = rss_bytes() - base
    del batches
    churn = removals(1, n_blocks // 2)
    again = payloads(n_blocks // 2, block_size, chain, per_event)
    seq = feed.last + 1
    before = feed.counts["events"]
    t0 = time.process_time()
    for k, p in enumerate(churn + again):
        feed.live(seq + k, p)
    cpu_churn = time.process_time() - t0
    ev_churn = feed.counts["events"] - before
    # the page's arithmetic: three replicas' snapshots, the cross-replica numbers
    reps = []
    for i in range(3):
        r = Replica(f"r{i}", None, None)
        r.blocks, r.feed, r.has_events = blocks, feed, True  # one model thrice: every block held 3x
        reps.append(r)
    t0 = time.process_time()  # CPU seconds: the machine is shared, wall time is not ours
    snaps = [r.snap() for r in reps]
    numbers = cluster_numbers(snaps)
    page_s = time.process_time() - t0
    tracemalloc.start()
    small = ReplicaBlocks(max_blocks=200_000)
    f2 = Feed(small)
    for k, p in enumerate(payloads(100_000, block_size, chain, per_event)):
        f2.live(k, p)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "blocks": n_blocks,
        "block_size": block_size,
        "blocks_per_tree": chain,
        "blocks_per_event": per_event,
        "model_blocks_after_churn": len(blocks),
        "rss_fill_mib": rss_fill / 2**20,
        "bytes_per_block_rss": rss_fill / n_blocks,
        "numpy_columns_mib": blocks.nbytes() / 2**20,
        "events_fill": ev_fill,
        "cpu_s_fill": cpu_fill,
        "cpu_s_per_1e5_events_fill": cpu_fill / ev_fill * 1e5,
        "cpu_s_per_1e5_blocks_fill": cpu_fill / n_blocks * 1e5,
        "events_churn": ev_churn,
        "cpu_s_per_1e5_events_churn": cpu_churn / ev_churn * 1e5,
        "page_numbers_cpu_s_3_replicas": page_s,
        "avoidable_blocks": numbers.avoidable_blocks,
        "tracemalloc_peak_mib_1e5_blocks": peak / 2**20,
        "load_avg": os.getloadavg()[0],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench --kv-events")
    p.add_argument("--blocks", type=int, default=1_000_000)
    p.add_argument(
        "--block-size", type=int, default=16, help="tokens per block (vLLM GPU 16, CPU 128)"
    )
    p.add_argument("--chain", type=int, default=16, help="blocks per prefix tree (one chain)")
    p.add_argument(
        "--per-event",
        type=int,
        default=None,
        help="blocks per BlockStored event (default: the whole chain, as a prefill)",
    )
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    r = run(a.blocks, a.block_size, a.chain, a.per_event or a.chain)
    text = json.dumps(r, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
