"""KV-cache kernels: store, paged attention, block copy (see docs/DESIGN.md for the pool layout);
and the routed experts of a mixture-of-experts MLP.

Each public function dispatches to the torch implementation (kernels/reference.py, the CPU path)
or to Triton (kernels/triton_*.py). Triton is imported lazily on first use, so the engine on a
CPU-only machine never imports it; on CPU it runs only under TRITON_INTERPRET=1 (tests).
"""

from __future__ import annotations

import os

import torch

from . import reference

__all__ = ["store_kv", "paged_attention", "copy_blocks", "moe_experts", "resolve_backend"]


def resolve_backend(backend, device) -> str:
    """None/"auto": "triton" iff device is CUDA, else "torch". "triton" on a non-CUDA device is
    allowed only with TRITON_INTERPRET=1 set (before triton is imported)."""
    dev = torch.device(device)
    if backend in (None, "auto"):
        return "triton" if dev.type == "cuda" else "torch"
    if backend == "torch":
        return "torch"
    if backend == "triton":
        if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                f"backend='triton' on device {dev} needs a CUDA device, or TRITON_INTERPRET=1 "
                "set in the environment before triton is imported (slow interpreter, for tests)"
            )
        return "triton"
    raise ValueError(
        f"unknown kernel backend {backend!r}; expected None, 'auto', 'torch' or 'triton'"
    )


def store_kv(key, value, k_cache, v_cache, slot_mapping, backend=None) -> None:
    """Write key/value [num_tokens, kvh, d] into k_cache/v_cache [num_blocks, block_size, kvh, d]
    at slot_mapping (int64 [num_tokens], slot = block*block_size + offset, -1 = skip)."""
    if resolve_backend(backend, k_cache.device) == "torch":
        return reference.store_kv(key, value, k_cache, v_cache, slot_mapping)
    from . import kv_quant, triton_store

    if kv_quant.is_quantized(k_cache):
        return triton_store.store_kv_quant(key, value, k_cache, v_cache, slot_mapping)
    return triton_store.store_kv(key, value, k_cache, v_cache, slot_mapping)


def paged_attention(
    query,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    cu_seqlens_q,
    scale,
    max_seqlen_q=None,
    backend=None,
    window=None,
    sinks=None,
):
    """Causal attention of packed queries [num_tokens, H, d] over paged K/V; returns
    [num_tokens, H, d]. block_tables int32 [num_seqs, max_blocks]; seq_lens int32 [num_seqs]
    (context incl. this step's tokens); cu_seqlens_q int32 [num_seqs + 1]. Sequence i's queries
    sit at positions seq_lens[i]-q_len_i .. seq_lens[i]-1. max_seqlen_q == 1 selects decode;
    None computes it (a device sync). window W (sliding-window attention; None: full): the query
    at position p sees p-W+1 .. p, and no kernel reads a block wholly before that. sinks (fp32 [H],
    gpt-oss): a learned logit per head in each softmax's denominator; the torch path computes it
    in its reference (the CPU kernels do not take it), the Triton kernels in their last
    normalisation."""
    if resolve_backend(backend, query.device) == "torch":
        return reference.paged_attention(
            query,
            k_cache,
            v_cache,
            block_tables,
            seq_lens,
            cu_seqlens_q,
            scale,
            max_seqlen_q,
            window=window,
            sinks=sinks,
        )
    from . import triton_attention

    return triton_attention.paged_attention(
        query,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        cu_seqlens_q,
        scale,
        max_seqlen_q,
        window=window,
        sinks=sinks,
    )


def copy_blocks(kv_pool, src_dst, backend=None) -> None:
    """Copy block src -> dst (src_dst int64 [n, 2]) in every layer, K and V, in one launch.
    Destinations must be distinct and not also sources in the same call (CoW targets are fresh)."""
    if resolve_backend(backend, kv_pool.device) == "torch":
        return reference.copy_blocks(kv_pool, src_dst)
    from . import triton_copy

    return triton_copy.copy_blocks(kv_pool, src_dst)


def moe_experts(
    x,
    topk_weights,
    topk_ids,
    w13,
    w2,
    b13=None,
    b2=None,
    act="silu",
    alpha=0.0,
    limit=0.0,
    backend=None,
):
    """The routed experts of x [T, H]: sum over c < k of topk_weights[t, c] times expert
    topk_ids[t, c] applied to x[t] (act(x w13_gate^T + b) * (x w13_up^T + b), then w2), [T, H].
    w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I], b13 [E, 2I] / b2 [E, H] or None;
    act "silu" or "swiglu_clamp" (gpt-oss, with alpha and limit). Torch: kernels/moe_torch.py;
    Triton: kernels/triton_moe.py (grouped GEMM over the tokens sorted per expert)."""
    if resolve_backend(backend, x.device) == "torch":
        from . import moe_torch

        return moe_torch.moe_experts(x, topk_weights, topk_ids, w13, w2, b13, b2, act, alpha, limit)
    from . import triton_moe

    return triton_moe.moe_experts(x, topk_weights, topk_ids, w13, w2, b13, b2, act, alpha, limit)
