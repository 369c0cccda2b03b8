// The lean step's matrix products: weight rows streamed once against a few activation rows,
// batch-invariant (every row's dot product is computed the same way whatever the row count).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

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

// Four row-major weight rows (Kd apart) against MS activation rows: 4 x MS accumulators of 16
// lanes, in registers (locals, copied out once at the end).
template <typename W, int MS>
inline void tile4(const W* w, long Kd, long K16, const float* X, v16f (&out)[4][4], const W* pf) {
  v16f acc[4][MS];
  for (int r = 0; r < 4; ++r)
    for (int m = 0; m < MS; ++m) acc[r][m] = v16f{};
  const W *w0 = w, *w1 = w + Kd, *w2 = w + 2 * Kd, *w3 = w + 3 * Kd;
  for (long k = 0; k < K16; k += 16) {
    v16f a0 = vload(w0 + k), a1 = vload(w1 + k), a2 = vload(w2 + k), a3 = vload(w3 + k);
    if (pf != nullptr && (k * sizeof(W)) % 64 == 0) {
      for (int r = 0; r < 4; ++r) __builtin_prefetch(pf + r * Kd + k, 0, 2);
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

// ---- The column-block ("tiled") layout: outer products, for fp32 and bf16 weights ----
//
// Why: the row-major kernel above is a dot product per output, so every output pays a 16-lane
// reduction, and bf16 weights pay two conversions per load. Stored as blocks of 16 output columns,
// k-major ([N / 16][Kd][16] fp32; [N / 16][Kd / 2][16][2] bf16, pairs of k side by side), one
// 64-byte load is one k (or k pair) of 16 outputs, and an activation value broadcast against it
// is 16 finished multiply-adds (fp32 `vfmadd`; bf16 `vdpbf16ps`, two k at once): no reduction, no
// conversion, and a block is one sequential stream. Measured here (the default model's 120 layer
// linears, 2 threads, ms for fp32 / bf16): 1 row 13.5 -> 12.5 / 6.7 -> 6.4; 8 rows 17.9 -> 11.5 /
// 9.6 -> 6.2; 16 rows 27.2 -> 18.1 / 18.3 -> 10.2 (oneDNN's packed GEMMs: ~30 / ~15).
// Batch-invariant: an output is one accumulator over k in order, whatever M is. Each block's stream
// is prefetched kPrefetchBytes ahead (a line a k), as the row-major kernel's tiles are.
// bf16: the activations are bf16 values held in fp32 (every caller rounds them to dtype first), so
// taking them as bf16 pairs is exact; a pair's products are exact in fp32 and `vdpbf16ps` adds them
// to the accumulator one after the other (AVX512-BF16 flushes denormals, which activations of a
// normed model do not reach).
#if defined(__AVX512F__)
constexpr bool kColumnBlocksF32 = true;
#else
constexpr bool kColumnBlocksF32 = false;
#endif
#if defined(__AVX512BF16__)
constexpr bool kColumnBlocksBF16 = true;
#else
constexpr bool kColumnBlocksBF16 = false;
#endif
constexpr int kBlockRows = 8;    // activation rows a pass (8 rows x 3 blocks: 24 accumulators)

#if defined(__AVX512F__)
template <typename K> inline void store16(typename K::T* y, __m512 v);
template <> inline void store16<layer_ops::F32>(float* y, __m512 v) { _mm512_storeu_ps(y, v); }
template <> inline void store16<layer_ops::BF16>(uint16_t* y, __m512 v) {
  alignas(64) float f[16];
  _mm512_store_ps(f, v);
  for (int i = 0; i < 16; ++i) layer_ops::BF16::st(y, i, f[i]);   // the scalar path's rounding, NaN kept
}
template <typename K> inline __m512 bias16(const typename K::T* b) { return vload(b); }

// MS activation rows against NB consecutive 16-column blocks of fp32 weights or int8 codes (the
// greedy screen's copy of the LM head, kernels/greedy_head.py: 16 codes widened to fp32 a load);
// X fp32 [MS][Kd]. bf16 weights: blocks_bf16 below, X as bf16 pairs [MS][Kd / 2].
inline __m512 widen16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 widen16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

template <int MS, int NB, typename WT>
inline void blocks_fma(const WT* __restrict w, long Kd, const float* __restrict X, __m512 (&out)[kBlockRows][3]) {
  constexpr long kPerLine = 64 / (16 * sizeof(WT));    // k a block's 64-byte line holds: fp32 1, int8 4
  __m512 acc[MS][NB];     // locals, copied out once: accumulating into `out` kept them in memory
  for (int m = 0; m < MS; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_ps();
  for (long k = 0; k < Kd; ++k) {
    __m512 wv[NB];
    for (int j = 0; j < NB; ++j) {
      const WT* p = w + (j * Kd + k) * 16;
      wv[j] = widen16(p);
      if (k % kPerLine == 0) __builtin_prefetch(p + kPrefetchBytes / static_cast<long>(sizeof(WT)), 0, 2);
    }
#pragma GCC unroll 8
    for (int m = 0; m < MS; ++m) {
      const __m512 xb = _mm512_set1_ps(X[m * Kd + k]);
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_fmadd_ps(wv[j], xb, acc[m][j]);
    }
  }
  for (int m = 0; m < MS; ++m)
    for (int j = 0; j < NB; ++j) out[m][j] = acc[m][j];
}
#endif
#if defined(__AVX512BF16__)
template <int MS, int NB>
inline void blocks_bf16(const uint16_t* __restrict w, long Kd, const uint32_t* __restrict X,
                        __m512 (&out)[kBlockRows][3]) {
  const long P = Kd / 2;
  __m512 acc[MS][NB];
  for (int m = 0; m < MS; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_ps();
  for (long p = 0; p < P; ++p) {
    __m512bh wv[NB];
    for (int j = 0; j < NB; ++j) {
      wv[j] = (__m512bh)_mm512_loadu_si512(w + (j * P + p) * 32);
      __builtin_prefetch(w + (j * P + p) * 32 + kPrefetchBytes / 2, 0, 2);
    }
#pragma GCC unroll 8
    for (int m = 0; m < MS; ++m) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(static_cast<int>(X[m * P + p]));
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], wv[j], xb);
    }
  }
  for (int m = 0; m < MS; ++m)
    for (int j = 0; j < NB; ++j) out[m][j] = acc[m][j];
}
#endif

#if defined(__AVX512F__)
// The passes every column-block product shares: panels of up to 3 blocks of 16 columns over
// [r0, r1), activation rows kBlockRows at a time; Pass<MS, NB>::run computes one into acc, and
// store(n0, nb, m0, ms, acc) writes it out.
template <int MS, int NB> struct PassF32 {
  static void run(const float* w, long Kd, const float* x, __m512 (&acc)[kBlockRows][3]) { blocks_fma<MS, NB>(w, Kd, x, acc); }
};
template <int MS, int NB> struct PassI8 {
  static void run(const int8_t* w, long Kd, const float* x, __m512 (&acc)[kBlockRows][3]) { blocks_fma<MS, NB>(w, Kd, x, acc); }
};
#if defined(__AVX512BF16__)
template <int MS, int NB> struct PassBF16 {
  static void run(const uint16_t* w, long Kd, const uint32_t* x, __m512 (&acc)[kBlockRows][3]) {
    blocks_bf16<MS, NB>(w, Kd, x, acc);
  }
};
#endif

template <template <int, int> class Pass, int NB, typename WT, typename XT>
inline void pass_rows(int ms, const WT* w, long Kd, const XT* x, __m512 (&acc)[kBlockRows][3]) {
  switch (ms) {
    case 8: Pass<8, NB>::run(w, Kd, x, acc); break;
    case 7: Pass<7, NB>::run(w, Kd, x, acc); break;
    case 6: Pass<6, NB>::run(w, Kd, x, acc); break;
    case 5: Pass<5, NB>::run(w, Kd, x, acc); break;
    case 4: Pass<4, NB>::run(w, Kd, x, acc); break;
    case 3: Pass<3, NB>::run(w, Kd, x, acc); break;
    case 2: Pass<2, NB>::run(w, Kd, x, acc); break;
    default: Pass<1, NB>::run(w, Kd, x, acc);
  }
}

// w: the blocks (bstride elements each); xs: the activation rows (xstride elements apart)
template <template <int, int> class Pass, typename WT, typename XT, typename Store>
void column_passes(const WT* w, long bstride, const XT* xs, long xstride, int M, long r0, long r1, long Kd,
                   Store store) {
  __m512 acc[kBlockRows][3];
  for (long n0 = r0; n0 < r1; n0 += 48) {
    const int nb = static_cast<int>(std::min(3L, (r1 - n0) / 16));
    const WT* wb = w + (n0 / 16) * bstride;
    for (int m0 = 0; m0 < M; m0 += kBlockRows) {
      const int ms = std::min(kBlockRows, M - m0);
      const XT* xm = xs + m0 * xstride;
      if (nb == 3) pass_rows<Pass, 3>(ms, wb, Kd, xm, acc);
      else if (nb == 2) pass_rows<Pass, 2>(ms, wb, Kd, xm, acc);
      else pass_rows<Pass, 1>(ms, wb, Kd, xm, acc);
      store(n0, nb, m0, ms, acc);
    }
  }
}

// Y[m, n] = dtype(sum_k codes[n, k] X[m, k] * scale[n]) for the columns [r0, r1) (multiples of
// 16) of int8 codes in column blocks: the row-major int8 product's rounding, another summation
// order (the screen's bound holds for any order). False without AVX-512.
template <typename K>
bool gemm_i8_blocks(const int8_t* w, const float* X, int M, const float* scale, typename K::T* Y, long ldy, long r0,
                    long r1, long Kd) {
  column_passes<PassI8>(w, Kd * 16, X, Kd, M, r0, r1, Kd,
                        [&](long n0, int nb, int m0, int ms, __m512 (&acc)[kBlockRows][3]) {
                          for (int j = 0; j < nb; ++j) {
                            const __m512 sc = _mm512_loadu_ps(scale + n0 + 16 * j);
                            for (int m = 0; m < ms; ++m)
                              store16<K>(Y + (m0 + m) * ldy + n0 + 16 * j, _mm512_mul_ps(acc[m][j], sc));
                          }
                        });
  return true;
}
#endif

// Y[m, n] (+ bias[n]) for the blocks of columns [r0, r1) (multiples of 16) in the column-block
// layout; see above. Returns false where this build has no kernel for W (the caller checks first).
// pairs: bf16 weights, room for M * Kd / 2 pairs of the activations (null: allocated here).
template <typename K, typename W>
bool gemm_blocks(const W* w, const float* X, int M, const typename K::T* bias, typename K::T* Y, long ldy, long r0,
                 long r1, long Kd, uint32_t* pairs = nullptr) {
#if defined(__AVX512F__)
  constexpr bool kBF = std::is_same<W, uint16_t>::value;
  if constexpr (std::is_same<W, float>::value || (kBF && kColumnBlocksBF16)) {
    using XT = typename std::conditional<kBF, uint32_t, float>::type;
    const XT* xs;
    std::vector<uint32_t> own;
    if constexpr (kBF) {      // the rows as bf16 pairs (exact: the values are bf16 already)
      const long P = Kd / 2;
      if (pairs == nullptr) {
        own.resize(static_cast<size_t>(M) * P);
        pairs = own.data();
      }
      for (long i = 0; i < M * P; ++i)
        pairs[i] = static_cast<uint32_t>(layer_ops::BF16::to_bits(X[2 * i])) |
                   (static_cast<uint32_t>(layer_ops::BF16::to_bits(X[2 * i + 1])) << 16);
      xs = pairs;
    } else {
      xs = X;
    }
    const long xstride = kBF ? Kd / 2 : Kd;
    auto store = [&](long n0, int nb, int m0, int ms, __m512 (&acc)[kBlockRows][3]) {
      for (int j = 0; j < nb; ++j) {
        const __m512 b = bias != nullptr ? bias16<K>(bias + n0 + 16 * j) : _mm512_setzero_ps();
        for (int m = 0; m < ms; ++m)     // F.linear adds the bias before rounding
          store16<K>(Y + (m0 + m) * ldy + n0 + 16 * j, _mm512_add_ps(acc[m][j], b));
      }
    };
    if constexpr (kBF) {
#if defined(__AVX512BF16__)
      column_passes<PassBF16>(w, Kd * 16, xs, xstride, M, r0, r1, Kd, store);
#endif
    } else {
      column_passes<PassF32>(w, Kd * 16, xs, xstride, M, r0, r1, Kd, store);
    }
    return true;
  }
#endif
  (void)w, (void)X, (void)M, (void)bias, (void)Y, (void)ldy, (void)r0, (void)r1, (void)Kd, (void)pairs;
  return false;
}

// Y[m, n] = dtype(dot(W[n, :], X[m, :]) (* scale[n]) (+ bias[n])) for rows n in [r0, r1) and the M
// activation rows of X ([M, Kd] fp32; Y rows ldy apart). Batch-invariant: each dot product is 16
// lanes summed in k order, then the same tree and tail, whatever M is and wherever the row falls,
// so a token's logits in a k+1-token speculative step are bit-identical to the one-token step's.
// Weights are read once per call: four rows (<= 24 KB) stay in L1 while the activation rows pass.
// tiled: W is in the column-block layout (gemm_blocks; r0, r1 multiples of 16, no scale; pairs:
// its scratch for bf16 weights).
template <typename K, typename W>
void gemm(const W* w, const float* X, int M, const typename K::T* bias, const float* scale,
          typename K::T* Y, long ldy, long r0, long r1, long Kd, bool tiled = false, uint32_t* pairs = nullptr) {
  if (tiled) {     // never the row-major loop below over blocked weights (callers check the build first)
    gemm_blocks<K, W>(w, X, M, bias, Y, ldy, r0, r1, Kd, pairs);
    return;
  }
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
  // software prefetch ~10 KB ahead, spread over the tile's k loop: with only the hardware
  // prefetcher the weight loads waited on memory (int8: 9.3 -> 4.7 ms a step, measured). Into L2
  // (hint 2), not the non-temporal hint: with 5..8 activation rows the tile is read by a second
  // group of rows, which then found it evicted (7 rows, fp32, 538 MB: 94 -> 55 ms).
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
      switch (ms) {
        case 4: tile4<W, 4>(w4, Kd, K16, X4, acc, p); break;
        case 3: tile4<W, 3>(w4, Kd, K16, X4, acc, p); break;
        case 2: tile4<W, 2>(w4, Kd, K16, X4, acc, p); break;
        default: tile4<W, 1>(w4, Kd, K16, X4, acc, p);
      }
      for (int r = 0; r < 4; ++r)
        for (int m = 0; m < ms; ++m) finish(n0 + r, m0 + m, acc[r][m]);
    }
  }
  for (; n0 < r1; ++n0)
    for (int m = 0; m < M; ++m) finish(n0, m, dot1(w + n0 * Kd, X + m * Kd, K16));
}

}  // namespace lean
