"""Triton RMSNorm, optionally fused with the residual add before it (CUDA path).

Why: in eager torch an RMSNorm is ~8 launches (to, pow, mean, add, rsqrt, mul, to, mul) and the
residual add one more; at batch 1 decode a launch costs more than the math. One program per token
row does add + norm in one read and one write of the row.

Numerics follow transformers' LlamaRMSNorm exactly: the residual sum is rounded to the model dtype
(as `residual + hidden` in that dtype is), normalised in fp32, rounded to the dtype, then
multiplied by the weight and rounded again. An fp32 weight under a 16-bit model is Gemma's (1 + w):
Gemma's RMSNorm multiplies in fp32 and rounds once (FP32_WEIGHT).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_rounding import round_as


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    n_cols,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
    FP32_WEIGHT: tl.constexpr = False,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dt = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        x = round_as(x + r, dt)  # the sum as the dtype holds it
        tl.store(
            res_out_ptr + row * stride_ro + cols, x.to(dt), mask=mask
        )  # exact: x already rounded
    var = tl.sum(x * x, 0) / n_cols
    y = x * (1.0 / tl.sqrt(var + eps))
    if not FP32_WEIGHT:
        y = round_as(y, dt)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, round_as(w * y, dt).to(dt), mask=mask)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
):
    """residual None: returns rms_norm(x). Else returns (rms_norm(x + residual), x + residual)."""
    T, n = x.shape
    assert x.stride(1) == 1 and weight.shape == (n,)
    out = torch.empty_like(x) if out is None else out
    has_res = residual is not None
    if has_res:
        assert residual.shape == x.shape and residual.stride(1) == 1
        residual_out = torch.empty_like(x) if residual_out is None else residual_out
    if T:
        r = residual if has_res else x
        ro = residual_out if has_res else out
        _add_rms_norm_kernel[(T,)](
            x,
            r,
            weight,
            out,
            ro,
            x.stride(0),
            r.stride(0),
            out.stride(0),
            ro.stride(0),
            n,
            float(eps),
            HAS_RES=has_res,
            BLOCK=triton.next_power_of_2(n),
            num_warps=4 if n <= 4096 else 8,
            FP32_WEIGHT=weight.dtype == torch.float32 and x.dtype != torch.float32,
        )
    return (out, residual_out) if has_res else out
