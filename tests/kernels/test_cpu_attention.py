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
