"""Memory proof of beam search on copy-on-write blocks (k = 4, a 300-token prompt, 16-token blocks).

Measured on the real engine, not derived from the algorithm:
- peak used blocks stays near prompt blocks + k x (generated blocks + 1), far from k x prompt blocks;
- the copy-on-write copies the manager hands the runner == the forks whose parent's last block was
  partial (each extra child of such a parent diverges inside that block exactly once);
- the beams' block tables are ordinary sequences in the snapshot: the prompt's full blocks are held
  by all k beams (refcount k);
- afterwards no block is held (only cached-free blocks remain).
"""

import math

from engine import BeamSearchParams

K, PROMPT_LEN, GEN, BS = 4, 300, 40, 16
TEXT = " ".join(
    f"Line {i}: paged attention stores keys and values in fixed-size blocks." for i in range(60)
)


def test_k4_300_token_prompt_memory(make_llm, monkeypatch):
    llm = make_llm(num_blocks=256, block_size=BS)
    ids = llm.get_tokenizer().encode(TEXT)[:PROMPT_LEN]
    assert len(ids) == PROMPT_LEN

    from engine.kv.kv_cache_manager import KVCacheManager
    from engine.observe.kv_snapshot import take_snapshot

    copies, managers = [], []
    real_take = KVCacheManager.take_pending_copies

    def take_and_record(self):  # a spy on the class: the real copies, as the runner gets them
        out = real_take(self)
        copies.extend(out)
        managers[:] = [self]
        return out

    monkeypatch.setattr(KVCacheManager, "take_pending_copies", take_and_record)

    events, shared_views = [], []

    def on_step(ev):  # engine thread: between steps, the manager is consistent
        events.append(ev)
        if not ev.done and len(ev.beams) == K and not shared_views:
            request_of = lambda seq_id: str(seq_id).rsplit("#", 1)[0]  # noqa: E731
            shared_views.append(take_snapshot(managers[0], request_of=request_of).to_json())

    handle = llm.submit_beam_search(
        {"prompt_token_ids": ids},
        BeamSearchParams(beam_width=K, max_tokens=GEN, ignore_eos=True),
        on_step=on_step,
    )
    out = handle.result(timeout=600)
    stats = llm.stats()

    prompt_blocks = math.ceil(PROMPT_LEN / BS)  # 19 (18 full + 12 tokens)
    gen_blocks = math.ceil(GEN / BS)  # 3
    bound = prompt_blocks + K * (gen_blocks + 1)  # 19 + 4 x 4 = 35
    unshared = K * math.ceil((PROMPT_LEN + GEN) / BS)  # 4 x 22 = 88
    peak = stats["peak_used_blocks"]
    divergences = sum(1 for ev in events for _, _, ctx in ev.forked if ctx % BS)
    print(
        f"\npeak_used_blocks={peak} bound={bound} k*prompt_blocks={K * prompt_blocks} "
        f"unshared={unshared} cow_copies={len(copies)} partial_divergences={divergences} "
        f"forks={out.stats['forks']} frees={out.stats['frees']} steps={out.stats['steps']} "
        f"after: used={stats['used_blocks']} cached_free={stats['cached_blocks']} free={stats['free_blocks']}"
    )

    assert len(out.sequences) == K and all(len(s.token_ids) == GEN for s in out.sequences)
    assert prompt_blocks < peak <= bound
    assert peak < K * prompt_blocks
    # every copy-on-write copy is one divergence inside a partial block, and vice versa
    assert divergences > 0 and out.stats["forks"] > divergences  # some forks hit a block boundary
    assert len(copies) == divergences == out.stats["partial_block_divergences"]
    # the prompt's 18 full blocks: one physical copy, held by every beam
    snap = shared_views[0]
    beams = [s for s in snap["sequences"] if s.get("request_id") == handle.request_id]
    assert len(beams) == K
    head = beams[0]["block_table"][: PROMPT_LEN // BS]
    assert all(b["block_table"][: PROMPT_LEN // BS] == head for b in beams)
    assert all(snap["blocks"]["ref_count"][i] == K for i in head)
    # nothing held afterwards: everything is free (part of it cached-free)
    assert stats["used_blocks"] == 0 and stats["num_sequences"] == 0
    assert stats["free_blocks"] == stats["total_blocks"]
