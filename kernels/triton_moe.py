"""Triton grouped GEMM for the routed experts of a mixture-of-experts MLP (the CUDA path).

Why: the torch path (kernels/moe_torch.py) runs one GEMM pair per active expert from Python and
needs the per-expert counts on the host (a device sync per layer, and no CUDA graph). Here two
launches serve every expert at once, with no host sync:

1. Align (torch ops on the device): the T x k (token, choice) pairs are sorted by expert and each
   expert's run is padded to a multiple of BLOCK_M with a sentinel pair (T x k), so every
   BLOCK_M-row block of the sorted list belongs to one expert (`block_expert`). The number of
   blocks is bounded without reading the counts: sum_e ceil(c_e / M) <= ceil(T k / M) + min(E, T k);
   blocks past the last real one carry expert E and return at once.
2. Gate/up: a program owns one block of rows and BLOCK_N intermediate columns; it gathers its
   tokens' rows of x, multiplies by the expert's gate and up rows (two fp32 accumulators over the
   same x tile), adds the biases and applies the activation (SwiGLU, or gpt-oss's clamped SwiGLU
   with alpha, limit and up + 1), and writes h at the pair's row of a [T k, I] buffer.
3. Down: a program owns one block of rows and BLOCK_N hidden columns: h x w2[e]^T (+ bias), times
   the pair's router weight, written at the pair's row of a [T k, H] buffer; the k rows of a
   token are then summed in torch (fixed order: deterministic, no atomics).

Rounding: in 16-bit dtypes each step rounds where eager torch rounds (kernels/triton_rounding.py),
so results stay close to the torch path; only the order of the final sum over k differs. tl.dot
takes the native 16-bit tiles on a GPU and fp32 ("ieee", not tf32) for fp32 models; under the
interpreter every tile is upcast to fp32 (it mishandles bf16 arithmetic).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_rounding import round_as

ACTS = {"silu": 0, "swiglu_clamp": 1}
_TL = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


@triton.jit
def _gate_up_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    pairs_ptr,
    blk_exp_ptr,
    h_ptr,
    num_pairs,
    hidden,
    inter,
    num_experts,
    stride_xt,
    stride_we,
    stride_wn,
    stride_be,
    stride_ht,
    alpha,
    limit,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    CDT: tl.constexpr,
    PREC: tl.constexpr,
):
    blk = tl.program_id(0)
    e = tl.load(blk_exp_ptr + blk)
    if e >= num_experts:  # a block past the last expert's padded run
        return
    offs_m = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(pairs_ptr + offs_m)
    valid = pair < num_pairs
    tok = tl.where(valid, pair // TOP_K, 0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < inter
    offs_k = tl.arange(0, BLOCK_K)
    w_gate = w_ptr + e.to(tl.int64) * stride_we + offs_n[None, :] * stride_wn
    w_up = w_gate + inter * stride_wn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        kk = k0 + offs_k
        k_mask = kk < hidden
        a = tl.load(
            x_ptr + tok[:, None] * stride_xt + kk[None, :],
            mask=valid[:, None] & k_mask[None, :],
            other=0.0,
        ).to(CDT)
        wmask = k_mask[:, None] & n_mask[None, :]
        wg = tl.load(w_gate + kk[:, None], mask=wmask, other=0.0).to(CDT)
        wu = tl.load(w_up + kk[:, None], mask=wmask, other=0.0).to(CDT)
        acc_g += tl.dot(a, wg, input_precision=PREC)
        acc_u += tl.dot(a, wu, input_precision=PREC)
    DT = h_ptr.dtype.element_ty
    if HAS_BIAS:
        b_row = b_ptr + e.to(tl.int64) * stride_be
        acc_g += tl.load(b_row + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(b_row + inter + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    g = round_as(acc_g, DT)
    u = round_as(acc_u, DT)
    if ACT == 0:  # silu(gate) * up
        h = round_as(round_as(g / (1.0 + tl.exp(-g)), DT) * u, DT)
    else:  # gpt-oss: (clamp(up) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
        sig = round_as(1.0 / (1.0 + tl.exp(-round_as(g * alpha, DT))), DT)
        h = round_as(round_as(u + 1.0, DT) * round_as(g * sig, DT), DT)
    tl.store(
        h_ptr + pair.to(tl.int64)[:, None] * stride_ht + offs_n[None, :],
        h.to(DT),
        mask=valid[:, None] & n_mask[None, :],
    )


@triton.jit
def _down_kernel(
    h_ptr,
    w_ptr,
    b_ptr,
    pairs_ptr,
    blk_exp_ptr,
    rw_ptr,
    y_ptr,
    num_pairs,
    hidden,
    inter,
    num_experts,
    stride_ht,
    stride_we,
    stride_wn,
    stride_be,
    stride_yt,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    CDT: tl.constexpr,
    PREC: tl.constexpr,
):
    blk = tl.program_id(0)
    e = tl.load(blk_exp_ptr + blk)
    if e >= num_experts:
        return
    offs_m = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(pairs_ptr + offs_m)
    valid = pair < num_pairs
    row = tl.where(valid, pair, 0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < hidden
    offs_k = tl.arange(0, BLOCK_K)
    w_base = w_ptr + e.to(tl.int64) * stride_we + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        kk = k0 + offs_k
        k_mask = kk < inter
        a = tl.load(
            h_ptr + row[:, None] * stride_ht + kk[None, :],
            mask=valid[:, None] & k_mask[None, :],
            other=0.0,
        ).to(CDT)
        w = tl.load(w_base + kk[:, None], mask=k_mask[:, None] & n_mask[None, :], other=0.0).to(CDT)
        acc += tl.dot(a, w, input_precision=PREC)
    DT = y_ptr.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(b_ptr + e.to(tl.int64) * stride_be + offs_n, mask=n_mask, other=0.0).to(
            tl.float32
        )[None, :]
    rw = tl.load(rw_ptr + row, mask=valid, other=0.0).to(tl.float32)
    y = round_as(round_as(acc, DT) * rw[:, None], DT)
    tl.store(
        y_ptr + row[:, None] * stride_yt + offs_n[None, :],
        y.to(DT),
        mask=valid[:, None] & n_mask[None, :],
    )


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """(sorted_pairs int32 [blocks * block_m], block_expert int32 [blocks]): the flat pair
    indices t * k + c grouped by expert (ascending; within an expert by pair), each expert's run
    padded to a multiple of block_m with the sentinel T * k; block_expert[b] = the expert of
    rows b * block_m .. (b + 1) * block_m - 1, or num_experts past the last run. Torch ops only,
    no host sync (the block count is a bound computed from the shapes)."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    pairs, dev = flat.numel(), flat.device
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount would sync on CUDA
    blocks_of = (counts + block_m - 1) // block_m
    blk_end = torch.cumsum(blocks_of, 0)
    run_start = torch.cumsum(counts, 0) - counts  # in the unpadded sorted order
    e_sorted = flat[order]
    rank = torch.arange(pairs, device=dev) - run_start[e_sorted]
    dest = (blk_end - blocks_of)[e_sorted] * block_m + rank
    max_blocks = triton.cdiv(pairs, block_m) + min(num_experts, pairs)
    sorted_pairs = torch.full((max_blocks * block_m,), pairs, dtype=torch.int32, device=dev)
    sorted_pairs[dest] = order.to(torch.int32)
    block_expert = torch.searchsorted(blk_end, torch.arange(max_blocks, device=dev), right=True)
    return sorted_pairs, block_expert.to(torch.int32)


def choose_tiles(pairs: int, num_experts: int, hidden: int, inter: int, dtype, on_gpu: bool):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps). GPU: BLOCK_M from the mean rows per active expert
    (decode: 16, the least tl.dot takes; long prefills: 64), fp32 with a shorter K step (two
    fp32 accumulators and two weight tiles per program), 8 warps (ptxas for sm_90 at 4 warps:
    255 registers and spills up to ~500 B at M=64; at 8: no spills, scripts/compile_sm90.py
    --only moe). Interpreter: large tiles, few programs (each costs ~50 us there)."""
    if not on_gpu:
        return (
            16,
            min(128, triton.next_power_of_2(max(inter, hidden))),
            min(128, triton.next_power_of_2(hidden)),
            4,
        )
    rows = pairs / max(1, min(num_experts, pairs))
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    block_k = 32 if dtype == torch.float32 else 64
    return block_m, 64, block_k, 8


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
    tiles=None,
) -> torch.Tensor:
    """See kernels.moe_experts. `tiles` (BLOCK_M, BLOCK_N, BLOCK_K, num_warps) overrides
    choose_tiles (tests)."""
    T, H = x.shape
    E, two_i, _ = w13.shape
    inter, k = two_i // 2, topk_ids.shape[1]
    if not T:
        return torch.zeros_like(x)
    assert w13.shape[2] == H and tuple(w2.shape) == (E, H, inter), (w13.shape, w2.shape)
    x = x.contiguous()
    w13, w2 = w13.contiguous(), w2.contiguous()
    rw = topk_weights.reshape(-1).contiguous()
    pairs = T * k
    on_gpu = x.device.type == "cuda"
    bm, bn, bk, warps = tiles or choose_tiles(pairs, E, H, inter, x.dtype, on_gpu)
    sorted_pairs, block_expert = align_by_expert(topk_ids, E, bm)
    nblocks = block_expert.numel()
    if on_gpu and x.dtype != torch.float32:
        cdt, prec = _TL[x.dtype], "tf32"  # precision is ignored for 16-bit inputs
    else:
        cdt, prec = tl.float32, "ieee"
    h = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    y = torch.empty(pairs, H, dtype=x.dtype, device=x.device)
    b13_ = b13.contiguous() if b13 is not None else w13
    b2_ = b2.contiguous() if b2 is not None else w2
    _gate_up_kernel[(nblocks, triton.cdiv(inter, bn))](
        x,
        w13,
        b13_,
        sorted_pairs,
        block_expert,
        h,
        pairs,
        H,
        inter,
        E,
        x.stride(0),
        w13.stride(0),
        w13.stride(1),
        b13_.stride(0),
        h.stride(0),
        float(alpha),
        float(limit),
        TOP_K=k,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        ACT=ACTS[act],
        HAS_BIAS=b13 is not None,
        CDT=cdt,
        PREC=prec,
        num_warps=warps,
    )
    _down_kernel[(nblocks, triton.cdiv(H, bn))](
        h,
        w2,
        b2_,
        sorted_pairs,
        block_expert,
        rw,
        y,
        pairs,
        H,
        inter,
        E,
        h.stride(0),
        w2.stride(0),
        w2.stride(1),
        b2_.stride(0),
        y.stride(0),
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        HAS_BIAS=b2 is not None,
        CDT=cdt,
        PREC=prec,
        num_warps=warps,
    )
    return y.view(T, k, H).sum(1) if k > 1 else y.view(T, H)
