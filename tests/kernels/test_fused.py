"""Fused Triton layer ops (used on CUDA only) against the eager torch ops they replace, which follow
transformers: residual-add + RMSNorm, SiLU * mul, RoPE + K/V store. fp32 must agree to float
rounding; in bf16/fp16 the kernels round where eager torch rounds, so they agree to two units in the
last place (the only difference left is the order of the variance sum).
On CPU these run under TRITON_INTERPRET=1 (set in conftest)."""

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.exec.models.llama import apply_rope, rms_norm
from kernels import reference
from kernels.triton_rounding import round_as
from tests.kernels.helpers import DEVICE

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def ulp_close(out, ref, dtype):
    """fp32: 1e-5 relative; 16-bit: within 2 ulp (a 1-ulp difference in the normalised value can
    become 2 after the rounded multiply by the weight)."""
    eps = torch.finfo(dtype).eps
    tol = 1e-5 if dtype == torch.float32 else 2 * eps
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [576, 896, 2048])
def test_add_rms_norm(dtype, n):
    from kernels.triton_norm import add_rms_norm

    g = torch.Generator().manual_seed(n)
    x, r = (torch.randn(5, n, generator=g).mul(3).to(dtype).to(DEVICE) for _ in range(2))
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype).to(DEVICE)
    ulp_close(add_rms_norm(x, None, w, 1e-5), rms_norm(x, w, 1e-5), dtype)
    out, res = add_rms_norm(x, r, w, 1e-6)
    s = r + x
    assert torch.equal(res, s), "the residual sum must be exactly the dtype's sum"
    ulp_close(out, rms_norm(s, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_and_mul(dtype):
    from kernels.triton_act import silu_and_mul

    inter = 1536 + 8  # not a multiple of the 1024-column tile
    gu = (
        torch.randn(3, 2 * inter, generator=torch.Generator().manual_seed(1))
        .mul(4)
        .to(dtype)
        .to(DEVICE)
    )
    ref = F.silu(gu[:, :inter]) * gu[:, inter:]
    ulp_close(silu_and_mul(gu), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("h,kvh,d", [(9, 3, 64), (14, 2, 64), (4, 4, 128)])
def test_rope_and_store(dtype, h, kvh, d):
    from kernels.triton_rope_store import rope_and_store

    g = torch.Generator().manual_seed(h * d)
    T, bs, nb = 7, 16, 6
    qkv = torch.randn(T, (h + 2 * kvh) * d, generator=g).to(dtype).to(DEVICE)
    pos = torch.tensor([0, 1, 15, 16, 17, 63, 95]).to(DEVICE)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.cat([torch.arange(96).float()[:, None] * inv] * 2, -1)
    cos, sin = emb.cos().to(dtype).to(DEVICE), emb.sin().to(dtype).to(DEVICE)
    slots = torch.tensor([3, 17, -1, 40, 41, 90, 5], dtype=torch.int64).to(DEVICE)
    kc, vc = (torch.full((nb, bs, kvh, d), float("nan"), dtype=dtype).to(DEVICE) for _ in range(2))
    q = rope_and_store(qkv, pos, cos, sin, kc, vc, slots, h, kvh)
    x = qkv.view(T, h + 2 * kvh, d)
    qk = apply_rope(x[:, : h + kvh], cos[pos], sin[pos])
    kc_ref, vc_ref = (torch.full_like(kc, float("nan")) for _ in range(2))
    reference.store_kv(qk[:, h:], x[:, h + kvh :], kc_ref, vc_ref, slots)
    ulp_close(q, qk[:, :h], dtype)
    for got, want in ((kc, kc_ref), (vc, vc_ref)):
        assert torch.equal(got.isnan(), want.isnan()), (
            "wrote a slot it should not have (or missed one)"
        )
        ulp_close(got.nan_to_num(), want.nan_to_num(), dtype)


@triton.jit
def _round_kernel(x_ptr, o_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(
        o_ptr + i, round_as(tl.load(x_ptr + i), o_ptr.dtype.element_ty).to(o_ptr.dtype.element_ty)
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_round_as_matches_torch_rounding_bit_for_bit(dtype):
    """The interpreter truncates fp32 -> bf16 casts; round_as must round to nearest even anyway."""
    x = torch.cat(
        [
            torch.randn(4000, generator=torch.Generator().manual_seed(2)) * 7,
            torch.tensor([0.0, -0.0, 1.00390625, 1.01171875, 65504.0, 1e-30]),
        ]
    )
    x = torch.cat([x, torch.zeros(4096 - x.numel())]).to(DEVICE)
    out = torch.empty(4096, dtype=dtype, device=DEVICE)
    _round_kernel[(1,)](x, out, N=4096)
    assert torch.equal(out.view(torch.int16), x.to(dtype).view(torch.int16))


def test_fused_kernels_compile_for_sm90():
    """The real Triton compiler (not the interpreter) accepts every fused kernel, the quantized
    store and the MoE experts' two kernels (kernels/triton_moe.py, at their largest tiles: fp32
    gate/up without spills at 8 warps) for the H200 (the interpreter accepted a non-constexpr
    global that sm_90 refuses)."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU the other tests compile and run these kernels for real")
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [sys.executable, "scripts/compile_sm90.py"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (
        r.stdout.count("ok   ") == 17
    )  # 3 dtypes x (norm, silu, gelu, rope+store) + 3 quantized stores
    assert (
        "moe down bf16" in r.stdout and "spill 0/0 B" in r.stdout.split("moe gate_up")[1]
    )  # + 2 MoE
