"""How a CPU linear layer holds its weight: plain, oneDNN-packed, or weight-only int8.

Why: at the default model's sizes a CPU decode step is ~65% GEMM, and torch's `F.linear` re-reads
and re-lays-out the weight on every call. Three forms, picked once at load time:

- `DenseLinear` — `F.linear` on the plain tensor (MKL for fp32). Used where oneDNN is missing,
  or for fp32 when PAGED_CHAT_PACKED_FP32=0.
- `PackedLinear` — weights reordered once into oneDNN's blocked layout
  (`torch.ops.mkldnn._reorder_linear_weight`) and run by `_linear_pointwise`. In bf16 its results
  were bit-identical to `F.linear` on this box (tests/engine/exec/test_quant_int8.py checks it) and it
  skips the per-call reorder. In fp32 it is not bit-identical to MKL (~1e-6 relative: another
  summation order), but at the decode shapes it is 1.3-2.8x faster than MKL here (the 49k-row LM
  head at 16 rows: 7.0 vs 18.8 ms; bench/results/gemm-decode-shapes.txt), and greedy fp32 stays
  token-identical to HF (tests/engine/exec/test_generation_vs_hf.py runs on this path). fp32 logits
  stay within the 1e-4 the HF-logits test allows.
- `Int8Linear` — weight-only int8 with one fp scale per output channel (symmetric, round to
  nearest, |q| <= 127). Small batches (decode) run torch's own int8-weight kernel
  `aten._weight_int8pack_mm`, which reads a quarter of fp32's bytes; bigger batches (prefill)
  dequantize into the activation dtype first, because that kernel's cost grows with the rows while
  dequantizing is a fixed cost (measured here, bf16, [rows,576]x[576,3072]: 0.46 vs 2.5 ms at 8 rows,
  2.2 vs 3.8 ms at 64, 6.8 vs 4.4 ms at 128; the 49k-row LM head: 13 vs 184 ms at 8 rows).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

QUANTIZATIONS = (None, "int8")
INT8_KERNEL_MAX_ROWS = 64  # rows up to which the int8 kernel beats dequantize + GEMM (measured)


def mkldnn_bf16_available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(
        torch.ops.mkldnn, "_linear_pointwise"
    )


def packed_fp32_enabled() -> bool:
    """fp32 weights go through oneDNN's packed GEMM unless PAGED_CHAT_PACKED_FP32=0 (A/B runs)."""
    return os.environ.get("PAGED_CHAT_PACKED_FP32", "1") != "0" and mkldnn_bf16_available()


class DenseLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight, self.bias = weight, bias
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def numel(self) -> int:
        return self.weight.numel() + (0 if self.bias is None else self.bias.numel())


class PackedLinear:
    """oneDNN-packed bf16 or fp32 weight. The plain weight is dropped after packing (no second copy)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.out_features, self._numel = weight.shape[0], weight.numel()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def numel(self) -> int:
        return self._numel + (0 if self.bias is None else self.bias.numel())


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: w ~= q * scale[:, None]. Computed in fp32."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale


class Int8Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, act_dtype: torch.dtype):
        self.q, scale = quantize_int8(weight)
        self.scale = scale.to(act_dtype)  # both paths use this one rounding of the scale
        self.bias, self.act_dtype = bias, act_dtype
        self.out_features = weight.shape[0]

    def dequantized(self) -> torch.Tensor:
        return (self.q.float() * self.scale.float()[:, None]).to(self.act_dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= INT8_KERNEL_MAX_ROWS:
            y = torch.ops.aten._weight_int8pack_mm(x.contiguous(), self.q, self.scale)
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.dequantized(), self.bias)

    def numel(self) -> int:
        return self.q.numel() + (0 if self.bias is None else self.bias.numel())


def make_linear(
    weight: torch.Tensor, bias: torch.Tensor | None, *, quantization: str | None = None
):
    """The fastest form that keeps the dtype's contract (see module docstring)."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization must be one of {QUANTIZATIONS[1:]} or None, got {quantization!r}"
        )
    if weight.device.type != "cpu":
        if quantization is not None:
            raise ValueError("quantization='int8' is a CPU option (torch's CPU int8 weight kernel)")
        return DenseLinear(weight, bias)
    if quantization == "int8":
        return Int8Linear(weight, bias, weight.dtype)
    if weight.dtype == torch.bfloat16 and mkldnn_bf16_available():
        return PackedLinear(weight, bias)
    if weight.dtype == torch.float32 and packed_fp32_enabled():
        return PackedLinear(weight, bias)
    return DenseLinear(weight, bias)


def describe(linear) -> str:
    return {DenseLinear: "dense", PackedLinear: "onednn-packed", Int8Linear: "int8-weight"}[
        type(linear)
    ]


def layer_linear(L: dict, name: str, x: torch.Tensor) -> torch.Tensor:
    """One of a layer's linears, whatever form it was prepared in: a plain weight tensor (CUDA
    eager; bias under `name + "_b"`) or a callable from `make_linear` (CPU). Lives here, not in the
    model, so the fused variants and the model share it without importing each other."""
    w = L[name]
    if isinstance(w, torch.Tensor):
        return F.linear(x, w, L.get(name + "_b"))
    return w(x)
