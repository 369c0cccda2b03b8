"""A greedy step reads a small copy of the LM head, then only the rows that can win.

Why: a greedy step needs the argmax of the logits, not the logits. The default model's LM head is
49,152 x 576 weights: 113 MB in fp32, a fifth of the 538 MB a one-chat fp32 step reads, and at 16
chats its product is the step's largest (~7 ms of ~60). A copy at a quarter of the bytes (int8
codes, one scale per row) or half of them (bf16) gives approximate logits; a bound on how far each
can be from the exact one leaves a handful of rows that may still be the argmax (5 in the median
of the default model's greedy steps, a few hundred at worst), and only those are computed from the
real weights. The others are reported as -inf. The token is the argmax of the exact logits, as
without the screen: nothing is estimated, only skipped where it provably cannot matter.

The bound, for a vocabulary row w (K weights) and an activation row x (fp32, the final norm's):
the approximation sums x^ . w^ where w^ is the copy (codes x scale, or bf16) and x^ = x, or x in
bf16 for the loop's bf16 product. Then

    |x . w - x^ . w^| <= ||x^||_1 max|w - w^| + ||x - x^||_1 max|w|

and each of the two sums, computed in fp32, is within gamma = (K + 2) 2^-24 of its real value times
sum |x_i w_i| <= ||x||_1 max|w| (any summation order). Per row: coef = 2 (max|w - w^| + 2 gamma
max|w|), and coef2 = 2 max|w| (the bf16 activations); the factor 2 covers the (1 + 2^-8) factors.
A step sets tau = max over rows of (a - bound) (at most the argmax's exact logit) and computes the
rows with a + bound >= tau (greedy_screen.h), with margins for values rounded to bf16.

Where it runs: the lean C++ step (one chat, small batches) reads the int8 copy (28 MB for the
default model's 113); the loop (bigger batches, fp32 weights) asks oneDNN for the bf16 product
(compute-bound there: half the time of the fp32 one) and kernels/csrc/cpu_greedy_head.cpp screens
it. Only a step whose every logits row is a plain greedy argmax (engine/step_plan.py's
`argmax_only`) uses it: sampling, logprobs, penalties, biases, grammars and beam search read
every logit. PAGED_CHAT_GREEDY_HEAD=0 turns it off (A/B runs).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import torch

from kernels.cpu_build import CSRC, LazyLibrary, profiled

ENV = "PAGED_CHAT_GREEDY_HEAD"
BF16_RHO = 2.0**-7  # the loop's approximate logits come back in bf16 (2^-8 relative), with slack


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def _declare(dll) -> None:
    p, i, L, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
    dll.greedy_screen_rows.argtypes = [p, i, L, p, L, p, p, p, p, p, f, p, i]
    dll.greedy_screen_rows.restype = ctypes.c_long
    dll.greedy_int8_copy.argtypes = [p, i, L, L, p, p, p, i]
    dll.greedy_int8_copy.restype = None
    dll.greedy_bf16_coef.argtypes = [p, p, L, L, p, p, i]
    dll.greedy_bf16_coef.restype = None
    dll.greedy_column_blocks.restype = ctypes.c_int


_LIB = LazyLibrary(
    CSRC / "cpu_greedy_head.cpp",
    ("-ffp-contract=off",),
    disable_env=ENV,
    declare=_declare,
    label="greedy LM head screen",
)


@dataclass(frozen=True)
class Int8Screen:
    """The lean step's copy: codes int8, scales fp32 [V] (codes x scale ~ the weight) and each row's
    bound coefficient fp32 [V]. The codes are row-major [V, K], or in column blocks [V / 16, K, 16]
    (`blocked`, where V % 16 == 0 and the build has AVX-512): the lean step then computes a batch's
    approximate logits as outer products (kernels/csrc/lean_gemm.h gemm_i8_blocks), with no 16-lane
    reduction per logit and each 16 codes widened once for 8 rows (the bound holds in any order)."""

    codes: torch.Tensor
    scale: torch.Tensor
    coef: torch.Tensor

    @property
    def blocked(self) -> int:
        return int(self.codes.dim() == 3)

    @property
    def shape(self) -> tuple[int, int]:
        """The head's [V, K]."""
        c = self.codes
        return (c.shape[0] * c.shape[2], c.shape[1]) if self.blocked else tuple(c.shape)

    def rows(self) -> torch.Tensor:
        """The codes row-major [V, K], whatever the layout."""
        c = self.codes
        return c.transpose(1, 2).reshape(self.shape) if self.blocked else c

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.coef))


def column_blocks() -> bool:
    """Whether int8_screen lays a head of 16k rows out in column blocks on this machine."""
    lib = _LIB.lib
    return lib is not None and bool(lib.greedy_column_blocks())


def int8_screen(weight: torch.Tensor) -> Int8Screen | None:
    """The int8 copy of an LM head [V, K] (fp32 or bf16, contiguous) with its bound coefficients, in
    one compiled pass over the head (cpu_greedy_head.cpp); None without the library (no compiler:
    then there is no lean step to read it either)."""
    lib = _LIB.lib
    if lib is None or weight.dtype not in (torch.float32, torch.bfloat16) or weight.dim() != 2:
        return None
    weight = weight.contiguous()
    V, K = weight.shape
    codes = torch.empty(V, K, dtype=torch.int8)
    scale, coef = torch.empty(V), torch.empty(V)
    lib.greedy_int8_copy(
        weight.data_ptr(),
        int(weight.dtype == torch.bfloat16),
        V,
        K,
        codes.data_ptr(),
        scale.data_ptr(),
        coef.data_ptr(),
        torch.get_num_threads(),
    )
    if V % 16 == 0 and column_blocks():
        codes = codes.view(V // 16, 16, K).transpose(1, 2).contiguous()
    return Int8Screen(codes, scale, coef)


class Bf16Screen:
    """The loop's screened head for fp32 weights: oneDNN's bf16 product gives the approximation
    (weights packed once in bf16), cpu_greedy_head.cpp picks and computes the candidates."""

    def __init__(self, weight: torch.Tensor):
        if weight.dtype != torch.float32 or weight.dim() != 2 or not weight.is_contiguous():
            raise ValueError("the bf16 screen is for a contiguous fp32 [V, K] head")
        # the head itself is not kept here: the model passes it to `logits` (a screen cached per
        # head must not keep that head alive: engine/exec/models/greedy_screens.py)
        self.shape = tuple(weight.shape)
        wb = weight.to(torch.bfloat16)
        V, K = weight.shape
        self.coef, self.coef2 = torch.empty(V), torch.empty(V)
        _LIB.lib.greedy_bf16_coef(
            weight.data_ptr(),
            wb.data_ptr(),
            V,
            K,
            self.coef.data_ptr(),
            self.coef2.data_ptr(),
            torch.get_num_threads(),
        )
        self.packed = torch.ops.mkldnn._reorder_linear_weight(wb, None)
        self.nbytes = wb.numel() * 2 + 8 * weight.shape[0]
        self.computed = 0  # logits computed exactly, all calls (tests, the bench)

    @staticmethod
    def available() -> bool:
        return (
            enabled()
            and bool(torch.backends.mkldnn.is_available())
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and _LIB.lib is not None
        )

    def logits(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x [M, K] fp32 (final-normed rows), weight: the head this screen was built from -> [M, V]
        fp32: the exact logit at every row that may be its row's argmax, -inf elsewhere."""
        if tuple(weight.shape) != self.shape or weight.dtype != torch.float32:
            raise ValueError("the bf16 screen was built for another head")
        weight = weight.contiguous()
        x = x.float().contiguous()
        xb = x.to(torch.bfloat16)
        with profiled("greedy_head"):
            a = torch.ops.mkldnn._linear_pointwise(xb, self.packed, None, "none", [], "")
            a = a.float().contiguous()
            xf = xb.float()
            n1 = (xf.abs().sum(dim=1, dtype=torch.float64) * (1 + 2.0**-20)).float().contiguous()
            n2 = ((x - xf).abs().sum(dim=1, dtype=torch.float64) * (1 + 2.0**-20)).float()
            n2 = n2.contiguous()
            out = torch.empty_like(a)
            M, V = a.shape
            self.computed += _LIB.lib.greedy_screen_rows(
                a.data_ptr(),
                M,
                V,
                x.data_ptr(),
                x.shape[1],
                weight.data_ptr(),
                self.coef.data_ptr(),
                self.coef2.data_ptr(),
                n1.data_ptr(),
                n2.data_ptr(),
                BF16_RHO,
                out.data_ptr(),
                torch.get_num_threads(),
            )
        return out


def active_path() -> str:
    return _LIB.active_path()
