"""GPU check stage: a KV pool at 80% of free device memory, used at its HIGHEST block ids.

Why: element offsets into such a pool pass 2^31 (a 100 GB bf16 pool has ~5e10 elements), so any
32-bit address arithmetic in the store, attention or copy kernels would read or write the wrong
place. Each kernel is run on blocks at the very end of the pool and checked exactly against torch
indexing (which is 64-bit): store and copy must be bit-exact, attention within the fp32 tolerance
of a dense fp64 computation on the same stored values.
"""
from __future__ import annotations

import time

import torch

import kernels


def check_big_pool(device: str, dtype: str = "bfloat16", fraction: float = 0.8, kvh: int = 8, d: int = 128,
                   bs: int = 16, layers: int = 2, max_bytes: int | None = None, backend=None) -> dict:
    t0 = time.perf_counter()
    tdt = getattr(torch, dtype)
    dev = torch.device(device)
    if dev.type == "cuda":
        import gc
        gc.collect()                 # engines and HF models of earlier stages
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(dev)
    else:
        free = max_bytes or (256 << 20)
    budget = int(free * fraction) if max_bytes is None else min(max_bytes, int(free * fraction))
    esize = torch.empty((), dtype=tdt).element_size()
    block_bytes = 2 * layers * bs * kvh * d * esize
    nb = budget // block_bytes
    pool = torch.empty(2, layers, nb, bs, kvh, d, dtype=tdt, device=dev)
    last_layer = layers - 1
    kc, vc = pool[0, last_layer], pool[1, last_layer]
    hi = [nb - 1, nb - 3, nb - 2]                    # a block table at the top of the pool
    ctx = 3 * bs - 5
    g = torch.Generator(device=dev).manual_seed(0)
    key = torch.randn(ctx, kvh, d, generator=g, device=dev).to(tdt)
    val = torch.randn(ctx, kvh, d, generator=g, device=dev).to(tdt)
    slots = torch.tensor([hi[p // bs] * bs + p % bs for p in range(ctx)], dtype=torch.int64, device=dev)
    kernels.store_kv(key, val, kc, vc, slots, backend=backend)
    blk, off = slots // bs, slots % bs
    store_ok = bool(torch.equal(kc[blk, off], key) and torch.equal(vc[blk, off], val))
    # attention over those blocks vs fp64 dense on the stored values
    heads = 4 * kvh
    q = torch.randn(1, heads, d, generator=g, device=dev).to(tdt)
    table = torch.tensor([hi], dtype=torch.int32, device=dev)
    out = kernels.paged_attention(q, kc, vc, table, torch.tensor([ctx], dtype=torch.int32, device=dev),
                                  torch.tensor([0, 1], dtype=torch.int32, device=dev), d ** -0.5, max_seqlen_q=1,
                                  backend=backend)
    kk = key.double().repeat_interleave(heads // kvh, 1)
    vv = val.double().repeat_interleave(heads // kvh, 1)
    s = torch.einsum("hd,khd->hk", q[0].double(), kk) * d ** -0.5
    ref = torch.einsum("hk,khd->hd", s.softmax(-1), vv)
    eps = torch.finfo(tdt).eps
    attn_err = (out[0].double() - ref).abs().max().item()
    attn_ok = attn_err <= 4 * eps * max(1.0, ref.abs().max().item())
    # copy the top blocks to the bottom and the bottom back to other top blocks, all layers, K and V
    # (the pool is torch.empty: fill what is compared, and compare bits, since garbage may be NaN)
    bits = lambda t: t.view({2: torch.int16, 4: torch.int32}[t.element_size()])
    for b in (nb - 1, nb - 2):
        pool[:, :, b] = torch.randn(pool[:, :, b].shape, generator=g, device=dev).to(tdt)
    pool[:, :, 0:2].zero_()
    kernels.copy_blocks(pool, torch.tensor([[nb - 1, 0], [nb - 2, 1]], dtype=torch.int64, device=dev), backend=backend)
    copy_ok = bool(torch.equal(bits(pool[:, :, 0]), bits(pool[:, :, nb - 1]))
                   and torch.equal(bits(pool[:, :, 1]), bits(pool[:, :, nb - 2])))
    kernels.copy_blocks(pool, torch.tensor([[0, nb - 4]], dtype=torch.int64, device=dev), backend=backend)
    copy_ok &= bool(torch.equal(bits(pool[:, :, nb - 4]), bits(pool[:, :, 0])))
    max_offset = pool.numel() - 1
    del pool
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"ok": store_ok and attn_ok and copy_ok, "store_exact": store_ok, "attention_ok": attn_ok,
            "attention_max_err": attn_err, "copy_exact": copy_ok, "num_blocks": nb, "pool_gib": nb * block_bytes / 2**30,
            "max_element_offset": max_offset, "offsets_past_int32": max_offset > 2**31 - 1,
            "seconds": time.perf_counter() - t0}
