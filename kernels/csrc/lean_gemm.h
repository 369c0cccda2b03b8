// The lean step's matrix products: weight rows streamed once against a few activation rows,
// batch-invariant (every row's dot product is computed the same way whatever the row count).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "layer_ops.h"

namespace lean {

template <typename W> struct Weight;
template <> struct Weight<float> {
  static inline float ld(const float* p, long i) { return p[i]; }
};
template <> struct Weight<uint16_t> {
  static inline float ld(const uint16_t* p, long i) { return layer_ops::BF16::ld(p, i); }
};
template <> struct Weight<int8_t> {
  static inline float ld(const int8_t* p, long i) { return static_cast<float>(p[i]); }
};

constexpr long kPrefetchBytes = 10000;   // how far ahead the weight prefetch runs (5-20 KB measured alike)

// Weight rows as 16 fp32 lanes (GCC vector extensions: one code path for AVX-512, AVX2 or SSE).
typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef uint32_t v16u32 __attribute__((vector_size(64)));
typedef int8_t v16i8 __attribute__((vector_size(16)));

#if defined(__AVX512F__)
// AVX-512: one load and one or two conversions (GCC 12 scalarizes the generic int8 conversion)
inline v16f vload(const float* p) { return _mm512_loadu_ps(p); }
inline v16f vload(const uint16_t* p) {        // bf16 -> fp32: the 16 bits become the high half
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline v16f vload(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#else
inline v16f vload(const float* p) { v16f v; std::memcpy(&v, p, sizeof v); return v; }
inline v16f vload(const uint16_t* p) {
  v16u16 h; std::memcpy(&h, p, sizeof h);
  v16u32 w = __builtin_convertvector(h, v16u32) << 16;
  v16f v; std::memcpy(&v, &w, sizeof v); return v;
}
inline v16f vload(const int8_t* p) { v16i8 c; std::memcpy(&c, p, sizeof c); return __builtin_convertvector(c, v16f); }
#endif

// a * b + c: one fused multiply-add where the CPU has it (this file is built without implicit
// contraction, for the small ops' sake; both product paths below use this one, so they agree)
inline v16f madd(v16f a, v16f b, v16f c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

// Pin a value to a register at this point. Without it GCC folds a row's load into each of its
// multiply-adds (a row used MS times was loaded MS times, an activation used 4 times 4 times): the
// loads, not the multiply-adds, then bound the loop. Measured (one thread, 3072 x 576 fp32 rows in
// cache): 7 activation rows 550 -> 317 us; the default model's 538 MB from memory: 94 -> 37 ms.
// Only with AVX-512, where a v16f is one register.
inline void in_register(v16f& v) {
#if defined(__AVX512F__)
  asm("" : "+v"(v));
#else
  (void)v;
#endif
}

inline float hsum(v16f v) {                   // a fixed tree: the same order for every call
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(v);
#else
  float l[16];
  std::memcpy(l, &v, sizeof l);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) l[i] += l[i + w];
  return l[0];
#endif
}

// Four weight rows against MS activation rows: 4 x MS accumulators of 16 lanes, in registers
// (locals, copied out once at the end). TILED: the four rows are one tile of the tiled layout (see
// gemm), read as one sequential stream; else four row-major rows Kd apart.
template <typename W, int MS, bool TILED>
inline void tile4(const W* w, long Kd, long K16, const float* X, v16f (&out)[4][4], const W* pf) {
  v16f acc[4][MS];
  for (int r = 0; r < 4; ++r)
    for (int m = 0; m < MS; ++m) acc[r][m] = v16f{};
  const W *w0 = w, *w1 = w + Kd, *w2 = w + 2 * Kd, *w3 = w + 3 * Kd;
  for (long k = 0; k < K16; k += 16) {
    v16f a0, a1, a2, a3;
    if (TILED) {
      const W* t = w + 4 * k;             // this 16-column chunk of the tile's four rows
      a0 = vload(t), a1 = vload(t + 16), a2 = vload(t + 32), a3 = vload(t + 48);
      if (pf != nullptr) {                // the same chunk of the tile ahead: 64 bytes a line
        for (long o = 0; o < 64; o += 64 / static_cast<long>(sizeof(W))) __builtin_prefetch(pf + 4 * k + o, 0, 2);
      }
    } else {
      a0 = vload(w0 + k), a1 = vload(w1 + k), a2 = vload(w2 + k), a3 = vload(w3 + k);
      if (pf != nullptr && (k * sizeof(W)) % 64 == 0) {
        for (int r = 0; r < 4; ++r) __builtin_prefetch(pf + r * Kd + k, 0, 2);
      }
    }
    in_register(a0), in_register(a1), in_register(a2), in_register(a3);
#pragma GCC unroll 4
    for (int m = 0; m < MS; ++m) {
      v16f xv = vload(X + m * Kd + k);
      in_register(xv);
      acc[0][m] = madd(a0, xv, acc[0][m]);
      acc[1][m] = madd(a1, xv, acc[1][m]);
      acc[2][m] = madd(a2, xv, acc[2][m]);
      acc[3][m] = madd(a3, xv, acc[3][m]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int m = 0; m < MS; ++m) out[r][m] = acc[r][m];
}

// One weight row against one activation row: the same lane arithmetic as tile4 (tail rows).
template <typename W>
inline v16f dot1(const W* w, const float* x, long K16) {
  v16f acc = v16f{};
  for (long k = 0; k < K16; k += 16) acc = madd(vload(w + k), vload(x + k), acc);
  return acc;
}

// Y[m, n] = dtype(dot(W[n, :], X[m, :]) (* scale[n]) (+ bias[n])) for rows n in [r0, r1) and the M
// activation rows of X ([M, Kd] fp32; Y rows ldy apart). Batch-invariant: each dot product is 16
// lanes summed in k order, then the same tree and tail, whatever M is and wherever the row falls,
// so a token's logits in a k+1-token speculative step are bit-identical to the one-token step's.
// Weights are read once per call: four rows (<= 24 KB) stay in L1 while the activation rows pass.
// tiled: W is in the tiled layout [N / 4][Kd / 16][4][16] (kernels/cpu_lean_step.py's tile_rows):
// each four rows' 16-column chunks side by side, so a tile is one sequential read. Row-major, the
// four rows are four streams Kd apart, and one thread reads them at ~14 GB/s where a sequential
// stream runs at ~21 (measured here, the default model's 538 MB of fp32 weights: 37 vs 26 ms).
// The arithmetic is the same in both layouts (same lanes, same order): the results are
// bit-identical. Tiled needs Kd % 16 == 0 and r0, r1 at multiples of 4 (the caller checks).
template <typename K, typename W>
void gemm(const W* w, const float* X, int M, const typename K::T* bias, const float* scale,
          typename K::T* Y, long ldy, long r0, long r1, long Kd, bool tiled = false) {
  const long K16 = Kd - Kd % 16;
  auto finish = [&](long n, int m, v16f acc) {
    const W* wr = w + n * Kd;
    const float* xr = X + m * Kd;
    float v = hsum(acc);
    for (long k = K16; k < Kd; ++k) v += Weight<W>::ld(wr, k) * xr[k];
    if (scale != nullptr) v = K::rnd(v * scale[n]);   // int8: the product rounds first
    if (bias != nullptr) v += K::ld(bias, n);            // F.linear adds it before rounding
    K::st(Y + m * ldy, n, v);
  };
  long n0 = r0;
  // software prefetch ~10 KB ahead (whole tiles), spread over the tile's k loop: with only the
  // hardware prefetcher the weight loads waited on memory (int8: 9.3 -> 4.7 ms a step, measured).
  // Into L2 (hint 2), not the non-temporal hint: with 5..8 activation rows the tile is read by a
  // second group of rows, which then found it evicted (7 rows, tiled fp32, 538 MB: 94 -> 55 ms).
  const long tile_bytes = 4 * Kd * static_cast<long>(sizeof(W));
  const long ahead_rows = 4 * std::max(1L, kPrefetchBytes / tile_bytes);
  for (; n0 + 4 <= r1; n0 += 4) {
    const W* w4 = w + n0 * Kd;
    const W* pf = n0 + 4 + ahead_rows <= r1 ? w4 + ahead_rows * Kd : nullptr;
    for (int m0 = 0; m0 < M; m0 += 4) {
      const int ms = std::min(4, M - m0);
      const float* X4 = X + m0 * Kd;
      const W* p = m0 ? nullptr : pf;
      v16f acc[4][4];
      if (tiled) {
        switch (ms) {
          case 4: tile4<W, 4, true>(w4, Kd, K16, X4, acc, p); break;
          case 3: tile4<W, 3, true>(w4, Kd, K16, X4, acc, p); break;
          case 2: tile4<W, 2, true>(w4, Kd, K16, X4, acc, p); break;
          default: tile4<W, 1, true>(w4, Kd, K16, X4, acc, p);
        }
      } else {
        switch (ms) {
          case 4: tile4<W, 4, false>(w4, Kd, K16, X4, acc, p); break;
          case 3: tile4<W, 3, false>(w4, Kd, K16, X4, acc, p); break;
          case 2: tile4<W, 2, false>(w4, Kd, K16, X4, acc, p); break;
          default: tile4<W, 1, false>(w4, Kd, K16, X4, acc, p);
        }
      }
      for (int r = 0; r < 4; ++r)
        for (int m = 0; m < ms; ++m) finish(n0 + r, m0 + m, acc[r][m]);
    }
  }
  for (; n0 < r1; ++n0)
    for (int m = 0; m < M; ++m) finish(n0, m, dot1(w + n0 * Kd, X + m * Kd, K16));
}

}  // namespace lean
