"""python -m bench --kv-dtypes [--dtypes float32,bfloat16,int8] [--batch 32] [--context 1500]

What each KV cache format buys, side by side in one run (issue 22), weights in fp32 throughout:
- capacity: bytes per token, and how many sessions of the default chat workload (bench/workloads.py,
  32 sessions at their final length, cycled) fit in a 256 MiB pool with paging + prefix sharing
  (bench/report.sessions_fit);
- speed: decode tokens/s at batch 32 with ~1,500-token contexts, where attention reads dominate.
  Each format gets its own engine; its prompts are prefilled once (prefix cache), then
  t(1 + N new tokens) - t(1 new token) over the cached prompts is N decode steps of the batch.
  Two rounds per format, median kept; formats run one after the other in the same process.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

MIB = 2**20


def capacity_rows(
    tokenizer, dtypes, layers, kv_heads, head_dim, block_size=16, sessions=32
) -> list[dict]:
    import torch
    from bench.report import sessions_fit
    from bench.suite import Sizes
    from bench.workloads import chat_workload, common_prefix_len
    from kernels import kv_quant

    sz = Sizes(sessions=sessions)  # the default chat workload of `python -m bench`
    reqs = chat_workload(tokenizer, sessions, sz.out_min, sz.out_max, 0)
    prompts, outs = [len(r.prompt_ids) for r in reqs], [r.max_tokens for r in reqs]
    shared = common_prefix_len([r.prompt_ids for r in reqs])
    rows = []
    for dt in dtypes:
        bpt = kv_quant.bytes_per_token(
            layers, kv_heads, head_dim, kv_quant.pool_dtype(dt, torch.float32)
        )
        fit = sessions_fit(prompts, outs, shared, block_size, bpt)
        by = {
            r["scheme"].split(",")[0].split(" +")[0]
            + ("+sharing" if "sharing" in r["scheme"] else ""): r
            for r in fit["rows"]
        }
        rows.append(
            {
                "kv_cache_dtype": dt,
                "bytes_per_token": bpt,
                "tokens_in_256mib": fit["budget_tokens"],
                "sessions_paging": by["paging"]["sessions"],
                "sessions_paging_sharing": by["paging+sharing"]["sessions"],
            }
        )
    return rows


def decode_speed(kv: str, batch: int, context: int, new_tokens: int, rounds: int = 2) -> dict:
    from engine import LLM
    from engine.sampling.sampling_params import SamplingParams

    gib = (
        1.15 * batch * (context + new_tokens + 32) * 46080 / 2**30
    )  # fp32-sized: every format fits
    llm = LLM(
        kv_cache_gib=gib,
        dtype="float32",
        kv_cache_dtype=kv,
        max_num_seqs=batch,
        max_model_len=context + new_tokens + 32,
        progress=lambda f, m: None,
    )
    try:
        rng = random.Random(0)
        vocab = llm.model_info().vocab_size
        prompts = [
            {"prompt_token_ids": [rng.randrange(100, vocab) for _ in range(context)]}
            for _ in range(batch)
        ]
        p = lambda n: SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        llm.generate(prompts, p(1))  # prefill once: every later run hits the cache
        samples = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            llm.generate(prompts, p(1))
            t1 = time.perf_counter()
            llm.generate(prompts, p(1 + new_tokens))
            t2 = time.perf_counter()
            samples.append(batch * new_tokens / max(1e-9, (t2 - t1) - (t1 - t0)))
        info = llm.model_info()
        return {
            "kv_cache_dtype": kv,
            "decode_tokens_per_s": statistics.median(samples),
            "samples": samples,
            "kv_bytes_per_token": info.kv_bytes_per_token,
        }
    finally:
        llm.shutdown()


def attention_micro(
    dtypes, batch: int, context: int, rounds: int = 5, per_round: int = 4
) -> list[dict]:
    """One layer's decode attention alone (the C++ in-place kernel), SmolLM2's shape, shuffled
    16-token blocks, B x context: median ms per call per pool format, rounds interleaved."""
    import torch
    from kernels import cpu_attention, kv_quant, reference

    H, KVH, D, BS = 9, 3, 64, 16
    g = torch.Generator().manual_seed(0)
    per = -(-context // BS)
    nb = batch * per + 1
    k, v = torch.randn(nb, BS, KVH, D, generator=g), torch.randn(nb, BS, KVH, D, generator=g)
    tables = (
        (torch.randperm(nb - 1, generator=g)[: batch * per] + 1).view(batch, per).to(torch.int32)
    )
    q = torch.randn(batch, H, D, generator=g)
    lens = torch.full((batch,), context, dtype=torch.int32)
    cu = torch.arange(batch + 1, dtype=torch.int32)
    pools = {}
    for dt in dtypes:
        pd = kv_quant.pool_dtype(dt, torch.float32)
        pools[dt] = (
            (kv_quant.quantize_rows(k, pd), kv_quant.quantize_rows(v, pd))
            if kv_quant.is_quantized_dtype(pd)
            else (k.to(pd), v.to(pd))
        )
    times = {dt: [] for dt in dtypes}
    with torch.inference_mode():
        for _ in range(rounds):
            for dt in dtypes:
                kc, vc = pools[dt]
                for _ in range(per_round):
                    t = time.perf_counter()
                    reference.paged_attention(q, kc, vc, tables, lens, cu, D**-0.5, max_seqlen_q=1)
                    times[dt].append(time.perf_counter() - t)
    return [
        {
            "kv_cache_dtype": dt,
            "attention_ms_per_layer": 1e3 * statistics.median(times[dt]),
            "path": cpu_attention.active_path(),
        }
        for dt in dtypes
    ]


def render(cap: list[dict], speed: list[dict]) -> str:
    base = {r["kv_cache_dtype"]: r for r in cap}
    sp = {r["kv_cache_dtype"]: r for r in speed}
    f32, b16 = base.get("float32"), base.get("bfloat16")
    lines = [
        "| KV cache dtype | bytes/token | tokens in 256 MiB | chat sessions in 256 MiB (paging / +sharing) "
        "| x fp32 sessions | x bf16 sessions | decode tok/s, B=32, ~1.5k ctx | x bf16 decode |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in cap:
        s = r["sessions_paging_sharing"]
        d = sp.get(r["kv_cache_dtype"], {}).get("decode_tokens_per_s")
        db = sp.get("bfloat16", {}).get("decode_tokens_per_s")
        lines.append(
            f"| {r['kv_cache_dtype']} | {r['bytes_per_token']:,} | {r['tokens_in_256mib']:,} | "
            f"{r['sessions_paging']} / {s} | {s / f32['sessions_paging_sharing']:.2f}x | "
            f"{s / b16['sessions_paging_sharing']:.2f}x | "
            + (f"{d:.1f}" if d else "-")
            + " | "
            + (f"{d / db:.2f}x" if d and db else "-")
            + " |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench --kv-dtypes")
    p.add_argument("--dtypes", default="float32,bfloat16,int8")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=1500)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--no-speed", action="store_true", help="skip the end-to-end decode runs")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    from engine.exec.loader import load_model

    loaded = load_model(None)
    c = loaded.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    dtypes = a.dtypes.split(",")
    load0 = os.getloadavg()
    cap = capacity_rows(
        loaded.tokenizer, dtypes, c.num_hidden_layers, c.num_key_value_heads, head_dim
    )
    micro = attention_micro(dtypes, a.batch, a.context)
    speed = (
        [] if a.no_speed else [decode_speed(d, a.batch, a.context, a.new_tokens) for d in dtypes]
    )
    md = render(cap, speed)
    b = {r["kv_cache_dtype"]: r["attention_ms_per_layer"] for r in micro}
    md += (
        (
            "\n\n| KV cache dtype | decode attention, one layer, B=%d x %d ctx (ms, median) | speed vs bf16 KV |\n|---|---|---|\n"
            % (a.batch, a.context)
        )
        + "\n".join(
            f"| {r['kv_cache_dtype']} | {r['attention_ms_per_layer']:.2f} | "
            + (f"{b['bfloat16'] / r['attention_ms_per_layer']:.2f}x" if "bfloat16" in b else "-")
            + " |"
            for r in micro
        )
        + f"\n\n({micro[0]['path']})"
    )
    print(md)
    print(f"\nload average start {load0}, end {os.getloadavg()}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "capacity": cap,
                    "speed": speed,
                    "attention_micro": micro,
                    "loadavg": [load0, os.getloadavg()],
                    "markdown": md,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
