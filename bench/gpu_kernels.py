"""GPU benchmark of the paged-attention kernels (H200-sized, a few minutes).

    python bench/gpu_kernels.py              # on a CUDA machine; writes bench/results/gpu_kernels.{json,md}
    python bench/gpu_kernels.py --dry-run    # tiny shapes on CPU under the Triton interpreter

Measures: device copy bandwidth (clone of >= 4 GB, reported as read+write bytes / time); decode
(batch x context x block size, bf16, 32 q / 8 kv heads, d=128): time, KV bytes read per second,
% of copy bandwidth, speed vs torch SDPA on a contiguous cache of the same lengths; prefill with a
cached prefix: TFLOP/s (causally visible pairs only) and speed vs SDPA; bf16 spot checks of the
Triton kernels against the torch reference. Timing: CUDA events, warmup, L2 flushed before each
rep (a real model reads each layer's KV once per step), median of reps; GPU time only (a short
GPU sleep before each rep hides host launch overhead, as CUDA graphs would in an engine).
Imports only torch, triton (through kernels/) and the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if "--dry-run" in sys.argv:  # must precede the first triton import (kernels imports it lazily)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import kernels  # noqa: E402
from kernels import reference  # noqa: E402

H, KVH, D = 32, 8, 128  # Llama-2/3-7B-like attention with GQA (group 4)


class Timer:
    def __init__(self, dev, dry):
        self.dev, self.dry = dev, dry
        self.flush = None if dry else torch.empty(256 << 20, dtype=torch.uint8, device=dev)

    def __call__(self, fn, reps=20, warmup=3):
        """Median milliseconds of fn over reps, L2 flushed before each."""
        for _ in range(warmup):
            fn()
        if self.dry:
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(ts)
        ev = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(reps)
        ]
        for a, b in ev:
            self.flush.zero_()
            torch.cuda._sleep(1_000_000)  # keep the GPU busy so host launch overhead is hidden
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) for a, b in ev)


def copy_bandwidth(dev, timer, nbytes):
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), reps=10, warmup=2)
    src = dst = None  # free the buffers before the next measurement
    return 2 * nbytes / (ms * 1e-3) / 1e9  # read + write


def kernel_names(dev, fn):
    """Names of the GPU kernels fn launches (to say which SDPA backend really ran)."""
    if dev.type != "cuda":
        return "cpu"
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = {e.key for e in prof.key_averages() if e.device_type.name == "CUDA"}
        return "; ".join(sorted(n[:70] for n in names))[:300]
    except Exception as e:  # the names are informative only; never fail the run over them
        return f"unknown (profiler: {type(e).__name__})"


def pick_sdpa(q, k, v, **kw):
    """First SDPA backend that accepts these inputs with native GQA (no K/V repeat)."""
    order = [
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("math", SDPBackend.MATH),
    ]
    for name, backend in order:
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
            return name, backend
        except RuntimeError:
            continue
    raise RuntimeError("no SDPA backend ran")


def paged_pool(dev, n_tokens_per_seq, bs, gen_seed=0):
    """Random bf16 K/V for sequences of the given lengths, blocks scattered over the pool."""
    torch.manual_seed(gen_seed)
    need = [-(-n // bs) for n in n_tokens_per_seq]
    nb = sum(need) + 1
    kv = torch.randn(2, nb, bs, KVH, D, device=dev, dtype=torch.bfloat16)
    perm = (torch.randperm(nb - 1, device=dev) + 1).to(torch.int32)
    bt = torch.zeros(len(need), max(need), dtype=torch.int32, device=dev)
    off = 0
    for i, n in enumerate(need):
        bt[i, :n] = perm[off : off + n]
        off += n
    return kv, bt


def bench_decode(dev, timer, copy_gbs, args, rows):
    batches, ctxs, bss = args.batches, args.contexts, args.block_sizes
    spent, skipped = 0.0, []
    sdpa_name = None
    for ctx in ctxs:
        for b in batches:
            kv_bytes = 2 * b * ctx * KVH * D * 2
            est = 3 * kv_bytes * 60 / (copy_gbs * 1e9) + 2 * kv_bytes / 50e9  # runs + setup
            if spent + len(bss) * est > args.decode_budget_s or 2 * kv_bytes > args.max_gb * 1e9:
                skipped.append(f"B={b} ctx={ctx}")
                continue
            t0 = time.perf_counter()
            q = torch.randn(b, H, D, device=dev, dtype=torch.bfloat16)
            # baseline: the same lengths in a contiguous [B, kvh, ctx, d] cache, measured once
            kc = torch.randn(b, KVH, ctx, D, device=dev, dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            q4 = q.view(b, H, 1, D)
            if sdpa_name is None:
                sdpa_name, sdpa_backend = pick_sdpa(q4, kc, vc)
                sdpa_kernels = kernel_names(dev, lambda: sdpa_call(q4, kc, vc, sdpa_backend))
            ms_sdpa = timer(lambda: sdpa_call(q4, kc, vc, sdpa_backend), reps=args.reps)
            kc = vc = None  # freed before the next allocation (the lambdas above hold the names)
            seq = torch.full((b,), ctx, dtype=torch.int32, device=dev)
            cu = torch.arange(b + 1, dtype=torch.int32, device=dev)
            for bs in bss:
                kv, bt = paged_pool(dev, [ctx] * b, bs)
                fn = lambda: kernels.paged_attention(
                    q, kv[0], kv[1], bt, seq, cu, D**-0.5, max_seqlen_q=1, backend="triton"
                )
                ms = timer(fn, reps=args.reps)
                kv = bt = None
                gbs = kv_bytes / (ms * 1e-3) / 1e9
                rows.append(
                    dict(
                        kind="decode",
                        batch=b,
                        context=ctx,
                        block_size=bs,
                        ms=ms,
                        kv_gb_s=gbs,
                        pct_copy_bw=100 * gbs / copy_gbs,
                        sdpa_ms=ms_sdpa,
                        speed_vs_sdpa=ms_sdpa / ms,
                    )
                )
            spent += time.perf_counter() - t0
    return dict(
        sdpa_backend=sdpa_name,
        sdpa_kernels=sdpa_kernels if sdpa_name else None,
        skipped=skipped,
        seconds=spent,
    )


def sdpa_call(q, k, v, backend, **kw):
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)


def prefill_flops(prefix, chunk):
    pairs = chunk * prefix + chunk * (chunk + 1) // 2  # causally visible (query, key) pairs
    return 4 * D * H * pairs  # QK^T and PV, 2 flops per multiply-add


def bench_prefill(dev, timer, args, rows):
    from torch.nn.attention.bias import causal_lower_right

    info = {}
    for b, prefix, chunk in args.prefill_cases:
        for bs in args.prefill_block_sizes:
            ctx = prefix + chunk
            kv, bt = paged_pool(dev, [ctx] * b, bs)
            q = torch.randn(b * chunk, H, D, device=dev, dtype=torch.bfloat16)
            seq = torch.full((b,), ctx, dtype=torch.int32, device=dev)
            cu = torch.arange(0, b * chunk + 1, chunk, dtype=torch.int32, device=dev)
            fn = lambda: kernels.paged_attention(
                q, kv[0], kv[1], bt, seq, cu, D**-0.5, max_seqlen_q=chunk, backend="triton"
            )
            ms = timer(fn, reps=args.reps)
            kv = bt = None
            kc = torch.randn(b, KVH, ctx, D, device=dev, dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            q4 = q.view(b, chunk, H, D).transpose(1, 2)
            sdpa, name = prefill_sdpa(q4, kc, vc, causal_lower_right(chunk, ctx))
            info.setdefault(name, kernel_names(dev, sdpa))
            ms_sdpa = timer(sdpa, reps=args.reps)
            kc = vc = None  # freed before the next allocation (the lambdas above hold the names)
            fl = b * prefill_flops(prefix, chunk)
            rows.append(
                dict(
                    kind="prefill",
                    batch=b,
                    prefix=prefix,
                    chunk=chunk,
                    block_size=bs,
                    ms=ms,
                    tflops=fl / (ms * 1e-3) / 1e12,
                    sdpa_backend=name,
                    sdpa_ms=ms_sdpa,
                    sdpa_tflops=fl / (ms_sdpa * 1e-3) / 1e12,
                    speed_vs_sdpa=ms_sdpa / ms,
                )
            )
    return info


def prefill_sdpa(q, k, v, bias):
    """SDPA baseline for a chunk after a prefix (lower-right causal): native GQA if it runs,
    else K/V repeated per query head (outside the timed call)."""
    try:
        F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
        return (
            lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True),
            "causal_lower_right+gqa",
        )
    except (RuntimeError, TypeError, ValueError):
        k2, v2 = (t.repeat_interleave(H // KVH, 1) for t in (k, v))
        return (
            lambda: F.scaled_dot_product_attention(q, k2, v2, attn_mask=bias),
            "causal_lower_right+repeat_kv",
        )


def spot_checks(dev, dry):
    """bf16 Triton vs the torch reference (both on dev) and both vs an fp32 reference."""
    res = {}
    bs, lens = 16, [1, 17, 150, 300] if dry else [1, 17, 300, 2100]
    for name, qls in (
        ("decode", [1, 1, 1, 1]),
        ("decode_split8", [1, 1, 1, 1]),
        ("extend", [1, 9, 100, 70 if dry else 700]),
    ):
        kv, bt = paged_pool(dev, lens, bs, gen_seed=1)
        cu = torch.tensor([0] + torch.tensor(qls).cumsum(0).tolist(), dtype=torch.int32, device=dev)
        seq = torch.tensor(lens, dtype=torch.int32, device=dev)
        q = torch.randn(sum(qls), H, D, device=dev, dtype=torch.bfloat16)
        args = (q, kv[0], kv[1], bt, seq, cu, D**-0.5, max(qls))
        from kernels import triton_attention

        out = triton_attention.paged_attention(*args, num_splits=8 if "split" in name else None)
        ref = reference.paged_attention(*args)
        kv32 = kv.float()
        ref32 = reference.paged_attention(q.float(), kv32[0], kv32[1], *args[3:])
        e_tr = (out.float() - ref.float()).abs().max().item()
        res[name] = dict(
            triton_vs_ref=e_tr,
            triton_vs_fp32=(out.float() - ref32).abs().max().item(),
            ref_vs_fp32=(ref.float() - ref32).abs().max().item(),
            ok=e_tr < 3e-2,
        )
    pool = torch.randn(2, 3, 20, bs, KVH, D, device=dev, dtype=torch.bfloat16)
    p2 = pool.clone()
    pairs = torch.tensor([[1, 5], [2, 6]], device=dev)
    kernels.copy_blocks(pool, pairs, backend="triton")
    reference.copy_blocks(p2, pairs)
    key = torch.randn(7, KVH, D, device=dev, dtype=torch.bfloat16)
    slots = torch.tensor([3, -1, 40, 41, 0, 99, -1], device=dev)
    kernels.store_kv(key, key, pool[0, 1], pool[1, 1], slots, backend="triton")
    reference.store_kv(key, key, p2[0, 1], p2[1, 1], slots)
    res["store_and_copy_exact"] = dict(ok=bool(torch.equal(pool, p2)))
    return res


def markdown(meta, rows, checks):
    out = [
        f"# Paged attention kernels on {meta['device']}",
        "",
        f"torch {meta['torch']}, triton {meta['triton']}; q/kv heads {H}/{KVH}, d={D}, bf16. "
        f"Copy bandwidth (read+write): **{meta['copy_gb_s']:.0f} GB/s**. "
        f"Decode SDPA baseline: {meta['decode']['sdpa_backend']} "
        f"(kernels: {meta['decode']['sdpa_kernels']}).",
        "",
        "## Decode",
        "",
        "| batch | context | block | ms | KV GB/s | % copy BW | SDPA ms | speed vs SDPA |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["kind"] == "decode":
            out.append(
                f"| {r['batch']} | {r['context']} | {r['block_size']} | {r['ms']:.3f} | "
                f"{r['kv_gb_s']:.0f} | {r['pct_copy_bw']:.0f}% | {r['sdpa_ms']:.3f} | "
                f"{r['speed_vs_sdpa']:.2f}x |"
            )
    if meta["decode"]["skipped"]:
        out += ["", f"Skipped (time/memory budget): {', '.join(meta['decode']['skipped'])}"]
    out += [
        "",
        "## Prefill with cached prefix",
        "",
        "| seqs | prefix | chunk | block | ms | TFLOP/s | SDPA | SDPA TFLOP/s | speed vs SDPA |",
        "|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        if r["kind"] == "prefill":
            out.append(
                f"| {r['batch']} | {r['prefix']} | {r['chunk']} | {r['block_size']} | "
                f"{r['ms']:.3f} | {r['tflops']:.1f} | {r['sdpa_backend']} | "
                f"{r['sdpa_tflops']:.1f} | {r['speed_vs_sdpa']:.2f}x |"
            )
    out += [
        "",
        f"SDPA kernels: {meta['prefill_sdpa']}",
        "",
        "## bf16 spot checks (max abs error)",
        "",
        "| check | ok | triton vs ref | triton vs fp32 | ref vs fp32 |",
        "|---|---|---:|---:|---:|",
    ]
    for k, c in checks.items():
        out.append(
            f"| {k} | {c['ok']} | {c.get('triton_vs_ref', 0):.2e} | "
            f"{c.get('triton_vs_fp32', 0):.2e} | {c.get('ref_vs_fp32', 0):.2e} |"
        )
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes, CPU, Triton interpreter")
    ap.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--decode-budget-s", type=float, default=150.0)
    ap.add_argument(
        "--max-gb", type=float, default=40.0, help="max paged K+V bytes per decode case"
    )
    args = ap.parse_args()
    dry = args.dry_run
    dev = torch.device("cpu" if dry else "cuda")
    if not dry and not torch.cuda.is_available():
        sys.exit("no CUDA device: use --dry-run for the CPU/interpreter smoke run")
    global H, KVH, D
    if dry:
        H, KVH, D = 8, 2, 64
        args.batches, args.contexts, args.block_sizes, args.reps = [1, 2], [64, 200], [16, 32], 2
        args.prefill_cases, args.prefill_block_sizes = [(1, 0, 40), (2, 48, 20)], [16]
    else:
        args.batches, args.block_sizes, args.reps = [1, 8, 32, 128], [16, 32, 64], 20
        args.contexts = [512, 1024, 2048, 4096, 8192, 16384, 32768]
        args.prefill_cases = [
            (1, 0, 4096),
            (1, 4096, 2048),
            (1, 16384, 2048),
            (4, 2048, 512),
            (8, 1024, 1024),
            (16, 8192, 128),
        ]
        args.prefill_block_sizes = [16, 64]
    timer = Timer(dev, dry)
    t_start = time.perf_counter()
    copy_gbs = copy_bandwidth(dev, timer, (64 << 20) if dry else (4 << 30))
    checks = spot_checks(dev, dry)
    rows = []
    decode_info = bench_decode(dev, timer, copy_gbs, args, rows)
    prefill_info = bench_prefill(dev, timer, args, rows)
    meta = dict(
        device=torch.cuda.get_device_name(dev) if not dry else "CPU (interpreter dry run)",
        torch=torch.__version__,
        triton=__import__("triton").__version__,
        copy_gb_s=copy_gbs,
        decode=decode_info,
        prefill_sdpa=prefill_info,
        seconds=time.perf_counter() - t_start,
        dry_run=dry,
    )
    md = markdown(meta, rows, checks)
    print(md)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "gpu_kernels_dryrun" if dry else "gpu_kernels"
    (out_dir / f"{stem}.json").write_text(
        json.dumps(dict(meta=meta, rows=rows, checks=checks), indent=1, default=str)
    )
    (out_dir / f"{stem}.md").write_text(md)
    print(f"wrote {out_dir / stem}.json/.md in {meta['seconds']:.0f} s")
    if not all(c["ok"] for c in checks.values()):
        sys.exit("bf16 spot check FAILED")


if __name__ == "__main__":
    main()
