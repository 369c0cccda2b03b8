"""Triton paged attention: a decode kernel (one query token per sequence) with GQA grouping and
split-K, and a varlen prefill/extend kernel (chunk of queries after a cached prefix, causal).

Shared ideas:
- K/V tiles of TILE_N positions are gathered row by row through the block table (a row is one
  contiguous [d] run of a block slab), so the tile size is independent of block_size and a tile
  may span several blocks or part of one.
- GQA grouping: a program owns one KV head and every query head that shares it, stacked as rows
  of the Q tile, so each K/V tile is loaded once for the whole group (decode: GROUP rows padded
  to 16 for tl.dot; prefill: BLOCK_Q tokens x GROUP_P2 heads = BLOCK_M rows).
- Online softmax in base 2 (scale folded with log2 e), fp32 accumulators. Positions past the
  context are never loaded (masked loads), so stale or NaN slots cannot leak into the output.
- Sliding window W (`window`, 0 = none): a query at position p sees p-W+1 .. p. Positions before
  a program's first visible one are never loaded either, and tiles wholly before it are skipped,
  so blocks a window layer no longer needs may be freed and reused by anyone.
- Under the interpreter (CPU tensors) every load is upcast to fp32: it mishandles bf16 math.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import kv_quant


@triton.jit
def _load_rows(
    ptr,
    s_ptr,
    rows,
    offs_d,
    mask,
    valid,
    HEAD_DIM: tl.constexpr,
    CDT: tl.constexpr,
    QUANT: tl.constexpr,
):
    """A [positions, d] tile of K or V at row offsets `rows`. QUANT (an int8 / fp8 pool, see
    kernels/kv_quant.py): the row's codes times its fp32 scale, read from the row's last 4 bytes
    through s_ptr (an fp32 view of the same cache), so the pool is dequantized as it streams."""
    x = tl.load(ptr + rows[:, None] + offs_d[None, :], mask=mask, other=0.0)
    if QUANT:
        sc = tl.load(s_ptr + (rows + HEAD_DIM) // 4, mask=valid, other=0.0)
        x = x.to(tl.float32) * sc[:, None]
    return x.to(CDT)


@triton.jit
def _decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    bt_ptr,
    seq_lens_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    scale_log2,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    stride_ot,
    stride_oh,
    stride_pb,
    stride_ph,
    stride_ps,
    tokens_per_split,
    block_size,
    GROUP: tl.constexpr,
    G_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_P2: tl.constexpr,
    TILE_N: tl.constexpr,
    SPLIT: tl.constexpr,
    CDT: tl.constexpr,
    PREC: tl.constexpr,
    QUANT: tl.constexpr = False,
    window=0,
):
    """grid = (num_seqs, num_kv_heads, num_splits). Split s covers positions
    [s*tokens_per_split, (s+1)*tokens_per_split) and, with SPLIT, writes its normalised partial
    output and base-2 log-sum-exp for _merge_kernel; otherwise it writes the output directly.
    window > 0: positions before seq_len - window are outside (a split wholly before is empty)."""
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)
    if window > 0:
        start = tl.maximum(start, seq_len - window)
    offs_g = tl.arange(0, G_P2)
    offs_d = tl.arange(0, D_P2)
    offs_n = tl.arange(0, TILE_N)
    head = kvh * GROUP + offs_g
    gd_mask = (offs_g[:, None] < GROUP) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(
        q_ptr + seq * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=gd_mask,
        other=0.0,
    ).to(CDT)
    m_i = tl.full([G_P2], float("-inf"), tl.float32)
    l_i = tl.zeros([G_P2], tl.float32)
    acc = tl.zeros([G_P2, D_P2], tl.float32)
    bt_row = bt_ptr + seq * stride_bt
    for t0 in range(start, end, TILE_N):
        pos = t0 + offs_n
        valid = pos < end
        blk = tl.load(bt_row + pos // block_size, mask=valid, other=0).to(tl.int64)
        rows = blk * stride_cb + (pos % block_size) * stride_cs + kvh * stride_ch
        kv_mask = valid[:, None] & (offs_d[None, :] < HEAD_DIM)
        k = _load_rows(k_ptr, ks_ptr, rows, offs_d, kv_mask, valid, HEAD_DIM, CDT, QUANT)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale_log2
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile has >= 1 valid position
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_rows(v_ptr, vs_ptr, rows, offs_d, kv_mask, valid, HEAD_DIM, CDT, QUANT)
        acc = acc * alpha[:, None] + tl.dot(p.to(CDT), v, input_precision=PREC)
        m_i = m_new
    if SPLIT:
        # an empty split (start >= seq_len) writes o = 0 and lse = -inf: weight 0 in the merge
        nonempty = l_i > 0
        l_safe = tl.where(nonempty, l_i, 1.0)
        o = acc / l_safe[:, None]
        lse = tl.where(nonempty, m_i + tl.log2(l_safe), float("-inf"))
        base = seq * stride_pb + head * stride_ph + split * stride_ps
        tl.store(part_out_ptr + base[:, None] + offs_d[None, :], o, mask=gd_mask)
        tl.store(part_lse_ptr + base // stride_ps, lse, mask=offs_g < GROUP)
    else:
        o = acc / l_i[:, None]
        tl.store(
            out_ptr + seq * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=gd_mask,
        )


@triton.jit
def _merge_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_ot,
    stride_oh,
    num_splits,
    S_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_P2: tl.constexpr,
    sinks_ptr=None,
    HAS_SINKS: tl.constexpr = False,
):
    """grid = (num_seqs, num_heads): out = sum_s 2^(lse_s - max) o_s / sum_s 2^(lse_s - max).
    HAS_SINKS (gpt-oss): the head's sink logit (base 2: sinks * log2 e) is one more term of the
    denominator, with no value: out = sum_s w_s o_s / (sum_s w_s + 2^(sink - max))."""
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    offs_s = tl.arange(0, S_P2)
    offs_d = tl.arange(0, D_P2)
    base = seq * stride_pb + head * stride_ph + offs_s * stride_ps
    lse = tl.load(part_lse_ptr + base // stride_ps, mask=offs_s < num_splits, other=float("-inf"))
    top = tl.max(lse, 0)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634
        top = tl.maximum(top, sink)
    w = tl.exp2(lse - top)
    mask = (offs_s[:, None] < num_splits) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(part_out_ptr + base[:, None] + offs_d[None, :], mask=mask, other=0.0)
    den = tl.sum(w, 0)
    if HAS_SINKS:
        den += tl.exp2(sink - top)
    res = tl.sum(o * w[:, None], 0) / den
    tl.store(
        out_ptr + seq * stride_ot + head * stride_oh + offs_d,
        res.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    bt_ptr,
    seq_lens_ptr,
    cu_q_ptr,
    out_ptr,
    scale_log2,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    stride_ot,
    stride_oh,
    block_size,
    GROUP: tl.constexpr,
    G_P2: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_P2: tl.constexpr,
    TILE_N: tl.constexpr,
    CDT: tl.constexpr,
    PREC: tl.constexpr,
    QUANT: tl.constexpr = False,
    HAS_WINDOW: tl.constexpr = False,
    window=0,
    sinks_ptr=None,
    HAS_SINKS: tl.constexpr = False,
):
    """grid = (cdiv(max_seqlen_q, BLOCK_Q), num_seqs, num_kv_heads), BLOCK_Q = BLOCK_M // G_P2.
    Row r of the Q tile is token r // G_P2 of the tile, query head kvh*GROUP + r % G_P2. Keys
    before the tile's first query position are visible to every row (loop 1, no causal mask);
    the remaining tiles up to its last query position are masked per row (loop 2).
    HAS_WINDOW (window W): loop 1 starts at the tile of the first row's first visible key, loads
    nothing before it, and both loops mask each row's keys older than W; a row may then see no
    key of a tile, so the running max is kept finite for the exp2 (safe max)."""
    q_tile = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    kvh = tl.program_id(2).to(tl.int64)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    if q_tile * BLOCK_Q < q_len:
        ctx = tl.load(seq_lens_ptr + seq)
        prefix = ctx - q_len
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D_P2)
        offs_n = tl.arange(0, TILE_N)
        tok = q_tile * BLOCK_Q + offs_m // G_P2
        g = offs_m % G_P2
        head = kvh * GROUP + g
        row_mask = (tok < q_len) & (g < GROUP)
        qd_mask = row_mask[:, None] & (offs_d[None, :] < HEAD_DIM)
        q = tl.load(
            q_ptr
            + (q_start + tok).to(tl.int64)[:, None] * stride_qt
            + head[:, None] * stride_qh
            + offs_d[None, :],
            mask=qd_mask,
            other=0.0,
        ).to(CDT)
        q_pos = prefix + tok
        first_pos = prefix + q_tile * BLOCK_Q
        kv_end = tl.minimum(first_pos + BLOCK_Q, ctx)  # keys [0, kv_end) matter for this tile
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D_P2], tl.float32)
        bt_row = bt_ptr + seq * stride_bt
        d_mask = offs_d[None, :] < HEAD_DIM
        n_full = (first_pos + 1) // TILE_N
        j0 = 0
        lo = 0
        if HAS_WINDOW:  # keys before lo are outside every row's window: never loaded
            lo = tl.maximum(first_pos - window + 1, 0)
            j0 = lo // TILE_N
            for j in range(j0, n_full):
                pos = j * TILE_N + offs_n
                seen = pos >= lo
                blk = tl.load(bt_row + pos // block_size, mask=seen, other=0).to(tl.int64)
                rows = blk * stride_cb + (pos % block_size) * stride_cs + kvh * stride_ch
                kv_mask = seen[:, None] & d_mask
                k = _load_rows(k_ptr, ks_ptr, rows, offs_d, kv_mask, seen, HEAD_DIM, CDT, QUANT)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale_log2
                s = tl.where(
                    seen[None, :] & (pos[None, :] > q_pos[:, None] - window), s, float("-inf")
                )
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet
                alpha = tl.exp2(m_i - m_use)
                p = tl.exp2(s - m_use[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                v = _load_rows(v_ptr, vs_ptr, rows, offs_d, kv_mask, seen, HEAD_DIM, CDT, QUANT)
                acc = acc * alpha[:, None] + tl.dot(p.to(CDT), v, input_precision=PREC)
                m_i = m_new
            j0 = n_full
        for j in range(j0, n_full):  # every key here is <= first_pos <= each row's position
            pos = j * TILE_N + offs_n
            blk = tl.load(bt_row + pos // block_size).to(tl.int64)
            rows = blk * stride_cb + (pos % block_size) * stride_cs + kvh * stride_ch
            k = _load_rows(
                k_ptr, ks_ptr, rows, offs_d, d_mask, offs_n < TILE_N, HEAD_DIM, CDT, QUANT
            )
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale_log2
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = _load_rows(
                v_ptr, vs_ptr, rows, offs_d, d_mask, offs_n < TILE_N, HEAD_DIM, CDT, QUANT
            )
            acc = acc * alpha[:, None] + tl.dot(p.to(CDT), v, input_precision=PREC)
            m_i = m_new
        for t0 in range(n_full * TILE_N, kv_end, TILE_N):  # diagonal tiles: causal mask
            pos = t0 + offs_n
            valid = pos < kv_end
            if HAS_WINDOW:  # this tile may start before lo (both in the first row's tile)
                valid = valid & (pos >= lo)
            blk = tl.load(bt_row + pos // block_size, mask=valid, other=0).to(tl.int64)
            rows = blk * stride_cb + (pos % block_size) * stride_cs + kvh * stride_ch
            kv_mask = valid[:, None] & d_mask
            k = _load_rows(k_ptr, ks_ptr, rows, offs_d, kv_mask, valid, HEAD_DIM, CDT, QUANT)
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale_log2
            # the first diagonal tile starts at or below first_pos: no row is fully masked
            # (without a window; with one, a row may see none of a tile's keys: safe max)
            visible = valid[None, :] & (pos[None, :] <= q_pos[:, None])
            if HAS_WINDOW:
                visible = visible & (pos[None, :] > q_pos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = m_new
            if HAS_WINDOW:
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = _load_rows(v_ptr, vs_ptr, rows, offs_d, kv_mask, valid, HEAD_DIM, CDT, QUANT)
            acc = acc * alpha[:, None] + tl.dot(p.to(CDT), v, input_precision=PREC)
            m_i = m_new
        if HAS_SINKS:  # the head's sink logit joins the denominator (no value), max kept safe
            sink = tl.load(sinks_ptr + head, mask=row_mask, other=float("-inf")).to(tl.float32)
            sink = sink * 1.4426950408889634
            top = tl.maximum(m_i, sink)
            top = tl.where(top == float("-inf"), 0.0, top)
            a = tl.exp2(m_i - top)
            o = acc * a[:, None] / (l_i * a + tl.exp2(sink - top))[:, None]
        else:
            o = acc / l_i[:, None]
        tl.store(
            out_ptr
            + (q_start + tok).to(tl.int64)[:, None] * stride_ot
            + head[:, None] * stride_oh
            + offs_d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=qd_mask,
        )


_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def _compute_dtype(cache: torch.Tensor):
    """(load dtype, tl.dot input precision): native 16-bit on GPU, fp32 on the interpreter."""
    if cache.device.type != "cuda" or cache.dtype == torch.float32:
        return tl.float32, "ieee"
    return _TL_DTYPES[cache.dtype], "tf32"  # precision ignored for 16-bit inputs


def _num_sms(device) -> int:
    if device.type != "cuda":
        return 4  # interpreter: small, so tests exercise split-K on small batches
    return torch.cuda.get_device_properties(device).multi_processor_count


@dataclass(frozen=True)
class DecodeVariant:
    """A launch shape of _decode_kernel. blocks_d64 / blocks_d128: programs resident per SM at the
    registers the sm_90 ahead-of-time compile reports for bf16 at head_dim 64 / 128 (65,536
    registers per SM, docs/BENCHMARKS.md "Triton variants for sm_90"); split-K is sized from it.
    The GPU check measures each variant's GB/s and picks one (scripts/gpu_check.py)."""

    num_warps: int
    tile_n: int
    blocks_d64: int
    blocks_d128: int

    def blocks_per_sm(self, head_dim: int) -> int:
        return self.blocks_d64 if head_dim <= 64 else self.blocks_d128


# measured (triton 3.9, bf16): w4-t64 252 / 255 registers -> 2 / 2 programs per SM;
# w8-t64 128 / 250 -> 2 / 1 (twice the warps per program); w4-t32 126 / 228 -> 4 / 2.
DECODE_VARIANTS = {
    "w4-t64": DecodeVariant(4, 64, 2, 2),
    "w8-t64": DecodeVariant(8, 64, 2, 1),
    "w4-t32": DecodeVariant(4, 32, 4, 2),
}
_decode = [DECODE_VARIANTS[os.environ.get("PAGED_CHAT_DECODE_VARIANT", "w4-t64")]]


def set_decode_variant(name: str) -> None:
    """Select the decode launch shape for later calls (and later CUDA-graph captures)."""
    _decode[0] = DECODE_VARIANTS[name]


def current_decode_variant() -> DecodeVariant:
    return _decode[0]


@contextlib.contextmanager
def decode_variant(name: str):
    before = _decode[0]
    set_decode_variant(name)
    try:
        yield DECODE_VARIANTS[name]
    finally:
        _decode[0] = before


def prefill_tiles(cache_dtype: torch.dtype, on_gpu: bool, g_p2: int) -> tuple[int, int]:
    """(BLOCK_M, TILE_N) of _prefill_kernel. fp32 on the GPU uses 64 x 32: at 128 x 64 its sm_90
    compile took 12.6 s vs 2.8 s and spilled ~57 KB vs ~1.8 KB per thread (triton 3.9, d=64;
    fp32 tiles hold twice the registers of bf16). A cold GPU check compiles it several times."""
    if on_gpu and cache_dtype == torch.float32:
        return max(64, g_p2), 32
    return max(128 if on_gpu else 64, g_p2), 64


DECODE_BLOCKS_PER_SM = DECODE_VARIANTS["w4-t64"].blocks_d64  # the default variant's residency
DECODE_MIN_WAVES = 2  # a lone partial wave leaves SMs idle while its tail finishes
MIN_SPLIT_POSITIONS = 256  # below this the merge and the per-split overhead stop paying off


def choose_num_splits(
    num_seqs, num_kv_heads, max_ctx, device, tile_n, num_sms=None, head_dim=64
) -> int:
    """Split-K for decode from the SM count and the context: enough (seq, kv head, split) programs
    for DECODE_MIN_WAVES full waves of DECODE_BLOCKS_PER_SM programs per SM, but no split shorter
    than MIN_SPLIT_POSITIONS (short contexts are not worth splitting). Batch 64 x 8 KV heads on 132
    SMs is 512 programs, under two waves (528), so it still gets 2 splits at a 4k context.
    max_ctx is block_tables' width * block_size (no device sync); a CUDA graph passes its padded
    width, so a bucket's split count is fixed."""
    progs = max(1, num_seqs * num_kv_heads)
    sms = num_sms or _num_sms(device)
    target = DECODE_MIN_WAVES * _decode[0].blocks_per_sm(head_dim) * sms
    if progs >= target:
        return 1
    want = triton.cdiv(target, progs)
    return max(1, min(want, max_ctx // max(MIN_SPLIT_POSITIONS, tile_n), 64))


def paged_attention(
    query,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    cu_seqlens_q,
    scale,
    max_seqlen_q=None,
    out=None,
    num_splits=None,
    tile_n=None,
    window=None,
    sinks=None,
):
    """See kernels.paged_attention. Extra (tests/bench): out (preallocated), num_splits
    (decode split-K override), tile_n (K/V positions per inner step). window: sliding window
    (None / 0: full causal attention). sinks (fp32 [H], gpt-oss): added in the prefill kernel's
    last normalisation and in decode's merge (decode then always takes the split path)."""
    window = int(window or 0)
    num_tokens, H, d = query.shape
    _, bs, kvh, row = k_cache.shape
    quant = kv_quant.is_quantized(k_cache)
    assert (
        H % kvh == 0 and kv_quant.head_dim_of(k_cache) == d and k_cache.stride() == v_cache.stride()
    )
    assert query.stride(2) == 1 and k_cache.stride(3) == 1
    if out is None:
        out = torch.empty_like(query)
    assert out.shape == query.shape and out.stride(2) == 1
    if num_tokens == 0:
        return out
    num_seqs = seq_lens.shape[0]
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    block_tables = block_tables.contiguous()
    group = H // kvh
    cdt, prec = _compute_dtype(
        query if quant else k_cache
    )  # a quantized pool computes in q's dtype
    scales = (
        (k_cache.view(torch.float32), v_cache.view(torch.float32)) if quant else (k_cache, v_cache)
    )
    on_gpu = query.device.type == "cuda"
    scale_log2 = float(scale) * math.log2(math.e)
    d_p2 = max(16, triton.next_power_of_2(d))
    cache_args = (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0))
    if max_seqlen_q == 1 and num_tokens == num_seqs:  # pure decode: token i is sequence i
        variant = _decode[0]
        tile = tile_n or variant.tile_n
        splits = num_splits or choose_num_splits(
            num_seqs, kvh, block_tables.shape[1] * bs, query.device, tile, head_dim=d
        )
        per_split = triton.cdiv(triton.cdiv(block_tables.shape[1] * bs, splits), tile) * tile
        splits = max(1, triton.cdiv(block_tables.shape[1] * bs, per_split))
        split = splits > 1 or sinks is not None  # sinks are added by the merge
        if split:
            part_out = torch.empty(num_seqs, H, splits, d, device=query.device, dtype=torch.float32)
            part_lse = torch.empty(num_seqs, H, splits, device=query.device, dtype=torch.float32)
            assert part_lse.stride()[:2] == (H * splits, splits) and part_out.stride(2) == d
            pstrides = (part_out.stride(0), part_out.stride(1), part_out.stride(2))
        else:
            part_out = part_lse = out
            pstrides = (0, 0, 1)
        _decode_kernel[(num_seqs, kvh, splits)](
            query,
            k_cache,
            v_cache,
            *scales,
            block_tables,
            seq_lens,
            out,
            part_out,
            part_lse,
            scale_log2,
            query.stride(0),
            query.stride(1),
            *cache_args,
            out.stride(0),
            out.stride(1),
            *pstrides,
            per_split,
            bs,
            GROUP=group,
            G_P2=max(16, triton.next_power_of_2(group)),
            HEAD_DIM=d,
            D_P2=d_p2,
            TILE_N=tile,
            SPLIT=split,
            CDT=cdt,
            PREC=prec,
            QUANT=quant,
            window=window,
            num_warps=variant.num_warps,
        )
        if split:
            _merge_kernel[(num_seqs, H)](
                part_out,
                part_lse,
                out,
                *pstrides,
                out.stride(0),
                out.stride(1),
                splits,
                S_P2=triton.next_power_of_2(splits),
                HEAD_DIM=d,
                D_P2=d_p2,
                sinks_ptr=sinks,
                HAS_SINKS=sinks is not None,
                num_warps=4,
            )
        return out
    g_p2 = triton.next_power_of_2(group)
    block_m, prefill_tile = prefill_tiles(query.dtype if quant else k_cache.dtype, on_gpu, g_p2)
    block_q = block_m // g_p2
    _prefill_kernel[(triton.cdiv(max_seqlen_q, block_q), num_seqs, kvh)](
        query,
        k_cache,
        v_cache,
        *scales,
        block_tables,
        seq_lens,
        cu_seqlens_q,
        out,
        scale_log2,
        query.stride(0),
        query.stride(1),
        *cache_args,
        out.stride(0),
        out.stride(1),
        bs,
        GROUP=group,
        G_P2=g_p2,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        HEAD_DIM=d,
        D_P2=d_p2,
        TILE_N=tile_n or prefill_tile,
        CDT=cdt,
        PREC=prec,
        QUANT=quant,
        HAS_WINDOW=window > 0,
        window=window,
        sinks_ptr=sinks,
        HAS_SINKS=sinks is not None,
        num_warps=8 if on_gpu and d > 64 else 4,
    )
    return out
