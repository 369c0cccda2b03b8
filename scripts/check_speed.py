"""GPU check stages: decode throughput (engine eager vs CUDA graphs vs HF generate) and decode
attention bandwidth against the device's copy bandwidth.

Throughput: a dummy Llama-3.2-1B (full depth, bf16) decodes `batch` sequences of equal prompts;
decode tok/s = batch x (N - 1) / (time(N new tokens) - time(1 new token)), so prefill is excluded.
HF `generate` runs the same prompts as one static batch on the same weights.
Attention: one layer's decode at batch 64 x 4k context; bytes = K and V of every context position
(what the kernel must read), against a device-to-device copy (read + write bytes).
"""

from __future__ import annotations

import statistics
import time

import torch

from engine import LLM, SamplingParams
from engine.exec import dummy_weights as dw


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device, reps=1):
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def decode_rate(batch, new_tokens, t1, tn):
    """Decode tok/s from the time of 1 and of N new tokens (prefill cancels); None if too noisy."""
    return batch * (new_tokens - 1) / (tn - t1) if tn > t1 else None


def engine_decode(
    name, device, dtype, batches, prompt_len, new_tokens, enforce_eager, overrides, deadline
):
    """{batch: {"greedy": tok/s, "top_p": tok/s}} for one engine instance."""
    cfg = dw.load_config(name, overrides)
    maxb = max(batches)
    blocks = maxb * (-(-(prompt_len + new_tokens + 1) // 16)) + 64
    llm = LLM(
        model=name,
        load_format="dummy",
        hf_overrides=overrides,
        device=device,
        dtype=dtype,
        num_blocks=blocks,
        max_model_len=prompt_len + new_tokens + 16,
        max_num_seqs=maxb,
        enforce_eager=enforce_eager,
        enable_prefix_caching=False,
    )
    out = {"warmup": dict(llm.engine.runner.warmup_stats)}
    try:
        g = torch.Generator().manual_seed(0)
        for b in batches:
            if time.monotonic() > deadline:
                out[b] = "skipped: time budget"
                continue
            prompts = [
                {
                    "prompt_token_ids": torch.randint(
                        3, cfg.vocab_size, (prompt_len,), generator=g
                    ).tolist()
                }
                for _ in range(b)
            ]
            row = {}
            for mode, sp in (
                ("greedy", dict(temperature=0)),
                ("top_p", dict(temperature=0.7, top_p=0.95, seed=1)),
            ):
                run = lambda n: llm.generate(
                    prompts, SamplingParams(max_tokens=n, ignore_eos=True, **sp)
                )
                probe = _timed(lambda: run(2), device)  # also warms this batch size
                if mode == "top_p" and probe > 3.0:
                    row[mode] = f"skipped: a 2-token probe took {probe:.1f} s (host-side sampling)"
                    continue
                t1 = _timed(lambda: run(1), device)
                tn = _timed(lambda: run(new_tokens), device)
                row[mode] = decode_rate(b, new_tokens, t1, tn)
            out[b] = row
    finally:
        llm.shutdown()
    return out


def hf_decode(name, device, dtype, batches, prompt_len, new_tokens, overrides, deadline):
    cfg = dw.load_config(name, overrides)
    tdt = getattr(torch, dtype)
    hf = dw.hf_model_with_weights(
        cfg, dw.random_weights(cfg, seed=0, device=device, dtype=tdt), tdt, device
    )
    out = {}
    g = torch.Generator().manual_seed(0)
    for b in batches:
        if time.monotonic() > deadline:
            out[b] = "skipped: time budget"
            continue
        x = torch.randint(3, cfg.vocab_size, (b, prompt_len), generator=g).to(device)
        gen = lambda n: hf.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
        with torch.no_grad():
            gen(2)
            t1 = _timed(lambda: gen(1), device)
            tn = _timed(lambda: gen(new_tokens), device)
        out[b] = {"greedy": decode_rate(b, new_tokens, t1, tn)}
    hf = None  # free the model before the next one loads
    return out


def attention_bandwidth(device, dtype, batch, ctx, kvh=8, heads=32, d=64, bs=16, reps=20) -> dict:
    """Decode attention GB/s (K+V bytes read) vs device copy GB/s (read + write)."""
    import kernels

    tdt = getattr(torch, dtype)
    nblk = batch * (ctx // bs)
    k = torch.randn(nblk + 1, bs, kvh, d, device=device).to(tdt)
    v = torch.randn_like(k)
    perm = torch.randperm(nblk, device=device).add_(1).to(torch.int32)
    tables = perm.view(batch, ctx // bs)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=device)
    q = torch.randn(batch, heads, d, device=device).to(tdt)
    attn = lambda: kernels.paged_attention(q, k, v, tables, seq_lens, cu, d**-0.5, max_seqlen_q=1)
    attn()
    t_attn = _timed(attn, device, reps)
    kv_bytes = 2 * batch * ctx * kvh * d * k.element_size()
    src = torch.empty(kv_bytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t_copy = _timed(lambda: dst.copy_(src), device, reps)
    attn_gbs = kv_bytes / t_attn / 1e9
    copy_gbs = 2 * src.numel() / t_copy / 1e9
    return {
        "batch": batch,
        "context": ctx,
        "attention_gb_s": attn_gbs,
        "copy_gb_s": copy_gbs,
        "ratio": attn_gbs / copy_gbs,
        "attention_ms": t_attn * 1e3,
    }


def weight_bandwidth_bound(name, overrides, dtype, copy_gbs) -> float:
    """Batch-1 decode tok/s if every weight is read once per token at the measured copy bandwidth."""
    cfg = dw.load_config(name, overrides)
    shapes = dw._param_shapes(cfg)
    params = sum(torch.Size(s).numel() for s in shapes.values())
    return copy_gbs * 1e9 / (params * torch.empty((), dtype=getattr(torch, dtype)).element_size())
