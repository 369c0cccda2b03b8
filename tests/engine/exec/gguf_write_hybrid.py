"""Write a GGUF of the MoE and linear-attention families as llama.cpp's converter lays one out (its
conventions as engine/exec/gguf_own.py lists them), from an HF config + weights, with gguf's
writer: Qwen3-MoE (experts as [E, out, in]), gpt-oss (gate / up split from the interleaved pairs,
[E, out, in], sinks), Qwen3.5 and Qwen3.5-MoE (1 + w norms, -exp(A_log), squeezed conv, v heads
grouped -> tiled). Quantization: "Q8_0" (every tensor whose rows are a multiple of 32, experts
included) or "MXFP4" (gpt-oss's experts, as its release ships them; the rest F32). The tokenizer
is issue 45's tiny byte-level BPE (tests/engine/gguf_write.py)."""

from __future__ import annotations

import json

import numpy as np
import torch

from tests.engine.gguf_write import tiny_tokenizer

ARCH = {
    "qwen3_moe": "qwen3moe",
    "gpt_oss": "gpt-oss",
    "qwen3_5_text": "qwen35",
    "qwen3_5_moe_text": "qwen35moe",
}


def _grouped_to_tiled(
    t: torch.Tensor, dim: int, k_heads: int, per_k: int, head: int
) -> torch.Tensor:
    shape = list(t.shape)
    t = t.reshape(*shape[:dim], k_heads, per_k, head, *shape[dim + 1 :])
    return t.transpose(dim, dim + 1).contiguous().reshape(shape)


def _tensors(cfg, weights: dict) -> dict[str, torch.Tensor]:
    """gguf name -> tensor, converted as llama.cpp converts them."""
    mt, out = cfg.model_type, {}
    qwen35 = mt in ("qwen3_5_text", "qwen3_5_moe_text")
    out["token_embd.weight"] = weights["model.embed_tokens.weight"]
    out["output_norm.weight"] = weights["model.norm.weight"] + (1 if qwen35 else 0)
    if "lm_head.weight" in weights and not cfg.tie_word_embeddings:
        out["output.weight"] = weights["lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        plus = 1 if qwen35 else 0
        out[b + "attn_norm.weight"] = weights[p + "input_layernorm.weight"] + plus
        post = "post_attention_norm" if mt in ("gpt_oss",) or qwen35 else "ffn_norm"
        out[b + post + ".weight"] = weights[p + "post_attention_layernorm.weight"] + plus
        if qwen35 and cfg.layer_types[i] == "linear_attention":
            la = p + "linear_attn."
            kh, vh, dk, dv = (
                cfg.linear_num_key_heads,
                cfg.linear_num_value_heads,
                cfg.linear_key_head_dim,
                cfg.linear_value_head_dim,
            )
            r = vh // kh
            tile = (
                (lambda x, dim, head: _grouped_to_tiled(x, dim, kh, r, head))
                if r > 1
                else (lambda x, d, h: x)
            )
            qkv, q_end = weights[la + "in_proj_qkv.weight"], 2 * kh * dk
            out[b + "attn_qkv.weight"] = torch.cat((qkv[:q_end], tile(qkv[q_end:], 0, dv)))
            out[b + "attn_gate.weight"] = tile(weights[la + "in_proj_z.weight"], 0, dv)
            out[b + "ssm_beta.weight"] = tile(weights[la + "in_proj_b.weight"], 0, 1)
            out[b + "ssm_alpha.weight"] = tile(weights[la + "in_proj_a.weight"], 0, 1)
            out[b + "ssm_a"] = tile(-torch.exp(weights[la + "A_log"]), 0, 1)
            out[b + "ssm_dt.bias"] = tile(weights[la + "dt_bias"], 0, 1)
            conv = weights[la + "conv1d.weight"].squeeze(1)
            out[b + "ssm_conv1d.weight"] = torch.cat((conv[:q_end], tile(conv[q_end:], 0, dv)))
            out[b + "ssm_norm.weight"] = weights[la + "norm.weight"]
            out[b + "ssm_out.weight"] = tile(weights[la + "out_proj.weight"], 1, dv)
        else:
            a = p + "self_attn."
            for hf, g in (
                ("q_proj", "attn_q"),
                ("k_proj", "attn_k"),
                ("v_proj", "attn_v"),
                ("o_proj", "attn_output"),
            ):
                out[f"{b}{g}.weight"] = weights[a + hf + ".weight"]
                if a + hf + ".bias" in weights:
                    out[f"{b}{g}.bias"] = weights[a + hf + ".bias"]
            if a + "q_norm.weight" in weights:
                out[b + "attn_q_norm.weight"] = weights[a + "q_norm.weight"] + plus
                out[b + "attn_k_norm.weight"] = weights[a + "k_norm.weight"] + plus
            if a + "sinks" in weights:
                out[b + "attn_sinks.weight"] = weights[a + "sinks"]
        m = p + "mlp."
        if mt == "gpt_oss":
            out[b + "ffn_gate_inp.weight"], out[b + "ffn_gate_inp.bias"] = (
                weights[m + "router.weight"],
                weights[m + "router.bias"],
            )
            gu = weights[m + "experts.gate_up_proj"].transpose(1, 2)  # [E, 2I, H]
            out[b + "ffn_gate_exps.weight"], out[b + "ffn_up_exps.weight"] = gu[:, ::2], gu[:, 1::2]
            gb = weights[m + "experts.gate_up_proj_bias"]
            out[b + "ffn_gate_exps.bias"], out[b + "ffn_up_exps.bias"] = gb[:, ::2], gb[:, 1::2]
            out[b + "ffn_down_exps.weight"] = weights[m + "experts.down_proj"].transpose(1, 2)
            out[b + "ffn_down_exps.bias"] = weights[m + "experts.down_proj_bias"]
        elif m + "experts.gate_up_proj" in weights:
            gu = weights[m + "experts.gate_up_proj"]  # [E, 2I, H]
            inter = gu.shape[1] // 2
            out[b + "ffn_gate_inp.weight"] = weights[m + "gate.weight"]
            out[b + "ffn_gate_exps.weight"], out[b + "ffn_up_exps.weight"] = (
                gu[:, :inter],
                gu[:, inter:],
            )
            out[b + "ffn_down_exps.weight"] = weights[m + "experts.down_proj"]
            if m + "shared_expert.gate_proj.weight" in weights:
                for hf, g in (
                    ("gate_proj", "ffn_gate_shexp"),
                    ("up_proj", "ffn_up_shexp"),
                    ("down_proj", "ffn_down_shexp"),
                ):
                    out[f"{b}{g}.weight"] = weights[f"{m}shared_expert.{hf}.weight"]
                out[b + "ffn_gate_inp_shexp.weight"] = weights[
                    m + "shared_expert_gate.weight"
                ].reshape(-1)
        else:
            for hf, g in (
                ("gate_proj", "ffn_gate"),
                ("up_proj", "ffn_up"),
                ("down_proj", "ffn_down"),
            ):
                out[f"{b}{g}.weight"] = weights[f"{m}{hf}.weight"]
    return out


def write_gguf(
    path,
    cfg,
    weights: dict,
    quant: str | None = None,
    specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
) -> None:
    import gguf
    from gguf import GGMLQuantizationType as Q

    mt = cfg.model_type
    arch = ARCH[mt]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {mt}")
    n, h = cfg.num_hidden_layers, cfg.num_attention_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // h
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(n)
    w.add_head_count(h)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(d)
    w.add_value_length(d)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    params = cfg.rope_parameters
    w.add_rope_freq_base(params["rope_theta"])
    if getattr(cfg, "intermediate_size", None):
        w.add_feed_forward_length(cfg.intermediate_size)
    if mt == "gpt_oss":
        w.add_sliding_window(cfg.sliding_window)
        w.add_expert_feed_forward_length(cfg.intermediate_size)
        w.add_expert_count(cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(params["factor"])
        w.add_rope_scaling_orig_ctx_len(params["original_max_position_embeddings"])
    elif mt == "qwen3_moe":
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
    else:
        w.add_uint32(f"{arch}.ssm.conv_kernel", cfg.linear_conv_kernel_dim)
        w.add_uint32(f"{arch}.ssm.state_size", cfg.linear_key_head_dim)
        w.add_uint32(f"{arch}.ssm.group_count", cfg.linear_num_key_heads)
        w.add_uint32(f"{arch}.ssm.time_step_rank", cfg.linear_num_value_heads)
        w.add_uint32(
            f"{arch}.ssm.inner_size", cfg.linear_value_head_dim * cfg.linear_num_value_heads
        )
        w.add_uint32(f"{arch}.full_attention_interval", cfg.layer_types.index("full_attention") + 1)
        w.add_rope_dimension_count(int(d * params.get("partial_rotary_factor", 0.25)))
        w.add_array(
            f"{arch}.rope.dimension_sections", [11, 11, 10, 0]
        )  # llama.cpp writes Qwen3.5's mrope
        if mt == "qwen3_5_moe_text":
            w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
            w.add_uint32(
                f"{arch}.expert_shared_feed_forward_length", cfg.shared_expert_intermediate_size
            )
            w.add_expert_count(cfg.num_experts)
            w.add_expert_used_count(cfg.num_experts_per_tok)
    for name, t in _tensors(cfg, weights).items():
        a = t.float().contiguous().numpy().astype(np.float32)
        exps = "_exps.weight" in name
        if (
            quant == "Q8_0"
            and a.ndim >= 2
            and a.shape[-1] % 32 == 0
            and name != "token_embd.weight"
        ):
            w.add_tensor(name, gguf.quants.quantize(a, Q.Q8_0), raw_dtype=Q.Q8_0)
        elif quant == "MXFP4" and exps and a.shape[-1] % 32 == 0:
            w.add_tensor(name, gguf.quants.quantize(a, Q.MXFP4), raw_dtype=Q.MXFP4)
        else:
            w.add_tensor(name, a)
    tok = tiny_tokenizer(tuple(specials), cfg.vocab_size)
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = json.loads(tok.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_eos_token_id(vocab[specials[-1]])
    w.add_bos_token_id(vocab[specials[0]])
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
