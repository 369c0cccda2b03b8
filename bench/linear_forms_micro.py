"""Decode speed of the CPU linear forms (engine/cpu_linear.py), side by side in one process.

Why: the packed-bf16 and int8 choices were made by measurement, and on a shared box only same-run,
interleaved ratios mean anything. Four engines (fp32 dense, bf16 unpacked, bf16 oneDNN-packed,
int8 weights) decode batch 1 and 32 (16-token prompts, 32 new tokens, greedy) in interleaved rounds.

    python -m bench.linear_forms_micro [rounds]
"""
import os, sys; os.environ.setdefault("OMP_WAIT_POLICY","PASSIVE")
import time, torch
import engine.cpu_linear as cl
from engine import LLM, SamplingParams
real = cl.mkldnn_bf16_available
llms = {}
llms["fp32"] = LLM(dtype="float32", num_blocks=256)
cl.mkldnn_bf16_available = lambda: False
llms["bf16-unpacked"] = LLM(dtype="bfloat16", num_blocks=256)
cl.mkldnn_bf16_available = real
llms["bf16-packed"] = LLM(dtype="bfloat16", num_blocks=256)
llms["int8"] = LLM(quantization="int8", num_blocks=256)
sp = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
print("load start", os.getloadavg())
for B in (1, 32):
    prompts = [[1, 504, 3458, 282, 1117 + i, 314, 253, 1345, 30, 2, 77, 88, 99, 100, 101, 102] for i in range(B)]
    res = {n: [] for n in llms}
    for n, llm in llms.items(): llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))
    for r in range(rounds):
        for n, llm in llms.items():
            t = time.perf_counter(); llm.generate(prompts, sp); res[n].append(B * 32 / (time.perf_counter() - t))
    for n, v in res.items():
        v.sort(); print(f"B={B} {n}: median {v[len(v)//2]:.1f} tok/s  runs {[round(x,1) for x in v]}")
print("load end", os.getloadavg())
for l in llms.values(): l.shutdown()
