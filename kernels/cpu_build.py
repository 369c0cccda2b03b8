"""Build and load the small C++/OpenMP CPU kernels in kernels/csrc/ (ctypes, no torch headers).

Why not torch.utils.cpp_extension: including torch's headers makes every cold build take a minute
or more on a busy 2-core box; these kernels need no torch API, only pointers, so each is compiled
directly with the system C++ compiler in ~1 s and called through ctypes (which releases the GIL).
They link -fopenmp; torch has already loaded its libgomp.so.1, so both share one OpenMP runtime
and the thread count follows torch.get_num_threads() (passed per call).

Each library is built lazily on first use into ~/.cache/paged-chat/cpu_kernels/<name>_<hash>.so,
keyed on the source, the compiler and the CPU flags (-march=native). Without a compiler, or if the
build fails, `build` returns None and a reason, and the caller keeps its pure-torch path.
PAGED_CHAT_CPU_KERNEL=0 disables every compiled kernel.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"
CACHE = (
    Path(os.environ.get("PAGED_CHAT_CACHE", Path.home() / ".cache" / "paged-chat")) / "cpu_kernels"
)


def _cpu_flags() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def build(
    source: Path, flags: tuple[str, ...] = ("-ffp-contract=fast",)
) -> tuple[ctypes.CDLL | None, str]:
    """(library, description) or (None, why not). `flags`: numerics flags (the layer ops need
    -ffp-contract=off to round where torch rounds)."""
    if os.environ.get("PAGED_CHAT_CPU_KERNEL", "1") == "0":
        return None, "disabled by PAGED_CHAT_CPU_KERNEL=0"
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return None, "no C++ compiler found"
    src = source.read_bytes() + b"".join(
        h.read_bytes() for h in sorted(source.parent.glob("*.h"))
    )  # + shared headers
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(
        src + version.encode() + _cpu_flags().encode() + " ".join(flags).encode()
    ).hexdigest()[:16]
    lib = CACHE / f"{source.stem}_{key}.so"
    if not lib.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=CACHE)
        os.close(fd)
        cmd = [
            cxx,
            "-O3",
            "-march=native",
            *flags,
            "-fopenmp",
            "-shared",
            "-fPIC",
            "-std=c++17",
            str(source),
            "-o",
            tmp,
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            os.unlink(tmp)
            return None, f"build failed: {res.stderr.strip()[:500]}"
        os.replace(tmp, lib)  # atomic: concurrent builders never see a half-written file
    return ctypes.CDLL(str(lib)), f"C++/OpenMP kernel {lib.name}"


class LazyLibrary:
    """One kernel library, built and loaded on first use, once per process (thread-safe).
    `declare(dll)` sets its ctypes signatures; `disable_env`=0 turns it off. Never raises: a
    failed build or declare leaves `lib` None and says why (the caller keeps its fallback)."""

    def __init__(
        self,
        source: Path,
        flags: tuple[str, ...],
        *,
        disable_env: str | None = None,
        declare=None,
        label: str = "",
    ):
        import threading

        self.source, self.flags, self.disable_env, self.declare = (
            source,
            flags,
            disable_env,
            declare,
        )
        self.label = label or source.stem
        self._lock = threading.Lock()
        self._done = False
        self._lib: ctypes.CDLL | None = None
        self.why = ""

    @property
    def lib(self) -> ctypes.CDLL | None:
        if not self._done:
            with self._lock:
                if not self._done:
                    self._load()
                    self._done = True
        return self._lib

    def _load(self) -> None:
        import logging

        if self.disable_env and os.environ.get(self.disable_env, "1") == "0":
            self.why = f"disabled by {self.disable_env}=0"
        else:
            try:
                dll, self.why = build(self.source, self.flags)
                if dll is not None and self.declare is not None:
                    self.declare(dll)
                self._lib = dll
            except Exception as e:  # never let the fast path break the engine
                self._lib, self.why = None, f"build failed: {e}"
        logging.getLogger(
            "paged_chat.kernels"
        ).info(  # not active_path(): it would take the lock again
            "%s: %s%s", self.label, "cpp: " if self._lib is not None else "off: ", self.why
        )

    def active_path(self) -> str:
        return ("cpp: " if self.lib is not None else "off: ") + self.why


_NO_LABEL = contextlib.nullcontext()


def profiled(name: str):
    """A label for torch's profiler (bench.profile_decode sorts the C++ kernels' time by it), or
    nothing when no profiler runs: `record_function` costs ~5 us even then, and a batch-1 decode
    step makes ~150 of these calls."""
    import torch

    if getattr(torch.autograd.profiler, "_is_profiler_enabled", True):
        return torch.profiler.record_function(name)
    return _NO_LABEL
