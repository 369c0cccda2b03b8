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
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    block_size,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    KVH_P2: tl.constexpr, D_P2: tl.constexpr,
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
        key, value, k_cache, v_cache, slots,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_cache.shape[1],
        NUM_KV_HEADS=kvh, HEAD_DIM=d,
        KVH_P2=triton.next_power_of_2(kvh), D_P2=triton.next_power_of_2(d),
    )
