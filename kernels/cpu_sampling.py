"""The sampler's per-row statistics in one compiled pass on CPU: top-K candidates + log-sum-exp.

Why: the sampler's fast path needs both for every sampled row; in torch that is `topk` plus a full
`log_softmax` — two parallel passes over [B, vocab], the second writing a vocab-wide output that is
only read at one column. kernels/csrc/cpu_sampler_rows.cpp reads each row once. `row_stats`
returns None where the kernel cannot run (no compiler, PAGED_CHAT_CPU_KERNEL=0, not a contiguous
fp32 CPU tensor); the sampler then keeps its torch ops. `active_path()` says which is in use.
"""

from __future__ import annotations

import ctypes
import logging
import threading

import torch

from kernels.cpu_build import CSRC, build, profiled

log = logging.getLogger("paged_chat.kernels")
_lock = threading.Lock()
# above this many candidates the heap loses to torch.topk's selection (measured, 32 x 49,152 real
# logits: K=256 3.6 vs 5.7 ms, K=4,096 34 vs 23 ms), so the sampler's wider tier stays on torch
MAX_K = 512
_state: dict = {}


def _lib():
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                try:
                    dll, why = build(CSRC / "cpu_sampler_rows.cpp")
                    if dll is not None:
                        p, i, L = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
                        dll.sampler_row_stats.argtypes = [p, i, L, i, p, p, p, i]
                        dll.sampler_row_stats.restype = None
                except Exception as e:  # never let the fast path break sampling
                    dll, why = None, f"build failed: {e}"
                _state["lib"], _state["why"] = dll, why
                log.info("CPU sampler row pass: %s", active_path())
    return _state["lib"]


def active_path() -> str:
    lib = _lib()
    return ("cpp: " if lib is not None else "torch topk + log_softmax: ") + _state["why"]


def row_stats(logits: torch.Tensor, k: int):
    """logits [R, V] fp32 CPU -> (values [R, k], token ids int64 [R, k] in no particular order,
    logsumexp [R]); None if the compiled pass is unavailable for this input."""
    if (
        logits.device.type != "cpu"
        or logits.dtype != torch.float32
        or logits.dim() != 2
        or not logits.is_contiguous()
        or not 0 < k <= min(MAX_K, logits.shape[1])
    ):
        return None
    lib = _lib()
    if lib is None:
        return None
    R, V = logits.shape
    vals = torch.empty(R, k, dtype=torch.float32)
    idx = torch.empty(R, k, dtype=torch.int64)
    lse = torch.empty(R, dtype=torch.float32)
    with profiled("cpu_sampler_row_stats"):
        lib.sampler_row_stats(
            logits.data_ptr(),
            R,
            V,
            k,
            vals.data_ptr(),
            idx.data_ptr(),
            lse.data_ptr(),
            torch.get_num_threads(),
        )
    return vals, idx, lse
