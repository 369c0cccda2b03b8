#pragma once
// A decoder layer's small ops fused on CPU (shared by cpu_layer_ops.cpp and cpu_lean_step.cpp): residual-add + RMSNorm, RoPE + KV store, SiLU * up.
//
// Why: in eager torch each of these is 3-9 separate ops (RMSNorm alone: to, pow, mean, add, rsqrt,
// mul, to, mul), each a dispatch plus a pass over memory; at decode sizes the dispatch dominates.
// One call per fused op here. Numerics follow the torch expressions in engine/models/llama.py op by
// op: every intermediate that torch would round to the model dtype is rounded here too (fp32: the
// same single roundings; bf16: round-to-nearest-even to bf16 after each torch op), and this file
// is compiled with -ffp-contract=off so no multiply-add is fused where torch rounds between them.
// Only reductions (the RMS mean) may sum in another order: a few ulps, which the fp32 greedy
// equality with HF and the bf16 tolerance rule in tests/ absorb.
//
// Layouts: activations [T, width] contiguous. qkv rows: [H q heads | KVH k heads | KVH v heads] of
// D each. cos/sin tables [P, D] in the model dtype. KV cache slabs [num_slots, KVH, D] (the
// [num_blocks, block_size, KVH, D] pool slab of one layer, flattened), slot -1 = skip.
#include <cmath>
#include "fast_exp.h"
#include <cstdint>
#include <cstring>
#include <algorithm>

namespace layer_ops {

struct F32 {
  using T = float;
  static float ld(const float* p, long i) { return p[i]; }
  static float rnd(float x) { return x; }
  static void st(float* p, long i, float x) { p[i] = x; }
};

struct BF16 {
  using T = uint16_t;
  static float ld(const uint16_t* p, long i) {
    uint32_t b = static_cast<uint32_t>(p[i]) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  static uint16_t to_bits(float x) {   // round to nearest even, NaN kept quiet
    uint32_t b;
    std::memcpy(&b, &x, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40);
    b += 0x7fffu + ((b >> 16) & 1u);
    return static_cast<uint16_t>(b >> 16);
  }
  static float rnd(float x) {
    uint32_t b = static_cast<uint32_t>(to_bits(x)) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  static void st(uint16_t* p, long i, float x) { p[i] = to_bits(x); }
};


constexpr long kParallelMin = 1L << 16;   // below this many elements one thread is faster

// if delta: x += delta (rounded); out = w * dtype(x_f32 * rsqrt(mean(x_f32^2) + eps))
template <typename K>
void add_rms_norm(typename K::T* x, const typename K::T* delta, const typename K::T* w,
                  typename K::T* out, long T, long D, float eps, int nthreads) {
#pragma omp parallel for schedule(static) num_threads(nthreads) if (T * D >= kParallelMin)
  for (long t = 0; t < T; ++t) {
    typename K::T* xr = x + t * D;
    if (delta != nullptr) {
      const typename K::T* dr = delta + t * D;
      for (long j = 0; j < D; ++j) K::st(xr, j, K::ld(xr, j) + K::ld(dr, j));
    }
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (long j = 0; j < D; ++j) {
      const float v = K::ld(xr, j);
      ss += v * v;
    }
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
    typename K::T* o = out + t * D;
    for (long j = 0; j < D; ++j) K::st(o, j, K::ld(w, j) * K::rnd(K::ld(xr, j) * r));
  }
}

// q heads rotated into q_out [T, H, D]; k heads rotated and v copied into the cache slots
template <typename K>
void rope_store(const typename K::T* qkv, long T, int H, int KVH, int D, const typename K::T* cos,
                const typename K::T* sin, const int64_t* pos, const int64_t* slots,
                typename K::T* q_out, typename K::T* kc, typename K::T* vc, int nthreads) {
  const int half = D / 2;
  const long row = static_cast<long>(H + 2 * KVH) * D;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (T * row >= kParallelMin)
  for (long t = 0; t < T; ++t) {
    const typename K::T* c = cos + pos[t] * D;
    const typename K::T* s = sin + pos[t] * D;
    const long slot = slots[t];
    for (int h = 0; h < H + KVH; ++h) {
      const typename K::T* x = qkv + t * row + static_cast<long>(h) * D;
      typename K::T* o;
      if (h < H) {
        o = q_out + (t * H + h) * D;
      } else if (slot >= 0) {
        o = kc + (slot * KVH + (h - H)) * D;
      } else {
        continue;
      }
      for (int j = 0; j < D; ++j) {
        const float rot = j < half ? -K::ld(x, j + half) : K::ld(x, j - half);
        K::st(o, j, K::rnd(K::ld(x, j) * K::ld(c, j)) + K::rnd(rot * K::ld(s, j)));
      }
    }
    if (slot >= 0) {
      const typename K::T* v = qkv + t * row + static_cast<long>(H + KVH) * D;
      std::memcpy(vc + slot * KVH * D, v, sizeof(typename K::T) * KVH * D);
    }
  }
}

// out[t, j] = dtype(silu(gu[t, j])) * gu[t, I + j]
template <typename K>
void silu_mul(const typename K::T* gu, typename K::T* out, long T, long I, int nthreads) {
#pragma omp parallel for schedule(static) num_threads(nthreads) if (T * I >= kParallelMin)
  for (long t = 0; t < T; ++t) {
    const typename K::T* g = gu + t * 2 * I;
    typename K::T* o = out + t * I;
    float act[256];
    for (long c = 0; c < I; c += 256) {
      const long n = std::min(I - c, 256L);
#pragma omp simd
      for (long j = 0; j < n; ++j) {
        const float a = K::ld(g, c + j);
        act[j] = a / (1.0f + fast_exp(-a));
      }
      for (long j = 0; j < n; ++j) K::st(o, c + j, K::rnd(act[j]) * K::ld(g, I + c + j));
    }
  }
}

}  // namespace layer_ops
