"""Torch implementations of the KV-cache kernels.

Two roles: the engine's CPU hot path (fp32, 2 cores, decode batches of 1..64 sequences with up to
~2k tokens of context) and the oracle the Triton kernels are tested against. Only torch ops, no
Python loop over blocks, and no loop over sequences in decode.

Layouts: see docs/DESIGN.md. k_cache/v_cache are [num_blocks, block_size, kvh, d] views of one pool
slab, so the first two dims flatten into a [num_slots, kvh, d] view (a slot = block*bs + offset).
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from . import kv_quant

# Decode gathers K and V of a group of sequences into contiguous [n, T, kvh, d] tensors. Gathering
# the whole batch at once is ~4x slower than needed at B=64 x 2k tokens on the CPU box (200 MB of
# intermediates per layer thrash the caches), so sequences are processed in chunks whose gathered
# K+V stay under this many bytes. For short contexts the whole batch is one chunk.
DECODE_CHUNK_BYTES = 4 << 20
# On CPU, decode goes to the compiled in-place kernel (kernels/cpu_attention.py) when it builds;
# the gather + SDPA below stays as its fallback. Tests flip this to compare the two paths.
USE_CPU_KERNEL = True


class _StepMemo:
    """Every layer of a step calls the kernels with the same metadata tensors, so index work
    derived only from them (decode slot plans, the store's skip mask) is computed for the first
    layer and reused by the other layers. Keyed on tensor identity plus torch's in-place version
    counter; holding the keys keeps their ids from being reused while cached."""

    def __init__(self):
        self.keys: tuple = ()
        self.extra: tuple = ()
        self.value = None

    def get(self, keys: tuple, compute, extra: tuple = ()):
        """keys: tensors, compared by identity and version (in-place edits invalidate; inference
        tensors have no version counter, so for them identity alone decides);
        extra: plain values, compared by equality."""
        extra = tuple(extra) + tuple(-1 if t.is_inference() else t._version for t in keys)
        if (
            extra != self.extra
            or len(keys) != len(self.keys)
            or any(a is not b for a, b in zip(keys, self.keys))
        ):
            self.keys, self.extra, self.value = keys, extra, compute()
        return self.value


class _ThreadMemos(threading.local):
    """One memo pair per thread: two engines stepping in two threads must not share plans."""

    def __init__(self):
        self.store, self.decode = _StepMemo(), _StepMemo()
        self.windowed: dict = {}  # window -> memo (a model's layers alternate windows in one step)


_memos = _ThreadMemos()


def _slots_view(cache: torch.Tensor) -> torch.Tensor:
    nb, bs, kvh, d = cache.shape
    return cache.view(nb * bs, kvh, d)  # raises instead of silently copying if not viewable


def store_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Scatter new tokens' K/V into their slots with one index_copy_ each; slot -1 = skip."""

    def plan():
        slots = slot_mapping.to(device=key.device, dtype=torch.long)
        keep = slots >= 0
        return (slots, None) if bool(keep.all()) else (slots[keep], keep)

    slots, keep = _memos.store.get((slot_mapping,), plan, (key.device,))
    if keep is not None:
        key, value = key[keep], value[keep]
    if slots.numel() == 0:
        return
    if kv_quant.is_quantized(k_cache):  # whole rows: codes and their scale in one write
        # (as raw bytes: torch's CPU index ops do not take fp8)
        k_rows = kv_quant.quantize_rows(key, k_cache.dtype).view(torch.uint8)
        v_rows = kv_quant.quantize_rows(value, v_cache.dtype).view(torch.uint8)
        _slots_view(k_cache).view(torch.uint8).index_copy_(0, slots, k_rows)
        _slots_view(v_cache).view(torch.uint8).index_copy_(0, slots, v_rows)
        return
    _slots_view(k_cache).index_copy_(0, slots, key.to(k_cache.dtype))
    _slots_view(v_cache).index_copy_(0, slots, value.to(v_cache.dtype))


def copy_blocks(kv_pool: torch.Tensor, src_dst: torch.Tensor) -> None:
    """Copy block src -> dst in every layer, K and V: one gather + one scatter on the block dim.

    kv_pool[:, :, idx] addresses the (2 x num_layers) slabs of each block together. The right-hand
    side is gathered before anything is written, so chains (a->b, b->c) read old contents.
    """
    if src_dst.numel() == 0:
        return
    idx = src_dst.to(device=kv_pool.device, dtype=torch.long)
    kv_pool[:, :, idx[:, 1]] = kv_pool[:, :, idx[:, 0]]


def _gatherable(cache: torch.Tensor) -> torch.Tensor:
    """fp8 pools are gathered as bytes (torch's CPU index_select has no fp8 kernel)."""
    return cache.view(torch.uint8) if cache.dtype == torch.float8_e4m3fn else cache


def _kv_as(cache: torch.Tensor, query: torch.Tensor) -> torch.dtype | None:
    """The dtype gathered K/V must be turned into before SDPA, or None when the pool already has
    the query's dtype (or a float dtype the query is cast to, as before: bf16 pool, bf16 model)."""
    if kv_quant.is_quantized(cache):
        return query.dtype if query.dtype != torch.bfloat16 else torch.float32
    if cache.dtype != query.dtype and cache.element_size() < query.element_size():
        return query.dtype  # e.g. a bf16 pool under an fp32 model: attend in fp32
    return None


def _decode(query, k_cache, v_cache, block_tables, seq_lens, scale, out, window=None):
    """All sequences have one query token: gather per chunk of sequences, one masked SDPA.
    `window` W (sliding-window attention): the query at position len-1 sees positions
    len-W .. len-1 only; the gather starts at len-W, so blocks wholly before it are never read.

    The gather is by slot, not by block: slots past a sequence's length are redirected to its
    slot 0 (always written), so stale or NaN contents of unused/partial blocks are never read --
    a masked position has probability 0 but 0 * NaN would still poison the output.
    GQA without repeating K/V: queries become [n, kvh, group, d] and the group plays the role of
    the query-length dimension of SDPA, attending to the [n, kvh, T, d] keys of its KV head.
    """
    from . import cpu_attention

    if USE_CPU_KERNEL and cpu_attention.supports(query, k_cache):
        return cpu_attention.paged_decode(
            query, k_cache, v_cache, block_tables, seq_lens, scale, out, window=window
        )
    B, H, d = query.shape
    _, bs, kvh, row = k_cache.shape
    group = H // kvh
    kv_slots = (_gatherable(_slots_view(k_cache)), _gatherable(_slots_view(v_cache)))
    per_token = 2 * kvh * row * k_cache.element_size()
    lowp = _kv_as(k_cache, query)  # quantized / other-dtype pool: dequantize what is gathered
    memo = _memos.decode if not window else _memos.windowed.setdefault(window, _StepMemo())
    plan = memo.get(
        (block_tables, seq_lens),
        lambda: _decode_plan(block_tables, seq_lens, bs, per_token, query.device, window),
        (bs, per_token, query.device, window),
    )
    for start, end, tmax, valid, slots in plan:
        n = end - start
        k = kv_slots[0].index_select(0, slots).view(n, tmax, kvh, row).view(k_cache.dtype)
        v = kv_slots[1].index_select(0, slots).view(n, tmax, kvh, row).view(k_cache.dtype)
        if lowp is not None:
            k, v = kv_quant.dequantize(k, lowp), kv_quant.dequantize(v, lowp)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        q = query[start:end].reshape(n, kvh, group, d).to(k.dtype)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :], scale=scale)
        out[start:end] = o.reshape(n, H, d).to(out.dtype)
    return out


def _decode_plan(block_tables, seq_lens, bs, per_token, dev, window=None):
    """[(start, end, tmax, valid [n, T], slots [n*T])] per chunk of sequences. Row i gathers
    positions lo_i + 0 .. lo_i + T-1, lo_i = max(0, len_i - window) (0 without a window)."""
    lens = seq_lens.tolist()
    los = [max(0, n - window) for n in lens] if window else [0] * len(lens)
    spans = [n - lo for n, lo in zip(lens, los)]
    bt = block_tables.to(device=dev, dtype=torch.long)
    sl = seq_lens.to(device=dev, dtype=torch.long)
    lo_t = torch.tensor(los, dtype=torch.long, device=dev)
    chunk = max(1, DECODE_CHUNK_BYTES // (max(1, max(spans)) * per_token))
    plan = []
    for start in range(0, len(lens), chunk):
        end = min(len(lens), start + chunk)
        tmax = max(spans[start:end])
        pos = lo_t[start:end, None] + torch.arange(tmax, device=dev)[None, :]  # [n, T]
        valid = pos < sl[start:end, None]
        pos = torch.where(valid, pos, lo_t[start:end, None])  # past the end: the row's first slot
        slots = torch.gather(bt[start:end], 1, pos // bs) * bs + pos % bs
        plan.append((start, end, tmax, valid, slots.flatten()))
    return plan


def _prefill_one(q, k_cache, v_cache, blocks, ctx, scale, window=None):
    """One sequence's chunk of q_len queries at positions ctx-q_len .. ctx-1 (causal, GQA).
    `window` W: the query at position p sees p-W+1 .. p, and the blocks before the first query's
    window are not gathered (a sliding-window layer never reads them: they may be freed or reused)."""
    _, bs, kvh, row = k_cache.shape
    q_len, H, _ = q.shape
    first = max(0, ctx - q_len - window + 1) // bs if window else 0  # first block any query sees
    nblk = (ctx + bs - 1) // bs - first
    k0 = first * bs
    idx = blocks[first : first + nblk]
    k = (
        _gatherable(k_cache)
        .index_select(0, idx)
        .view(nblk * bs, kvh, row)[: ctx - k0]
        .view(k_cache.dtype)
    )
    v = (
        _gatherable(v_cache)
        .index_select(0, idx)
        .view(nblk * bs, kvh, row)[: ctx - k0]
        .view(v_cache.dtype)
    )
    lowp = _kv_as(k_cache, q)
    if lowp is not None:  # quantized / other-dtype pool: only this sequence's blocks, dequantized
        k, v = kv_quant.dequantize(k, lowp), kv_quant.dequantize(v, lowp)
    k, v = k.transpose(0, 1), v.transpose(0, 1)
    qh = q.transpose(0, 1).to(k.dtype).unsqueeze(0)
    if (
        q_len == ctx and not window
    ):  # no cached prefix: plain causal (SDPA's is_causal is top-left aligned)
        o = F.scaled_dot_product_attention(
            qh, k[None], v[None], is_causal=True, scale=scale, enable_gqa=H != kvh
        )
    else:  # causal mask shifted right by the prefix length (and the window's left edge)
        o = F.scaled_dot_product_attention(
            qh,
            k[None],
            v[None],
            attn_mask=_mask(ctx, q_len, k0, window, q.device),
            scale=scale,
            enable_gqa=H != kvh,
        )
    return o[0].transpose(0, 1)


def _mask(ctx, q_len, k0, window, device):
    """[q_len, ctx - k0]: the query at position p (ctx-q_len .. ctx-1) sees key position k
    (k0 .. ctx-1) when k <= p and, with a window W, k > p - W."""
    qpos = torch.arange(ctx - q_len, ctx, device=device)[:, None]
    kpos = torch.arange(k0, ctx, device=device)[None, :]
    mask = kpos <= qpos
    return mask & (kpos > qpos - window) if window else mask


# A batch whose chunks are all this short (decode rows + speculative verification rows of k + 1
# tokens) runs as a decode of one query row per token: query j of a chunk is a decode query whose
# context ends at its own position, over its sequence's block table. One kernel call for the batch
# instead of a Python loop of masked SDPAs per chunk, and each row attends exactly as a plain decode
# step would at that position.
MULTI_DECODE_MAX_Q = 16


def _multi_decode(query, k_cache, v_cache, block_tables, lens, q_lens, scale, out, window=None):
    rows = torch.tensor(q_lens, device=block_tables.device)
    tables = block_tables.repeat_interleave(rows, dim=0)
    ends = [ctx - n + 1 + j for ctx, n in zip(lens, q_lens) for j in range(n)]
    return _decode(
        query,
        k_cache,
        v_cache,
        tables,
        torch.tensor(ends, dtype=torch.int32, device=block_tables.device),
        scale,
        out,
        window,
    )


def _attend_with_sinks(query, k_cache, v_cache, block_tables, lens, cu, scale, window, sinks, out):
    """Attention whose softmax denominator also holds a learned per-head logit (gpt-oss's "sinks":
    softmax over [scores, sink], the sink's column dropped), as transformers' eager attention
    computes it. One sequence at a time over its own blocks (the window's only): the reference
    path for the few models that have sinks; the fast kernels do not take them."""
    _, bs, kvh, row = k_cache.shape
    H = query.shape[1]
    blocks = block_tables.to(device=query.device, dtype=torch.long)
    for i, ctx in enumerate(lens):
        q = query[cu[i] : cu[i + 1]]
        n = q.shape[0]
        if n == 0:
            continue
        first = max(0, ctx - n - window + 1) // bs if window else 0
        nblk = (ctx + bs - 1) // bs - first
        k0 = first * bs
        idx = blocks[i, first : first + nblk]
        k = (
            _gatherable(k_cache)
            .index_select(0, idx)
            .view(nblk * bs, kvh, row)[: ctx - k0]
            .view(k_cache.dtype)
        )
        v = (
            _gatherable(v_cache)
            .index_select(0, idx)
            .view(nblk * bs, kvh, row)[: ctx - k0]
            .view(v_cache.dtype)
        )
        lowp = _kv_as(k_cache, q)
        if lowp is not None:
            k, v = kv_quant.dequantize(k, lowp), kv_quant.dequantize(v, lowp)
        k = k.to(q.dtype).transpose(0, 1).repeat_interleave(H // kvh, dim=0)  # [H, L, d]
        v = v.to(q.dtype).transpose(0, 1).repeat_interleave(H // kvh, dim=0)
        scores = (q.transpose(0, 1) @ k.transpose(1, 2)) * scale  # [H, n, L]
        scores = scores.masked_fill(~_mask(ctx, n, k0, window, q.device), float("-inf"))
        both = torch.cat((scores, sinks.to(scores.dtype)[:, None, None].expand(H, n, 1)), dim=-1)
        both = both - both.max(dim=-1, keepdim=True).values
        probs = F.softmax(both, dim=-1, dtype=both.dtype)[..., :-1]
        out[cu[i] : cu[i + 1]] = (probs @ v).transpose(0, 1).to(out.dtype)
    return out


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
    window=None,
    sinks=None,
):
    """out[num_tokens, H, d]. Decode batches take the batched path; otherwise the q_len==1
    sequences of a mixed batch still go through it and the rest loop per sequence.
    `window` W (None or 0: full causal attention): the query at position p sees p-W+1 .. p only.
    `sinks` (fp32 [H], gpt-oss): a per-head logit in every softmax's denominator."""
    window = window or None
    num_tokens, H, d = query.shape
    if out is None:
        out = torch.empty_like(query)
    if num_tokens == 0:
        return out
    if sinks is not None:
        return _attend_with_sinks(
            query,
            k_cache,
            v_cache,
            block_tables,
            seq_lens.tolist(),
            cu_seqlens_q.tolist(),
            scale,
            window,
            sinks,
            out,
        )
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    if max_seqlen_q == 1 and num_tokens == seq_lens.shape[0]:
        return _decode(query, k_cache, v_cache, block_tables, seq_lens, scale, out, window)
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    q_lens = [cu[i + 1] - cu[i] for i in range(len(lens))]
    if max_seqlen_q <= MULTI_DECODE_MAX_Q and all(n > 0 for n in q_lens):
        return _multi_decode(
            query, k_cache, v_cache, block_tables, lens, q_lens, scale, out, window
        )
    dec = [i for i, n in enumerate(q_lens) if n == 1]
    if len(dec) > 1:
        rows = torch.tensor([cu[i] for i in dec], device=query.device)
        sel = torch.tensor(dec, device=block_tables.device)
        o = torch.empty(len(dec), H, d, dtype=out.dtype, device=out.device)
        _decode(
            query[rows],
            k_cache,
            v_cache,
            block_tables[sel],
            seq_lens[sel.to(seq_lens.device)],
            scale,
            o,
            window,
        )
        out[rows] = o
        dec = set(dec)
    else:
        dec = set()
    blocks = block_tables.to(device=query.device, dtype=torch.long)
    for i, ctx in enumerate(lens):
        if i in dec or q_lens[i] == 0:
            continue
        o = _prefill_one(query[cu[i] : cu[i + 1]], k_cache, v_cache, blocks[i], ctx, scale, window)
        out[cu[i] : cu[i + 1]] = o.to(out.dtype)
    return out
