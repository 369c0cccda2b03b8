"""KV cache groups end to end: tiny random-weight models with sliding-window layers, greedy ids equal
to transformers fp32 over contexts longer than the window, while the window gives blocks back.

- mistral: every layer slides (window 32): one sliding group (P = 2 layers), the lean C++ step and
  the fused loop read tables whose released entries are never touched;
- gemma3 text, 4 layers (3 sliding with window 16, 1 global): four groups of one layer each in
  one pool [2, 1, N, ...], each its own tables and slots.
Three 70-token prompts with 40 new tokens each share a pool too small for all of them (chunked
prefill of 32 tokens), so the scheduler preempts and recomputes; then a prompt that continues the
first conversation past the window is served from the prefix cache (its sliding groups from the
last window's blocks only) and still matches HF.
"""
import pytest
import torch

from engine import LLM, SamplingParams

PROMPT, NEW = 70, 40


def _tiny(kind, tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, MistralConfig
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512)
    if kind == "mistral":
        cfg, window = MistralConfig(**common, num_hidden_layers=2, sliding_window=32, tie_word_embeddings=False), 32
    else:
        cfg, window = Gemma3TextConfig(**common, num_hidden_layers=4, head_dim=16, sliding_window=16,
                                       query_pre_attn_scalar=16,
                                       layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                                    "sliding_attention"]), 16
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    model.save_pretrained(tmp_path / kind)
    tokenizer.save_pretrained(tmp_path / kind)
    return model, str(tmp_path / kind), window


def _hf(model, prompt, n):
    x = torch.tensor([prompt])
    with torch.no_grad():
        return model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()


@pytest.mark.parametrize("kind, groups", [("mistral", 1), ("gemma3", 4)])
def test_sliding_window_groups_match_transformers(kind, groups, tmp_path, tokenizer):
    model, folder, window = _tiny(kind, tmp_path, tokenizer)
    llm = LLM(model=folder, num_blocks=48 if kind == "gemma3" else 16, block_size=8, max_num_batched_tokens=32)
    try:
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(3, 300, (PROMPT,), generator=g).tolist() for _ in range(3)]
        greedy = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy)
        for p, o in zip(prompts, outs):
            assert o.outputs[0].token_ids == _hf(model, p, NEW)
        st = llm.stats()
        assert st["num_groups"] == groups and len(st["kv_groups"]) == groups
        assert st["num_preemptions"] >= 1, "the pool was meant to be too small for all three"
        assert st["window_released_blocks"] > 0
        assert st["used_blocks"] == 0
        # a conversation continued: its prefix (past the window) comes from the cache
        first = prompts[0] + outs[0].outputs[0].token_ids
        again = llm.generate([{"prompt_token_ids": first}], SamplingParams(temperature=0, max_tokens=8,
                                                                          ignore_eos=True))[0]
        assert again.outputs[0].token_ids == _hf(model, first, 8)
        more = first + again.outputs[0].token_ids + [5, 6, 7, 8, 9]
        hits = llm.stats()["prefix_cache_hits"]
        out = llm.generate([{"prompt_token_ids": more}], SamplingParams(temperature=0, max_tokens=20,
                                                                        ignore_eos=True))[0]
        assert llm.stats()["prefix_cache_hits"] - hits >= 2 * window
        assert out.outputs[0].token_ids == _hf(model, more, 20)
    finally:
        llm.shutdown()
