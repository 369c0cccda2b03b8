"""The GPU check's first stage: what the machine has, and what each missing piece means.

Why: the check has one command on a machine we have never seen. In its first seconds it records
the versions (torch, CUDA, triton, transformers, pytest), the C compiler and Python headers that
Triton's launcher build needs, free memory and SM count; on CUDA it launches one tiny Triton kernel,
which builds the launcher for real. Each missing piece maps to the stages it would break; those
stages are then "not run" with that reason instead of failing half-way after a long build.
"""

from __future__ import annotations

import os
import platform
import shutil
import sysconfig
import time
from pathlib import Path

TRITON_STAGES = ("kernels", "numerics", "bigpool", "graphs", "kvquant", "attention", "speed")


def _version(mod: str):
    try:
        m = __import__(mod)
        return getattr(m, "__version__", "?")
    except Exception as e:  # noqa: BLE001 - any import failure means "not usable"
        return None if isinstance(e, ImportError) else f"broken: {type(e).__name__}: {e}"


def _major(v) -> int:
    try:
        return int(str(v).split(".")[0])
    except ValueError:
        return 0


def compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc and shutil.which(cc):
        return shutil.which(cc)
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def _triton_probe() -> str | None:
    """Launch a one-element Triton copy on the GPU (builds the launcher); None if it worked."""
    try:
        import torch
        import kernels

        pool = torch.zeros(2, 1, 2, 1, 1, 16, device="cuda")
        pool[:, :, 0] = 1.0
        kernels.copy_blocks(
            pool, torch.tensor([[0, 1]], dtype=torch.int64, device="cuda"), backend="triton"
        )
        torch.cuda.synchronize()
        return (
            None
            if bool((pool[:, :, 1] == 1.0).all())
            else "a Triton block copy returned wrong data"
        )
    except Exception as e:  # noqa: BLE001 - the message is the finding
        return f"{type(e).__name__}: {str(e)[:300]}"


def preflight(device: str) -> tuple[str, str, dict, dict[str, str]]:
    """(status, one-line summary, data, {stage: reason it cannot run})."""
    import torch

    t0 = time.perf_counter()
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "pytest": _version("pytest"),
        "device": device,
        "cc": compiler(),
        "python_headers": (Path(sysconfig.get_paths()["include"]) / "Python.h").exists(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),
    }
    blocked: dict[str, str] = {}
    problems: list[str] = []
    if not info["pytest"] or str(info["pytest"]).startswith("broken") or _major(info["pytest"]) < 8:
        blocked["kernels"] = f"pytest {info['pytest']} (tests/conftest.py needs pytest >= 8)"
        problems.append(blocked["kernels"])
    if not info["transformers"] or str(info["transformers"]).startswith("broken"):
        for s in ("numerics", "speed"):
            blocked[s] = f"transformers {info['transformers']} (the HF reference)"
        problems.append("no transformers: numerics / HF speed not run")
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        info.update(
            gpu=p.name,
            sms=p.multi_processor_count,
            capability=f"{p.major}.{p.minor}",
            mem_gib=round(total / 2**30, 1),
            free_gib=round(free / 2**30, 1),
        )
        if not info["cc"] or not info["python_headers"]:
            problems.append(
                f"C compiler {info['cc']}, Python.h {info['python_headers']}: Triton's launcher build may fail"
            )
        why = (
            "triton missing"
            if not info["triton"] or str(info["triton"]).startswith("broken")
            else _triton_probe()
        )
        info["triton_probe"] = why or "ok"
        if why:
            for s in TRITON_STAGES:
                blocked.setdefault(s, f"Triton unusable on this machine: {why}")
            problems.append(f"Triton unusable: {why}")
    info["seconds"] = round(time.perf_counter() - t0, 2)
    hw = (
        (
            f"{info['gpu']} sm_{info['capability'].replace('.', '')} {info['sms']} SMs, "
            f"{info['free_gib']:.0f}/{info['mem_gib']:.0f} GiB free"
        )
        if device == "cuda"
        else "CPU (smoke)"
    )
    msg = (
        f"torch {info['torch']} (cuda {info['cuda']}), triton {info['triton']}, transformers {info['transformers']}, "
        f"pytest {info['pytest']}, cc {'yes' if info['cc'] else 'NO'}, Python.h "
        f"{'yes' if info['python_headers'] else 'NO'}; {hw}"
        + (f"; PROBLEMS: {'; '.join(problems)}" if problems else "")
    )
    info["problems"] = problems
    info["blocked_stages"] = blocked
    return ("info", msg, info, blocked)
