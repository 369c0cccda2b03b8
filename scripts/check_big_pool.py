"""GPU check stage: a KV pool at 80% of free device memory, used at its HIGHEST block ids.

Why: element offsets into such a pool pass 2^31 (a 100 GB bf16 pool has ~5e10 elements), so any
32-bit address arithmetic would read or write the wrong place. Checked at the top of the pool,
with what the CUDA forward actually runs:
- rope_and_store (the fused RoPE + K/V store the engine writes through) and store_kv: bit-identical
  to the same kernel writing the same tokens into a small pool at block ids 0..n (so only the
  offsets differ), and store_kv exactly as torch (64-bit) indexing;
- decode and prefill / extend attention over those blocks: within 4 eps of fp64 dense attention
  on the stored values (causal for prefill);
- copy_blocks top -> bottom -> top: bit-exact.
On CPU (smoke, tests) the pool is torch.empty: pages are committed only where written, so the
interpreter can run a pool of more than 2^31 elements (8 GiB virtual) with ~100 MB resident.
"""

from __future__ import annotations

import time

import torch

import kernels

BLOCKS_USED = 5  # a 75-token context over five blocks at the top of the pool


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _dense(q, key, val, heads, kvh, d, q_pos):
    """fp64 attention of queries at positions q_pos over key/val[0 .. pos] (causal)."""
    kk = key.double().repeat_interleave(heads // kvh, 1)
    vv = val.double().repeat_interleave(heads // kvh, 1)
    s = torch.einsum("thd,khd->thk", q.double(), kk) * d**-0.5
    mask = torch.arange(key.shape[0], device=key.device)[None, :] > q_pos[:, None]
    s = s.masked_fill(mask[:, None, :], float("-inf"))
    return torch.einsum("thk,khd->thd", s.softmax(-1), vv)


def check_big_pool(
    device: str,
    dtype: str = "bfloat16",
    fraction: float = 0.8,
    kvh: int = 8,
    d: int = 128,
    bs: int = 16,
    layers: int = 2,
    max_bytes: int | None = None,
    backend=None,
) -> dict:
    t0 = time.perf_counter()
    tdt = getattr(torch, dtype)
    dev = torch.device(device)
    if dev.type == "cuda":
        import gc

        gc.collect()  # engines and HF models of earlier stages
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(dev)
    else:
        free = max_bytes or (256 << 20)
    budget = int(free * fraction) if max_bytes is None else min(max_bytes, int(free * fraction))
    esize = torch.empty((), dtype=tdt).element_size()
    block_bytes = 2 * layers * bs * kvh * d * esize
    nb = budget // block_bytes
    pool = torch.empty(2, layers, nb, bs, kvh, d, dtype=tdt, device=dev)
    kc, vc = pool[0, layers - 1], pool[1, layers - 1]
    hi = [nb - 1, nb - 4, nb - 2, nb - 5, nb - 3]  # a block table at the top of the pool
    ctx = BLOCKS_USED * bs - 5
    heads = 4 * kvh
    g = torch.Generator(device=dev).manual_seed(0)
    rnd = lambda *shape: torch.randn(*shape, generator=g, device=dev).to(tdt)
    slot_of = lambda table: torch.tensor(
        [table[p // bs] * bs + p % bs for p in range(ctx)], dtype=torch.int64, device=dev
    )
    slots = slot_of(hi)
    blk, off = slots // bs, slots % bs
    out: dict = {}

    # rope_and_store at the top vs the same call into a small pool at the bottom
    rope_ok = None
    if kernels.resolve_backend(backend, dev) == "triton":
        from kernels.triton_rope_store import rope_and_store

        qkv = rnd(ctx, (heads + 2 * kvh) * d)
        pos = torch.arange(ctx, device=dev)
        ang = (
            pos[:, None].double()
            * (10000.0 ** (-torch.arange(0, d, 2, device=dev).double() / d))[None, :]
        )
        ang = torch.cat([ang, ang], 1)
        cos, sin = ang.cos().to(tdt), ang.sin().to(tdt)
        small = torch.zeros(2, BLOCKS_USED, bs, kvh, d, dtype=tdt, device=dev)
        q_small = rope_and_store(
            qkv, pos, cos, sin, small[0], small[1], slot_of(list(range(BLOCKS_USED))), heads, kvh
        )
        q_big = rope_and_store(qkv, pos, cos, sin, kc, vc, slots, heads, kvh)
        sb, so = torch.arange(ctx, device=dev) // bs, torch.arange(ctx, device=dev) % bs
        rope_ok = bool(
            torch.equal(_bits(q_big), _bits(q_small))
            and torch.equal(_bits(kc[blk, off]), _bits(small[0][sb, so]))
            and torch.equal(_bits(vc[blk, off]), _bits(small[1][sb, so]))
        )
    out["rope_store_exact"] = rope_ok

    # store_kv (overwrites what rope_and_store wrote) and attention over the stored values
    key, val = rnd(ctx, kvh, d), rnd(ctx, kvh, d)
    kernels.store_kv(key, val, kc, vc, slots, backend=backend)
    store_ok = bool(torch.equal(kc[blk, off], key) and torch.equal(vc[blk, off], val))
    eps = torch.finfo(tdt).eps
    table = torch.tensor([hi], dtype=torch.int32, device=dev)
    q = rnd(1, heads, d)
    dec = kernels.paged_attention(
        q,
        kc,
        vc,
        table,
        torch.tensor([ctx], dtype=torch.int32, device=dev),
        torch.tensor([0, 1], dtype=torch.int32, device=dev),
        d**-0.5,
        max_seqlen_q=1,
        backend=backend,
    )
    ref = _dense(q, key, val, heads, kvh, d, torch.tensor([ctx - 1], device=dev))
    attn_err = (dec.double() - ref).abs().max().item()
    attn_ok = attn_err <= 4 * eps * max(1.0, ref.abs().max().item())
    # prefill: sequence 0 is the whole context, sequence 1 extends a 67-token cached prefix by 8
    ext = 8
    qp = rnd(ctx + ext, heads, d)
    pre = kernels.paged_attention(
        qp,
        kc,
        vc,
        table.repeat(2, 1),
        torch.tensor([ctx, ctx], dtype=torch.int32, device=dev),
        torch.tensor([0, ctx, ctx + ext], dtype=torch.int32, device=dev),
        d**-0.5,
        max_seqlen_q=ctx,
        backend=backend,
    )
    all_pos = torch.arange(ctx, device=dev)
    ref_p = torch.cat(
        [
            _dense(qp[:ctx], key, val, heads, kvh, d, all_pos),
            _dense(qp[ctx:], key, val, heads, kvh, d, all_pos[ctx - ext :]),
        ]
    )
    pre_err = (pre.double() - ref_p).abs().max().item()
    pre_ok = pre_err <= 4 * eps * max(1.0, ref_p.abs().max().item())

    # copy the top blocks to the bottom and the bottom back to other top blocks, all layers, K and V
    # (the pool is torch.empty: fill what is compared, and compare bits, since garbage may be NaN)
    for b in (nb - 1, nb - 2):
        pool[:, :, b] = torch.randn(pool[:, :, b].shape, generator=g, device=dev).to(tdt)
    pool[:, :, 0:2].zero_()
    kernels.copy_blocks(
        pool,
        torch.tensor([[nb - 1, 0], [nb - 2, 1]], dtype=torch.int64, device=dev),
        backend=backend,
    )
    copy_ok = bool(
        torch.equal(_bits(pool[:, :, 0]), _bits(pool[:, :, nb - 1]))
        and torch.equal(_bits(pool[:, :, 1]), _bits(pool[:, :, nb - 2]))
    )
    kernels.copy_blocks(
        pool, torch.tensor([[0, nb - 6]], dtype=torch.int64, device=dev), backend=backend
    )
    copy_ok &= bool(torch.equal(_bits(pool[:, :, nb - 6]), _bits(pool[:, :, 0])))
    layer_elems = kc.shape[0] * kc.stride(0)  # what a kernel indexes from kc's base
    max_offset = pool.numel() - 1
    del pool
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    out.update(
        store_exact=store_ok,
        attention_ok=attn_ok,
        attention_max_err=attn_err,
        prefill_ok=pre_ok,
        prefill_max_err=pre_err,
        copy_exact=copy_ok,
        num_blocks=nb,
        pool_gib=nb * block_bytes / 2**30,
        max_element_offset=max_offset,
        layer_slab_elements=layer_elems,
        offsets_past_int32=layer_elems > 2**31 - 1,
        seconds=time.perf_counter() - t0,
    )
    out["ok"] = store_ok and attn_ok and pre_ok and copy_ok and rope_ok is not False
    return out
