"""Read a serving engine's Prometheus /metrics text into one engine-neutral `Sample`.

Why one Sample: the Memory tab draws the same timelines whatever the backend is; only the metric
names differ. Names per engine (summed over label sets, e.g. several model_name / tp_rank):

  what                 vLLM (and app.py)                    SGLang (--enable-metrics)     llama.cpp (--metrics)
  KV usage 0..1        vllm:kv_cache_usage_perc             sglang:token_usage            llamacpp:kv_cache_usage_ratio
                       (older: vllm:gpu_cache_usage_perc)
  prefix queries/hits  vllm:prefix_cache_queries/hits(_total)  sglang:prompt_tokens_total /  -
                       (older: vllm:gpu_prefix_cache_*)        sglang:cached_tokens_total,
                                                               or sglang:cache_hit_rate (gauge)
  running / waiting    vllm:num_requests_running/waiting    sglang:num_running_reqs /     llamacpp:requests_processing /
                                                             sglang:num_queue_reqs         llamacpp:requests_deferred
  preemptions          vllm:num_preemptions(_total)         -                             -
  prompt / gen tokens  vllm:prompt_tokens_total /           sglang:prompt_tokens_total /  llamacpp:prompt_tokens_total /
                       vllm:generation_tokens_total         sglang:generation_tokens_total llamacpp:tokens_predicted_total
A field the backend does not export stays None, and the dashboard says so instead of drawing 0.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?$')


def parse(text: str) -> dict[str, float]:
    """Metric name -> value summed over its label sets (histogram _bucket lines are skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m or m.group(1).endswith("_bucket"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


@dataclass(frozen=True)
class Sample:
    engine: str | None = None  # "vLLM" / "SGLang" / "llama.cpp" / None (unknown)
    kv_usage: float | None = None  # 0..1
    prefix_queries: float | None = None  # counters, tokens
    prefix_hits: float | None = None
    hit_rate_gauge: float | None = None  # SGLang's own 0..1 gauge when no counters
    running: float | None = None
    waiting: float | None = None
    preemptions: float | None = None  # counter
    prompt_tokens: float | None = None  # counters
    generation_tokens: float | None = None

    def missing(self) -> list[str]:
        return [
            f.name
            for f in fields(self)
            if f.name not in ("engine", "hit_rate_gauge") and getattr(self, f.name) is None
        ]


def _first(m: dict, *names: str) -> float | None:
    for n in names:
        for name in (n, n + "_total"):
            if name in m:
                return m[name]
    return None


def sample(metrics: dict[str, float]) -> Sample:
    m = metrics
    if any(k.startswith("vllm:") for k in m):
        return Sample(
            "vLLM",
            kv_usage=_first(m, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            prefix_queries=_first(m, "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
            prefix_hits=_first(m, "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
            running=_first(m, "vllm:num_requests_running"),
            waiting=_first(m, "vllm:num_requests_waiting"),
            preemptions=_first(m, "vllm:num_preemptions"),
            prompt_tokens=_first(m, "vllm:prompt_tokens"),
            generation_tokens=_first(m, "vllm:generation_tokens"),
        )
    if any(k.startswith("sglang:") for k in m):
        cached = _first(m, "sglang:cached_tokens")
        prompt = _first(m, "sglang:prompt_tokens")
        return Sample(
            "SGLang",
            kv_usage=_first(m, "sglang:token_usage"),
            prefix_queries=prompt if cached is not None else None,
            prefix_hits=cached,
            hit_rate_gauge=_first(m, "sglang:cache_hit_rate"),
            running=_first(m, "sglang:num_running_reqs"),
            waiting=_first(m, "sglang:num_queue_reqs"),
            prompt_tokens=prompt,
            generation_tokens=_first(m, "sglang:generation_tokens"),
        )
    if any(k.startswith("llamacpp:") for k in m):
        return Sample(
            "llama.cpp",
            kv_usage=_first(m, "llamacpp:kv_cache_usage_ratio"),
            running=_first(m, "llamacpp:requests_processing"),
            waiting=_first(m, "llamacpp:requests_deferred"),
            prompt_tokens=_first(m, "llamacpp:prompt_tokens"),
            generation_tokens=_first(m, "llamacpp:tokens_predicted"),
        )
    return Sample()
