"""The KV tier on the real engine (SmolLM2, fp32 CPU): greedy outputs are identical with the tier on
and off across eviction + reload, preemption with swap-out / swap-in, and a restart; the tier
really served the tokens (loads, write-backs, swaps counted; fewer prompt tokens computed); after
a restart the first turn hits the tier; deleting the conversation deletes its blocks from disk."""

import pytest

from engine import ServingLLM, SamplingParams
from engine.kv.tier.store import FileStore, owner_tag

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(temperature=0.0, max_tokens=10)
TEXTS = [
    "The history of paged memory in operating systems begins with",
    "A recipe for bread needs flour, water, salt and yeast, and",
    "Rivers carry sediment from mountains to the sea, where",
    "The rules of chess say that a pawn may move",
]


def _prompts(tok):
    """Four ~110-token prompts with nothing in common (so nothing is shared in the pool)."""
    out = []
    for t in TEXTS:
        ids = tok.encode(" ".join([t] * 16))
        assert len(ids) >= 110
        out.append(ids[:110])
    return out


def _workload(llm, prompts):
    """Each prompt alone (each evicts the ones before), each again + more text (reload), then
    all four together on a pool that cannot hold them (preemption)."""
    outs = []
    for p in prompts:
        outs.append(llm.generate([{"prompt_token_ids": p}], GREEDY)[0])
    for p in prompts:
        outs.append(llm.generate([{"prompt_token_ids": p + p[:20]}], GREEDY)[0])
    burst = SamplingParams(n=2, temperature=0.0, max_tokens=40)  # n = 2: forks share their blocks
    outs += llm.generate([{"prompt_token_ids": p[:100]} for p in prompts], burst)
    return [[c.token_ids for c in o.outputs] for o in outs], [o.outputs[0].metrics for o in outs]


@pytest.fixture(scope="module")
def reference(model_folder):
    llm = ServingLLM(model=model_folder, device="cpu", num_blocks=24, max_model_len=384)
    try:
        prompts = _prompts(llm.tokenizer)
        ids, _ = _workload(llm, prompts)
        yield prompts, ids, llm.stats()
    finally:
        llm.shutdown()


def test_greedy_identical_tier_on_and_off_across_eviction_reload_and_swap(
    make_llm, model_folder, reference, tmp_path, hf_greedy
):
    prompts, ref_ids, ref_stats = reference
    llm = make_llm(
        model=model_folder,
        num_blocks=24,
        max_model_len=384,
        kv_offload_gib=0.5,
        kv_offload_dir=str(tmp_path),
    )
    ids, metrics = _workload(llm, prompts)
    assert ids == ref_ids
    assert ids[4][0] == hf_greedy(
        prompts[0] + prompts[0][:20], 10, draft=ids[4][0]
    )  # a reloaded prompt, vs HF
    st = llm.stats()
    assert st["tier_kind"] == "disk" and st["tier_writebacks_blocks"] > 0
    assert all(m["cached_tokens"] >= 96 for m in metrics[4:8])  # the reloads hit the tier
    assert st["tier_loaded_tokens"] >= 4 * 96
    assert ref_stats["num_preemptions"] > 0 and st["num_preemptions"] > 0
    assert st["swap_preemptions"] > 0 and st["tokens_swapped_out"] > 0
    assert st["tokens_recomputed_after_preempt"] < ref_stats["tokens_recomputed_after_preempt"]
    assert st["prompt_tokens_computed_total"] < ref_stats["prompt_tokens_computed_total"]


def _turn(llm, session, messages, previous=None):
    stream = llm.submit_chat(
        messages,
        SamplingParams(temperature=0.0, max_tokens=12),
        session_id=session,
        previous_ids=previous,
    )
    toks, metrics = [], None
    for d in stream:
        toks += d.token_ids
        if d.finished:
            metrics = d.metrics
    return toks, metrics, stream.prompt_ids


def test_restart_first_turn_hits_the_tier_and_delete_removes_the_conversation_from_disk(
    model_folder, tmp_path
):
    conv = [
        {"role": "system", "content": "You are a helpful assistant who answers briefly."},
        {
            "role": "user",
            "content": "Tell me about the moon and why it has phases, in two sentences.",
        },
    ]
    kw = dict(model=model_folder, device="cpu", num_blocks=64, max_model_len=512)

    def second_turn(reply_text):
        return conv + [
            {"role": "assistant", "content": reply_text},
            {"role": "user", "content": "And the sun?"},
        ]

    ref = ServingLLM(**kw)  # no tier, no restart: the reference
    try:
        r1, _, p1 = _turn(ref, "c", conv)
        text1 = ref.tokenizer.decode(r1, skip_special_tokens=True)
        r2, m2_ref, _ = _turn(ref, "c", second_turn(text1))
    finally:
        ref.shutdown()

    first = ServingLLM(**kw, kv_offload_gib=0.5, kv_offload_dir=str(tmp_path))
    try:
        a1, _, q1 = _turn(first, "c", conv)
        assert a1 == r1
        assert first.stats()["tier_writes_blocks"] > 0  # parked: written through
    finally:
        first.shutdown()

    second = ServingLLM(**kw, kv_offload_gib=0.5, kv_offload_dir=str(tmp_path))
    try:
        st = second.stats()
        assert st["tier_restored_blocks"] > 0
        a2, m2, _ = _turn(second, "c", second_turn(text1), previous=q1 + a1)
        assert a2 == r2  # greedy output unchanged by the restart
        assert m2["cached_tokens"] >= (len(q1) + len(a1) - 1) // 16 * 16 > 0
        assert m2["cached_tokens"] > 0 and m2_ref["cached_tokens"] > 0
        tier = second.engine.tier_link.tier
        folder = tier.store.folder
        mine = {f"{i.block_hash:016x}" for i, _, o in tier.entries() if o == owner_tag("c")}
        assert mine and mine <= FileStore(folder).names_on_disk()
        second.close_session("c")
        left = FileStore(folder).names_on_disk()
        assert not (mine & left), "the deleted conversation's blocks are still on disk"
        assert all(o != owner_tag("c") for _, _, o in tier.entries())
    finally:
        second.shutdown()
