"""Compile the Triton kernels ahead of time for sm_90 (H100/H200) on a machine without a GPU.

Why: the CPU tests run these kernels in the interpreter, which accepts code the real compiler
rejects (and vice versa); and a lent GPU session is minutes long, so what a cold run compiles, how
long each compile takes and what it costs in registers / spills / shared memory is measured here
beforehand. Each variant is compiled into an empty Triton cache (cold) with the ptxas bundled in the
triton wheel; ptxas -v gives registers and spill bytes. One line per variant; exit 1 on any failure.
    python scripts/compile_sm90.py                  # the fused layer ops + quantized store + 2 MoE (tests/kernels/test_fused.py)
    python scripts/compile_sm90.py --only all --markdown   # + attention: the docs/BENCHMARKS.md table
    python scripts/compile_sm90.py --only moe       # the routed experts' grouped GEMM (kernels/triton_moe.py)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # the real compiler, not the interpreter
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-aot-")  # cold: nothing cached
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels import (
    triton_act,
    triton_attention,
    triton_moe,
    triton_norm,
    triton_rope_store,
    triton_store,
)  # noqa: E402

TL = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}
ATTN_STRIDES = (
    "stride_qt",
    "stride_qh",
    "stride_cb",
    "stride_cs",
    "stride_ch",
    "stride_bt",
    "stride_ot",
    "stride_oh",
)


def fused_variants():
    for dt in ("bf16", "fp16", "fp32"):
        p = "*" + dt
        yield (
            f"add_rms_norm {dt}",
            triton_norm._add_rms_norm_kernel,
            {
                "x_ptr": p,
                "res_ptr": p,
                "w_ptr": p,
                "out_ptr": p,
                "res_out_ptr": p,
                "stride_x": "i32",
                "stride_r": "i32",
                "stride_o": "i32",
                "stride_ro": "i32",
                "n_cols": "i32",
                "eps": "fp32",
                "HAS_RES": "constexpr",
                "BLOCK": "constexpr",
                "FP32_WEIGHT": "constexpr",
            },
            {"HAS_RES": True, "BLOCK": 4096, "FP32_WEIGHT": False},
            4,
        )
        for act, code in triton_act.ACTS.items():
            yield (
                f"{act}_and_mul {dt}",
                triton_act._act_mul_kernel,
                {
                    "gu_ptr": p,
                    "out_ptr": p,
                    "stride_gu": "i32",
                    "stride_o": "i32",
                    "inter": "i32",
                    "BLOCK": "constexpr",
                    "ACT": "constexpr",
                },
                {"BLOCK": 1024, "ACT": code},
                4,
            )
        yield (
            f"rope_and_store {dt}",
            triton_rope_store._rope_store_kernel,
            {
                "qkv_ptr": p,
                "cos_ptr": p,
                "sin_ptr": p,
                "pos_ptr": "*i64",
                "q_out_ptr": p,
                "k_cache_ptr": p,
                "v_cache_ptr": p,
                "slot_ptr": "*i64",
                "stride_t": "i32",
                "stride_cos": "i32",
                "stride_qo_t": "i32",
                "stride_qo_h": "i32",
                "stride_cb": "i64",
                "stride_cs": "i32",
                "stride_ch": "i32",
                "block_size": "i32",
                "H": "constexpr",
                "KVH": "constexpr",
                "HEAD_DIM": "constexpr",
                "HALF": "constexpr",
                "H_P2": "constexpr",
                "KVH_P2": "constexpr",
                "HALF_P2": "constexpr",
            },
            {"H": 14, "KVH": 2, "HEAD_DIM": 64, "HALF": 32, "H_P2": 16, "KVH_P2": 2, "HALF_P2": 32},
            4,
        )
    for dt, code, int8 in (("bf16", "i8", True), ("bf16", "fp8e4nv", False), ("fp32", "i8", True)):
        p = "*" + dt  # the quantized pool's store (kernels/kv_quant.py)
        yield (
            f"store_kv_quant {dt} -> {code}",
            triton_store._store_kv_quant_kernel,
            {
                "key_ptr": p,
                "value_ptr": p,
                "k_cache_ptr": "*" + code,
                "v_cache_ptr": "*" + code,
                "ks_ptr": "*fp32",
                "vs_ptr": "*fp32",
                "slot_ptr": "*i64",
                "stride_kt": "i32",
                "stride_kh": "i32",
                "stride_vt": "i32",
                "stride_vh": "i32",
                "stride_cb": "i64",
                "stride_cs": "i32",
                "stride_ch": "i32",
                "block_size": "i32",
                "qmax": "fp32",
                "NUM_KV_HEADS": "constexpr",
                "HEAD_DIM": "constexpr",
                "KVH_P2": "constexpr",
                "D_P2": "constexpr",
                "INT8": "constexpr",
            },
            {"NUM_KV_HEADS": 3, "HEAD_DIM": 64, "KVH_P2": 4, "D_P2": 64, "INT8": int8},
            4,
        )


MOE_SMOKE = ("moe gate_up swiglu_clamp fp32 M=64 N=64 K=32", "moe down bf16 M=64 N=64 K=64")


def moe_variants(dtypes=("bf16", "fp16", "fp32")):
    """The experts' two kernels at the tiles choose_tiles picks on a GPU (decode M=16, prefill
    M=64), each activation, with biases (gpt-oss) and without (Qwen)."""
    import torch

    for dt in dtypes:
        p, tdt = (
            "*" + dt,
            {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dt],
        )
        cdt, prec = TL[dt], "ieee" if dt == "fp32" else "tf32"
        for rows in (1, 4096):
            bm, bn, bk, warps = triton_moe.choose_tiles(rows * 8, 128, 2048, 768, tdt, True)
            for act, code in triton_moe.ACTS.items():
                bias = act == "swiglu_clamp"
                yield (
                    f"moe gate_up {act} {dt} M={bm} N={bn} K={bk}",
                    triton_moe._gate_up_kernel,
                    {
                        "x_ptr": p,
                        "w_ptr": p,
                        "b_ptr": p,
                        "pairs_ptr": "*i32",
                        "blk_exp_ptr": "*i32",
                        "h_ptr": p,
                        "num_pairs": "i32",
                        "hidden": "i32",
                        "inter": "i32",
                        "num_experts": "i32",
                        "stride_xt": "i32",
                        "stride_we": "i64",
                        "stride_wn": "i32",
                        "stride_be": "i32",
                        "stride_ht": "i32",
                        "alpha": "fp32",
                        "limit": "fp32",
                        "TOP_K": "constexpr",
                        "BLOCK_M": "constexpr",
                        "BLOCK_N": "constexpr",
                        "BLOCK_K": "constexpr",
                        "ACT": "constexpr",
                        "HAS_BIAS": "constexpr",
                        "CDT": "constexpr",
                        "PREC": "constexpr",
                    },
                    {
                        "TOP_K": 8,
                        "BLOCK_M": bm,
                        "BLOCK_N": bn,
                        "BLOCK_K": bk,
                        "ACT": code,
                        "HAS_BIAS": bias,
                        "CDT": cdt,
                        "PREC": prec,
                    },
                    warps,
                )
            yield (
                f"moe down {dt} M={bm} N={bn} K={bk}",
                triton_moe._down_kernel,
                {
                    "h_ptr": p,
                    "w_ptr": p,
                    "b_ptr": p,
                    "pairs_ptr": "*i32",
                    "blk_exp_ptr": "*i32",
                    "rw_ptr": p,
                    "y_ptr": p,
                    "num_pairs": "i32",
                    "hidden": "i32",
                    "inter": "i32",
                    "num_experts": "i32",
                    "stride_ht": "i32",
                    "stride_we": "i64",
                    "stride_wn": "i32",
                    "stride_be": "i32",
                    "stride_yt": "i32",
                    "BLOCK_M": "constexpr",
                    "BLOCK_N": "constexpr",
                    "BLOCK_K": "constexpr",
                    "HAS_BIAS": "constexpr",
                    "CDT": "constexpr",
                    "PREC": "constexpr",
                },
                {
                    "BLOCK_M": bm,
                    "BLOCK_N": bn,
                    "BLOCK_K": bk,
                    "HAS_BIAS": True,
                    "CDT": cdt,
                    "PREC": prec,
                },
                warps,
            )


def decode(dt: str, d: int, variant: str, split: bool, group: int = 4):
    v = triton_attention.DECODE_VARIANTS[variant]
    p = "*" + dt
    sig = {
        "q_ptr": p,
        "k_ptr": p,
        "v_ptr": p,
        "ks_ptr": "*fp32",
        "vs_ptr": "*fp32",
        "bt_ptr": "*i32",
        "seq_lens_ptr": "*i32",
        "out_ptr": p,
        "part_out_ptr": "*fp32",
        "part_lse_ptr": "*fp32",
        "scale_log2": "fp32",
        **{s: "i32" for s in ATTN_STRIDES},
        "stride_pb": "i32",
        "stride_ph": "i32",
        "stride_ps": "i32",
        "tokens_per_split": "i32",
        "block_size": "i32",
    }
    consts = {
        "GROUP": group,
        "G_P2": 16,
        "HEAD_DIM": d,
        "D_P2": d,
        "TILE_N": v.tile_n,
        "SPLIT": split,
        "CDT": TL[dt],
        "PREC": "ieee" if dt == "fp32" else "tf32",
        "QUANT": False,
    }
    sig.update({k: "constexpr" for k in consts})
    sig["window"] = "i32"  # sliding window (0: none), a runtime argument
    return (
        f"decode {dt} d={d} {variant}{' split' if split else ''}",
        triton_attention._decode_kernel,
        sig,
        consts,
        v.num_warps,
    )


def prefill(dt: str, d: int, block_m: int, tile_n: int, group: int = 4):
    p = "*" + dt
    sig = {
        "q_ptr": p,
        "k_ptr": p,
        "v_ptr": p,
        "ks_ptr": "*fp32",
        "vs_ptr": "*fp32",
        "bt_ptr": "*i32",
        "seq_lens_ptr": "*i32",
        "cu_q_ptr": "*i32",
        "out_ptr": p,
        "scale_log2": "fp32",
        **{s: "i32" for s in ATTN_STRIDES},
        "block_size": "i32",
    }
    g_p2 = triton.next_power_of_2(group)
    consts = {
        "GROUP": group,
        "G_P2": g_p2,
        "BLOCK_M": block_m,
        "BLOCK_Q": block_m // g_p2,
        "HEAD_DIM": d,
        "D_P2": d,
        "TILE_N": tile_n,
        "CDT": TL[dt],
        "PREC": "ieee" if dt == "fp32" else "tf32",
        "QUANT": False,
        "HAS_WINDOW": False,
        "HAS_SINKS": False,
    }
    sig.update({k: "constexpr" for k in consts})
    sig["window"] = "i32"
    sig["sinks_ptr"] = "*fp32"  # gpt-oss's sinks (unused without HAS_SINKS)
    return (
        f"prefill {dt} d={d} M={block_m} N={tile_n}",
        triton_attention._prefill_kernel,
        sig,
        consts,
        8 if d > 64 else 4,
    )


def attention_variants():
    for d in (64, 128):
        for dt in ("bf16", "fp32"):
            for variant in triton_attention.DECODE_VARIANTS:
                yield decode(dt, d, variant, split=True)
        for dt in ("bf16", "fp16"):
            yield prefill(dt, d, 128, 64)
        yield prefill("fp32", d, 128, 64)  # the fp32 tile before issue 27
        yield prefill(
            "fp32", d, *triton_attention.prefill_tiles(__import__("torch").float32, True, 4)
        )


def compile_one(name, fn, sig, consts, num_warps, target):
    log = io.StringIO()
    knobs.nvidia.dump_ptxas_log = True
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(log):
        k = triton.compile(
            ASTSource(fn=fn, signature=sig, constexprs=consts),
            target=target,
            options={"num_warps": num_warps},
        )
    secs = time.perf_counter() - t0
    text = log.getvalue()
    regs = re.findall(r"Used (\d+) registers", text)
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return {
        "variant": name,
        "num_warps": num_warps,
        "registers": int(regs[-1]) if regs else None,
        "spill_stores_b": int(spill[-1][0]) if spill else None,
        "spill_loads_b": int(spill[-1][1]) if spill else None,
        "shared_b": k.metadata.shared,
        "ptx_lines": k.asm["ptx"].count("\n"),
        "compile_s": secs,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["fused", "attention", "moe", "all"], default="fused")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table at the end")
    a = ap.parse_args()
    target = GPUTarget("cuda", 90, 32)
    todo = []
    if a.only in ("all", "fused"):
        todo += list(fused_variants())
    if a.only == "fused":  # the experts' two kernels at their largest tiles
        todo += [v for v in moe_variants(("bf16", "fp32")) if v[0] in MOE_SMOKE]
    if a.only in ("all", "attention"):
        todo += list(attention_variants())
    if a.only in ("all", "moe"):
        todo += list(moe_variants())
    bad, rows = 0, []
    for name, fn, sig, consts, warps in todo:
        try:
            r = compile_one(name, fn, sig, consts, warps, target)
            rows.append(r)
            print(
                f"ok   {name}: {r['registers']} regs, spill {r['spill_stores_b']}/{r['spill_loads_b']} B, "
                f"shared {r['shared_b']} B, {r['ptx_lines']} PTX lines, {r['compile_s']:.1f} s",
                flush=True,
            )
        except Exception as e:  # noqa: BLE001 - report every failure, then exit 1
            bad += 1
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:800]}", flush=True)
    if a.markdown:
        print(
            "\n| variant | warps | registers | spill stores / loads (B) | shared (B) | PTX lines | compile s |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['variant']} | {r['num_warps']} | {r['registers']} | {r['spill_stores_b']} / {r['spill_loads_b']} "
                f"| {r['shared_b']} | {r['ptx_lines']} | {r['compile_s']:.1f} |"
            )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
