"""The quantized KV row: head_dim 1-byte codes followed by that row's fp32 scale, in the pool itself.

Why the scale sits inside the row: a block is the pool's unit of sharing, hashing, copy-on-write,
eviction (and, later, of a second storage tier). With the scale stored next to the codes of the
(token, KV head) it belongs to, a block's slab `kv_pool[:, :, block_id]` holds everything needed to
read it back, so copy_blocks, CUDA-graph shapes and every block-level operation stay as they are:
the pool is still one tensor, [2, layers, num_blocks, block_size, kv_heads, head_dim + 4], whose
dtype says the format (int8: symmetric int8 codes; float8_e4m3fn: fp8 e4m3 codes). The last 4
bytes of each row are the row's scale as an fp32, read through a dtype view of the same memory.

Granularity: one scale per token per KV head, not per block per head: it needs no re-quantization
when a partial block grows (a token is written once, never rewritten under readers that share the
block), and a row's own amax is never larger than its block's, so its error bound is never larger; a block
scale would save 5.5% of the bytes (docs/DESIGN.md, "Quantized KV"; bench/kv_accuracy.py --study).
x ~= code * scale, scale = amax(|x| over head_dim) / QMAX (QMAX = 127 for int8, 448 for e4m3).
"""
from __future__ import annotations

import torch

SCALE_BYTES = 4          # one fp32 per (token, KV head) row
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8", "fp8")


def is_quantized(cache: torch.Tensor) -> bool:
    """True for a quantized pool / cache view (its dtype is a 1-byte code type)."""
    return cache.dtype in QMAX


def is_quantized_dtype(dtype: torch.dtype) -> bool:
    return dtype in QMAX


def pool_dtype(kv_cache_dtype: str, weights_dtype: torch.dtype) -> torch.dtype:
    """The pool tensor's dtype for a --kv-cache-dtype value ('auto' = the weights' dtype)."""
    if kv_cache_dtype in (None, "auto"):
        return weights_dtype
    if kv_cache_dtype == "int8":
        return torch.int8
    if kv_cache_dtype == "fp8":
        return torch.float8_e4m3fn
    if kv_cache_dtype in ("float32", "bfloat16", "float16"):
        return getattr(torch, kv_cache_dtype)
    raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")


def row_width(head_dim: int, dtype: torch.dtype) -> int:
    """Last dimension of the pool: head_dim, plus the scale's 4 bytes for a quantized dtype."""
    if dtype in QMAX:
        if head_dim % SCALE_BYTES:
            raise ValueError(f"a quantized KV cache needs head_dim divisible by 4, got {head_dim}")
        return head_dim + SCALE_BYTES
    return head_dim


def head_dim_of(cache: torch.Tensor) -> int:
    return cache.shape[-1] - (SCALE_BYTES if is_quantized(cache) else 0)


def bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """2 (K and V) x layers x KV heads x (row bytes): what one token costs in this pool."""
    return 2 * layers * kv_heads * row_width(head_dim, dtype) * torch.empty((), dtype=dtype).element_size()


def split(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [..., head_dim], scales [...] fp32): views of the same memory, nothing copied."""
    d = head_dim_of(cache)
    return cache[..., :d], cache[..., d:].view(torch.float32)[..., 0]


def scale_for(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per-row scale (amax over the last dim / QMAX), fp32; kept separate so tests can mutate it."""
    return x.float().abs().amax(dim=-1) / QMAX[dtype]


def quantize_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [..., d] float -> rows [..., d + 4] of `dtype`: codes then the fp32 scale's bytes."""
    xf = x.float()
    scale = scale_for(xf, dtype)
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    y = xf * inv[..., None]
    if dtype == torch.int8:
        codes = torch.round(y).clamp_(-127, 127).to(torch.int8)
    else:
        codes = y.clamp_(-448.0, 448.0).to(dtype)
    rows = torch.empty(*x.shape[:-1], x.shape[-1] + SCALE_BYTES, dtype=dtype, device=x.device)
    rows[..., :x.shape[-1]] = codes
    rows[..., x.shape[-1]:].view(torch.float32)[..., 0] = scale
    return rows


def dequantize(rows: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """rows [..., d + 4] (any view of the pool) -> values [..., d] in out_dtype. Unquantized
    caches are only cast."""
    if not is_quantized(rows):
        return rows.to(out_dtype)
    codes, scales = split(rows)
    return (codes.float() * scales[..., None]).to(out_dtype)
