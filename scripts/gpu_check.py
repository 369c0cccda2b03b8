"""The one prepared GPU check (issue #16): `bash scripts/gpu_check.sh` on the GPU machine.

Stages, one line each, then a verdict; everything also goes to bench/results/gpu-check-*.json:
  env       torch / triton / transformers versions, device, SMs, memory
  kernels   the kernel tests on real Triton (incl. bf16/fp16 attention vs fp64 dense, fused ops)
  numerics  engine vs HF on the same random weights, each shipped config, fp32 and bf16
  bigpool   a pool at 80% of free memory used at its highest block ids (64-bit offsets)
  attention decode attention GB/s at batch 64 x 4k vs the measured copy bandwidth
  speed     decode tok/s at batch 1/8/64/256, engine eager vs CUDA graphs vs HF generate
The verdict is PASS when every correctness stage passes; the issue's performance targets are
reported beside it (met / missed), never silently. --smoke runs tiny shapes on CPU with the
Triton interpreter so CI keeps this script from rotting (tests/test_gpu_check_smoke.py).
A wall-clock budget (default 7.5 min) skips what would not fit and says so.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

CONFIGS = ["llama-3.2-1b", "qwen2.5-0.5b", "llama-3-8b"]


def line(stage: str, ok, msg: str) -> None:
    tag = {True: "ok  ", False: "FAIL", None: "info"}[ok]
    print(f"[gpu-check] {stage:9s} {tag} {msg}", flush=True)


def stage_env(device):
    import torch
    import transformers
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "device": device}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        info.update(gpu=p.name, sms=p.multi_processor_count, mem_gib=total / 2**30, free_gib=free / 2**30)
    msg = f"torch {info['torch']} (cuda {info['cuda']}), triton {info['triton']}, transformers " \
          f"{info['transformers']}" + (f", {info['gpu']} {info['sms']} SMs {info['mem_gib']:.0f} GiB" if device == "cuda" else ", CPU")
    return True, msg, info


def stage_kernels(smoke, remaining):
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
            "tests/kernels", "tests/engine/test_fused_forward.py", "-k", "not sm90"]
    if smoke:
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                "tests/kernels/test_attention_lowp.py", "tests/kernels/test_fused.py", "-k",
                "(16-64-8-2 and triton and decode) or round or (576 and bfloat16) or split_k"]
    try:
        r = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=max(30, remaining))
    except subprocess.TimeoutExpired:
        return False, "timed out", {"timeout": True}
    summary = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
    return r.returncode == 0, summary, {"returncode": r.returncode, "summary": summary,
                                        "tail": r.stdout[-3000:] if r.returncode else ""}


def stage_numerics(device, smoke, deadline):
    from check_numerics import check_config
    results = []
    plan = [("smollm2-135m", "float32", 2), ("smollm2-135m", "bfloat16", 2)] if smoke else \
        [(c, dt, 4) for c in CONFIGS for dt in ("float32", "bfloat16")]
    over = {"vocab_size": 4096} if smoke else None
    for name, dt, layers in plan:
        if time.monotonic() > deadline:
            results.append({"config": name, "dtype": dt, "ok": None, "skipped": "time budget"})
            continue
        try:
            r = check_config(name, dt, device, layers, smoke, over)
        except Exception as e:
            r = {"config": name, "dtype": dt, "ok": False, "error": f"{type(e).__name__}: {e}",
                 "traceback": traceback.format_exc()[-2000:]}
        results.append(r)
        err = r.get("max_abs_err_vs_hf_fp32")
        line("numerics", r["ok"], f"{name} {dt}: " + (f"max err {err:.3g} ({r['rule']}), {r['rows_compared']} rows"
                                                       if err is not None else r.get("error", "skipped")))
    ran = [r for r in results if r["ok"] is not None]
    ok = bool(ran) and all(r["ok"] for r in ran)
    return ok, f"{sum(1 for r in ran if r['ok'])}/{len(ran)} configs within the rules", {"results": results}


def stage_bigpool(device, smoke):
    from check_big_pool import check_big_pool
    r = check_big_pool(device, max_bytes=(32 << 20) if smoke else None, backend="triton" if smoke else None,
                       d=64 if smoke else 128, kvh=2 if smoke else 8)
    return r["ok"], (f"{r['num_blocks']} blocks ({r['pool_gib']:.1f} GiB), max offset {r['max_element_offset']:.3g}"
                     f"{' > 2^31' if r['offsets_past_int32'] else ''}: store {r['store_exact']}, "
                     f"attention {r['attention_ok']}, copy {r['copy_exact']}"), r


def stage_attention(device, smoke):
    from check_speed import attention_bandwidth
    r = attention_bandwidth(device, "float32" if smoke else "bfloat16", 4 if smoke else 64, 256 if smoke else 4096,
                            kvh=2 if smoke else 8, heads=4 if smoke else 32, reps=2 if smoke else 20)
    return None, f"batch {r['batch']} x {r['context']}: {r['attention_gb_s']:.0f} GB/s vs copy {r['copy_gb_s']:.0f} GB/s " \
                 f"({100 * r['ratio']:.0f}%)", r


def stage_speed(device, smoke, deadline):
    from check_speed import engine_decode, hf_decode
    name = "smollm2-135m" if smoke else "llama-3.2-1b"
    over = {"num_hidden_layers": 2, "vocab_size": 4096} if smoke else None
    dt = "float32" if smoke else "bfloat16"
    batches = [1, 4] if smoke else [1, 8, 64, 256]
    plen, new = (8, 8) if smoke else (128, 64)
    out = {"model": name, "dtype": dt, "prompt_len": plen, "new_tokens": new}
    out["graphs"] = engine_decode(name, device, dt, batches, plen, new, False, over, deadline)
    out["eager"] = engine_decode(name, device, dt, batches, plen, new, True, over, deadline)
    out["hf_generate"] = hf_decode(name, device, dt, batches, plen, new, over, deadline)
    cells = []
    for b in batches:
        g, e, h = out["graphs"].get(b), out["eager"].get(b), out["hf_generate"].get(b)
        f = lambda x: f"{x['greedy']:.0f}" if isinstance(x, dict) and isinstance(x.get("greedy"), float) else "-"
        cells.append(f"b{b}: graphs {f(g)} / eager {f(e)} / HF {f(h)}")
    return None, "greedy decode tok/s " + "; ".join(cells), out


def targets(report, device) -> list[dict]:
    """The issue's targets, from what was measured (only meaningful on the H200 run)."""
    from check_speed import weight_bandwidth_bound
    out = []
    sp, at = report.get("speed", {}), report.get("attention", {})
    g, e, h = (sp.get(k, {}) for k in ("graphs", "eager", "hf_generate"))
    ok = lambda x: isinstance(x, dict) and isinstance(x.get("greedy"), float)
    if ok(g.get(1)) and at.get("copy_gb_s"):
        bound = weight_bandwidth_bound(sp["model"], None if device == "cuda" else {"num_hidden_layers": 2, "vocab_size": 4096},
                                       sp["dtype"], at["copy_gb_s"])
        out.append({"target": "batch-1 decode >= 60% of weight-bandwidth bound", "value": g[1]["greedy"] / bound,
                    "met": g[1]["greedy"] >= 0.6 * bound})
    if ok(g.get(64)) and ok(h.get(64)):
        out.append({"target": "batch 64 >= 3x HF generate", "value": g[64]["greedy"] / h[64]["greedy"],
                    "met": g[64]["greedy"] >= 3 * h[64]["greedy"]})
    if at.get("ratio") is not None:
        out.append({"target": "decode attention >= 60% of copy bandwidth (4k)", "value": at["ratio"], "met": at["ratio"] >= 0.6})
    if ok(g.get(1)) and ok(e.get(1)):
        out.append({"target": "CUDA graphs >= 3x eager at batch 1", "value": g[1]["greedy"] / e[1]["greedy"],
                    "met": g[1]["greedy"] >= 3 * e[1]["greedy"]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, interpreted Triton (CI)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="wall-clock budget for the whole check")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/gpu-check-<time>.json)")
    ap.add_argument("--stages", default="env,kernels,numerics,bigpool,attention,speed")
    a = ap.parse_args(argv)
    import torch
    device = "cuda" if torch.cuda.is_available() and not a.smoke else "cpu"
    if device == "cpu" and not a.smoke:
        print("[gpu-check] no CUDA device: running the smoke mode instead (--smoke)", flush=True)
        a.smoke = True
    start = time.monotonic()
    deadline = start + a.budget_s
    report, verdict_ok = {"mode": "smoke" if a.smoke else "full", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, True
    runners = {
        "env": lambda: stage_env(device),
        "kernels": lambda: stage_kernels(a.smoke, deadline - time.monotonic()),
        "numerics": lambda: stage_numerics(device, a.smoke, deadline - 200 if not a.smoke else deadline),
        "bigpool": lambda: stage_bigpool(device, a.smoke),
        "attention": lambda: stage_attention(device, a.smoke),
        "speed": lambda: stage_speed(device, a.smoke, deadline),
    }
    for name in a.stages.split(","):
        t0 = time.monotonic()
        try:
            ok, msg, data = runners[name]()
        except Exception as e:
            ok, msg, data = False, f"{type(e).__name__}: {e}", {"traceback": traceback.format_exc()[-3000:]}
        data = dict(data) if isinstance(data, dict) else {"data": data}
        data.update(ok=ok, seconds=time.monotonic() - t0)
        report[name] = data
        line(name, ok, f"{msg} ({data['seconds']:.1f} s)")
        import gc
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        verdict_ok &= ok is not False
    report["targets"] = targets(report, device)
    for t in report["targets"]:
        line("target", t["met"], f"{t['target']}: {t['value']:.2f}" + ("" if device == "cuda" else " (smoke: not meaningful)"))
    report["verdict"] = "PASS" if verdict_ok else "FAIL"
    report["seconds"] = time.monotonic() - start
    out = Path(a.out) if a.out else REPO / "bench" / "results" / f"gpu-check-{report['mode']}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    met = sum(1 for t in report["targets"] if t["met"])
    print(f"[gpu-check] VERDICT {report['verdict']} ({report['mode']}, {report['seconds']:.0f} s; targets met "
          f"{met}/{len(report['targets'])}) -> {out.relative_to(REPO) if out.is_relative_to(REPO) else out}", flush=True)
    return 0 if verdict_ok else 1


if __name__ == "__main__":
    sys.exit(main())
