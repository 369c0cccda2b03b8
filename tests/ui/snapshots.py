"""Snapshots for the dashboard and route tests, without a model.

`busy_snapshot` drives a real KVCacheManager (the contract comes from engine/observe/kv_contract.py).
`hand_snapshot` is a worked example whose numbers were computed by hand (the oracle the view tests
check against; block size 4 is below what the manager accepts, so it cannot come from it).
`make_snapshot` lays out given block tables at chosen block ids for grid/table layout tests.
"""

from __future__ import annotations

import dataclasses
import random
import time

from engine.kv.kv_cache_manager import KVCacheManager
from engine.observe.kv_contract import KVStats
from engine.observe.kv_snapshot import take_snapshot


def make_snapshot(
    num_blocks: int,
    block_size: int,
    seqs: list[dict],
    *,
    cached=(),
    kv_bytes_per_token: int = 46080,
    max_model_len: int = 8192,
    queries: int = 0,
    hits: int = 0,
    preemptions: list[dict] = (),
    generated: int = 0,
    running: int | None = None,
    waiting: int = 0,
    t: float | None = None,
) -> dict:
    """seqs: {"key", "state" ("running"|"idle_session"), "num_computed", "table", "request_id"?}."""
    bs = block_size
    refs, filled = [0] * num_blocks, [0] * num_blocks
    owners: dict[int, list] = {}
    sequences = []
    for s in seqs:
        running_seq = s["state"] == "running"
        who = s["key"] if not running_seq else s.get("seq_id", s["key"] + "#0")
        n, table = s["num_computed"], list(s["table"])
        for j, b in enumerate(table):
            refs[b] += 1
            filled[b] = max(filled[b], min(bs, n - j * bs))
            owners.setdefault(b, []).append(who)
        sequences.append(
            {
                "seq_id": who if running_seq else None,
                "session_id": s.get("session_id", s["key"]),
                "request_id": s.get("request_id"),
                "state": s["state"],
                "num_tokens": s.get("num_tokens", n),
                "num_computed": n,
                "block_table": table,
                "shared": [],
                "last_block_filled": n - (len(table) - 1) * bs if table else 0,
            }
        )
    for e in sequences:
        e["shared"] = [refs[b] >= 2 for b in e["block_table"]]
    cached = set(cached)
    for b in cached:
        filled[b] = bs
    state = ["used" if r else "cached" if i in cached else "free" for i, r in enumerate(refs)]
    used = sum(1 for r in refs if r)
    used_tokens = sum(f for f, r in zip(filled, refs) if r)
    logical = sum(len(e["block_table"]) for e in sequences)
    n_run = sum(1 for e in sequences if e["state"] == "running")
    live = len(sequences)
    contiguous = live * -(-max_model_len // bs)
    stats = KVStats(
        **{  # through the contract's dataclass: a renamed field fails here
            "block_size": bs,
            "total_blocks": num_blocks,
            "free_blocks": num_blocks - used,
            "used_blocks": used,
            "cached_blocks": sum(1 for x in state if x == "cached"),
            "shared_blocks": sum(1 for r in refs if r >= 2),
            "peak_used_blocks": used,
            "logical_blocks": logical,
            "kv_bytes_per_token": kv_bytes_per_token,
            "kv_bytes_per_block": kv_bytes_per_token * bs,
            "kv_capacity_tokens": num_blocks * bs,
            "used_tokens": used_tokens,
            "prefix_cache_queries": queries,
            "prefix_cache_hits": hits,
            "num_preemptions": len(preemptions),
            "savings_vs_unshared": 1 - used / logical if logical else 0.0,
            "savings_vs_contiguous": 1 - used / contiguous if contiguous else 0.0,
            "num_sequences": n_run,
            "num_idle_sessions": live - n_run,
            "internal_fragmentation_tokens": used * bs - used_tokens,
            "usage": used / num_blocks,
            "running": n_run if running is None else running,
            "waiting": waiting,
            "peak_running": n_run,
            "generated_tokens_total": generated,
            "prompt_tokens_computed_total": 0,
            "max_model_len": max_model_len,
            "steps": 0,
        }
    ).to_json()
    return {
        "time": time.time() if t is None else t,
        "block_size": bs,
        "num_blocks": num_blocks,
        "stats": stats,
        "blocks": {"state": state, "ref_count": refs, "filled": filled},
        "owners": owners,
        "sequences": sequences,
        "preemption_events": list(preemptions),
    }


def busy_snapshot(
    num_blocks: int = 3000,
    users: int = 32,
    prefix_blocks: int = 10,
    block_size: int = 16,
    seed: int = 0,
    t: float | None = None,
) -> dict:
    """A pool under chat load, produced by driving a real KVCacheManager (not re-derived): `users`
    conversations sharing a system-prompt prefix, each with a private tail (every third one
    parked as an idle session), plus cached-free blocks left by an earlier, finished sequence.
    On a fresh pool block ids are deterministic: the prefix is blocks 0..prefix_blocks-1."""
    rng = random.Random(seed)
    m = KVCacheManager(num_blocks, block_size, max_model_len=8192, kv_bytes_per_token=46080)
    prefix = list(range(1, prefix_blocks * block_size + 1))
    for u in range(users):
        tail_blocks = rng.randint(1, 30)
        tail = (tail_blocks - 1) * block_size + rng.randint(1, block_size)
        ids = prefix + [1_000_000 + u * 10_000 + j for j in range(tail)]
        m.add_sequence(f"user-{u}#0", ids, num_new_tokens=len(ids), session_id=f"user-{u}")
        if u % 3 == 0:
            m.park(f"user-{u}#0", f"user-{u}")
    earlier = [900_000 + j for j in range(40 * block_size)]
    m.add_sequence("earlier#0", earlier, num_new_tokens=len(earlier))
    m.free("earlier#0")  # its full blocks stay in the prefix cache
    snap = take_snapshot(
        m, request_of=lambda seq_id: "req-" + str(seq_id).split("-")[1].split("#")[0]
    )
    stats = dataclasses.replace(
        snap.stats,
        running=snap.stats.num_sequences,
        peak_running=snap.stats.num_sequences,
        generated_tokens_total=5_000,
        max_model_len=8192,
    )
    snap = dataclasses.replace(snap, stats=stats, time=time.time() if t is None else t)
    return snap.to_json()


# A worked example (the dashboard unit tests check hand-computed numbers against it).
# Pool: 12 blocks of 4 tokens, 46,080 B/token (SmolLM2-135M fp32), max_model_len 32.
#   A  running (seq "r1#0", session "a"): 10 tokens, table [0, 1, 2]   (block 2 holds 2 tokens)
#   B  idle session "b":                   9 tokens, table [0, 1, 3]   (block 3 holds 1 token)
#   C  running (seq "r3#0", no session):   4 tokens, table [4]
#   blocks 0, 1 shared by A and B (ref 2); 5, 6 cached-free; 7..11 free.
BPT = 46080


def hand_snapshot():
    return {
        "time": 100.0,
        "block_size": 4,
        "num_blocks": 12,
        "stats": KVStats(
            **{
                "block_size": 4,
                "total_blocks": 12,
                "free_blocks": 7,
                "used_blocks": 5,
                "cached_blocks": 2,
                "shared_blocks": 2,
                "peak_used_blocks": 6,
                "logical_blocks": 7,
                "kv_bytes_per_token": BPT,
                "kv_bytes_per_block": 4 * BPT,
                "kv_capacity_tokens": 48,
                "used_tokens": 15,
                "prefix_cache_queries": 40,
                "prefix_cache_hits": 30,
                "num_preemptions": 1,
                "savings_vs_unshared": 1 - 5 / 7,
                "savings_vs_contiguous": 1 - 5 / 24,
                "num_sequences": 2,
                "num_idle_sessions": 1,
                "internal_fragmentation_tokens": 5,
                "usage": 5 / 12,
                "running": 2,
                "waiting": 1,
                "peak_running": 3,
                "generated_tokens_total": 77,
                "prompt_tokens_computed_total": 20,
                "max_model_len": 32,
                "steps": 9,
            }
        ).to_json(),
        "blocks": {
            "state": ["used"] * 5 + ["cached"] * 2 + ["free"] * 5,
            "ref_count": [2, 2, 1, 1, 1] + [0] * 7,
            "filled": [4, 4, 2, 1, 4, 4, 4] + [0] * 5,
        },
        "owners": {0: ["r1#0", "b"], 1: ["r1#0", "b"], 2: ["r1#0"], 3: ["b"], 4: ["r3#0"]},
        "sequences": [
            {
                "seq_id": "r1#0",
                "session_id": "a",
                "request_id": "r1",
                "state": "running",
                "num_tokens": 11,
                "num_computed": 10,
                "block_table": [0, 1, 2],
                "shared": [True, True, False],
                "last_block_filled": 2,
            },
            {
                "seq_id": None,
                "session_id": "b",
                "request_id": None,
                "state": "idle_session",
                "num_tokens": 9,
                "num_computed": 9,
                "block_table": [0, 1, 3],
                "shared": [True, True, False],
                "last_block_filled": 1,
            },
            {
                "seq_id": "r3#0",
                "session_id": None,
                "request_id": "r3",
                "state": "running",
                "num_tokens": 5,
                "num_computed": 4,
                "block_table": [4],
                "shared": [False],
                "last_block_filled": 4,
            },
        ],
        "preemption_events": [
            {"request_id": "r2", "seq_id": "r2#0", "tokens_lost": 37, "time": 99.0}
        ],
    }
