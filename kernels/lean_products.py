"""The weight layout the lean CPU step's products read, and those products alone (tests, benchmarks).

Why a file of its own: the layout is decided where weights are prepared (engine/exec/models/
llama_weights.py keeps the lean step's copy in it) and checked by tests against plain products,
while kernels/cpu_lean_step.py is the step itself. The layout: blocks of 16 output rows, k-major
(fp32 [N / 16, K, 16]; bf16 [N / 16, K / 2, 16, 2]), which kernels/csrc/lean_gemm.h's
`gemm_blocks` reads as outer products (docs/DESIGN.md, "The lean CPU step").
"""

from __future__ import annotations

import torch

from kernels import cpu_lean_step


def can_tile(weight: torch.Tensor, row_groups: int = 1) -> bool:
    """Whether `tile_rows` takes this [N, K] weight and this build has the kernel for it: fp32 or
    bf16, K a multiple of 16 and N of 16 (of 16 per group: gate/up is two groups, each thread's
    rows of both halves must start a block), on a CPU with AVX-512 (bf16: AVX512-BF16)."""
    return (
        weight.dim() == 2
        and cpu_lean_step.column_blocks(weight.dtype)
        and weight.shape[1] % 16 == 0
        and weight.shape[0] % (16 * row_groups) == 0
    )


def tile_rows(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] row-major -> the lean step's column-block layout: blocks of 16 output rows, k-major,
    so one 64-byte load is one k of 16 outputs (kernels/csrc/lean_gemm.h, gemm_blocks): fp32
    [N / 16, K, 16]; bf16 [N / 16, K / 2, 16, 2] (two k side by side, as `vdpbf16ps` takes them).
    Same values; the products sum each output over k in order (not bit-identical to row-major)."""
    n, k = weight.shape
    if weight.dtype == torch.bfloat16:
        return weight.reshape(n // 16, 16, k // 2, 2).transpose(1, 2).contiguous()
    return weight.reshape(n // 16, 16, k).transpose(1, 2).contiguous()


def untile_rows(tiled: torch.Tensor) -> torch.Tensor:
    """tile_rows' inverse: the [N, K] row-major weight."""
    if tiled.dim() == 4:
        a, p, sixteen, two = tiled.shape
        return tiled.transpose(1, 2).reshape(a * sixteen, p * two).contiguous()
    a, k, sixteen = tiled.shape
    return tiled.transpose(1, 2).reshape(a * sixteen, k).contiguous()


def linear_rows(
    weight: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None, n: int
) -> torch.Tensor:
    """One of the step's products alone, for tests and benchmarks: x [M, K] (fp32 or bf16, as the
    weight) times `weight` ([n, K] row-major, or tile_rows' layout) plus `bias` -> [M, n] in the
    weight's dtype, on one thread, by the kernels the step runs."""
    dtype = weight.dtype
    fn = {torch.float32: "lean_linear_f32", torch.bfloat16: "lean_linear_bf16"}[dtype]
    xf = x.to(dtype).float().contiguous()  # the step's activations: dtype values held in fp32
    w = weight.contiguous()
    b = None if bias is None else bias.to(dtype).contiguous()
    y = torch.empty(x.shape[0], n, dtype=dtype)
    err = getattr(cpu_lean_step.library(), fn)(
        w.data_ptr(),
        int(w.dim() > 2),
        xf.data_ptr(),
        x.shape[0],
        None if b is None else b.data_ptr(),
        y.data_ptr(),
        n,
        x.shape[1],
    )
    if err:
        raise RuntimeError(cpu_lean_step.error_text(err, "lean product"))
    return y


def screen_rows(screen, x: torch.Tensor) -> torch.Tensor:
    """The greedy screen's approximate logits alone, for tests: x [M, K] fp32 times a
    kernels/greedy_head.Int8Screen's codes and scales -> [M, V] fp32, by the kernel the step runs
    for its layout, on one thread."""
    V, K = screen.shape
    xf = x.float().contiguous()
    y = torch.empty(x.shape[0], V)
    err = cpu_lean_step.library().lean_linear_i8(
        screen.codes.data_ptr(),
        screen.blocked,
        xf.data_ptr(),
        x.shape[0],
        screen.scale.data_ptr(),
        y.data_ptr(),
        V,
        K,
    )
    if err:
        raise RuntimeError(cpu_lean_step.error_text(err, "screen product"))
    return y
