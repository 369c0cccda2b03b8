"""One-off probe: the engine end to end on CUDA with each KV cache dtype (greedy tokens vs the
bf16 pool's), graphs on. Prints one JSON line per dtype."""

import json
import sys
import time

import torch

from engine import LLM, SamplingParams

MODEL, DEVICE, DTYPES = (
    sys.argv[1:4] + ["llama-3.2-1b", "cuda", "auto,int8,fp8"][len(sys.argv) - 1 :]
)[:3]
prompts = [
    {"prompt_token_ids": [(7 * i + 3 * j) % 30000 + 3 for j in range(40 + 9 * i)]} for i in range(6)
]
ref = None
for kvd in DTYPES.split(","):
    t0 = time.perf_counter()
    llm = LLM(
        model=MODEL,
        load_format="dummy",
        device=DEVICE,
        dtype="bfloat16",
        num_blocks=512,
        max_model_len=512,
        max_num_seqs=8,
        kv_cache_dtype=kvd,
    )
    outs = llm.generate(prompts, SamplingParams(max_tokens=48, temperature=0, ignore_eos=True))
    toks = [o.outputs[0].token_ids for o in outs]
    if ref is None:
        ref = toks
    same = [sum(a == b for a, b in zip(x, y)) / len(y) for x, y in zip(toks, ref)]
    first_diff = [
        next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(toks, ref)
    ]
    print(
        json.dumps(
            {
                "kv_cache_dtype": kvd,
                "secs": round(time.perf_counter() - t0, 1),
                "token_agreement_vs_bf16": [round(s, 2) for s in same],
                "first_diff": first_diff,
            }
        ),
        flush=True,
    )
    llm.shutdown()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
