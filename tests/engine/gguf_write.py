"""Write a GGUF as llama.cpp's converter lays one out, from an HF config + weights, for the loader
tests: gguf's writer, gguf's tensor-name map, llama.cpp's conventions per architecture (Llama-style
files permute q/k rows for rotate-pair RoPE; Gemma stores norm weights as 1 + w; Phi-3 keeps qkv
and gate_up fused, names its rotated dims and stores LongRoPE factors as tensors), and a tiny
byte-level BPE tokenizer (300 tokens) with the family's special tokens and chat template.

Quantization: "Q8_0" through gguf-py's own quantizer (every 2-D weight whose rows are a multiple of
32). gguf-py 0.19 quantizes no K-quant (NotImplementedError for Q2_K..Q6_K), so "Q4_K" writes the
blocks directly: 144 bytes per 256 weights, random codes and sub-scales with small finite fp16
block scales; any such bytes are a valid Q4_K block, and every reader dequantizes the same bytes.
"""

from __future__ import annotations

import functools
import zlib
import json

import numpy as np
import torch

TEXT = (
    "The quick brown fox jumps over the lazy dog. Paged attention keeps the cache in blocks. "
    "Hello world, how are you today? I think, therefore I am. 0123456789 "
) * 20


@functools.lru_cache(maxsize=None)
def tiny_tokenizer(specials: tuple[str, ...], vocab: int = 300):
    """A byte-level BPE of `vocab` tokens (256 bytes, merges learnt from TEXT, the specials)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(specials),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([TEXT], trainer)
    return tok


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's q/k row order for rotate-pair RoPE (transformers reverses it when reading)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _q4k_blocks(n: int, seed: int) -> np.ndarray:
    """n Q4_K blocks (144 bytes each: fp16 d, fp16 dmin, 12 bytes of 6-bit scales, 128 of codes)."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, 144), dtype=np.uint8)
    d = rng.uniform(0.0002, 0.0004, size=n).astype(np.float16)
    dmin = (7.5 * d).astype(np.float16)  # offsets near the codes' mean: weights centred near 0
    raw[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    raw[:, 2:4] = dmin.view(np.uint8).reshape(n, 2)
    return raw


GGUF_ARCH = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "smollm3": "smollm3",
    "phi3": "phi3",
    "gemma3_text": "gemma3",
}


def write_gguf(
    path,
    cfg,
    weights: dict,
    specials=("<|endoftext|>",),
    template: str | None = None,
    quant: str | None = None,
    name: str = "tiny",
) -> None:
    import gguf
    from gguf import GGMLQuantizationType as Q

    mt = cfg.model_type
    arch = GGUF_ARCH[mt]
    n = cfg.num_hidden_layers
    h, kvh = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // h
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(n)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(h)
    w.add_head_count_kv(kvh)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    params = cfg.rope_parameters if mt != "gemma3_text" else cfg.rope_parameters["full_attention"]
    w.add_rope_freq_base(params["rope_theta"])
    if mt in ("qwen3", "gemma3_text"):
        w.add_key_length(d)
        w.add_value_length(d)
    if mt == "gemma3_text":
        w.add_sliding_window(cfg.sliding_window)
    if mt == "phi3":
        rot = int(d * params.get("partial_rotary_factor", 1.0))
        w.add_rope_dimension_count(rot)
        if params.get("rope_type") == "longrope":
            w.add_rope_scaling_orig_ctx_len(params["original_max_position_embeddings"])
            w.add_tensor(
                "rope_factors_long.weight", np.asarray(params["long_factor"], dtype=np.float32)
            )
            w.add_tensor(
                "rope_factors_short.weight", np.asarray(params["short_factor"], dtype=np.float32)
            )
    if (
        arch == "llama" and params.get("rope_type") == "llama3"
    ):  # as llama.cpp's converter stores it
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
        plain = 1.0 / (
            params["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)
        )
        w.add_tensor("rope_freqs.weight", (plain / scaled).numpy().astype(np.float32))
    names = gguf.get_tensor_name_map(
        next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), n
    )
    for k, t in weights.items():
        base, suffix = k.rsplit(".", 1)
        gname = names.get_name(base)
        assert gname is not None, k
        t = t.float()
        if arch in ("llama", "smollm3") and base.endswith(("q_proj", "k_proj")):
            t = _permute(t, h if base.endswith("q_proj") else kvh)
        if mt == "gemma3_text" and base.endswith("norm"):
            t = t + 1.0
        a = t.numpy().astype(np.float32)
        if quant == "Q8_0" and a.ndim == 2 and a.shape[1] % 32 == 0:
            w.add_tensor(f"{gname}.{suffix}", gguf.quants.quantize(a, Q.Q8_0), raw_dtype=Q.Q8_0)
        elif quant == "Q4_K" and a.ndim == 2 and a.shape[1] % 256 == 0 and gname != "token_embd":
            blocks = _q4k_blocks(a.size // 256, seed=zlib.crc32(k.encode()))
            w.add_tensor(f"{gname}.{suffix}", blocks.reshape(a.shape[0], -1), raw_dtype=Q.Q4_K)
        else:
            w.add_tensor(f"{gname}.{suffix}", a)
    tok = tiny_tokenizer(tuple(specials), cfg.vocab_size)
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = json.loads(tok.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_eos_token_id(vocab[specials[-1] if len(specials) > 1 else specials[0]])
    w.add_bos_token_id(vocab[specials[0]])
    w.add_unk_token_id(vocab[specials[0]])
    w.add_add_bos_token(False)
    if template:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
