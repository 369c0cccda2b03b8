"""The machine: what it is (cores, CPU, torch, commit) and what it can do (GEMM FLOP/s, read bandwidth).

The limits turn into two ceilings for a decoder of P parameters in fp32:
  compute-bound tokens/s (large batch) = GEMM FLOP/s / (2 x P)        -- every weight is one FMA
  weight-bandwidth-bound tokens/s (batch 1) = read bytes/s / (4 x P)  -- every weight is read once
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time

import torch

GEMM_SHAPES = {  # name: (m, k, n)
    "decode_b32_mlp_up [32,576]x[576,1536]": (32, 576, 1536),
    "decode_b64_mlp_down [64,1536]x[1536,576]": (64, 1536, 576),
    "lm_head_b32 [32,576]x[576,49152]": (32, 576, 49152),
    "square_2048": (2048, 2048, 2048),
    "gemv_b1 [1,576]x[576,1536]": (1, 576, 1536),
}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit(repo: str) -> dict:
    def git(*args):
        try:
            return subprocess.run(
                ["git", "-C", repo, *args], capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "commit": git("rev-parse", "HEAD") or "unknown",
        "dirty_files": len([x for x in git("status", "--porcelain").splitlines() if x.strip()]),
    }


def machine_info(repo: str) -> dict:
    import transformers

    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "affinity_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        "memory_gib": round(mem / 2**30, 1),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        **git_commit(repo),
    }


def _median_time(fn, reps: int, min_time: float = 0.0) -> float:
    fn()  # warm-up
    times = []
    t_start = time.perf_counter()
    while len(times) < reps or time.perf_counter() - t_start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 10 * reps:
            break
    return statistics.median(times)


@torch.inference_mode()
def gemm_flops(
    m: int, k: int, n: int, reps: int = 5, dtype=torch.float32, min_time: float = 0.2
) -> float:
    """FLOP/s of x[m,k] @ W^T with W stored [n,k] like a linear layer (F.linear)."""
    x, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
    inner = max(1, int(2e8 // (2 * m * k * n)))  # keep each timed call >= ~1 ms of work
    t = _median_time(
        lambda: [torch.nn.functional.linear(x, w) for _ in range(inner)], reps, min_time
    )
    return 2 * m * k * n * inner / t


@torch.inference_mode()
def gemm_flops_cold(
    m: int, k: int, n: int, total_mib: int = 256, reps: int = 3, min_time: float = 0.2
) -> float:
    """Like gemm_flops but cycling through distinct weights (total_mib of them, far more than the
    caches hold), the way a forward pass streams 30 layers' weights from memory every step."""
    x = torch.randn(m, k)
    ws = [torch.randn(n, k) for _ in range(max(2, total_mib * 2**20 // (4 * n * k)))]
    t = _median_time(lambda: [torch.nn.functional.linear(x, w) for w in ws], reps, min_time)
    return 2 * m * k * n * len(ws) / t


@torch.inference_mode()
def read_bandwidth(mib: int = 512, reps: int = 5, min_time: float = 0.3) -> float:
    """Bytes/s of a full read of a tensor much larger than the caches (a sum)."""
    x = torch.ones(mib * 2**20 // 4)
    t = _median_time(lambda: x.sum(), reps, min_time)
    return x.numel() * 4 / t


def measure_limits(num_params: int, quick: bool = False) -> dict:
    # quick (the smoke test): every figure once, no minimum time; its numbers mean nothing anyway
    reps, mt = (1, 0.0) if quick else (7, None)
    t = {} if mt is None else {"min_time": mt}
    gemm = {name: gemm_flops(*shape, reps=reps, **t) for name, shape in GEMM_SHAPES.items()}
    cold = {
        "cold_weights_b32 [32,576]x[576,1536]": gemm_flops_cold(
            32, 576, 1536, 64 if quick else 256, **t
        ),
        "cold_weights_b1 [1,576]x[576,1536]": gemm_flops_cold(
            1, 576, 1536, 64 if quick else 256, **t
        ),
    }
    bf16 = {
        name: gemm_flops(*GEMM_SHAPES[name], reps=reps, dtype=torch.bfloat16, **t)
        for name in ("decode_b32_mlp_up [32,576]x[576,1536]", "square_2048")
    }
    bw = read_bandwidth(256 if quick else 512, reps, **t)
    peak = max(gemm.values())
    realistic = gemm["decode_b32_mlp_up [32,576]x[576,1536]"]
    return {
        "gemm_flops": gemm,
        "gemm_flops_cold_weights": cold,
        "gemm_flops_bf16": bf16,
        "read_bytes_per_s": bw,
        "num_params": num_params,
        "weight_bytes_fp32": 4 * num_params,
        "compute_bound_tok_s": peak / (2 * num_params),
        "compute_bound_tok_s_b32_shape": realistic / (2 * num_params),
        "compute_bound_tok_s_b32_cold": cold["cold_weights_b32 [32,576]x[576,1536]"]
        / (2 * num_params),
        "weight_bw_bound_tok_s": bw / (4 * num_params),
        "compute_bound_tok_s_bf16": max(bf16.values()) / (2 * num_params),
        "weight_bw_bound_tok_s_bf16": bw / (2 * num_params),
        "gemv_bound_tok_s_b1_cold": cold["cold_weights_b1 [1,576]x[576,1536]"] / (2 * num_params),
        "loadavg": os.getloadavg(),
        "time": time.time(),
    }


def combine_limits(samples: list[dict]) -> dict:
    """Several measurements in one run (start, end): the best of each is the machine's ceiling."""
    best = dict(samples[0])
    for key in (
        "compute_bound_tok_s",
        "compute_bound_tok_s_b32_shape",
        "compute_bound_tok_s_b32_cold",
        "weight_bw_bound_tok_s",
        "gemv_bound_tok_s_b1_cold",
        "read_bytes_per_s",
        "compute_bound_tok_s_bf16",
        "weight_bw_bound_tok_s_bf16",
    ):
        best[key] = max(s[key] for s in samples)
    for group in ("gemm_flops", "gemm_flops_cold_weights", "gemm_flops_bf16"):
        best[group] = {k: max(s[group][k] for s in samples) for k in samples[0][group]}
    best["samples"] = samples
    return best
