"""Our own GGUF reading for gpt-oss: transformers maps the architecture, but its tensor processor
looks for the experts under names llama.cpp does not write (`ffn_*_projs`), so they would stay
random. (Qwen3.5 / Qwen3.5-MoE files transformers 5.24 reads itself, with llama.cpp's conventions
undone: integrations/gguf; Qwen3-MoE through its older table, completed in gguf_families.py.)

llama.cpp's converter (convert_hf_to_gguf.py, read for its conventions) writes gpt-oss's experts as
one [E, out, in] tensor each (ffn_gate_exps, ffn_up_exps, ffn_down_exps), with the interleaved
gate_up split into gate = rows 0::2 and up = rows 1::2 (biases alike), MXFP4 blocks for the
released weights (a ggml type gguf-py dequantizes), and the sinks as attn_sinks. This module undoes
that and returns transformers' in-memory layout (HF names), so an HF model holding these tensors is
the reference and the engine's own loading path is unchanged. The tokenizer is still transformers'
GGUF tokenizer reading (`tokenizer`).
"""

from __future__ import annotations

import numpy as np
import torch

OWN_ARCHS = ("gpt-oss",)


def _field(reader, key, default=None):
    from engine.exec.gguf_families import _field as field

    return field(reader, key, default)


def read(path: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(HF config dict, HF-named fp32 tensors) of a GGUF of OWN_ARCHS."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = str(_field(reader, "general.architecture", ""))
    if arch not in OWN_ARCHS:
        raise ValueError(f"not one of {OWN_ARCHS}: {arch!r}")
    tensors = {}
    for t in reader.tensors:
        a = (
            gguf.quants.dequantize(t.data, t.tensor_type)
            if t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
            else np.asarray(t.data)
        )
        tensors[t.name] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
    cfg = _config(reader, arch, tensors)
    return cfg, _gpt_oss(cfg, tensors)


def _config(reader, arch: str, tensors: dict) -> dict:
    f = lambda key, default=None: _field(reader, f"{arch}.{key}", default)  # noqa: E731
    n = int(f("block_count"))
    heads = int(f("attention.head_count"))
    vocab = (
        len(reader.fields["tokenizer.ggml.tokens"].data)
        if "tokenizer.ggml.tokens" in reader.fields
        else int(tensors["token_embd.weight"].shape[0])
    )
    cfg = dict(
        num_hidden_layers=n,
        hidden_size=int(f("embedding_length")),
        num_attention_heads=heads,
        num_key_value_heads=int(f("attention.head_count_kv")),
        vocab_size=vocab,
        max_position_embeddings=int(f("context_length")),
        rms_norm_eps=float(f("attention.layer_norm_rms_epsilon")),
        tie_word_embeddings="output.weight" not in tensors,
    )
    head_dim = int(f("attention.key_length", cfg["hidden_size"] // heads))
    cfg["head_dim"] = head_dim
    theta = float(f("rope.freq_base", 10000.0))
    for key, name in (
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
    ):
        v = _field(reader, name)
        if v is not None:
            cfg[key] = int(v)
    window = int(f("attention.sliding_window", 128))
    cfg.update(
        model_type="gpt_oss",
        architectures=["GptOssForCausalLM"],
        sliding_window=window,
        intermediate_size=int(f("expert_feed_forward_length")),
        attention_bias=True,
        num_local_experts=int(f("expert_count")),
        num_experts_per_tok=int(f("expert_used_count")),
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)],
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": theta,
            "factor": float(f("rope.scaling.factor", 32.0)),
            "original_max_position_embeddings": int(
                f("rope.scaling.original_context_length", 4096)
            ),
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
    )
    return cfg


def _gpt_oss(cfg: dict, t: dict) -> dict:
    out = {
        "model.embed_tokens.weight": t["token_embd.weight"],
        "model.norm.weight": t["output_norm.weight"],
    }
    if "output.weight" in t:
        out["lm_head.weight"] = t["output.weight"]
    E, inter = cfg["num_local_experts"], cfg["intermediate_size"]
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out[p + "input_layernorm.weight"] = t[b + "attn_norm.weight"]
        out[p + "post_attention_layernorm.weight"] = t[b + "post_attention_norm.weight"]
        a = p + "self_attn."
        for hf, g in (
            ("q_proj", "attn_q"),
            ("k_proj", "attn_k"),
            ("v_proj", "attn_v"),
            ("o_proj", "attn_output"),
        ):
            out[a + hf + ".weight"] = t[f"{b}{g}.weight"]
            out[a + hf + ".bias"] = t[f"{b}{g}.bias"]
        out[a + "sinks"] = t[b + "attn_sinks.weight"].reshape(-1)
        m = p + "mlp."
        out[m + "router.weight"], out[m + "router.bias"] = (
            t[b + "ffn_gate_inp.weight"],
            t[b + "ffn_gate_inp.bias"],
        )
        gate, up = t[b + "ffn_gate_exps.weight"], t[b + "ffn_up_exps.weight"]  # [E, I, H] each
        gu = torch.stack((gate, up), dim=2).reshape(E, 2 * inter, -1)  # rows g0 u0 g1 u1 ...
        out[m + "experts.gate_up_proj"] = gu.transpose(1, 2).contiguous()  # HF: [E, H, 2I]
        gb, ub = t[b + "ffn_gate_exps.bias"], t[b + "ffn_up_exps.bias"]
        out[m + "experts.gate_up_proj_bias"] = torch.stack((gb, ub), dim=2).reshape(E, 2 * inter)
        out[m + "experts.down_proj"] = (
            t[b + "ffn_down_exps.weight"].transpose(1, 2).contiguous()
        )  # [E, I, H]
        out[m + "experts.down_proj_bias"] = t[b + "ffn_down_exps.bias"]
    return out


def tokenizer(path: str):
    """transformers' GGUF tokenizer reading, without its config reading (which trips over
    gpt-oss's rope keys before the tokenizer is reached): the file's vocabulary, merges, special
    tokens and chat template as a fast tokenizer."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    arch, tok_dict, tok_cfg = get_gguf_tokenizer(path)
    backend, extra = convert_gguf_tokenizer(arch, tok_dict)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **{**tok_cfg, **extra})
