"""Triton RoPE on q and k fused with the store of k and v into the paged pool (CUDA path).

Why: rotate-half RoPE in eager torch is 5+ launches over q and k (index cos/sin, two muls, a cat
of negated halves, an add) and the store one more; one program per token reads the token's qkv
row once, writes rotated q to a packed buffer and rotated k plus v straight into their slots.
Rounding mirrors transformers in 16-bit dtypes: x*cos and rotate_half(x)*sin are each rounded to
the dtype before their sum. Slot -1 means "do not store" (the token's K/V is already cached).
Slots are 64-bit: slot * row stride overflows int32 on big pools.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_rounding import round_as


@triton.jit
def _rope_store_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_t,
    stride_cos,
    stride_qo_t,
    stride_qo_h,
    stride_cb,
    stride_cs,
    stride_ch,
    block_size,
    H: tl.constexpr,
    KVH: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    H_P2: tl.constexpr,
    KVH_P2: tl.constexpr,
    HALF_P2: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    dt = q_out_ptr.dtype.element_ty
    j = tl.arange(0, HALF_P2)
    jm = j < HALF
    c1 = tl.load(cos_ptr + pos * stride_cos + j, mask=jm, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + pos * stride_cos + HALF + j, mask=jm, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + pos * stride_cos + j, mask=jm, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + pos * stride_cos + HALF + j, mask=jm, other=0.0).to(tl.float32)
    row = qkv_ptr + tok * stride_t
    # q heads: out[:half] = x1*c1 - x2*s1, out[half:] = x2*c2 + x1*s2 (each product rounded)
    hq = tl.arange(0, H_P2)[:, None]
    mq = (hq < H) & jm[None, :]
    x1 = tl.load(row + hq * HEAD_DIM + j[None, :], mask=mq, other=0.0).to(tl.float32)
    x2 = tl.load(row + hq * HEAD_DIM + HALF + j[None, :], mask=mq, other=0.0).to(tl.float32)
    a1 = round_as(x1 * c1[None, :], dt)
    b1 = round_as((-x2) * s1[None, :], dt)
    a2 = round_as(x2 * c2[None, :], dt)
    b2 = round_as(x1 * s2[None, :], dt)
    qo = q_out_ptr + tok * stride_qo_t + hq * stride_qo_h + j[None, :]
    tl.store(qo, round_as(a1 + b1, dt).to(dt), mask=mq)
    tl.store(qo + HALF, round_as(a2 + b2, dt).to(dt), mask=mq)
    # k heads (rotated) and v heads (as is) into the slot
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    blk = slot // block_size
    off = slot % block_size
    hk = tl.arange(0, KVH_P2)[:, None]
    nk = (slot >= 0).to(tl.int32) * KVH  # slot < 0: every lane masked
    mk = (hk < nk) & jm[None, :]
    kbase = row + (H + hk) * HEAD_DIM + j[None, :]
    k1 = tl.load(kbase, mask=mk, other=0.0).to(tl.float32)
    k2 = tl.load(kbase + HALF, mask=mk, other=0.0).to(tl.float32)
    kd1 = round_as(k1 * c1[None, :], dt) + round_as((-k2) * s1[None, :], dt)
    kd2 = round_as(k2 * c2[None, :], dt) + round_as(k1 * s2[None, :], dt)
    dst = blk * stride_cb + off * stride_cs + hk * stride_ch + j[None, :]
    cdt = k_cache_ptr.dtype.element_ty
    tl.store(k_cache_ptr + dst, round_as(kd1, dt).to(cdt), mask=mk)
    tl.store(k_cache_ptr + dst + HALF, round_as(kd2, dt).to(cdt), mask=mk)
    vbase = row + (H + KVH + hk) * HEAD_DIM + j[None, :]
    v1 = tl.load(vbase, mask=mk, other=0.0)
    v2 = tl.load(vbase + HALF, mask=mk, other=0.0)
    tl.store(v_cache_ptr + dst, v1.to(cdt), mask=mk)
    tl.store(v_cache_ptr + dst + HALF, v2.to(cdt), mask=mk)


def rope_and_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """qkv [T, (H + 2*KVH) * d] (q heads, k heads, v heads); cos/sin [max_pos, d] in the model dtype.
    Returns rotated q [T, H, d]; rotated k and v are written at slot_mapping (-1: skipped)."""
    T = qkv.shape[0]
    d = k_cache.shape[3]
    assert qkv.stride(1) == 1 and qkv.shape[1] == (num_heads + 2 * num_kv_heads) * d and d % 2 == 0
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1 and cos.stride(1) == 1
    assert cos.stride() == sin.stride()
    q_out = (
        torch.empty(T, num_heads, d, dtype=qkv.dtype, device=qkv.device) if q_out is None else q_out
    )
    assert q_out.stride(2) == 1
    if T:
        _rope_store_kernel[(T,)](
            qkv,
            cos,
            sin,
            positions,
            q_out,
            k_cache,
            v_cache,
            slot_mapping,
            qkv.stride(0),
            cos.stride(0),
            q_out.stride(0),
            q_out.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            k_cache.shape[1],
            H=num_heads,
            KVH=num_kv_heads,
            HEAD_DIM=d,
            HALF=d // 2,
            H_P2=triton.next_power_of_2(num_heads),
            KVH_P2=triton.next_power_of_2(num_kv_heads),
            HALF_P2=triton.next_power_of_2(d // 2),
            num_warps=4,
        )
    return q_out
