"""store_kv and copy_blocks, torch reference and Triton, against plain Python indexing.

Pools start as NaN; every slot that is not written must stay NaN (bit-exact checks), keys come
from a strided slice of a fused qkv-like tensor, and slot_mapping holds -1 entries to skip.
"""

import pytest
import torch

import kernels

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ["torch", "triton"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "bs,kvh,d,dtype",
    [
        (8, 3, 64, torch.float32),
        (16, 2, 128, torch.float16),
        (32, 1, 64, torch.bfloat16),
        (16, 4, 32, torch.float32),
    ],
)
def test_store_kv(bs, kvh, d, dtype, backend):
    g = torch.Generator().manual_seed(bs + kvh)
    nb, L, n = 9, 2, 40
    pool = torch.full((2, L, nb, bs, kvh, d), float("nan"), dtype=dtype, device=DEVICE)
    # keys/values as strided views into one [n, (1 + 2) * kvh * d + 5] projection output
    qkv = torch.randn(n, 3 * kvh * d + 5, generator=g).to(dtype).to(DEVICE)
    key = qkv[:, kvh * d : 2 * kvh * d].view(n, kvh, d)
    value = qkv[:, 2 * kvh * d : 3 * kvh * d].view(n, kvh, d)
    slots = torch.randperm(nb * bs, generator=g)[:n]
    slots[::7] = -1
    kernels.store_kv(key, value, pool[0, 1], pool[1, 1], slots.to(DEVICE), backend=backend)
    expect = torch.full_like(pool, float("nan"))
    keep = slots >= 0
    s = slots[keep].to(DEVICE)
    expect[0, 1, s // bs, s % bs] = key[keep.to(DEVICE)]
    expect[1, 1, s // bs, s % bs] = value[keep.to(DEVICE)]
    assert torch.equal(pool.isnan(), expect.isnan())
    assert torch.equal(pool.nan_to_num(), expect.nan_to_num())


@pytest.mark.parametrize("backend", BACKENDS)
def test_store_kv_all_skipped_and_empty(backend):
    pool = torch.full((2, 1, 3, 8, 2, 16), float("nan"), device=DEVICE)
    key = torch.randn(4, 2, 16, device=DEVICE)
    slots = torch.full((4,), -1, dtype=torch.int64, device=DEVICE)
    kernels.store_kv(key, key, pool[0, 0], pool[1, 0], slots, backend=backend)
    kernels.store_kv(key[:0], key[:0], pool[0, 0], pool[1, 0], slots[:0], backend=backend)
    assert pool.isnan().all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_blocks(dtype, backend):
    g = torch.Generator().manual_seed(0)
    L, nb, bs, kvh, d = 3, 10, 16, 3, 64
    pool = torch.randn(2, L, nb, bs, kvh, d, generator=g).to(dtype).to(DEVICE)
    pool[:, :, 7:] = float("nan")  # destinations start as NaN
    before = pool.clone()
    pairs = torch.tensor([[2, 7], [5, 9], [2, 8]], dtype=torch.int64, device=DEVICE)
    kernels.copy_blocks(pool, pairs, backend=backend)
    expect = before.clone()
    for src, dst in pairs.tolist():
        expect[:, :, dst] = before[:, :, src]
    assert torch.equal(pool, expect)  # exact, no NaN left, other blocks untouched
    kernels.copy_blocks(pool, pairs[:0], backend=backend)  # no-op
    assert torch.equal(pool, expect)


def test_copy_blocks_reference_reads_before_writing():
    pool = torch.arange(4.0).view(1, 1, 4, 1, 1, 1).repeat(2, 2, 1, 1, 1, 1)
    kernels.copy_blocks(pool, torch.tensor([[0, 1], [1, 2]]), backend="torch")
    assert pool[0, 0, :, 0, 0, 0].tolist() == [0.0, 0.0, 1.0, 3.0]


def test_step_memo_recomputes_for_new_or_edited_metadata():
    """The per-step index memo must never serve a plan for different metadata."""
    from kernels.reference import _StepMemo

    memo, calls = _StepMemo(), []
    a = torch.tensor([1, 2, 3])
    compute = lambda: calls.append(1) or len(calls)
    assert memo.get((a,), compute) == 1
    assert memo.get((a,), compute) == 1  # same tensor, untouched: reused
    a[0] = 7  # in-place edit bumps the version
    assert memo.get((a,), compute) == 2
    assert memo.get((a.clone(),), compute) == 3  # equal content, different tensor
    assert memo.get((a,), compute, extra=(16,)) == 4
