"""Triton act(gate) * up over the fused gate_up GEMM output (CUDA path): SiLU (Llama, Qwen,
Phi, SmolLM3) or GELU with the tanh approximation (Gemma 3's gelu_pytorch_tanh).

Why: `F.silu(gu[:, :I]) * gu[:, I:]` is two launches and an intermediate the size of the MLP;
one elementwise program reads gate and up once. Rounding mirrors transformers in 16-bit dtypes:
the activation's result is rounded to the dtype before the multiply, as eager torch does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_rounding import round_as

ACTS = {"silu": 0, "gelu_tanh": 1}


@triton.jit
def _act_mul_kernel(
    gu_ptr, out_ptr, stride_gu, stride_o, inter, BLOCK: tl.constexpr, ACT: tl.constexpr = 0
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    dt = out_ptr.dtype.element_ty
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + inter + cols, mask=mask, other=0.0).to(tl.float32)
    if ACT == 0:
        s = round_as(g / (1.0 + tl.exp(-g)), dt)
    else:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), tanh(y) = 1 - 2 / (exp(2y) + 1)
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        s = round_as(0.5 * g * (2.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)), dt)
    tl.store(out_ptr + row * stride_o + cols, round_as(s * u, dt).to(dt), mask=mask)


def act_and_mul(
    gu: torch.Tensor, act: str = "silu", out: torch.Tensor | None = None
) -> torch.Tensor:
    """gu [T, 2*I] (gate columns then up columns) -> act(gate) * up, [T, I]."""
    T, two_i = gu.shape
    inter = two_i // 2
    assert gu.stride(1) == 1 and two_i == 2 * inter
    out = torch.empty(T, inter, dtype=gu.dtype, device=gu.device) if out is None else out
    if T:
        block = min(1024, triton.next_power_of_2(inter))
        _act_mul_kernel[(T, triton.cdiv(inter, block))](
            gu, out, gu.stride(0), out.stride(0), inter, BLOCK=block, ACT=ACTS[act], num_warps=4
        )
    return out


def silu_and_mul(gu: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gu [T, 2*I] (gate columns then up columns) -> silu(gate) * up, [T, I]."""
    return act_and_mul(gu, "silu", out)
