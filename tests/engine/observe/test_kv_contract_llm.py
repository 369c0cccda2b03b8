"""The snapshot contract on the real engine (engine.LLM): the shared per-window snapshot, its
compact form and its JSON bytes agree with an exact snapshot taken between steps."""

import json

from engine import SamplingParams
from engine.observe.kv_contract import KVSnapshot, expand_ranges


def test_shared_full_compact_and_bytes_agree_with_an_exact_snapshot(make_llm):
    llm = make_llm(num_blocks=128)
    long = "Paging splits the KV cache into fixed-size blocks that sequences share. " * 4
    outs = llm.generate(
        [long + "The capital of France is", long + "A haiku about memory:"],
        SamplingParams(temperature=0.0, max_tokens=8, n=2),
    )
    assert all(len(o.outputs) == 2 for o in outs)
    exact = llm.snapshot()  # nothing runs now: every form must agree
    full, compact = llm.latest_snapshot(), llm.latest_snapshot(compact=True)
    body = llm.latest_snapshot_bytes()
    assert body is llm.latest_snapshot_bytes() and json.loads(body) == json.loads(json.dumps(full))
    assert (
        full["blocks"] == exact["blocks"]
        and full["stats"]["used_blocks"] == exact["stats"]["used_blocks"]
    )
    assert full["time"] == compact["time"] and "blocks" not in compact
    assert KVSnapshot.from_json(compact).blocks == KVSnapshot.from_json(exact).blocks
    for s, t in zip(full["sequences"], compact["sequences"]):
        assert expand_ranges(t["block_ranges"]) == s["block_table"]
    assert "cached" in exact["blocks"]["state"]  # the finished requests left their prefixes
    used = sum(1 for r in exact["blocks"]["ref_count"] if r)
    assert used == exact["stats"]["used_blocks"]
