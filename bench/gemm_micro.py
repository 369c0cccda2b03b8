"""GEMM forms at the decode shapes: python -m bench.gemm_micro [--rows 1,2,4,8,16,32,64]

The default model's linear shapes ([rows, K] x [K, N]: fused QKV 960x576, o 576x576, fused
gate/up 3072x576, down 576x1536, LM head 49152x576) in fp32 through MKL (`F.linear`), MKL's
packed sgemm and oneDNN's packed weight (`mkldnn._linear_pointwise`, what engine/exec/cpu_linear.py
uses). Prints median ms, GFLOP/s and the max difference from MKL, same process, interleaved.
Why: a decode step is mostly these GEMMs, and which form is fastest depends on the row count.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    print(f"torch threads {torch.get_num_threads()}; median ms (GFLOP/s); diff = max |y - MKL|")
    with torch.inference_mode():
        for M in (int(r) for r in a.rows.split(",")):
            for N, K in SHAPES:
                w, x = torch.randn(N, K) * 0.05, torch.randn(M, K)
                pw = torch.ops.mkl._mkl_reorder_linear_weight(w, M)
                dw = torch.ops.mkldnn._reorder_linear_weight(w, None)
                forms = {
                    "mkl": lambda x: F.linear(x, w),
                    "mkl-packed": lambda x: torch.ops.mkl._mkl_linear(x, pw, w, None, M),
                    "onednn-packed": lambda x: torch.ops.mkldnn._linear_pointwise(
                        x, dw, None, "none", [], ""
                    ),
                }
                ref = F.linear(x, w)
                times = {k: [] for k in forms}
                for f in forms.values():
                    f(x), f(x)  # warm
                for _ in range(a.repeats):  # interleaved
                    for k, f in forms.items():
                        t = time.perf_counter()
                        f(x)
                        times[k].append(time.perf_counter() - t)
                line = f"rows {M:3d} N {N:5d} K {K:5d}"
                for k, f in forms.items():
                    ms = statistics.median(times[k]) * 1e3
                    diff = (f(x) - ref).abs().max().item()
                    line += f" | {k} {ms:.3f} ({2 * M * N * K / ms / 1e6:.0f}) diff {diff:.1e}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
