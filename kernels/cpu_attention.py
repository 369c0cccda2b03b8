"""CPU decode attention that reads the paged pool in place: a small C++/OpenMP library
(kernels/csrc/cpu_paged_decode.cpp, built and loaded by kernels/cpu_build.py).

Without a compiler, or if the build fails, the pure-torch gather path is used; `active_path()`
says which, and the first use logs it once. Set PAGED_CHAT_CPU_KERNEL=0 to force the torch path.
"""

from __future__ import annotations

import ctypes
import logging
import threading

import torch

from kernels import kv_quant
from kernels.cpu_build import CSRC, build, profiled

log = logging.getLogger("paged_chat.kernels")
SOURCE = CSRC / "cpu_paged_decode.cpp"
_lock = threading.Lock()
_state: dict = {}
_FN = {
    torch.float32: "paged_decode_f32",
    torch.bfloat16: "paged_decode_bf16",
    torch.int8: "paged_decode_i8",
}


def _build() -> ctypes.CDLL | None:
    dll, _state["why"] = build(SOURCE)
    if dll is None:
        return None
    i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    for name in ("paged_decode_f32", "paged_decode_bf16", "paged_decode_i8"):
        fn = getattr(dll, name)
        fn.argtypes = [p, p, p, p, p, p, i, i, i, i, i, i, f, i, i]
        fn.restype = None
    g, d, b = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    dll.paged_decode_limits(ctypes.byref(g), ctypes.byref(d), ctypes.byref(b))
    _state["limits"] = (g.value, d.value, b.value)
    return dll


def _lib() -> ctypes.CDLL | None:
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                try:
                    _state["lib"] = _build()
                except Exception as e:  # never let the fast path break the engine
                    _state["lib"], _state["why"] = None, f"build failed: {e}"
                log.info("CPU decode attention: %s", active_path())
    return _state["lib"]


def active_path() -> str:
    """'cpp (...)' when the compiled kernel is in use, else 'torch (why)'."""
    if "lib" not in _state:
        _lib()
    return ("cpp: " if _state.get("lib") is not None else "torch gather fallback: ") + _state["why"]


def supports(query: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Shapes and dtypes the kernel handles; anything else takes the torch path."""
    if query.device.type != "cpu" or k_cache.dtype not in _FN:
        return False
    if _lib() is None:
        return False
    g, d, b = _state["limits"]
    _, bs, kvh, _ = k_cache.shape
    hd = kv_quant.head_dim_of(k_cache)
    return (
        query.shape[1] % kvh == 0
        and query.shape[1] // kvh <= g
        and hd <= d
        and bs <= b
        and k_cache.is_contiguous()
    )


def paged_decode(
    query, k_cache, v_cache, block_tables, seq_lens, scale, out=None, window=None
) -> torch.Tensor:
    """query [B, H, d] (one token per sequence); caches [num_blocks, bs, kvh, row] contiguous views
    of the pool (row = d, or d codes + a 4-byte scale for int8, kernels/kv_quant.py); block_tables
    int32 [B, W]; seq_lens int32 [B] (>= 1); window: sliding-window attention, each query sees its
    last `window` positions and blocks before them are never read (None / 0: all). Returns out [B, H, d]."""
    lib = _lib()
    B, H, d = query.shape
    _, bs, kvh, _ = k_cache.shape
    q = query.to(torch.float32).contiguous()
    direct = out is not None and out.dtype == torch.float32 and out.is_contiguous()  # no copy back
    res = out if direct else torch.empty(B, H, d, dtype=torch.float32)
    tables = block_tables.to(torch.int32).contiguous()
    lens = seq_lens.to(torch.int32).contiguous()
    fn = getattr(lib, _FN[k_cache.dtype])
    with profiled("cpu_paged_decode"):  # visible to bench.profile_decode
        fn(
            q.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            tables.data_ptr(),
            lens.data_ptr(),
            res.data_ptr(),
            B,
            H,
            kvh,
            d,
            bs,
            tables.shape[1],
            float(scale),
            torch.get_num_threads(),
            int(window or 0),
        )
    if out is None:
        return res.to(query.dtype)
    if not direct:
        out.copy_(res)
    return out
