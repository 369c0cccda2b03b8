"""The CPU decoder loop with fused layer ops (kernels/cpu_layer_ops.py).

Why a second loop: on CPU the eager loop in llama.py issues ~25 small torch ops per layer around
its four GEMMs and attention; at decode sizes their dispatch cost rivals the math. Here each layer
is: add+RMSNorm, QKV GEMM, RoPE+KV store, attention, o GEMM, add+RMSNorm, gate/up GEMM, SiLU*up,
down GEMM — nine calls. The residual stream `x` is updated in place by the next add+RMSNorm, so a
layer allocates only its GEMM outputs. The same expressions as llama.py's loop, op by op (the
tests compare the two loops and HF).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import kernels
from engine.exec.cpu_linear import layer_linear as _linear
from kernels import cpu_layer_ops as ops, kv_quant


def forward_cpu_fused(model, input_ids, positions, kv_pool, meta, logits_indices) -> torch.Tensor:
    T = input_ids.shape[0]
    h, kvh, d = model.num_heads, model.num_kv_heads, model.head_dim
    positions = positions.to(torch.int64).contiguous()
    slots = meta.slot_mapping.to(torch.int64).contiguous()
    # the C++ ops index tables and pool slots without bounds checks: check the ranges once here
    # (torch's indexing in the eager loop would raise; so does this, with a clearer message)
    if T and int(positions.max()) >= model.cos.shape[0]:
        raise ValueError(f"position {int(positions.max())} is beyond the RoPE table ({model.cos.shape[0]})")
    num_slots = kv_pool.shape[2] * kv_pool.shape[3]
    if T and int(slots.max()) >= num_slots:
        raise ValueError(f"KV slot {int(slots.max())} is beyond the pool ({num_slots} slots)")
    # a pool of another dtype (int8 / bf16 KV under fp32 weights, ...) or a rotated one: RoPE goes
    # into a scratch [T, 1, kvh, d] "cache" at slots 0..T-1, and kernels.store_kv converts (quantizes)
    R = model.kv_rotation
    own_kv = kv_pool.dtype == model.cos.dtype and R is None
    if not own_kv:
        scratch = torch.empty(2, T, 1, kvh, d, dtype=model.cos.dtype)
        scratch_slots = torch.arange(T, dtype=torch.int64)
    x = F.embedding(input_ids, model.embed)
    delta = None                                   # what the next norm adds to x first
    for i, L in enumerate(model.layers):
        a = ops.add_rms_norm(x, delta, L["ln1"], model.eps)
        qkv = _linear(L, "qkv", a).contiguous()
        k_cache, v_cache = kv_pool[0, i], kv_pool[1, i]
        if own_kv:
            q = ops.rope_store(qkv, h, kvh, d, model.cos, model.sin, positions, slots, k_cache, v_cache)
        else:
            q = ops.rope_store(qkv, h, kvh, d, model.cos, model.sin, positions, scratch_slots,
                               scratch[0], scratch[1])
            k, v = scratch[0, :, 0], scratch[1, :, 0]
            if R is not None:           # rotated pool (kernels/kv_quant.py): q, k, v per head, exact
                q, k, v = kv_quant.rotate(q, R, q.dtype), kv_quant.rotate(k, R), kv_quant.rotate(v, R)
            kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping, backend=meta.backend)
        o = kernels.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                    meta.cu_seqlens_q, model.scale, max_seqlen_q=meta.max_seqlen_q,
                                    backend=meta.backend)
        if R is not None:
            o = kv_quant.rotate(o, R, o.dtype)
        a = ops.add_rms_norm(x, _linear(L, "o", o.reshape(T, h * d)).contiguous(), L["ln2"], model.eps)
        gu = _linear(L, "gate_up", a).contiguous()
        delta = _linear(L, "down", ops.silu_mul(gu)).contiguous()
    if delta is not None:
        x += delta
    x = x[logits_indices].contiguous()
    x = ops.add_rms_norm(x, None, model.norm, model.eps)
    return model.lm_head_linear(x).float()
