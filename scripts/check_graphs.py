"""GPU check stage: CUDA-graph replay vs eager on the same engine and the same batch.

Why: serving decodes through captured graphs (engine/exec/cuda_graphs.py: padded buckets, static
inputs copied from one pinned buffer, split-K fixed per bucket); the numerics stage compares the
engine with HF but cannot tell which of the two paths produced a wrong row. Here one engine
(random weights) generates greedily twice for the same prompts, first replaying its graphs, then
with them switched off (eager, the same weights and pool); the token ids must be identical. The
batch has 5 sequences, so it runs in the padded bucket of 8 and, as sequences finish at different
lengths, in smaller buckets too. Prefix caching is off so both runs compute everything.
On CPU (smoke) there are no graphs: both runs are eager, which checks this stage's own code.
"""

from __future__ import annotations

import time

import torch

from engine import LLM, SamplingParams
from engine.exec import dummy_weights as dw


def graphs_vs_eager(device: str, smoke: bool, kv_cache_dtype: str = "auto") -> dict:
    """kv_cache_dtype: the pool's form (int8 / fp8: the quantized kernels inside the graphs)."""
    t0 = time.perf_counter()
    name = "smollm2-135m" if smoke else "llama-3.2-1b"
    over = {"num_hidden_layers": 2, "vocab_size": 4096} if smoke else {"num_hidden_layers": 4}
    dtype = "float32" if smoke else "bfloat16"
    llm = LLM(
        model=name,
        load_format="dummy",
        hf_overrides=over,
        device=device,
        dtype=dtype,
        seed=5,
        num_blocks=256,
        max_model_len=512,
        max_num_seqs=8,
        enable_prefix_caching=False,
        kv_cache_dtype=kv_cache_dtype,
    )
    try:
        g = torch.Generator().manual_seed(3)
        vocab = dw.load_config(name, over).vocab_size
        lengths = [1, 15, 17, 40, 100]
        news = [4, 12, 8, 16, 6] if smoke else [24, 48, 32, 64, 40]
        prompts = [
            {"prompt_token_ids": torch.randint(3, vocab, (n,), generator=g).tolist()}
            for n in lengths
        ]
        params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in news]
        runner = llm.engine.runner
        graphs = runner.graphs
        with_graphs = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        runner.graphs = None
        try:
            eager = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        finally:
            runner.graphs = graphs
    finally:
        llm.shutdown()
    identical = sum(1 for a, b in zip(with_graphs, eager) if list(a) == list(b))
    first_diff = []
    for i, (a, b) in enumerate(zip(with_graphs, eager)):
        k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if k is not None or len(a) != len(b):
            first_diff.append(
                {
                    "sequence": i,
                    "position": k,
                    "graphs": list(a)[: k + 3 if k is not None else None],
                    "eager": list(b)[: k + 3 if k is not None else None],
                }
            )
    return {
        "ok": identical == len(prompts),
        "cuda_graphs": graphs is not None,
        "kv_cache_dtype": kv_cache_dtype,
        "sequences": len(prompts),
        "identical": identical,
        "new_tokens": sum(news),
        "first_differences": first_diff,
        "seconds": time.perf_counter() - t0,
    }
