"""Decode speed of the CPU weight forms and layer paths, side by side in one process.

Why: the packed-weight, fused-op and int8 choices were made by measurement, and on a shared box
only same-run, interleaved ratios mean anything. Engines decode batch 1 and 32 (16-token prompts,
32 new tokens, greedy) in interleaved rounds:
  fp32 before     MKL F.linear, eager torch layer ops (the path before issue 15's third pass)
  fp32            oneDNN-packed fp32 weights, fused C++ layer ops (today's default)
  bf16-packed     oneDNN-packed bf16 weights, fused layer ops
  int8            weight-only int8 (bf16 activations), fused layer ops
  int8 eager      weight-only int8, eager torch layer ops

    python -m bench.linear_forms_micro [rounds]
"""

import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import time

from engine import LLM, SamplingParams


def build(eager=False, packed_fp32=True, **kw):
    os.environ["PAGED_CHAT_PACKED_FP32"] = "1" if packed_fp32 else "0"
    llm = LLM(num_blocks=256, **kw)
    os.environ.pop("PAGED_CHAT_PACKED_FP32")
    if eager:
        llm.engine.runner.model.use_cpu_fused = False
    return llm


def main():
    llms = {
        "fp32 before": build(eager=True, packed_fp32=False, dtype="float32"),
        "fp32": build(dtype="float32"),
        "bf16-packed": build(dtype="bfloat16"),
        "int8": build(quantization="int8"),
        "int8 eager": build(eager=True, quantization="int8"),
    }
    sp = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print("load start", os.getloadavg())
    for B in (1, 32):
        prompts = [
            [1, 504, 3458, 282, 1117 + i, 314, 253, 1345, 30, 2, 77, 88, 99, 100, 101, 102]
            for i in range(B)
        ]
        res = {n: [] for n in llms}
        for llm in llms.values():
            llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))
        for _ in range(rounds):
            for n, llm in llms.items():
                t = time.perf_counter()
                llm.generate(prompts, sp)
                res[n].append(B * 32 / (time.perf_counter() - t))
        base = sorted(res["fp32 before"])[rounds // 2]
        for n, v in res.items():
            v.sort()
            print(
                f"B={B} {n}: median {v[len(v) // 2]:.1f} tok/s ({v[len(v) // 2] / base:.2f}x fp32 before)"
                f"  runs {[round(x, 1) for x in v]}"
            )
    print("load end", os.getloadavg())
    for llm in llms.values():
        llm.shutdown()


if __name__ == "__main__":
    main()
