"""Compile the fused Triton kernels ahead of time for sm_90 (H100/H200) on a machine without a GPU.

Why: the CPU tests run these kernels in the interpreter, which accepts code the real compiler
rejects (and vice versa). Compiling for the GPU's target with the ptxas bundled in the triton wheel
catches that before a GPU session is spent. Prints one line per variant; exit 1 on any failure.
    python scripts/compile_sm90.py
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)          # the real compiler, not the interpreter
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels import triton_act, triton_norm, triton_rope_store  # noqa: E402


def variants():
    for dt in ("bf16", "fp16", "fp32"):
        p = "*" + dt
        yield (f"add_rms_norm {dt}", triton_norm._add_rms_norm_kernel,
               {"x_ptr": p, "res_ptr": p, "w_ptr": p, "out_ptr": p, "res_out_ptr": p, "stride_x": "i32",
                "stride_r": "i32", "stride_o": "i32", "stride_ro": "i32", "n_cols": "i32", "eps": "fp32",
                "HAS_RES": "constexpr", "BLOCK": "constexpr"}, {"HAS_RES": True, "BLOCK": 4096})
        yield (f"silu_and_mul {dt}", triton_act._silu_mul_kernel,
               {"gu_ptr": p, "out_ptr": p, "stride_gu": "i32", "stride_o": "i32", "inter": "i32",
                "BLOCK": "constexpr"}, {"BLOCK": 1024})
        yield (f"rope_and_store {dt}", triton_rope_store._rope_store_kernel,
               {"qkv_ptr": p, "cos_ptr": p, "sin_ptr": p, "pos_ptr": "*i64", "q_out_ptr": p, "k_cache_ptr": p,
                "v_cache_ptr": p, "slot_ptr": "*i64", "stride_t": "i32", "stride_cos": "i32",
                "stride_qo_t": "i32", "stride_qo_h": "i32", "stride_cb": "i64", "stride_cs": "i32",
                "stride_ch": "i32", "block_size": "i32", "H": "constexpr", "KVH": "constexpr",
                "HEAD_DIM": "constexpr", "HALF": "constexpr", "H_P2": "constexpr", "KVH_P2": "constexpr",
                "HALF_P2": "constexpr"},
               {"H": 14, "KVH": 2, "HEAD_DIM": 64, "HALF": 32, "H_P2": 16, "KVH_P2": 2, "HALF_P2": 32})


def main() -> int:
    target = GPUTarget("cuda", 90, 32)
    bad = 0
    for name, fn, sig, consts in variants():
        try:
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=target)
            print(f"ok   {name}: shared {k.metadata.shared} B")
        except Exception as e:                     # noqa: BLE001 - report every failure, then exit 1
            bad += 1
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:800]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
