"""Weights the CPU decode step streams, moved into memory backed by 2 MiB pages (issue 49).

Why: a decode step at batch 1 reads every weight once, and on this box the read rate, not the
arithmetic, sets the token rate. With 4 KiB pages the hardware prefetcher stops at every page
boundary and each page costs a TLB miss: two threads summing 425 MB of fp32 read it at ~30 GB/s;
the same bytes on transparent huge pages at ~38 GB/s (one thread: 18 -> 33 GB/s). Linux gives
anonymous memory huge pages only where a program asks (`/sys/kernel/mm/transparent_hugepage/enabled`
is `madvise` here and on most distributions), and torch's allocator does not ask, so the tensors the
lean step reads are copied once, at load time, into one anonymous mapping that does ask
(`madvise(MADV_HUGEPAGE)` before its first touch).

One arena per call: the tensors become views of it; the caller drops the originals (so the memory
is moved, not doubled). Where the OS has no such call (not Linux) or `PAGED_CHAT_HUGE_PAGES=0` is
set (for A/B measurements), the tensors are returned as they are.
"""

from __future__ import annotations

import mmap
import os

import torch

from engine.exec.load_checks import available_memory_bytes

HUGE_PAGE = 2 << 20
_ALIGN = 4096  # each tensor starts on its own 4 KiB page


def enabled() -> bool:
    """Whether weights are moved to huge pages on this machine."""
    return (
        os.environ.get("PAGED_CHAT_HUGE_PAGES", "1") != "0"
        and hasattr(mmap, "MADV_HUGEPAGE")
        and hasattr(mmap, "MAP_ANONYMOUS")
    )


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _mapping(nbytes: int) -> torch.Tensor | None:
    """nbytes of zeroed anonymous memory asking for huge pages, as a uint8 tensor starting on a
    2 MiB boundary (the tensor keeps the mapping alive), or None if the OS refuses."""
    try:
        buf = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf.madvise(mmap.MADV_HUGEPAGE)  # before the first write: the faults then take 2 MiB pages
    except (OSError, ValueError):
        return None
    arena = torch.frombuffer(buf, dtype=torch.uint8)
    skip = (-arena.data_ptr()) % HUGE_PAGE
    return arena[skip : skip + nbytes]


class Arena:
    """One huge-page mapping that tensors are copied into, one after another (`take`). Pages are
    touched only as tensors arrive, so a caller that drops each original after its copy holds
    about one tensor twice at a time, not the whole model."""

    def __init__(self, nbytes: int):
        self.nbytes = _round_up(max(nbytes, 1), _ALIGN)
        self.mem = _mapping(self.nbytes)
        self.used = 0

    @staticmethod
    def size_of(tensors) -> int:
        """The bytes an arena needs for these tensors (each on its own 4 KiB page)."""
        return sum(_round_up(t.numel() * t.element_size(), _ALIGN) for t in tensors)

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of t (same dtype, shape, values) in the arena; t itself where it does not fit."""
        n = t.numel() * t.element_size()
        if self.mem is None or self.used + n > self.nbytes or not t.numel():
            return t
        view = self.mem[self.used : self.used + n].view(t.dtype).view(t.shape)
        view.copy_(t)
        self.used += _round_up(n, _ALIGN)
        return view


def arena_for(tensors) -> Arena | None:
    """An arena for these CPU tensors, or None where huge pages are not asked for, or where the
    copy would not fit comfortably in the memory left (a big checkpoint's tensors may still be
    held by the loader while they are copied)."""
    if not enabled():
        return None
    nbytes = Arena.size_of(tensors)
    if nbytes == 0 or 2 * nbytes > (available_memory_bytes() or 0):
        return None
    arena = Arena(nbytes)
    return arena if arena.mem is not None else None


def zeros(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled CPU tensor on huge pages (the KV pool: attention reads its blocks scattered
    across the whole pool, where 4 KiB pages cost a TLB miss per few rows), or torch.zeros where
    huge pages are not asked for. Anonymous memory is zero until written: nothing is cleared."""
    n = 1
    for d in shape:
        n *= int(d)
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    mem = _mapping(nbytes) if enabled() and nbytes >= HUGE_PAGE else None
    return torch.zeros(shape, dtype=dtype) if mem is None else mem.view(dtype).view(shape)


def huge_page_bytes() -> int:
    """Bytes of this process's memory on transparent huge pages (/proc/self/smaps_rollup), or -1."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            kb = [ln.split()[1] for ln in f if ln.startswith("AnonHugePages:")]
    except OSError:
        return -1
    return int(kb[0]) * 1024 if kb else -1
