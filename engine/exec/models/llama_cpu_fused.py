"""The CPU decoder loop with fused layer ops (kernels/cpu_layer_ops.py).

Why a second loop: on CPU the eager loop in llama.py issues ~25 small torch ops per layer around
its four GEMMs and attention; at decode sizes their dispatch cost rivals the math. Here each layer
is: add+RMSNorm, QKV GEMM, RoPE+KV store, attention, o GEMM, add+RMSNorm, gate/up GEMM, SiLU*up,
down GEMM — nine calls. The residual stream `x` is updated in place by the next add+RMSNorm, so a
layer allocates only its GEMM outputs. The same expressions as llama.py's loop, op by op (the
tests compare the two loops and HF). Attention (q/k norm, RoPE kind, window, foreign pools) is
engine/exec/models/attention_block.py's, shared with the other loops; Gemma's sandwich norms and
GELU are the same C++ ops on other weights.
"""

from __future__ import annotations

import torch

from engine.exec.cpu_linear import layer_linear as _linear
from engine.exec.models.attention_block import LayerAttention
from kernels import cpu_layer_ops as ops


def forward_cpu_fused(
    model, input_ids, positions, kv_pool, meta, logits_indices, argmax_only: bool = False
) -> torch.Tensor:
    T = input_ids.shape[0]
    h, kvh, d, eps = model.num_heads, model.num_kv_heads, model.head_dim, model.eps
    positions = positions.to(torch.int64).contiguous()
    slots = meta.slot_mapping.to(torch.int64).contiguous()
    # the C++ ops index tables and pool slots without bounds checks: check the ranges once here
    # (torch's indexing in the eager loop would raise; so does this, with a clearer message)
    if T and int(positions.max()) >= model.cos.shape[0]:
        raise ValueError(
            f"position {int(positions.max())} is beyond the RoPE table ({model.cos.shape[0]})"
        )
    num_slots = kv_pool.shape[2] * kv_pool.shape[3]
    for group_slots in (
        meta.group_slots if meta.group_slots is not None else (slots,)
    ):  # every group's
        if T and int(group_slots.max()) >= num_slots:
            raise ValueError(
                f"KV slot {int(group_slots.max())} is beyond the pool ({num_slots} slots)"
            )

    def rope_store(qkv, cos, sin, pos, k_cache, v_cache, slot_mapping):
        return ops.rope_store(
            qkv.contiguous(),
            h,
            kvh,
            d,
            cos,
            sin,
            pos,
            slot_mapping.to(torch.int64).contiguous(),
            k_cache,
            v_cache,
        )

    attend = LayerAttention(model, positions, kv_pool, meta, rope_store)
    sandwich, gelu = model.spec.sandwich_norms, model.spec.act != "silu"
    x = model.embed_tokens(input_ids).contiguous()
    delta = None  # what the next norm adds to x first
    for i, L in enumerate(model.layers):
        a = ops.add_rms_norm(x, delta, L["ln1"], eps)
        o = _linear(
            L, "o", attend(i, _linear(L, "qkv", a).contiguous()).reshape(T, h * d)
        ).contiguous()
        if sandwich:
            o = ops.add_rms_norm(o, None, L["post_attn"], eps)
        a = ops.add_rms_norm(x, o, L["ln2"], eps)
        gu = _linear(L, "gate_up", a).contiguous()
        delta = _linear(
            L, "down", model.act_mul(gu).contiguous() if gelu else ops.silu_mul(gu)
        ).contiguous()
        if sandwich:
            delta = ops.add_rms_norm(delta, None, L["post_ff"], eps)
    if delta is not None:
        x += delta
    x = x[logits_indices].contiguous()
    x = ops.add_rms_norm(x, None, model.norm, eps)
    return model.logits(x, argmax_only)  # the LM head (screened for a greedy step), soft-cap
