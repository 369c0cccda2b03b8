"""Triton store of new tokens' K/V into the paged pool.

One program per token: a token's [kvh, d] row lands in one contiguous run of the block slab
(pool layout [num_blocks, block_size, kvh, d]), so the store is one masked row load + row write
for K and one for V. All address math is 64-bit: slot * row stride overflows int32 on big pools.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    block_size,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    KVH_P2: tl.constexpr,
    D_P2: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    blk = slot // block_size
    off = slot % block_size
    h = tl.arange(0, KVH_P2)[:, None]
    d = tl.arange(0, D_P2)[None, :]
    # slot < 0: zero heads to move, every lane masked, nothing read or written. (Folded into the
    # head bound: the interpreter rejects `tensor_mask & scalar_bool`.)
    num_heads = (slot >= 0).to(tl.int32) * NUM_KV_HEADS
    mask = (h < num_heads) & (d < HEAD_DIM)
    k = tl.load(key_ptr + tok * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(value_ptr + tok * stride_vt + h * stride_vh + d, mask=mask)
    dst = blk * stride_cb + off * stride_cs + h * stride_ch + d
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    num_tokens, kvh, d = key.shape
    if num_tokens == 0:
        return
    assert k_cache.shape[2:] == (kvh, d) and k_cache.stride() == v_cache.stride()
    assert key.stride(2) == 1 and value.stride(2) == 1 and k_cache.stride(3) == 1
    assert slot_mapping.shape == (num_tokens,)
    slots = slot_mapping.to(torch.int64)
    _store_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slots,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_cache.shape[1],
        NUM_KV_HEADS=kvh,
        HEAD_DIM=d,
        KVH_P2=triton.next_power_of_2(kvh),
        D_P2=triton.next_power_of_2(d),
    )


# ---- quantized pool (kernels/kv_quant.py): codes + the row's fp32 scale ----------------------
# 1.5 * 2**23: (y + c) - c rounds fp32 |y| < 2**22 to nearest even, like torch.round. A constexpr: the
# real compiler refuses a plain global inside @triton.jit (the interpreter does not; the first device
# run found it), scripts/compile_sm90.py now compiles this kernel for sm_90 on the CPU machine too.
_RNE = tl.constexpr(12582912.0)


@triton.jit
def _round_e4m3(y):
    """fp32 y (|y| <= 448) rounded to the nearest e4m3 value (ties to even), still fp32, so the
    cast that follows is exact: the interpreter's own fp8 cast rounds wrongly (measured: codes off
    by a factor of 2 near powers of two), and torch's cast rounds to nearest even. Normal range:
    keep 3 of fp32's 23 mantissa bits; below 2**-6 (e4m3 subnormals) the step is a fixed 2**-9."""
    bits = y.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    sub = (y + 24576.0) - 24576.0  # 1.5 * 2**14: rounds to a multiple of 2**-9
    return tl.where(tl.abs(y) < 0.015625, sub, normal)


@triton.jit
def _store_kv_quant_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    ks_ptr,
    vs_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    block_size,
    qmax,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    KVH_P2: tl.constexpr,
    D_P2: tl.constexpr,
    INT8: tl.constexpr,
):
    """One program per token: per KV head, scale = amax / qmax, codes = x / scale (int8:
    rounded to nearest even and clamped; fp8: the cast rounds). The scale goes into the row's last
    4 bytes, read here through ks_ptr / vs_ptr: fp32 views of the same caches."""
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    blk = slot // block_size
    off = slot % block_size
    h = tl.arange(0, KVH_P2)
    d = tl.arange(0, D_P2)[None, :]
    num_heads = (slot >= 0).to(tl.int32) * NUM_KV_HEADS
    hmask = h < num_heads
    mask = hmask[:, None] & (d < HEAD_DIM)
    row = blk * stride_cb + off * stride_cs + h * stride_ch  # byte offset of each head's row
    for which in tl.static_range(2):
        if which == 0:
            x = tl.load(
                key_ptr + tok * stride_kt + h[:, None] * stride_kh + d, mask=mask, other=0.0
            )
        else:
            x = tl.load(
                value_ptr + tok * stride_vt + h[:, None] * stride_vh + d, mask=mask, other=0.0
            )
        x = x.to(tl.float32)
        scale = tl.max(tl.abs(x), 1) / qmax
        inv = tl.where(scale > 0, 1.0 / scale, 0.0)
        y = x * inv[:, None]
        if INT8:
            y = (y + _RNE) - _RNE
            codes = tl.minimum(tl.maximum(y, -127.0), 127.0).to(tl.int8)
        else:
            codes = _round_e4m3(tl.minimum(tl.maximum(y, -448.0), 448.0)).to(tl.float8e4nv)
        if which == 0:
            tl.store(k_cache_ptr + row[:, None] + d, codes, mask=mask)
            tl.store(ks_ptr + (row + HEAD_DIM) // 4, scale, mask=hmask)
        else:
            tl.store(v_cache_ptr + row[:, None] + d, codes, mask=mask)
            tl.store(vs_ptr + (row + HEAD_DIM) // 4, scale, mask=hmask)


def store_kv_quant(key, value, k_cache, v_cache, slot_mapping) -> None:
    """store_kv for an int8 / fp8 pool [num_blocks, block_size, kvh, head_dim + 4]."""
    from kernels import kv_quant

    num_tokens, kvh, d = key.shape
    if num_tokens == 0:
        return
    assert (
        k_cache.shape[2:] == (kvh, d + kv_quant.SCALE_BYTES)
        and k_cache.stride() == v_cache.stride()
    )
    assert key.stride(2) == 1 and value.stride(2) == 1 and k_cache.stride(3) == 1
    _store_kv_quant_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        k_cache.view(torch.float32),
        v_cache.view(torch.float32),
        slot_mapping.to(torch.int64),
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_cache.shape[1],
        kv_quant.QMAX[k_cache.dtype],
        NUM_KV_HEADS=kvh,
        HEAD_DIM=d,
        KVH_P2=triton.next_power_of_2(kvh),
        D_P2=triton.next_power_of_2(d),
        INT8=k_cache.dtype == torch.int8,
    )
