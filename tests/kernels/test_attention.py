"""paged_attention (torch reference and Triton) against an fp64 dense oracle.

Every case builds a pool whose unused blocks and unwritten slots are NaN (block 0, the padding
entry of block tables, is never allocated), gives sequences permuted block ids, and prefills the
output buffer with NaN: a kernel that reads a wrong block or slot, or skips an output row, fails.
Tolerances (max abs error vs the fp64 oracle on the same stored values):
fp32: 1e-4 (+1e-4 relative); fp16: 3e-3 (+3e-3 relative; fp16 output rounding is ~1e-3).
The Triton set is a covering set, not a cartesian product: each case batches many
(context, prefix, chunk) combinations into one launch to keep the interpreter run short.
"""

import os
import subprocess
import sys

import pytest
import torch

import kernels
from kernels import reference
from tests.kernels.helpers import (
    kernel_args,
    DEVICE,
    build_case,
    check,
    decode_seqs,
    dense_attention_fp64,
    extend_seqs,
    oracle,
    release_outside_window,
    run_backend,
)


# (block_size, head_dim, q_heads, kv_heads, dtype, num_splits, tile_n)
DECODE = [
    (16, 64, 9, 3, torch.float32, None, None),
    (32, 128, 8, 2, torch.float32, 3, None),
    (16, 128, 4, 4, torch.float16, 2, None),
    (32, 64, 16, 1, torch.float32, 4, 16),  # tile smaller than a block
    (16, 64, 8, 2, torch.float16, None, 128),
    (32, 128, 9, 3, torch.float32, None, None),
]
# (block_size, head_dim, q_heads, kv_heads, dtype, tile_n)
EXTEND = [
    (16, 64, 9, 3, torch.float32, None),
    (32, 128, 8, 2, torch.float32, None),
    (16, 128, 4, 4, torch.float32, 32),
    (32, 64, 16, 1, torch.float16, None),
    (16, 64, 9, 3, torch.float16, 128),
    (32, 128, 16, 1, torch.float32, 16),  # tile smaller than a block
    (16, 64, 8, 2, torch.float16, None),
]


def _id(p):
    return "-".join(str(x).replace("torch.", "") for x in p)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case", DECODE, ids=_id)
def test_decode(case, backend):
    bs, d, H, kvh, dtype, splits, tile = case
    c = build_case(bs, H, kvh, d, decode_seqs(bs), dtype)
    check(c, run_backend(c, backend, num_splits=splits, tile_n=tile))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case", EXTEND, ids=_id)
def test_extend(case, backend):
    bs, d, H, kvh, dtype, tile = case
    c = build_case(bs, H, kvh, d, extend_seqs(bs), dtype, seed=1)
    check(c, run_backend(c, backend, tile_n=tile))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize(
    "case", [(16, 64, 9, 3, torch.float32), (32, 128, 8, 2, torch.float16)], ids=_id
)
def test_speculative_verification_rows(case, backend):
    """Speculative decoding's step: decode rows mixed with k + 1-token rows over long paged
    contexts, chunks starting anywhere in a block (the torch backend runs them as one multi-row
    decode, reference.MULTI_DECODE_MAX_Q)."""
    bs, d, H, kvh, dtype = case
    seqs = [(bs * 3 + 5, 1), (bs * 2 - 1, 6), (40, 2), (bs * 4, 16), (7, 1), (bs * 5 + 2, 9)]
    c = build_case(bs, H, kvh, d, seqs, dtype, seed=3)
    check(c, run_backend(c, backend))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("decode", [True, False])
def test_shared_prefix_blocks(decode, backend):
    """Two sequences whose block tables start with the same 3 physical blocks."""
    bs = 16
    seqs = [(199, 1), (3 * bs + 20, 1)] if decode else [(160, 40), (3 * bs + 10, 10)]
    c = build_case(bs, 9, 3, 64, seqs, torch.float32, share_blocks=3, seed=2)
    assert (c["block_tables"][0, :3] == c["block_tables"][1, :3]).all()
    check(c, run_backend(c, backend, num_splits=2 if decode else None))


# (block_size, head_dim, q_heads, kv_heads, dtype, window, tile_n): windows shorter than a block,
# not a multiple of one, and a multiple; tiles smaller and larger than a block (Triton: the first
# two; the interpreter is the slow side, and the third adds no Triton path the others miss)
WINDOW = [
    (16, 64, 9, 3, torch.float32, 37, None),
    (16, 64, 8, 2, torch.float16, 5, 32),
    (32, 128, 4, 1, torch.float32, 64, 16),
]


@pytest.mark.parametrize(
    "case,backend",
    [(c, b) for c in WINDOW for b in ("torch", "triton") if b == "torch" or c is not WINDOW[2]],
    ids=lambda v: v if isinstance(v, str) else _id(v),
)
def test_sliding_window(case, backend, monkeypatch):
    """Sliding-window attention (Mistral, Gemma 3's local layers): decode rows, chunks after a
    prefix longer than the window, a whole prompt longer than it, short contexts inside it, and
    speculative-length rows, in one batch, then a pure-decode batch (split-K on Triton). Blocks
    wholly outside every query's window are NaN: a kernel that reads one fails."""
    bs, d, H, kvh, dtype, window, tile = case
    mixed = [
        (0, 1),
        (3, 1),
        (window + 30, 1),
        (bs * 6 + 3, 1),
        (0, 90),
        (bs * 4 + 2, 40),
        (window - 2, 3),
        (bs * 5, 9),
        (7, 20),
        (window + 15, 4),
    ]  # the last: window and prefix in one tile
    decode = [(c - 1, 1) for c in (1, window - 1, window, window + 1, 300, bs * 9 + 5)]
    for seqs, seed in ((mixed, 6), (decode, 7)):
        c = build_case(bs, H, kvh, d, seqs, dtype, seed=seed)
        assert release_outside_window(c, window) > 0
        ref = oracle(c, window)
        check(c, run_backend(c, backend, window=window, tile_n=tile), ref)
        if backend == "triton" and seqs is decode:
            check(c, run_backend(c, backend, window=window, num_splits=5), ref)
        if backend == "torch" and dtype == torch.float32:  # the gather path under the C++ kernel
            monkeypatch.setattr(reference, "USE_CPU_KERNEL", False)
            check(c, run_backend(c, backend, window=window), ref)
            monkeypatch.undo()


def test_reference_decode_chunked(monkeypatch):
    """Large batch with mixed lengths through the reference's chunked decode path."""
    g = torch.Generator().manual_seed(3)
    seqs = [(int(n) - 1, 1) for n in torch.randint(1, 400, (40,), generator=g)]
    c = build_case(16, 9, 3, 64, seqs, torch.float32, seed=3)
    ref = oracle(c)
    for budget in (1, 200_000, 1 << 30):  # one sequence per chunk, a few chunks, one chunk
        monkeypatch.setattr(reference, "DECODE_CHUNK_BYTES", budget)
        check(c, run_backend(c, "torch"), ref)


def test_triton_auto_split():
    """Few (seq, kv head) programs and a long context: the heuristic splits by itself."""
    from kernels import triton_attention as ta

    assert ta.choose_num_splits(1, 1, 4096, torch.device("cpu"), 64) > 1
    assert ta.choose_num_splits(64, 8, 4096, torch.device("cpu"), 64) == 1
    c = build_case(32, 4, 1, 64, [(1000, 1)], torch.float32, seed=4)
    check(c, run_backend(c, "triton", tile_n=128))


@pytest.mark.parametrize("backend", [None, "torch", "triton"])
def test_public_dispatch(backend):
    c = build_case(16, 8, 2, 64, [(20, 1), (0, 7)], torch.float32, seed=5)
    pool = c["pool"]
    out = kernels.paged_attention(
        c["query"],
        pool[0, 1],
        pool[1, 1],
        c["block_tables"],
        c["seq_lens"],
        c["cu_seqlens_q"],
        c["scale"],
        backend=backend,
    )
    check(c, out)


def test_resolve_backend(monkeypatch):
    assert kernels.resolve_backend(None, "cpu") == "torch"
    assert kernels.resolve_backend("auto", torch.device("cpu")) == "torch"
    assert kernels.resolve_backend("auto", "cuda") == "triton"
    assert kernels.resolve_backend("torch", "cuda") == "torch"
    with pytest.raises(ValueError):
        kernels.resolve_backend("cuda", "cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        kernels.resolve_backend("triton", "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernels.resolve_backend("triton", "cpu") == "triton"


def test_import_does_not_load_triton():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "import sys, kernels; assert 'triton' not in sys.modules, 'triton imported'"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env=env)


def test_sinks_in_the_triton_kernels():
    """gpt-oss's attention sinks (a learned logit per head in every softmax's denominator) in the
    Triton prefill kernel's last normalisation and in decode's merge (one split or several),
    with and without a sliding window, against the fp64 oracle; one sink far above every score
    (the output shrinks towards 0) and one far below (no effect)."""
    from kernels import triton_attention

    bs, d, H, kvh = 16, 64, 4, 2
    sinks = torch.tensor([0.5, -1.0, 30.0, -30.0])
    mixed = [(0, 1), (bs + 3, 1), (0, 40), (bs * 2 + 2, 20), (5, 9)]
    decode = [(c - 1, 1) for c in (1, bs + 1, 90)]
    for seqs, window, splits in (
        (mixed, None, None),
        (mixed, 24, None),
        (decode, None, 1),
        (decode, 24, 3),
    ):
        c = build_case(bs, H, kvh, d, seqs, torch.float32, seed=11)
        args = kernel_args(c)
        if window:
            release_outside_window(c, window)
        ref = dense_attention_fp64(*args[:7], window=window, sinks=sinks)
        out = triton_attention.paged_attention(
            *args, window=window, sinks=sinks.to(DEVICE), num_splits=splits
        )
        check(c, out, ref)
        check(
            c,
            kernels.paged_attention(*args, backend="torch", window=window, sinks=sinks.to(DEVICE)),
            ref,
        )
