"""Tiny random-weight checkpoints for tests that need a real model of a given shape (seconds to
build, a 300-token vocabulary read through the default model's tokenizer)."""
from __future__ import annotations

import torch


def save_tiny_llama(folder, tokenizer, *, kv_heads: int = 2, seed: int = 0):
    """A 2-layer Llama (hidden 64, 4 heads) saved as an HF folder with the given tokenizer;
    returns the HF model (the reference)."""
    from transformers import AutoModelForCausalLM, LlamaConfig
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=256,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def hf_greedy(model, prompt: list[int], n: int = 8) -> list[int]:
    x = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()
