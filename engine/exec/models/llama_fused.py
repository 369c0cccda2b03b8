"""The Llama forward with fused Triton layer ops: the CUDA path of `LlamaModel.forward`.

Why a second loop: on a GPU a decode step is launch-bound (~950 launches for 30 layers, most of
them the 8-op RMSNorm, 5-op RoPE, the residual adds and SiLU*mul). Here each layer is
  norm+add (1) -> qkv GEMM -> RoPE+KV store (1) -> attention -> o GEMM -> add+norm (1)
  -> gate_up GEMM -> SiLU*mul (1) -> down GEMM,
and the residual add is folded into the next norm. Rounding matches the eager loop (and so
transformers) in every dtype; tests/engine/test_fused_forward.py checks the two loops agree.
The CPU path keeps the eager loop and its exact fp32 mode.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import kernels
from kernels import kv_quant
from engine.exec.cpu_linear import layer_linear as _linear
from kernels.triton_act import silu_and_mul
from kernels.triton_norm import add_rms_norm
from kernels.triton_rope_store import rope_and_store


@torch.inference_mode()
def forward_fused(m, input_ids: torch.Tensor, positions: torch.Tensor, kv_pool: torch.Tensor, meta,
                  logits_indices: torch.Tensor) -> torch.Tensor:
    """Same contract as LlamaModel.forward (m is the LlamaModel)."""
    T = input_ids.shape[0]
    h, kvh, d = m.num_heads, m.num_kv_heads, m.head_dim
    x = F.embedding(input_ids, m.embed)
    if not m.layers:
        return _lm_head(m, add_rms_norm(x[logits_indices], None, m.norm, m.eps))
    residual = x
    a = add_rms_norm(x, None, m.layers[0]["ln1"], m.eps)
    # a pool of another format (int8 / fp8 KV, kernels/kv_quant.py), or a rotated one: RoPE writes a
    # [T, 1, kvh, d] scratch at slots 0..T-1 and the (quantizing) store_kv kernel moves it into the pool
    R = m.kv_rotation
    own_kv = kv_pool.dtype == m.cos.dtype and R is None
    if not own_kv:
        scratch = torch.empty(2, T, 1, kvh, d, dtype=m.cos.dtype, device=x.device)
        scratch_slots = torch.arange(T, dtype=meta.slot_mapping.dtype, device=x.device)
    for i, L in enumerate(m.layers):
        k_cache, v_cache = kv_pool[0, i], kv_pool[1, i]
        qkv = _linear(L, "qkv", a)
        if own_kv:
            q = rope_and_store(qkv, positions, m.cos, m.sin, k_cache, v_cache, meta.slot_mapping, h, kvh)
        else:
            q = rope_and_store(qkv, positions, m.cos, m.sin, scratch[0], scratch[1], scratch_slots, h, kvh)
            k, v = scratch[0, :, 0], scratch[1, :, 0]
            if R is not None:           # rotated pool (kernels/kv_quant.py): q, k, v per head, exact
                q, k, v = kv_quant.rotate(q, R, q.dtype), kv_quant.rotate(k, R), kv_quant.rotate(v, R)
            kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping, backend=meta.backend)
        o = kernels.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                    meta.cu_seqlens_q, m.scale, max_seqlen_q=meta.max_seqlen_q,
                                    backend=meta.backend)
        if R is not None:
            o = kv_quant.rotate(o, R, o.dtype)
        a, residual = add_rms_norm(_linear(L, "o", o.view(T, h * d)), residual, L["ln2"], m.eps)
        down = _linear(L, "down", silu_and_mul(_linear(L, "gate_up", a)))
        nxt = m.layers[i + 1]["ln1"] if i + 1 < len(m.layers) else m.norm
        a, residual = add_rms_norm(down, residual, nxt, m.eps)
    return _lm_head(m, a[logits_indices])


def _lm_head(m, x: torch.Tensor) -> torch.Tensor:
    """Plain weights on CUDA; on CPU (interpreted-Triton tests) the prepared linear."""
    if m.lm_head_linear is not None:
        return m.lm_head_linear(x).float()
    return F.linear(x, m.lm_head).float()
