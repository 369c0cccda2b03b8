"""Triton SiLU(gate) * up over the fused gate_up GEMM output (CUDA path).

Why: `F.silu(gu[:, :I]) * gu[:, I:]` is two launches and an intermediate the size of the MLP;
one elementwise program reads gate and up once. Rounding mirrors transformers in 16-bit dtypes:
silu's result is rounded to the dtype before the multiply, as eager torch does.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_rounding import round_as


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, stride_gu, stride_o, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    dt = out_ptr.dtype.element_ty
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + inter + cols, mask=mask, other=0.0).to(tl.float32)
    s = round_as(g / (1.0 + tl.exp(-g)), dt)
    tl.store(out_ptr + row * stride_o + cols, round_as(s * u, dt).to(dt), mask=mask)


def silu_and_mul(gu: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gu [T, 2*I] (gate columns then up columns) -> silu(gate) * up, [T, I]."""
    T, two_i = gu.shape
    inter = two_i // 2
    assert gu.stride(1) == 1 and two_i == 2 * inter
    out = torch.empty(T, inter, dtype=gu.dtype, device=gu.device) if out is None else out
    if T:
        block = min(1024, triton.next_power_of_2(inter))
        _silu_mul_kernel[(T, triton.cdiv(inter, block))](gu, out, gu.stride(0), out.stride(0), inter,
                                                         BLOCK=block, num_warps=4)
    return out
