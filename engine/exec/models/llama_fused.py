"""The decoder forward with fused Triton layer ops: the CUDA path of `LlamaModel.forward`.

Why a second loop: on a GPU a decode step is launch-bound (~950 launches for 30 layers, most of
them the 8-op RMSNorm, 5-op RoPE, the residual adds and SiLU*mul). Here each layer is
  norm+add (1) -> qkv GEMM -> RoPE+KV store (1) -> attention -> o GEMM -> add+norm (1)
  -> gate_up GEMM -> SiLU*mul (1) -> down GEMM,
and the residual add is folded into the next norm. Rounding matches the eager loop (and so
transformers) in every dtype; tests/engine/exec/test_fused_forward.py checks the two loops agree.
Attention (q/k norm, RoPE kind, sliding window, foreign pools) is attention_block.py's, shared
with the other loops; Gemma's sandwich norms are one more norm kernel each, its GELU the act kernel's
other activation. The CPU path keeps the eager loop and its exact fp32 mode.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.exec.cpu_linear import layer_linear as _linear
from engine.exec.models.attention_block import LayerAttention
from kernels.triton_act import act_and_mul
from kernels.triton_norm import add_rms_norm
from kernels.triton_rope_store import rope_and_store


@torch.inference_mode()
def forward_fused(
    m,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    kv_pool: torch.Tensor,
    meta,
    logits_indices: torch.Tensor,
) -> torch.Tensor:
    """Same contract as LlamaModel.forward (m is the LlamaModel)."""
    T = input_ids.shape[0]
    h, kvh, d = m.num_heads, m.num_kv_heads, m.head_dim
    x = m.embed_tokens(input_ids)
    if not m.layers:
        return _lm_head(m, add_rms_norm(x[logits_indices], None, m.norm, m.eps))

    def rope_store(qkv, cos, sin, pos, k_cache, v_cache, slots):
        return rope_and_store(qkv, pos, cos, sin, k_cache, v_cache, slots, h, kvh)

    attend = LayerAttention(m, positions, kv_pool, meta, rope_store)
    sandwich = m.spec.sandwich_norms
    residual = x
    a = add_rms_norm(x, None, m.layers[0]["ln1"], m.eps)
    for i, L in enumerate(m.layers):
        o = _linear(L, "o", attend(i, _linear(L, "qkv", a)).view(T, h * d))
        if sandwich:
            o = add_rms_norm(o, None, L["post_attn"], m.eps)
        a, residual = add_rms_norm(o, residual, L["ln2"], m.eps)
        down = _linear(L, "down", act_and_mul(_linear(L, "gate_up", a), m.spec.act))
        if sandwich:
            down = add_rms_norm(down, None, L["post_ff"], m.eps)
        nxt = m.layers[i + 1]["ln1"] if i + 1 < len(m.layers) else m.norm
        a, residual = add_rms_norm(down, residual, nxt, m.eps)
    return _lm_head(m, a[logits_indices])


def _lm_head(m, x: torch.Tensor) -> torch.Tensor:
    """Plain weights on CUDA; on CPU (interpreted-Triton tests) the prepared linear."""
    if m.lm_head_linear is not None:
        return m.softcap(m.lm_head_linear(x).float())
    return m.softcap(F.linear(x, m.lm_head).float())  # (soft-cap: in the dtype, like transformers)
