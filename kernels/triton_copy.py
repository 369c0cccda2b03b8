"""Triton copy-on-write block copy across all layers, K and V, in one launch.

The pool [2, L, num_blocks, block_size, kvh, d] is viewed as [2L, num_blocks, slab] where a slab
(block_size*kvh*d elements) is contiguous. Grid = (pair, 2L slab index, chunk of the slab): each
program moves CHUNK contiguous elements, so one launch covers every layer and both K and V.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_blocks_kernel(pool_ptr, pairs_ptr, stride_l, stride_b, slab, CHUNK: tl.constexpr):
    pair = tl.program_id(0).to(tl.int64)
    layer = tl.program_id(1).to(tl.int64)
    chunk = tl.program_id(2).to(tl.int64)
    src = tl.load(pairs_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(pairs_ptr + 2 * pair + 1).to(tl.int64)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < slab
    base = pool_ptr + layer * stride_l
    x = tl.load(base + src * stride_b + offs, mask=mask)
    tl.store(base + dst * stride_b + offs, x, mask=mask)


def copy_blocks(kv_pool, src_dst) -> None:
    n = src_dst.shape[0]
    if n == 0:
        return
    two, num_layers, num_blocks = kv_pool.shape[:3]
    if kv_pool.element_size() == 1:  # int8 / fp8 pools (codes + scales) move as plain bytes
        kv_pool = kv_pool.view(torch.uint8)
    pool = kv_pool.view(two * num_layers, num_blocks, -1)  # raises if slabs are not contiguous
    assert pool.stride(2) == 1
    pairs = src_dst.to(device=kv_pool.device, dtype=torch.int64).contiguous()
    slab = pool.shape[2]
    chunk = min(4096, triton.next_power_of_2(slab))
    grid = (n, two * num_layers, triton.cdiv(slab, chunk))
    _copy_blocks_kernel[grid](pool, pairs, pool.stride(0), pool.stride(1), slab, CHUNK=chunk)
