"""How fast this machine can read a model's weights, and what that allows one chat (issue 49).

    python -m bench.read_ceiling [--mb 425] [--repeats 8] [--model-mb 538]

Why: a batch-1 decode step reads every weight once, so its token rate is bounded by the memory
read rate, whatever the kernel. This compiles a plain read loop (AVX-512 when the CPU has it: four
independent 16-lane adds, no arithmetic worth the name) and times it over `--mb` megabytes on 1
and 2 threads, on ordinary 4 KiB pages and on 2 MiB pages (madvise(MADV_HUGEPAGE) before the first
touch, what engine/exec/huge_pages.py does for the weights), with the array also cut into 150
pieces each split between the threads (a decode step's five products per layer over 30 layers).
It prints the best GB/s of each and the decode bound they imply for a model of `--model-mb`
(the default: SmolLM2-135M in fp32, 538 MB with its tied embedding read once as the LM head).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import tempfile

SOURCE = r"""
#include <immintrin.h>
#include <sys/mman.h>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

// reads n floats with nt threads; the array cut into `pieces`, each split between the threads,
// with a spin barrier after each piece (as a decode step's products are); returns seconds
static double read_once(const float* a, long n, int nt, int pieces) {
  std::atomic<int> arrived{0};
  std::vector<float> sink(nt * 16);
  auto t0 = std::chrono::steady_clock::now();
  auto work = [&](int t) {
#if defined(__AVX512F__)
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
#else
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#endif
    const long per = n / pieces;
    for (int p = 0; p < pieces; ++p) {
      const long lo = p * per + per * t / nt, hi = p * per + per * (t + 1) / nt;
      for (long i = lo; i + 64 <= hi; i += 64) {
#if defined(__AVX512F__)
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(a + i));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps(a + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_loadu_ps(a + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_loadu_ps(a + i + 48));
#else
        for (int j = 0; j < 64; j += 4) { s0 += a[i + j]; s1 += a[i + j + 1]; s2 += a[i + j + 2]; s3 += a[i + j + 3]; }
#endif
      }
      if (pieces > 1) {
        const int target = (p + 1) * nt;
        arrived.fetch_add(1);
        while (arrived.load() < target) {}
      }
    }
#if defined(__AVX512F__)
    sink[t * 16] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
#else
    sink[t * 16] = s0 + s1 + s2 + s3;
#endif
  };
  std::vector<std::thread> th;
  for (int t = 1; t < nt; ++t) th.emplace_back(work, t);
  work(0);
  for (auto& x : th) x.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

extern "C" {
// an array of `bytes` filled with ones: 2 MiB-aligned, on huge pages when `huge` (else madvise
// NOHUGEPAGE, so the kernel's default cannot give it huge pages either)
void* ceiling_alloc(long bytes, int huge) {
  void* p = std::aligned_alloc(2 << 20, (bytes + (2 << 20) - 1) / (2 << 20) * (2 << 20));
  if (p == nullptr) return nullptr;
  madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  float* f = static_cast<float*>(p);
  for (long i = 0; i < bytes / 4; ++i) f[i] = 1.0f;
  return p;
}
void ceiling_free(void* p) { std::free(p); }
double ceiling_read(const void* p, long bytes, int nt, int pieces, int repeats) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const double s = read_once(static_cast<const float*>(p), bytes / 4, nt, pieces);
    if (s < best) best = s;
  }
  return best;
}
}
"""


def build() -> ctypes.CDLL:
    d = tempfile.mkdtemp(prefix="read-ceiling-")
    src, so = os.path.join(d, "ceiling.cpp"), os.path.join(d, "ceiling.so")
    with open(src, "w") as f:
        f.write(SOURCE)
    subprocess.run(
        [
            "g++",
            "-O2",
            "-march=native",
            "-shared",
            "-fPIC",
            "-std=c++17",
            "-pthread",
            src,
            "-o",
            so,
        ],
        check=True,
    )
    lib = ctypes.CDLL(so)
    lib.ceiling_alloc.argtypes, lib.ceiling_alloc.restype = (
        [ctypes.c_long, ctypes.c_int],
        ctypes.c_void_p,
    )
    lib.ceiling_free.argtypes, lib.ceiling_free.restype = [ctypes.c_void_p], None
    lib.ceiling_read.argtypes = [
        ctypes.c_void_p,
        ctypes.c_long,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
    ]
    lib.ceiling_read.restype = ctypes.c_double
    return lib


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.read_ceiling", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--mb", type=int, default=425, help="megabytes read per pass")
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--model-mb", type=float, default=538.0, help="bytes a decode step reads, MB")
    a = p.parse_args(argv)
    lib = build()
    nbytes = a.mb * 10**6
    print(
        f"# read ceiling: {a.mb} MB a pass, best of {a.repeats}; load {os.getloadavg()[0]:.2f}, "
        f"{os.cpu_count()} CPUs\n\n| pages | threads | pieces | GB/s | bound for {a.model_mb:.0f} MB a token |"
        "\n|---|---|---|---|---|"
    )
    best = 0.0
    for huge in (0, 1):
        buf = lib.ceiling_alloc(nbytes, huge)
        if not buf:
            raise SystemExit("out of memory")
        try:
            for nt, pieces in ((1, 1), (2, 1), (2, 150)):
                s = lib.ceiling_read(buf, nbytes, nt, pieces, a.repeats)
                gbs = nbytes / s / 1e9
                best = max(best, gbs)
                print(
                    f"| {'2 MiB' if huge else '4 KiB'} | {nt} | {pieces} | {gbs:.1f} | "
                    f"{gbs * 1e3 / a.model_mb:.0f} tok/s |"
                )
        finally:
            lib.ceiling_free(buf)
    print(f"\nbest: {best:.1f} GB/s = at most {best * 1e3 / a.model_mb:.0f} tok/s for one chat")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
