"""MoE and linear-attention families through the whole engine: greedy equal to HF transformers fp32.

Per family (tests/engine/exec/hybrid_helpers.py: the shipped config shrunk to 2-4 layers that keep its
layer kinds, seeded random weights), one workload: a 70-token prompt prefilled in 32-token chunks
(Qwen3.5: a state checkpoint is kept at its last block boundary, 64, and the second chunk ends
there), a prompt sharing its first 64 tokens (a prefix hit: Qwen3.5 restores the checkpointed
state with the KV), then a burst of four on a pool that cannot hold them (preemption: the state is
dropped and recomputed). Every reply must be HF's greedy choice token by token (one HF forward over
prompt + reply). Then n > 1 and beam search (the state slot shared by forks, copied on write), a
chat's next turn adopting its parked state, and the Triton kernels (interpreted) for the attention
layers. The model and stats views (/api/kv's state slots, ModelInfo) are checked on the way.
"""

import pytest
import torch

from engine import SamplingParams
from tests.engine.exec import hybrid_helpers as H

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
BURST = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
A = H.prompt(1, 70)
B = A[:64] + H.prompt(2, 6)
BURST_PROMPTS = [H.prompt(10 + i, 40) for i in range(4)]
LINEAR = ("qwen3_5", "qwen3_5_moe")


@pytest.mark.parametrize("family", list(H.FAMILIES))
def test_engine_matches_hf(family):
    llm = H.make_llm(
        family, num_blocks=12, max_num_batched_tokens=24
    )  # 24, 24, 16 (ends at 64), ...
    try:
        assert "CPU path: per-layer loop" in llm.model_info().compute_path
        for prompts, params in (([A], GREEDY), ([B], GREEDY), (BURST_PROMPTS, BURST)):
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
            for p, o in zip(prompts, outs):
                H.assert_hf_greedy(family, p, o.outputs[0].token_ids)
        st = llm.stats()
        assert st["prefix_cache_hits"] >= 64, st
        assert st["num_preemptions"] > 0, st
        states = llm.engine.kv.states
        snap = llm.run_on_engine(lambda eng: eng.kv_snapshot().to_json())  # what /api/kv serves
        info = llm.model_info()
        if family in LINEAR:
            s = st["state_groups"]
            assert s["state_checkpoint_hits"] >= 1 and s["state_checkpoints_taken"] >= 2, s
            assert s["state_slots_used"] == len(states.checkpoints), s  # nothing else holds one
            assert [v["holders"] for v in snap["state_slots"]] == [["checkpoint"]] * len(
                states.checkpoints
            )
            assert {v["bytes"] for v in snap["state_slots"]} == {info.state_bytes_per_slot} and s[
                "state_bytes_per_slot"
            ]
            assert "linear" in info.layer_mixers and info.experts == (
                (8, 2) if family == "qwen3_5_moe" else ()
            )
        else:
            assert states is None and st["state_groups"] == {} and snap["state_slots"] == []
            assert info.experts == (8, 2) and info.weights_read_per_token_bytes < info.weights_bytes
    finally:
        llm.shutdown()


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_moe"])
def test_n_and_beam_search_match_hf(family):
    """n = 3 greedy samples are three times HF's greedy reply (forks share the prompt's blocks and
    its state slot; each copies the state before its first write); beam search equals HF's."""
    from engine.core.beam_search import BeamSearchParams

    llm = H.make_llm(family, num_blocks=32)
    try:
        p = A[:40]
        out = llm.generate(
            [{"prompt_token_ids": p}],
            SamplingParams(n=3, temperature=0.0, max_tokens=10, ignore_eos=True),
        )[0]
        assert len(out.outputs) == 3
        for o in out.outputs:
            H.assert_hf_greedy(family, p, o.token_ids)
        beams = llm.beam_search(
            [{"prompt_token_ids": p}], BeamSearchParams(beam_width=2, max_tokens=6, ignore_eos=True)
        )[0]
        with torch.no_grad():
            r = H.hf_model(family).generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=6,
                num_beams=2,
                num_return_sequences=2,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        assert [list(s.token_ids) for s in beams.sequences] == [
            r[i, len(p) :].tolist() for i in range(2)
        ]
        if family in LINEAR:
            s = llm.engine.kv.states.stats()
            assert s["state_cow_copies"] >= 2, s
            assert s["state_slots_used"] == len(llm.engine.kv.states.checkpoints), s
    finally:
        llm.shutdown()


def test_next_turn_adopts_the_parked_state():
    """A chat's second turn (its first turn's tokens + more) adopts the parked tables and state:
    only the new tokens are computed, and the reply is still HF's."""
    llm = H.make_llm("qwen3_5", num_blocks=24)
    try:
        from engine.front.request_stream import collect

        first = collect(llm.submit({"prompt_token_ids": A[:30]}, GREEDY, session_id="chat"), GREEDY)
        turn1 = A[:30] + list(first.outputs[0].token_ids)
        H.assert_hf_greedy("qwen3_5", A[:30], first.outputs[0].token_ids)
        snap = llm.run_on_engine(lambda eng: eng.kv_snapshot().to_json())  # the parked chat's slot
        assert [v["tokens"] for v in snap["state_slots"] if v["holders"] == ["chat"]] == [
            len(turn1) - 1
        ], snap["state_slots"]
        prompt2 = turn1 + H.prompt(3, 9)
        before = llm.stats()["prompt_tokens_computed_total"]
        second = collect(
            llm.submit({"prompt_token_ids": prompt2}, GREEDY, session_id="chat"), GREEDY
        )
        H.assert_hf_greedy("qwen3_5", prompt2, second.outputs[0].token_ids)
        assert llm.stats()["prompt_tokens_computed_total"] - before == len(prompt2) - (
            len(turn1) - 1
        )
    finally:
        llm.shutdown()


def test_speculative_decoding_is_refused_for_linear_attention():
    with pytest.raises(ValueError, match="cannot be rolled back"):
        H.make_llm("qwen3_5", speculative="ngram")


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_moe", "gpt_oss"])
def test_triton_kernels_match_hf(family):
    """Triton attention and KV store (interpreted on CPU) for the attention layers, around the
    linear-attention states and the experts (gpt-oss: its sinks in the Triton kernels, its window
    on alternate layers); the second prompt a prefix hit (Qwen3.5: restoring its checkpointed
    state)."""
    llm = H.make_llm(family, attention_backend="triton", num_blocks=24)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        outs = [llm.generate([{"prompt_token_ids": p}], params)[0] for p in (A, B)]
        assert llm.stats()["prefix_cache_hits"] >= 64
        for p, o in zip((A, B), outs):
            H.assert_hf_greedy(family, p, o.outputs[0].token_ids)
    finally:
        llm.shutdown()


def test_states_in_the_kv_tier_serve_evicted_prompts_and_restarts(tmp_path):
    """Qwen3.5 with a disk KV tier (engine/kv/tier/state_entries.py). A chat's turn is parked: its blocks
    and its state at its last block boundary are written through at once. A 70-token prompt keeps
    a checkpoint at 64; two more prompts evict its blocks to the tier; asked again, it is served
    64 tokens from the pool's checkpoint and the tier's blocks. After a graceful stop a new engine
    on the same folder serves it from the tier alone (blocks and state read back; the state
    bit-identical to the one saved), and the chat's next turn starts at its boundary (32 of its 38
    tokens). Every reply equals the first, computed from scratch, and HF's; closing the chat
    deletes its states from disk too. A pin writes its end's state at once; a burst preempted to
    the tier (the policy told to swap) comes back equal to HF."""
    from engine.front.pin_api import pin_prefix
    from engine.front.request_stream import collect
    from engine.kv.block_hash import state_key, walk_blocks
    from engine.kv.tier.store import owner_tag

    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    chat, prompt = H.prompt(5, 30), A

    def run(llm, ids, session=None):
        o = collect(llm.submit({"prompt_token_ids": ids}, params, session_id=session), params)
        return list(o.outputs[0].token_ids), o.outputs[0].metrics["cached_tokens"]

    def owned(llm):  # the chat's state entries in the tier
        entries = llm.engine.tier_link.tier.entries()
        return [
            i
            for i, _, o in entries
            if o == owner_tag("chat")
            and i.parent_hash is not None
            and i.block_hash == state_key(i.parent_hash)
        ]

    kw = dict(num_blocks=12, kv_offload_gib=0.01, kv_offload_dir=str(tmp_path))
    key = list(walk_blocks(prompt, None, 16))[3].hash  # the state after 64 tokens
    llm = H.make_llm("qwen3_5", **kw, max_pin_fraction=0.5)
    try:
        reply1, _ = run(llm, chat, "chat")
        assert len(owned(llm)) >= 1  # written at park, before any stop
        first, cached = run(llm, prompt)
        assert cached == 0
        for i in range(2):
            run(llm, H.prompt(20 + i, 50))
        loaded = llm.stats()["tier_loaded_tokens"]
        again, cached = run(llm, prompt)
        assert (again, cached) == (first, 64) and llm.stats()["tier_loaded_tokens"] > loaded
        states, ls = llm.engine.kv.states, llm.engine.runner.linear_state
        saved = ls.slot_bytes(states.checkpoints[key].slot)
        writes = states.tier_writes
        pin_prefix(llm, "sys", prompt[:64])  # a pin writes its end's state through at once
        assert states.tier_writes == writes + 1
    finally:
        assert llm.shutdown()["states"]["left"] == 0
    llm = H.make_llm("qwen3_5", **kw)
    try:
        after, cached = run(llm, prompt)
        s = llm.stats()["state_groups"]
        assert (after, cached) == (first, 64) and s["state_tier_loads"] == 1, s
        states, ls = llm.engine.kv.states, llm.engine.runner.linear_state
        assert ls.slot_bytes(states.checkpoints[key].slot) == saved
        turn2 = chat + reply1 + H.prompt(3, 9)
        reply2, cached = run(llm, turn2, "chat")
        assert cached == 32 and llm.stats()["state_groups"]["state_tier_loads"] == 2
        H.assert_hf_greedy("qwen3_5", prompt, first)
        H.assert_hf_greedy("qwen3_5", turn2, reply2)
        assert owned(llm)
        llm.run_on_engine(lambda eng: eng.close_session("chat"))
        assert not owned(llm)
        # preemption: the policy told to swap (its timing rule aside), the burst on a full pool
        # goes to the tier (blocks up to a boundary with a state, and that state) and back (the
        # state comes back from the pool's checkpoint while one is there, as here)
        llm.engine.tier_link.policy.should_swap = lambda *a: True
        outs = llm.generate([{"prompt_token_ids": p} for p in BURST_PROMPTS], BURST)
        st = llm.stats()
        assert st["swap_preemptions"] > 0 and st["tokens_swapped_out"] >= 16, st
        for p, o in zip(BURST_PROMPTS, outs):
            H.assert_hf_greedy("qwen3_5", p, o.outputs[0].token_ids)
    finally:
        llm.shutdown()
