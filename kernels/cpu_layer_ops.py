"""Fused decoder-layer ops on CPU (kernels/csrc/cpu_layer_ops.cpp through ctypes).

Why: an eager CPU decode step spent more time dispatching small torch ops (RMSNorm is 8 of them,
RoPE 5, the KV store 2 index_copy_ plus a mask) than computing them. Three calls replace them:
`add_rms_norm` (residual add in place + RMSNorm), `rope_store` (RoPE on q and k, k and v written
straight into their pool slots) and `silu_mul`. Numerics mirror the torch expressions op by op
(see the C++ header); tests/kernels/test_cpu_layer_ops.py checks them against those expressions
and an fp64 reference. `available(dtype)` is False without a compiler, for other dtypes, or with
PAGED_CHAT_CPU_KERNEL=0 / PAGED_CHAT_CPU_FUSED=0; the model then runs its torch ops.
"""

from __future__ import annotations

import ctypes

import torch

from kernels.cpu_build import CSRC, LazyLibrary, profiled

_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


def _declare(dll) -> None:
    p, i, L, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
    for sfx in _SUFFIX.values():
        getattr(dll, f"add_rms_norm_{sfx}").argtypes = [p, p, p, p, L, L, f, i]
        getattr(dll, f"rope_store_{sfx}").argtypes = [p, L, i, i, i, p, p, p, p, p, p, p, i]
        getattr(dll, f"silu_mul_{sfx}").argtypes = [p, p, L, L, i]


_LIB = LazyLibrary(
    CSRC / "cpu_layer_ops.cpp",
    ("-ffp-contract=off",),
    disable_env="PAGED_CHAT_CPU_FUSED",
    declare=_declare,
    label="CPU fused layer ops",
)


def _lib():
    return _LIB.lib


def active_path() -> str:
    return _LIB.active_path()


def available(dtype: torch.dtype) -> bool:
    return dtype in _SUFFIX and _lib() is not None


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check(*ts: torch.Tensor) -> None:
    for t in ts:
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError("fused CPU layer ops need contiguous CPU tensors")


def add_rms_norm(
    x: torch.Tensor,
    delta: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [T, D] (updated in place to x + delta when delta is given); returns RMSNorm(x) * weight."""
    _check(x, weight, *(() if delta is None else (delta,)))
    T, D = x.shape
    out = torch.empty_like(x) if out is None else out
    with profiled("cpu_fused_add_rms_norm"):  # visible to bench.profile_decode
        getattr(_lib(), f"add_rms_norm_{_SUFFIX[x.dtype]}")(
            x.data_ptr(),
            _ptr(delta),
            weight.data_ptr(),
            out.data_ptr(),
            T,
            D,
            eps,
            torch.get_num_threads(),
        )
    return out


def rope_store(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
) -> torch.Tensor:
    """qkv [T, (H + 2 KVH) * D]; cos/sin [P, D] tables; positions and slot_mapping int64 [T];
    caches [num_blocks, block_size, KVH, D] contiguous. Writes rotated k and v into their slots
    (slot -1 = skip) and returns the rotated queries [T, H, D]."""
    _check(qkv, cos, sin, positions, slot_mapping, k_cache, v_cache)
    if positions.dtype != torch.int64 or slot_mapping.dtype != torch.int64:
        raise ValueError("positions and slot_mapping must be int64")
    T = qkv.shape[0]
    q = torch.empty(T, num_heads, head_dim, dtype=qkv.dtype)
    with profiled("cpu_fused_rope_store"):
        getattr(_lib(), f"rope_store_{_SUFFIX[qkv.dtype]}")(
            qkv.data_ptr(),
            T,
            num_heads,
            num_kv_heads,
            head_dim,
            cos.data_ptr(),
            sin.data_ptr(),
            positions.data_ptr(),
            slot_mapping.data_ptr(),
            q.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            torch.get_num_threads(),
        )
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] -> silu(gate) * up [T, I]."""
    _check(gate_up)
    T, I2 = gate_up.shape
    out = torch.empty(T, I2 // 2, dtype=gate_up.dtype)
    with profiled("cpu_fused_silu_mul"):
        getattr(_lib(), f"silu_mul_{_SUFFIX[gate_up.dtype]}")(
            gate_up.data_ptr(), out.data_ptr(), T, I2 // 2, torch.get_num_threads()
        )
    return out
