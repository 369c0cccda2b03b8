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

Rotation (on by default for int8/fp8, `kv_cache_rotation`): the model rotates K (after RoPE), V and
q per head by a fixed orthonormal symmetric Hadamard matrix R (`hadamard`, R @ R = I) before the
store and attention, and the attention output back by R after it. q R . k R = q . k and
softmax(.) (V R) R = softmax(.) V, so attention is unchanged in exact arithmetic, while a row's
outlier channels are spread over all head_dim codes and its amax shrinks toward the rms: int8's
per-row step amax/127 gets finer. No kernel knows: only the tensors around them change.
"""

from __future__ import annotations

import torch

SCALE_BYTES = 4  # one fp32 per (token, KV head) row
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
    return (
        2
        * layers
        * kv_heads
        * row_width(head_dim, dtype)
        * torch.empty((), dtype=dtype).element_size()
    )


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
    rows[..., : x.shape[-1]] = codes
    rows[..., x.shape[-1] :].view(torch.float32)[..., 0] = scale
    return rows


def dequantize(rows: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """rows [..., d + 4] (any view of the pool) -> values [..., d] in out_dtype. Unquantized
    caches are only cast."""
    if not is_quantized(rows):
        return rows.to(out_dtype)
    codes, scales = split(rows)
    return (codes.float() * scales[..., None]).to(out_dtype)


def hadamard(d: int, device=None) -> torch.Tensor | None:
    """The KV rotation for head_dim d: the Sylvester Hadamard matrix scaled to be orthonormal,
    H / sqrt(d), fp32 [d, d]; None when d is not a power of two (no rotation then). It is
    symmetric and its own inverse (R @ R = I), so one matrix rotates q, k, v in and the attention
    output back out. (A variant with a fixed random diagonal of signs, S H S / sqrt(d), measured
    the same within noise: bench/kv_accuracy.py --study, docs/BENCHMARKS.md.)"""
    if d < 1 or d & (d - 1):
        return None
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    return (h / d**0.5).to(device=device, dtype=torch.float32)


def rotation_for(mode: str, pool: torch.dtype, head_dim: int) -> str:
    """'hadamard' or 'none': whether a pool of dtype `pool` is written and read rotated.
    auto: rotate exactly when the pool is quantized and head_dim is a power of two (measured: 4x
    lower KL for int8, docs/BENCHMARKS.md); hadamard: the same, but an error where it cannot apply;
    none: never. An unquantized pool is never rotated (it would only cost fp32 exactness)."""
    if mode in (None, "none"):
        return "none"
    ok = pool in QMAX and hadamard(head_dim) is not None
    if mode == "hadamard" and not ok:
        raise ValueError(
            f"kv_cache_rotation='hadamard' needs an int8/fp8 KV cache and a power-of-two "
            f"head_dim; got a {pool} pool, head_dim {head_dim}"
        )
    if mode not in ("auto", "hadamard"):
        raise ValueError(f"kv_cache_rotation must be auto, hadamard or none, got {mode!r}")
    return "hadamard" if ok else "none"


def rotate(
    x: torch.Tensor, r: torch.Tensor, out_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """x [..., d] @ r in fp32 (r from hadamard()), as out_dtype; contiguous. k and v stay fp32 for
    the quantizing store (one rounding fewer); q and the attention output go back to the model's dtype."""
    return (x.float() @ r).to(out_dtype)
