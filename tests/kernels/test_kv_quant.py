"""The quantized KV pool (kernels/kv_quant.py): store, decode (C++ and torch), prefill, copy.

Oracle: fp64 dense attention on the *dequantized* pool (what the kernels should compute exactly,
up to fp32 accumulation). Cases come from test_attention.build_case: permuted block ids, a prefix
shared between two sequences, partial last blocks; unused blocks and slots are NaN and stay NaN
through quantization (their scale is NaN), so reading one poisons the output.
"""

import pytest
import torch

import kernels
from kernels import cpu_attention, kv_quant, reference
from tests.kernels.helpers import (
    DEVICE,
    build_case,
    decode_seqs,
    dense_attention_fp64,
    extend_seqs,
    kernel_args,
)

QDTYPES = [torch.int8, torch.float8_e4m3fn]
SEQS = {
    "decode": (decode_seqs(16), 0),
    "extend": (extend_seqs(16), 0),
    "shared": ([(40, 1), (40, 9), (17, 1), (100, 20)], 2),
}


def quantize_case(c, dtype):
    """The case's fp32 pool quantized row by row, and the fp32 pool it dequantizes to."""
    q = kv_quant.quantize_rows(c["pool"].cpu(), dtype)
    if dtype == torch.int8:  # NaN -> int8 is undefined: make sure unused rows keep a NaN scale
        nan_rows = c["pool"].cpu().isnan().any(-1)
        kv_quant.split(q)[1][nan_rows] = float("nan")
    return dict(c, pool=q.to(c["pool"].device)), kv_quant.dequantize(q).to(c["pool"].device)


def nan_pool(shape, dtype, device="cpu"):
    """A quantized pool whose every row reads back as NaN (random codes, NaN scale)."""
    pool = (
        torch.randint(-100, 100, shape, dtype=torch.int8).view(dtype)
        if dtype == torch.int8
        else torch.full(shape, float("nan")).to(dtype)
    )
    kv_quant.split(pool)[1].fill_(float("nan"))
    return pool.to(device)


def oracle_on(c, deq):
    return dense_attention_fp64(
        c["query"],
        deq[0, 1],
        deq[1, 1],
        c["block_tables"],
        c["seq_lens"],
        c["cu_seqlens_q"],
        c["scale"],
    )


def run_torch(c):
    pool = c["pool"]
    out = torch.full_like(c["query"], float("nan"))
    reference.paged_attention(
        c["query"],
        pool[0, 1],
        pool[1, 1],
        c["block_tables"],
        c["seq_lens"],
        c["cu_seqlens_q"],
        c["scale"],
        c["max_seqlen_q"],
        out=out,
    )
    return out


def test_row_layout_and_round_trip_error():
    x = torch.randn(7, 3, 64, dtype=torch.float64).float() * torch.logspace(-3, 2, 7)[:, None, None]
    rows = kv_quant.quantize_rows(x, torch.int8)
    assert rows.shape == (7, 3, 68) and rows.dtype == torch.int8
    codes, scales = kv_quant.split(rows)
    torch.testing.assert_close(scales, x.abs().amax(-1) / 127)
    assert codes.abs().max() == 127  # the largest element maps to +-127
    err = (kv_quant.dequantize(rows) - x).abs()
    assert (err <= scales[..., None] * 0.5 * (1 + 1e-5)).all()  # round to nearest code
    zero = kv_quant.quantize_rows(torch.zeros(2, 1, 8), torch.int8)
    assert (kv_quant.dequantize(zero) == 0).all()  # amax 0: no NaN from 0/0
    assert kv_quant.bytes_per_token(30, 3, 64, torch.int8) == 12_240  # the default model
    assert kv_quant.bytes_per_token(30, 3, 64, torch.bfloat16) == 23_040


@pytest.mark.parametrize("dtype", QDTYPES)
def test_store_kv_writes_codes_and_scale_per_row(dtype):
    pool = nan_pool((2, 1, 6, 16, 3, 68), dtype)
    kc, vc = pool[0, 0], pool[1, 0]
    k, v = torch.randn(5, 3, 64), torch.randn(5, 3, 64) * 10
    slots = torch.tensor([17, -1, 3, 95, 40])
    reference.store_kv(k, v, kc, vc, slots)
    keep = slots >= 0
    for cache, x in ((kc, k), (vc, v)):
        rows = cache.view(-1, 3, 68)[slots[keep]]
        assert torch.equal(
            rows.view(torch.uint8), kv_quant.quantize_rows(x[keep], dtype).view(torch.uint8)
        )
    untouched = torch.ones(96, dtype=torch.bool)
    untouched[slots[keep]] = False
    assert kv_quant.dequantize(kc.reshape(96, 3, 68)[untouched]).isnan().all()


@pytest.mark.parametrize("case", range(4))
def test_cpu_int8_decode_kernel_matches_fp64_dense_on_dequantized_pool(case):
    bs, H, kvh, d, ctxs, share = [
        (16, 9, 3, 64, [1, 15, 16, 17, 200, 513], 0),
        (16, 9, 3, 64, [64, 70, 33], 3),
        (8, 8, 8, 128, [5, 8, 9, 100], 0),
        (16, 9, 3, 64, [300], 0),
    ][case]
    c, deq = quantize_case(
        build_case(
            bs,
            H,
            kvh,
            d,
            [(x - 1, 1) for x in ctxs],
            torch.float32,
            share_blocks=share,
            seed=case,
            device="cpu",
        ),
        torch.int8,
    )
    kc, vc = c["pool"][0, 1], c["pool"][1, 1]
    assert cpu_attention.supports(c["query"], kc), cpu_attention.active_path()
    out = torch.full(c["query"].shape, float("nan"))
    cpu_attention.paged_decode(
        c["query"], kc, vc, c["block_tables"], c["seq_lens"], c["scale"], out
    )
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), oracle_on(c, deq), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("use_kernel", [True, False])
@pytest.mark.parametrize("dtype", QDTYPES)
@pytest.mark.parametrize("seqs", ["decode", "extend", "shared"])
def test_torch_paged_attention_on_quantized_pool(seqs, dtype, use_kernel, monkeypatch):
    """Decode batches, mixed batches of prefill / chunked prefill after a cached prefix, and a
    prefix hit (sequence 1 attends over sequence 0's first two blocks)."""
    monkeypatch.setattr(reference, "USE_CPU_KERNEL", use_kernel)
    shape = SEQS[seqs]
    fp = build_case(16, 9, 3, 64, shape[0], torch.float32, share_blocks=shape[1], seed=5)
    c, deq = quantize_case(fp, dtype)
    out = run_torch(c)  # on the GPU when there is one: the `--attention-backend torch` path
    assert not out.isnan().any()
    torch.testing.assert_close(out.double().cpu(), oracle_on(c, deq), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", QDTYPES)
def test_copy_on_write_of_a_quantized_partial_block_copies_scales(dtype):
    """A block holding 5 of 16 tokens is copied, then each copy is written on its own: the copy
    reads back the original 5 rows exactly (codes and scales), neither sees the other's writes."""
    pool = nan_pool((2, 3, 4, 16, 3, 68), dtype)
    x = torch.randn(2, 3, 5, 3, 64) * 3
    for kv in range(2):
        for layer in range(3):
            reference.store_kv(
                x[kv, layer], x[kv, layer], pool[kv, layer], pool[kv, layer], torch.arange(16, 21)
            )
    before = pool[:, :, 1].clone()
    kernels.copy_blocks(pool, torch.tensor([[1, 3]]), backend="torch")
    assert torch.equal(pool[:, :, 3].view(torch.uint8), before.view(torch.uint8))
    new = torch.randn(1, 3, 64) * 100  # a much larger scale than the shared rows had
    reference.store_kv(new, new, pool[0, 2], pool[1, 2], torch.tensor([3 * 16 + 5]))
    assert torch.equal(pool[:, :, 1].view(torch.uint8), before.view(torch.uint8))
    deq = kv_quant.dequantize(pool[0, 2, 3])
    torch.testing.assert_close(deq[:5], kv_quant.dequantize(before[0, 2, :5]))
    assert (deq[5] - new[0]).abs().max() <= new.abs().max() / kv_quant.QMAX[dtype] * (
        16 if dtype != torch.int8 else 0.51
    )


# ---- Triton (the interpreter on CPU): the same oracle, the same poisoned pools ----------------
def run_triton(c, **kw):
    from kernels import triton_attention

    pool = c["pool"]
    out = torch.full_like(c["query"], float("nan"))
    triton_attention.paged_attention(
        c["query"],
        pool[0, 1],
        pool[1, 1],
        c["block_tables"],
        c["seq_lens"],
        c["cu_seqlens_q"],
        c["scale"],
        c["max_seqlen_q"],
        out=out,
        **kw,
    )
    return out


@pytest.mark.parametrize("dtype", QDTYPES)
@pytest.mark.parametrize(
    "seqs,splits", [("decode", 1), ("decode", 3), ("extend", None), ("shared", None)]
)
def test_triton_attention_on_quantized_pool(seqs, splits, dtype):
    """Decode with and without split-K, prefill / chunked prefill after a prefix, a prefix hit."""
    shape = SEQS[seqs]
    c, deq = quantize_case(
        build_case(16, 9, 3, 64, shape[0], torch.float32, share_blocks=shape[1], seed=7), dtype
    )
    out = run_triton(c, **({"num_splits": splits} if splits else {}))
    assert not out.isnan().any(), "NaN in output: a wrong block/slot was read or a row skipped"
    torch.testing.assert_close(out.double().cpu(), oracle_on(c, deq).cpu(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", QDTYPES)
def test_triton_store_matches_the_torch_store(dtype):
    shape = (2, 1, 6, 16, 3, 68)
    pools = [nan_pool(shape, dtype, DEVICE) for _ in range(2)]
    pools[1].view(torch.uint8).copy_(pools[0].view(torch.uint8))
    k, v = torch.randn(6, 3, 64), torch.randn(6, 3, 64) * 30
    k[2] = 0  # amax 0: scale 0, codes 0, no NaN
    slots = torch.tensor([17, -1, 3, 95, 40, 0])
    k, v, slots = k.to(DEVICE), v.to(DEVICE), slots.to(DEVICE)
    reference.store_kv(k, v, pools[0][0, 0], pools[0][1, 0], slots)
    kernels.store_kv(k, v, pools[1][0, 0], pools[1][1, 0], slots, backend="triton")
    slots = slots.cpu()
    rows = [p.cpu().view(2, 96, 3, 68) for p in pools]  # [K / V, slot, head, row]
    a, b = (kv_quant.dequantize(r) for r in rows)
    keep = slots[slots >= 0]
    torch.testing.assert_close(
        kv_quant.split(rows[1])[1][:, keep], kv_quant.split(rows[0])[1][:, keep], rtol=1e-6, atol=0
    )
    step = kv_quant.split(rows[0])[1][:, keep][..., None]
    # both round to nearest even in fp32 first (kernels/triton_store.py): identical codes
    tol = step * 1e-3  # same codes (a tie may differ by a step)
    assert ((a[:, keep] - b[:, keep]).abs() <= tol).all()
    untouched = torch.ones(96, dtype=torch.bool)
    untouched[keep] = False
    assert b[:, untouched].isnan().all()  # skipped slot -1 and other rows untouched


@pytest.mark.parametrize("dtype", QDTYPES)
def test_triton_copy_blocks_copies_codes_and_scales(dtype):
    pool = nan_pool((2, 3, 5, 16, 3, 68), dtype, DEVICE)
    x = torch.randn(2, 3, 7, 3, 64, device=DEVICE)
    for kv in range(2):
        for layer in range(3):
            reference.store_kv(
                x[kv, layer],
                x[kv, layer],
                pool[kv, layer],
                pool[kv, layer],
                torch.arange(32, 39, device=DEVICE),
            )
    before = pool.cpu()
    kernels.copy_blocks(pool, torch.tensor([[2, 4], [0, 1]], device=DEVICE), backend="triton")
    pool = pool.cpu()
    assert torch.equal(pool[:, :, 4].view(torch.uint8), before[:, :, 2].view(torch.uint8))
    assert torch.equal(pool[:, :, 1].view(torch.uint8), before[:, :, 0].view(torch.uint8))
    assert torch.equal(
        pool[:, :, [0, 2, 3]].view(torch.uint8), before[:, :, [0, 2, 3]].view(torch.uint8)
    )


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
def test_sliding_window_on_an_int8_pool(backend, monkeypatch):
    """A window over int8 rows (Gemma 3's local layers with --kv-cache-dtype int8): the C++ decode
    kernel, the torch gather path and Triton, decode and prefill after a prefix longer than the
    window; blocks wholly before every query's window hold NaN scales and must not be read."""
    from tests.kernels.helpers import release_outside_window

    monkeypatch.setattr(reference, "USE_CPU_KERNEL", backend == "cpp")
    for seqs in ([(c - 1, 1) for c in (3, 24, 25, 90, 161)], [(0, 40), (50, 9), (70, 1), (33, 20)]):
        fp = build_case(16, 9, 3, 64, seqs, torch.float32, seed=8)
        assert release_outside_window(fp, 24) > 0
        c, deq = quantize_case(fp, torch.int8)
        out = torch.full_like(c["query"], float("nan"))
        args = kernel_args(c)
        if backend == "triton":
            from kernels import triton_attention

            triton_attention.paged_attention(*args, out=out, window=24)
        else:
            reference.paged_attention(*args, out=out, window=24)
        want = dense_attention_fp64(
            c["query"],
            deq[0, 1],
            deq[1, 1],
            c["block_tables"],
            c["seq_lens"],
            c["cu_seqlens_q"],
            c["scale"],
            window=24,
        )
        assert not out.isnan().any()
        torch.testing.assert_close(out.double().cpu(), want.cpu(), atol=1e-4, rtol=1e-4)
