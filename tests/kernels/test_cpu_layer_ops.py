"""Fused CPU layer ops (kernels/cpu_layer_ops.py) against the plain torch expressions they replace
(engine/exec/models/llama.py) and an fp64 reference.

RoPE + store has no reduction, so it must be bit-identical to apply_rope + store_kv in fp32 and
bf16. RMSNorm sums in another order (and SiLU's exp is another implementation), so those are
checked to fp64 at float rounding and to the torch expression within one bf16 step. Unused pool
slots are NaN-poisoned: a write to a wrong slot or a missed skip shows.
"""

import shutil

import pytest
import torch
import torch.nn.functional as F

from engine.exec.models.llama import apply_rope, rms_norm
from kernels import cpu_layer_ops as ops
from kernels import reference

DTYPES = [torch.float32, torch.bfloat16]


def test_fused_ops_build_where_a_compiler_exists():
    has_compiler = (shutil.which("g++") or shutil.which("c++")) is not None
    assert ops.available(torch.float32) == has_compiler, ops.active_path()
    assert not ops.available(torch.float16)


def _ulp_ok(got, want, dtype):
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-6, rtol=2e-6)
    else:  # at most one bf16 step apart (2^-7 relative), and nearly all equal
        diff = (got.float() - want.float()).abs()
        assert bool((diff <= want.float().abs() * 2**-7 + 1e-30).all())
        assert (diff == 0).float().mean() > 0.97


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 7, 130])
def test_add_rms_norm(dtype, T):
    g = torch.Generator().manual_seed(T)
    x = (torch.randn(T, 576, generator=g) * 3).to(dtype)
    d = torch.randn(T, 576, generator=g).to(dtype)
    w = (1 + torch.randn(576, generator=g) * 0.1).to(dtype)
    want_x = x + d
    want = rms_norm(want_x, w, 1e-5)
    got_x = x.clone()
    got = ops.add_rms_norm(got_x, d, w, 1e-5)
    assert torch.equal(got_x, want_x)  # the residual add: one rounding
    _ulp_ok(got, want, dtype)
    xd = want_x.double()
    ref = w.double() * xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), ref, atol=tol, rtol=tol)
    assert torch.equal(ops.add_rms_norm(want_x.clone(), None, w, 1e-5), got)  # no-delta form


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_store_is_bit_identical_to_rope_then_store(dtype):
    g = torch.Generator().manual_seed(0)
    T, H, KVH, D, nb, bs = 9, 9, 3, 64, 12, 16
    qkv = torch.randn(T, (H + 2 * KVH) * D, generator=g).to(dtype)
    cos = torch.randn(100, D, generator=g).to(dtype)
    sin = torch.randn(100, D, generator=g).to(dtype)
    pos = torch.randint(0, 100, (T,), generator=g)
    slots = torch.randperm(nb * bs, generator=g)[:T]
    slots[3] = -1  # a skipped token
    kc = torch.full((nb, bs, KVH, D), float("nan"), dtype=dtype)
    vc = torch.full((nb, bs, KVH, D), float("nan"), dtype=dtype)
    kc2, vc2 = kc.clone(), vc.clone()
    q = ops.rope_store(qkv, H, KVH, D, cos, sin, pos, slots, kc, vc)
    v3 = qkv.view(T, H + 2 * KVH, D)
    qk = apply_rope(v3[:, : H + KVH], cos[pos], sin[pos])
    reference.store_kv(qk[:, H:], v3[:, H + KVH :], kc2, vc2, slots)
    assert torch.equal(q, qk[:, :H])
    assert torch.equal(kc.isnan(), kc2.isnan()) and torch.equal(kc.nan_to_num(), kc2.nan_to_num())
    assert torch.equal(vc.isnan(), vc2.isnan()) and torch.equal(vc.nan_to_num(), vc2.nan_to_num())
    assert int((~kc.isnan()).all(-1).all(-1).sum()) == T - 1  # exactly the kept tokens written


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype):
    g = torch.Generator().manual_seed(1)
    gu = (torch.randn(5, 2 * 1536, generator=g) * 4).to(dtype)
    got = ops.silu_mul(gu)
    want = F.silu(gu[:, :1536]) * gu[:, 1536:]
    _ulp_ok(got, want, dtype)
    gd = gu.double()
    ref = F.silu(gd[:, :1536]) * gd[:, 1536:]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), ref, atol=tol, rtol=tol)


def test_non_contiguous_input_is_a_clear_error():
    with pytest.raises(ValueError, match="contiguous"):
        ops.silu_mul(torch.randn(8, 6).t())


def test_fused_model_loop_rejects_out_of_range_positions_and_slots():
    """The fused loop checks what the C++ ops would read unchecked; the eager loop would raise too."""
    from engine.exec.dummy_weights import load_config, random_weights
    from engine.exec.models.llama import AttentionMetadata, LlamaModel

    cfg = load_config("smollm2-135m", {"num_hidden_layers": 2})
    model = LlamaModel(cfg, random_weights(cfg), torch.float32, "cpu", max_positions=64)
    pool = torch.zeros(2, 2, 4, 16, model.num_kv_heads, model.head_dim)
    assert model.use_cpu_fused
    ids = torch.tensor([1, 2, 3])
    meta = AttentionMetadata(
        torch.tensor([0, 1, 2]),
        torch.tensor([[0]], dtype=torch.int32),
        torch.tensor([3], dtype=torch.int32),
        torch.tensor([0, 3], dtype=torch.int32),
        3,
        "torch",
    )
    model.forward(ids, torch.arange(3), pool, meta, torch.tensor([2]))  # in range: runs
    with pytest.raises(ValueError, match="RoPE table"):
        model.forward(ids, torch.tensor([0, 1, 10**6]), pool, meta, torch.tensor([2]))
    bad = AttentionMetadata(
        torch.tensor([0, 1, 10**6]), meta.block_tables, meta.seq_lens, meta.cu_seqlens_q, 3, "torch"
    )
    with pytest.raises(ValueError, match="beyond the pool"):
        model.forward(ids, torch.arange(3), pool, bad, torch.tensor([2]))
