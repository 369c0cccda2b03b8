"""Turn raw runs (per-request token times) into the numbers we report, and combine repetitions."""

from __future__ import annotations

import statistics

ROW_FIELDS = (
    "requests",
    "output_tokens",
    "wall_s",
    "tokens_per_s",
    "decode_tokens_per_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "itl_p50_s",
    "itl_p95_s",
    "peak_kv_bytes",
    "prompt_tokens",
    "prefill_tokens_computed",
    "prefill_tokens_cached",
)


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for no data."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def decode_rate(timings) -> float | None:
    """Steady-state decode tokens/s: from the moment every request has its first token to the last
    token, counting the tokens received in that window (prefill excluded)."""
    starts = [t.token_times[0] for t in timings if t.token_times]
    if not starts:
        return None
    t_start = max(starts)
    t_end = max(t.token_times[-1] for t in timings if t.token_times)
    n = sum(1 for t in timings for x in t.token_times if x > t_start)
    return n / (t_end - t_start) if t_end > t_start and n else None


def summarize(run: dict, system: str) -> dict:
    """One run -> one row. `run` has timings, wall_s, peak_kv_bytes and optional counters."""
    ts = run["timings"]
    out_tokens = sum(len(t.token_ids) for t in ts)
    ttfts = [t.ttft for t in ts]
    itls = [x for t in ts for x in t.itls]
    prompt = sum(t.prompt_tokens for t in ts)
    cached = run.get("prefill_tokens_cached")
    if cached is None:
        cached = sum(t.cached_tokens for t in ts)
    computed = run.get("prefill_tokens_computed")
    if computed is None:
        computed = run.get("stats", {}).get("prompt_tokens_computed_total", prompt - cached)
    row = {
        "system": system,
        "requests": len(ts),
        "output_tokens": out_tokens,
        "wall_s": run["wall_s"],
        "tokens_per_s": out_tokens / run["wall_s"] if run["wall_s"] > 0 else None,
        "decode_tokens_per_s": decode_rate(ts),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "itl_p50_s": percentile(itls, 50),
        "itl_p95_s": percentile(itls, 95),
        "peak_kv_bytes": run.get("peak_kv_bytes"),
        "prompt_tokens": prompt,
        "prefill_tokens_computed": computed,
        "prefill_tokens_cached": cached,
    }
    for extra in (
        "stats",
        "setup_s",
        "timed_out",
        "finished",
        "failed_or_missing",
        "kv_bytes_kind",
        "generated_tokens_computed",
        "note",
        "subsample",
        "peak_used_blocks",
        "kv_bytes_per_block",
    ):
        if extra in run:
            row[extra] = run[extra]
    return row


def combine(rows: list[dict]) -> dict:
    """Repetitions of one system -> medians of every numeric field, plus the per-rep throughputs."""
    if len(rows) == 1:
        return {**rows[0], "reps": 1, "tokens_per_s_reps": [rows[0]["tokens_per_s"]]}
    out = dict(rows[0])
    for k in ROW_FIELDS:
        vals = [r[k] for r in rows if r.get(k) is not None]
        if vals and all(v == vals[0] for v in vals):
            out[k] = vals[0]  # counts that do not vary stay integers
        else:
            out[k] = statistics.median(vals) if vals else None
    out["reps"] = len(rows)
    out["tokens_per_s_reps"] = [r["tokens_per_s"] for r in rows]
    out["decode_tokens_per_s_reps"] = [r["decode_tokens_per_s"] for r in rows]
    return out


def ratio(a, b) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


def token_match(ref_timings, other_timings) -> dict:
    """How many requests produced exactly the same ids (greedy, same prompts) as the reference."""
    pairs = list(zip(ref_timings, other_timings))
    same = sum(1 for a, b in pairs if a.token_ids == b.token_ids)
    first_div = []
    for a, b in pairs:
        if a.token_ids != b.token_ids:
            n = next(
                (i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
                min(len(a.token_ids), len(b.token_ids)),
            )
            first_div.append(n)
    return {"compared": len(pairs), "identical": same, "first_divergence_positions": first_div[:20]}
