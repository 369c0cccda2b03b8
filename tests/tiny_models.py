"""Tiny random-weight checkpoints for tests that need a real model of a given shape (seconds to
build, a 300-token vocabulary read through the default model's tokenizer)."""

from __future__ import annotations

import torch


def save_tiny_llama(folder, tokenizer, *, kv_heads: int = 2, seed: int = 0):
    """A 2-layer Llama (hidden 64, 4 heads) saved as an HF folder with the given tokenizer;
    returns the HF model (the reference)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def hf_greedy(model, prompt: list[int], n: int = 8) -> list[int]:
    x = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def scripted_chain(tokenizer, reply: list[str], after: str = "\n") -> list[int]:
    """Token ids of `reply` (each piece one token of `tokenizer`), led by the token `after`: the
    last token of the chat template's generation prompt. Every id appears once (a chain)."""
    ids = [
        tokenizer.convert_tokens_to_ids(after)
        if after in tokenizer.get_added_vocab()
        else tokenizer.encode(after, add_special_tokens=False)[-1]
    ]
    for piece in reply:
        got = (
            tokenizer.convert_tokens_to_ids(piece)
            if piece in tokenizer.get_added_vocab()
            else tokenizer.encode(piece, add_special_tokens=False)
        )
        got = [got] if isinstance(got, int) else got
        if len(got) != 1:
            raise ValueError(f"{piece!r} is {len(got)} tokens, not one")
        ids += got
    if len(set(ids)) != len(ids):
        raise ValueError("a scripted chain names a token twice (the reply would loop)")
    return ids


def save_scripted_qwen3(folder, tokenizer, chain: list[int], *, sliding_window: int | None = None):
    """A 2-layer Qwen3 (hidden 64) that answers every chat with the same tokens: `chain[i + 1]`
    follows `chain[i]` (scripted_chain), whatever came before. Why: a browser test needs a reply
    the engine really generates (a reasoning block, then an answer) from weights that run in a
    second. How: o_proj and down_proj are zero, so no layer adds anything and the last hidden state
    is the token's own embedding; chain tokens get one-hot embeddings and the LM head maps each to
    its successor with a margin of 64 logits (sampling at the chat's default temperature and
    repetition penalty picks it too). `sliding_window`: layer 0 is a sliding-window layer of that
    size (two KV cache groups), layer 1 full attention. Returns the folder."""
    from transformers import AutoModelForCausalLM

    from engine.exec import dummy_weights as dw

    hidden = 64
    if len(chain) > hidden:
        raise ValueError(f"at most {hidden} chained tokens")
    windows = (
        {}
        if sliding_window is None
        else {
            "use_sliding_window": True,
            "sliding_window": sliding_window,
            "max_window_layers": 1,
            "layer_types": ["sliding_attention", "full_attention"],
        }
    )
    cfg = dw.load_config(
        "qwen3-0.6b",
        dict(
            num_hidden_layers=2,
            hidden_size=hidden,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=len(tokenizer),
            tie_word_embeddings=False,
            bos_token_id=None,
            pad_token_id=None,
            max_position_embeddings=8192,
            eos_token_id=tokenizer.convert_tokens_to_ids(tokenizer.eos_token),
            **windows,
        ),
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.normal_(0.0, 0.02)
        head = model.lm_head.weight
        head.zero_()
        for k, t in enumerate(chain):
            emb[t].zero_()
            emb[t, k] = 1.0
            if k + 1 < len(chain):
                head[chain[k + 1], k] = 8.0  # normed one-hot: 8 at dim k -> logit 64
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
