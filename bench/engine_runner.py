"""Drive the engine through its public streaming API and time every token on receipt.

A burst of requests is submitted from one thread per request, so all of them reach the engine's
command queue together (LLM.generate submits one at a time and each submit waits for the engine
loop, which admits one request per step -- see docs/BENCHMARKS.md). Each thread records its own
submit time and the receipt time of every token.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from engine import SamplingParams

STAT_COUNTERS = (
    "prompt_tokens_computed_total",
    "generated_tokens_total",
    "prefix_cache_hits",
    "prefix_cache_queries",
    "num_preemptions",
    "steps",
)


@dataclass
class RequestTiming:
    """One request seen from the client: submit time, token receipt times, its ids and metrics."""

    submit: float
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    text: str = ""

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.submit if self.token_times else None

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


def reset_peak(llm) -> None:
    """Start a fresh peak window (peak blocks and peak running sequences)."""
    llm.reset_peak_stats()


def stream_one(
    llm, ids: list[int], params: SamplingParams, session_id=None, cache_salt=None, messages=None
) -> RequestTiming:
    rt = RequestTiming(time.perf_counter())
    if messages is not None:
        stream = llm.submit_chat(messages, params, session_id=session_id)
    else:
        stream = llm.submit(
            {"prompt_token_ids": ids}, params, session_id=session_id, cache_salt=cache_salt
        )
    for d in stream:
        now = time.perf_counter()
        if d.token_ids:
            rt.token_times.extend([now] * len(d.token_ids))
            rt.token_ids.extend(d.token_ids)
        rt.text += d.text
        if d.error:
            raise RuntimeError(d.error)
        if d.finished:
            rt.prompt_tokens = d.metrics.get("prompt_tokens", len(stream.prompt_ids))
            rt.cached_tokens = d.metrics.get("cached_tokens", 0)
    rt.prompt_ids = list(stream.prompt_ids)
    return rt


def engine_stats(llm) -> dict:
    return llm.stats()


def stats_delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in STAT_COUNTERS if k in after and k in before}


def run_burst(
    llm,
    prompts: list[list[int]],
    max_tokens: list[int],
    cache_salt: str | None,
    ignore_eos: bool = True,
) -> dict:
    """All requests arrive at once; returns per-request timings, wall time, stats delta, peak KV."""
    reset_peak(llm)
    before = engine_stats(llm)
    params = [
        SamplingParams(temperature=0.0, max_tokens=k, ignore_eos=ignore_eos) for k in max_tokens
    ]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(prompts)) as ex:
        futs = [
            ex.submit(stream_one, llm, ids, p, None, cache_salt) for ids, p in zip(prompts, params)
        ]
        timings = [f.result() for f in futs]
    t1 = time.perf_counter()
    after = engine_stats(llm)
    return {
        "timings": timings,
        "t0": t0,
        "wall_s": t1 - t0,
        "stats": stats_delta(before, after),
        "peak_kv_bytes": after["peak_used_blocks"] * after["kv_bytes_per_block"],
        "peak_used_blocks": after["peak_used_blocks"],
        "kv_bytes_per_block": after["kv_bytes_per_block"],
    }


def run_generate_api(llm, prompts: list[list[int]], max_tokens: int) -> dict:
    """The same burst through LLM.generate (the vLLM-shaped batch API), for its admission pattern:
    wall time, engine steps and the most sequences that ran together."""
    llm.reset_peak_stats()
    before = engine_stats(llm)
    t0 = time.perf_counter()
    outs = llm.generate(
        [{"prompt_token_ids": ids} for ids in prompts],
        SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
    )
    wall = time.perf_counter() - t0
    after = engine_stats(llm)
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    return {
        "requests": len(prompts),
        "output_tokens": n,
        "wall_s": wall,
        "tokens_per_s": n / wall,
        "steps": after["steps"] - before["steps"],
        "peak_running": after["peak_running"],
        "token_ids": [o.outputs[0].token_ids for o in outs],
    }


def run_sequential(
    llm,
    ids: list[int],
    max_tokens: int,
    session_id=None,
    cache_salt=None,
    messages=None,
    ignore_eos: bool = False,
) -> tuple[RequestTiming, dict]:
    """One request alone (multiturn): its timing and the engine counters it moved."""
    before = engine_stats(llm)
    rt = stream_one(
        llm,
        ids,
        SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos),
        session_id=session_id,
        cache_salt=cache_salt,
        messages=messages,
    )
    return rt, stats_delta(before, engine_stats(llm))
