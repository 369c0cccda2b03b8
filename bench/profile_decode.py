"""Where does a decode step go? python -m bench.profile_decode [--batches 1,32] [--steps 16] [--threads N]

Drives an LLMEngine directly in this thread (no front thread), lets every sequence finish its
prefill, then times pure decode steps in three layers:
  step wall            engine.step(): schedule + runner + sample + detokenize/stream
  runner.run           building the batch tensors + model forward (+ logits to CPU)
  model.forward        the torch ops (split by torch.profiler into categories below)
The wrappers are installed on this process's objects only; no engine file is changed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

CATEGORIES = [  # (category, substrings of aten op names), first match wins
    ("GEMM (linear / lm_head)", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "mkldnn")),
    (
        "attention SDPA",
        (
            "cpu_paged_decode",
            "scaled_dot_product",
            "_flash_attention",
            "_efficient_attention",
            "aten::softmax",
        ),
    ),
    (
        "attention gather (index_select/where/arange/mask)",
        (
            "aten::index_select",
            "aten::where",
            "aten::arange",
            "aten::lt",
            "aten::floor_divide",
            "aten::remainder",
            "aten::div",
            "aten::index",
        ),
    ),
    ("KV store (index_copy_)", ("aten::index_copy", "aten::all", "aten::ge")),
    ("fused C++ layer ops (norm / rope+store / act)", ("cpu_fused_",)),
    (
        "norm / rope / act / residual (elementwise)",
        (
            "aten::mul",
            "aten::add",
            "aten::rsqrt",
            "aten::pow",
            "aten::mean",
            "aten::cat",
            "aten::neg",
            "aten::silu",
            "aten::sub",
            "aten::embedding",
        ),
    ),
    (
        "copies / layout",
        (
            "aten::copy_",
            "aten::to",
            "aten::_to_copy",
            "aten::contiguous",
            "aten::clone",
            "aten::empty",
            "aten::slice",
            "aten::view",
            "aten::reshape",
            "aten::transpose",
            "aten::select",
            "aten::expand",
            "aten::unsqueeze",
            "aten::item",
            "aten::_local_scalar",
        ),
    ),
]


def category(name: str) -> str:
    for cat, keys in CATEGORIES:
        if any(k in name for k in keys):
            return cat
    return "other ops"


def timed(obj, attr: str, bucket: list):
    fn = getattr(obj, attr)

    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            bucket.append(time.perf_counter() - t0)

    setattr(obj, attr, wrapper)


def profile_batch(eng, tok, batch: int, steps: int, seed: int, prompt_len: int = 16) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import engine.core.sample_isolated as isolated  # where the step loop calls the sampler
    from bench.workloads import decode_prompts
    from engine.sampling.sampling_params import SamplingParams
    from engine.core.sequence import Request

    prompts = decode_prompts(tok, batch, prompt_len, seed)
    params = SamplingParams(temperature=0.0, max_tokens=steps * 2 + 8, ignore_eos=True)
    for i, ids in enumerate(prompts):
        eng.add_request(
            Request(f"p{batch}-{prompt_len}-{i}", ids, params, cache_salt=f"prof-{batch}-{i}")
        )
    while any(s.first_token_time is None for r in eng.requests.values() for s in r.seqs):
        eng.step()  # prefill done: every request has a token
    for _ in range(2):
        eng.step()  # warm-up decode steps
    b_run, b_fwd, b_sample, b_step = [], [], [], []
    timed(eng.runner, "run_on_device", b_run)  # what LLMEngine.step calls
    timed(eng.runner.model, "forward", b_fwd)
    orig_sample = isolated.sample_batch
    isolated.sample_batch = lambda *a, **kw: _timed_call(orig_sample, b_sample, *a, **kw)
    try:
        for _ in range(steps):  # timed without the profiler
            t0 = time.perf_counter()
            eng.step()
            b_step.append(time.perf_counter() - t0)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                eng.step()
    finally:
        isolated.sample_batch = orig_sample
        del eng.runner.run_on_device, eng.runner.model.forward  # drop the instance wrappers
    for rid in list(eng.requests):
        eng.abort_request(rid)
    n = steps
    step, run, fwd, smp = (sum(b[:n]) / n for b in (b_step, b_run, b_fwd, b_sample))
    fwd_prof = sum(b_fwd[n : 2 * n]) / n  # forward wall while profiled
    cats = defaultdict(float)
    for ev in prof.key_averages():
        cats[category(ev.key)] += ev.self_cpu_time_total / 1e6 / steps
    # time inside forward but in no op: the Python interpreter between ops (and the profiler's own)
    cats["Python between ops (forward wall - op self times)"] = max(
        0.0, fwd_prof - sum(cats.values())
    )
    scale = fwd / fwd_prof if fwd_prof else 0.0  # the profiler inflates: shares of the real time
    ops = {k: v * scale for k, v in sorted(cats.items(), key=lambda kv: -kv[1])}
    top = [
        (e.key, e.self_cpu_time_total / 1e6 / steps, e.count // steps)
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:15]
    ]
    return {
        "batch": batch,
        "context": prompt_len,
        "steps_timed": n,
        "step_s": step,
        "tokens_per_s": batch / step,
        "breakdown_s": {
            "scheduler + bookkeeping + detokenize/stream (step - run - sample)": step - run - smp,
            "runner: batch tensors (run_on_device - forward)": run - fwd,
            "sampling (argmax etc.)": smp,
            **{f"forward: {k}": v for k, v in ops.items()},
        },
        "op_calls_per_step": sum(e.count for e in prof.key_averages()) / steps,
        "forward_s": fwd,
        "forward_profiled_s": fwd_prof,
        "top_ops": top,
        "threads": torch.get_num_threads(),
    }


def _timed_call(fn, bucket, *a, **kw):
    t0 = time.perf_counter()
    try:
        return fn(*a, **kw)
    finally:
        bucket.append(time.perf_counter() - t0)


def render(results: list[dict]) -> str:
    lines = []
    for r in results:
        lines += [
            f"### decode batch {r['batch']}, context ~{r['context']} tokens: {r['step_s'] * 1000:.1f} ms/step = {r['tokens_per_s']:.1f} tok/s "
            f"({r['threads']} threads, ~{r['op_calls_per_step']:.0f} aten ops per step)",
            "",
            "| where | ms/step | share |",
            "|---|---|---|",
        ]
        for k, v in r["breakdown_s"].items():
            lines.append(f"| {k} | {v * 1000:.1f} | {100 * v / r['step_s']:.0f}% |")
        lines += [
            "",
            "Top ops by self time (profiled, not rescaled): "
            + ", ".join(f"{k} {v * 1000:.1f} ms x{c}" for k, v, c in r["top_ops"][:8]),
            "",
        ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile_decode")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument(
        "--prompt-len", type=int, default=16, help="prompt tokens per sequence (context)"
    )
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | auto")
    p.add_argument("--out", default=None, help="JSON path (Markdown next to it)")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as engine/__init__.py does
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from engine.config import EngineConfig
    from engine.core.llm_engine import LLMEngine
    from engine.exec.loader import load_model

    loaded = load_model(None, progress=lambda f, m: None)
    eng = LLMEngine(EngineConfig(kv_cache_gib=0.5, dtype=args.dtype), loaded)
    load = os.getloadavg()
    results = [
        profile_batch(eng, loaded.tokenizer, int(b), args.steps, 0, args.prompt_len)
        for b in args.batches.split(",")
    ]
    md = f"Load average {load[0]:.2f} -> {os.getloadavg()[0]:.2f}\n\n" + render(results)
    print(md)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"loadavg": [load, os.getloadavg()], "results": results}, f, indent=1, default=str
            )
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
