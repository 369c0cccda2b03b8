#pragma once
// Decode attention over the paged KV pool, read in place (no per-layer gather of K/V).
//
// Why a hand-written loop: the torch path gathers every sequence's K and V into contiguous
// copies per layer before SDPA; at chat context lengths that copy is a large share of a step.
// Here each (sequence, KV head) pair walks its block table and streams K and V straight from the
// pool with an online softmax, so every byte of K/V is read once from where it lives.
//
// Layout (docs/DESIGN.md): cache [num_blocks, block_size, kv_heads, row], contiguous; row = head_dim
// values (fp32 / bf16), or for an int8 pool head_dim int8 codes then the row's fp32 scale (4 bytes,
// kernels/kv_quant.py): a row is dequantized into registers as it is streamed, never copied out.
// Query/out: [B, H, D] fp32 contiguous. GQA: query head h uses KV head h / (H / KVH).
// Parallel over (sequence, KV head) with OpenMP; the process's OpenMP runtime is torch's own
// (libgomp.so.1 is already loaded by torch when this library is opened).
#include <cmath>
#include "fast_exp.h"
#include "lean_gemm.h"      // lean::v16f, vload, madd: 16-lane rows (one path for AVX-512 / AVX2 / SSE)
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <vector>
#include <omp.h>

namespace paged_decode {

inline float load(const float* p, long i) { return p[i]; }
inline float load(const uint16_t* p, long i) {
  uint32_t bits = static_cast<uint32_t>(p[i]) << 16;   // bf16 -> fp32 is a 16-bit shift
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Row traits: how many elements a (token, KV head) row spans and how it becomes D floats.
template <typename T> struct Row {
  static constexpr int kExtra = 0;
  static inline void get(const T* p, float* out, int D) {
    for (int d = 0; d < D; ++d) out[d] = load(p, d);
  }
};
template <> struct Row<int8_t> {
  static constexpr int kExtra = 4;       // the fp32 scale after the codes
  static inline void get(const int8_t* p, float* out, int D) {
    float scale;
    std::memcpy(&scale, p + D, sizeof scale);
#pragma omp simd
    for (int d = 0; d < D; ++d) out[d] = static_cast<float>(p[d]) * scale;
  }
};

// One block of the online softmax for one query head: scores sh[0..n) become exp(score - new max)
// in place, the running max m and sum l move to the new max, and the output accumulator acc[0..D)
// is rescaled to it (exp(-inf) = 0 on the first block).
inline void softmax_block(float* sh, int n, float& m, float& l, float* acc, int D) {
  float bm = m;
  for (int t = 0; t < n; ++t) bm = std::max(bm, sh[t]);
  const float corr = std::exp(m - bm);
  l *= corr;
  for (int d = 0; d < D; ++d) acc[d] *= corr;
  m = bm;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int t = 0; t < n; ++t) {
    sh[t] = fast_exp(sh[t] - bm);
    sum += sh[t];
  }
  l += sum;
}

constexpr int kMaxGroup = 16;
constexpr int kMaxDim = 256;
constexpr int kMaxBlock = 128;
constexpr long kSharedScratchMax = 1L << 22;   // floats of shared_prefix's scores a thread (16 MB)

// The row's scale: the stored fp32 of an int8 row, 1 for rows of values.
template <typename T> inline float row_scale(const T*, int) { return 1.f; }
template <> inline float row_scale<int8_t>(const int8_t* p, int D) {
  float s;
  std::memcpy(&s, p + D, sizeof s);
  return s;
}

// 16 vectors -> one vector of their lane sums (lane t = the sum of p[t]'s 16 lanes), in one fixed
// tree. Why: a token's score is a 64-wide dot product; summing each one's 16 lanes on its own (a
// horizontal reduction per token and head) was the largest share of the kernel's instructions.
inline lean::v16f sum16(const lean::v16f (&p)[16]) {
#if defined(__AVX512F__)
  __m512 z[4];
  for (int g = 0; g < 4; ++g) {     // per 128-bit lane: [sum of p[4g]'s 4 lanes there, p[4g+1], p[4g+2], p[4g+3]]
    __m512 x[2];
    for (int i = 0; i < 2; ++i) {
      const __m512 a = p[4 * g + 2 * i], b = p[4 * g + 2 * i + 1];
      x[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    z[g] = _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], 0x44), _mm512_shuffle_ps(x[0], x[1], 0xEE));
  }
  const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x44), _mm512_shuffle_f32x4(z[0], z[1], 0xEE));
  const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(z[2], z[3], 0x44), _mm512_shuffle_f32x4(z[2], z[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xDD));
#else
  lean::v16f out;
  for (int t = 0; t < 16; ++t) out[t] = lean::hsum(p[t]);
  return out;
#endif
}

inline lean::v16f vmax(lean::v16f a, lean::v16f b) {
#if defined(__AVX512F__)
  return _mm512_max_ps(a, b);
#else
  for (int i = 0; i < 16; ++i) a[i] = std::max(a[i], b[i]);
  return a;
#endif
}

inline float hmax(lean::v16f a) {
#if defined(__AVX512F__)
  return _mm512_reduce_max_ps(a);
#else
  float r = a[0];
  for (int i = 1; i < 16; ++i) r = std::max(r, a[i]);
  return r;
#endif
}

// fast_exp (fast_exp.h) on 16 lanes at once: the same steps, lane by lane, with explicit fused
// multiply-adds, so the loop's kernel (built with contraction) and the lean step's (without) agree.
inline lean::v16f exp16(lean::v16f x) {
#if defined(__AVX512F__)
  // x second: max/min return their second operand when one is NaN, so a NaN score stays NaN (as
  // fast_exp's std::max / std::min keep it), and a poisoned row still shows in the output
  const __m512 xc = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-87.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f),
                                    _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), xc));
  __m512 p = _mm512_set1_ps(1.3888889e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3333337e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1666668e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666667e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 e = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
  const __mmask16 lo = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  const __mmask16 hi = _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.0f), _CMP_GT_OQ);
  return _mm512_mask_mov_ps(_mm512_mask_mov_ps(e, lo, _mm512_setzero_ps()), hi, _mm512_set1_ps(INFINITY));
#else
  for (int i = 0; i < 16; ++i) x[i] = fast_exp(x[i]);
  return x;
#endif
}

// softmax_block's arithmetic for block_heads, 16 scores at a time (a partial last chunk padded
// with -inf, whose exp is 0): scores s[0..n) become exp(score - new max) in place, m and l move to
// the new max; returns the factor the output accumulator must be multiplied by (exp(old max - new
// max); 0 on the first block).
inline float softmax16(float* s, int n, float& m, float& l) {
  using lean::v16f;
  auto chunk = [&](int t) {
    if (n - t >= 16) return lean::vload(s + t);
    v16f x = v16f{} - INFINITY;
    for (int i = 0; i < n - t; ++i) x[i] = s[t + i];
    return x;
  };
  v16f mx = v16f{} - INFINITY;
  for (int t = 0; t < n; t += 16) mx = vmax(mx, chunk(t));
  const float bm = std::max(m, hmax(mx));
  const float corr = fast_exp(m - bm);     // (-inf on the first block: 0)
  m = bm;
  v16f sum = v16f{};
  for (int t = 0; t < n; t += 16) {
    const v16f e = exp16(chunk(t) - bm);
    if (n - t >= 16) {
      std::memcpy(s + t, &e, sizeof e);
    } else {
      for (int i = 0; i < n - t; ++i) s[t + i] = e[i];
    }
    sum += e;
  }
  l = std::fma(l, corr, lean::hsum(sum));
  return corr;
}

// block_heads serves D % 16 == 0 with AVX-512 only: without it, sum16 and exp16 fall back to lane
// loops and the kernel executed ~2x the instructions of the per-token loop below (callgrind,
// -march=x86-64-v3, B=8 x 64 tokens), so AVX2 / SSE builds keep that loop.
#if defined(__AVX512F__)
constexpr bool kVecBlocks = true;
#else
constexpr bool kVecBlocks = false;
#endif

// One block of n (<= kMaxBlock) tokens of KV head g for nh of its query heads: the arithmetic every
// decode variant shares when D is a multiple of 16 (NC = D / 16 chunks). qv: the heads' scaled
// queries [nh][D]; kb / vb: the block's first token's K / V row for head g, rows tok_stride apart;
// m, l, acc [nh][D]: the heads' online-softmax state (qv and acc rows hs apart); s: scratch
// [nh][ss]. Heads outer, tokens inner, so a head's query and its output accumulator stay in
// registers over the block's rows
// (K and V rows of the block are re-read from L1 per head). Scores: each row's 16-lane partials
// summed 16 tokens at a time by sum16, then times the row's scale (int8: codes first, scale
// after); values: p (times the row's scale) into the accumulator.
template <typename T, int NC>
inline void block_heads(const float* qv, const T* kb, const T* vb, long tok_stride, int n, int D, int nh,
                        float* m, float* l, float* acc, long hs, float* s, int ss) {
  using lean::v16f;
  for (int i = 0; i < nh; ++i) {
    v16f q[NC];
    for (int c = 0; c < NC; ++c) q[c] = lean::vload(qv + i * hs + 16 * c);
    float* si = s + static_cast<long>(i) * ss;
    for (int t0 = 0; t0 < n; t0 += 16) {
      const int nt = std::min(16, n - t0);
      const T* k0 = kb + t0 * tok_stride;
      v16f p[16];
      if (nt == 16) {
#pragma GCC unroll 16
        for (int t = 0; t < 16; ++t) {
          v16f x = v16f{};
          for (int c = 0; c < NC; ++c) x = lean::madd(q[c], lean::vload(k0 + t * tok_stride + 16 * c), x);
          p[t] = x;
        }
      } else {
        for (int t = 0; t < 16; ++t) {
          v16f x = v16f{};
          if (t < nt)
            for (int c = 0; c < NC; ++c) x = lean::madd(q[c], lean::vload(k0 + t * tok_stride + 16 * c), x);
          p[t] = x;
        }
      }
      v16f sv = sum16(p);
      if (Row<T>::kExtra) {
        v16f sc = v16f{};
        for (int t = 0; t < nt; ++t) sc[t] = row_scale(k0 + t * tok_stride, D);
        sv = sv * sc;
      }
      if (nt == 16) {
        std::memcpy(si + t0, &sv, sizeof sv);
      } else {
        for (int t = 0; t < nt; ++t) si[t0 + t] = sv[t];
      }
    }
    float* ai = acc + i * hs;
    const float corr = softmax16(si, n, m[i], l[i]);
    // two accumulators per chunk (even and odd tokens), added at the block's end: one chain of
    // n dependent multiply-adds per chunk was the loop's bound, not its loads
    v16f a[NC], b[NC];
    for (int c = 0; c < NC; ++c) a[c] = lean::vload(ai + 16 * c) * corr, b[c] = v16f{};
    int t = 0;
    for (; t + 1 < n; t += 2) {
      const T* v0 = vb + t * tok_stride;
      const T* v1 = v0 + tok_stride;
      const v16f p0 = v16f{} + si[t] * row_scale(v0, D), p1 = v16f{} + si[t + 1] * row_scale(v1, D);
      for (int c = 0; c < NC; ++c) {
        a[c] = lean::madd(p0, lean::vload(v0 + 16 * c), a[c]);
        b[c] = lean::madd(p1, lean::vload(v1 + 16 * c), b[c]);
      }
    }
    if (t < n) {
      const T* v0 = vb + t * tok_stride;
      const v16f p0 = v16f{} + si[t] * row_scale(v0, D);
      for (int c = 0; c < NC; ++c) a[c] = lean::madd(p0, lean::vload(v0 + 16 * c), a[c]);
    }
    for (int c = 0; c < NC; ++c) {
      const v16f r = a[c] + b[c];
      std::memcpy(ai + 16 * c, &r, sizeof(v16f));
    }
  }
}

// One sequence, KV head g, its query heads g*G + [h_lo, h_hi): the per-head arithmetic every
// variant below shares. q/out point at the sequence's [H, D] rows; table at its block table.
// lo: the first position the query sees (sliding-window attention: len - window; 0 = all). Blocks
// wholly before it are never read (a window layer's released blocks may hold anything).
template <typename T, int DC>
inline void decode_group(const float* q, const T* kc, const T* vc, const int32_t* table, int len, float* out,
                         int H, int KVH, int D_, int BS, float scale, int g, int h_lo, int h_hi, int lo = 0) {
  const int D = DC ? DC : D_;     // a compile-time head_dim lets every 64-wide loop unroll fully
  const int G = H / KVH;
  const int n_h = h_hi - h_lo;
  const long tok_stride = static_cast<long>(KVH) * (D + Row<T>::kExtra);
  const long blk_stride = tok_stride * BS;
  float m[kMaxGroup], l[kMaxGroup];
  float acc[kMaxGroup][kMaxDim];
  float qv[kMaxGroup][kMaxDim];
  float s[kMaxGroup][kMaxBlock];
  float kf[kMaxDim];
  for (int h = 0; h < n_h; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
    const float* qh = q + static_cast<long>(g * G + h_lo + h) * D;
    for (int d = 0; d < D; ++d) { qv[h][d] = qh[d] * scale; acc[h][d] = 0.f; }
  }
  const int nblk = (len + BS - 1) / BS;
  for (int j = lo / BS; j < nblk; ++j) {
    const long base = static_cast<long>(table[j]) * blk_stride + g * (D + Row<T>::kExtra);
    const int t0 = std::max(0, lo - j * BS);     // window: the first block's first visible token
    const int n = std::min(BS, len - j * BS);
    if constexpr (kVecBlocks && DC > 0 && DC % 16 == 0) {
      if (t0 == 0) {    // a block the window cuts takes the per-token loop below
        block_heads<T, DC / 16>(&qv[0][0], kc + base, vc + base, tok_stride, n, D, n_h, m, l, &acc[0][0], kMaxDim,
                                &s[0][0], kMaxBlock);
        continue;
      }
    }
    for (int t = t0; t < n; ++t) {
      const long kp = base + t * tok_stride;
      Row<T>::get(kc + kp, kf, D);
      for (int h = 0; h < n_h; ++h) {
        float dot = 0.f;
        // without this the reduction is a scalar FMA chain (no -ffast-math reassociation)
#pragma omp simd reduction(+ : dot)
        for (int d = 0; d < D; ++d) dot += qv[h][d] * kf[d];
        s[h][t - t0] = dot;
      }
    }
    for (int h = 0; h < n_h; ++h) softmax_block(s[h], n - t0, m[h], l[h], acc[h], D);
    for (int t = t0; t < n; ++t) {
      const long vp = base + t * tok_stride;
      Row<T>::get(vc + vp, kf, D);
      for (int h = 0; h < n_h; ++h) {
        const float p = s[h][t - t0];
        for (int d = 0; d < D; ++d) acc[h][d] += p * kf[d];
      }
    }
  }
  for (int h = 0; h < n_h; ++h) {
    float* oh = out + static_cast<long>(g * G + h_lo + h) * D;
    const float inv = len > 0 ? 1.f / l[h] : 0.f;
    for (int d = 0; d < D; ++d) oh[d] = acc[h][d] * inv;
  }
}

// window > 0: each query sees only the last `window` positions of its sequence
inline int window_lo(int len, int window) { return window > 0 ? std::max(0, len - window) : 0; }

template <typename T, int DC>
void decode(const float* q, const T* kc, const T* vc, const int32_t* tables, const int32_t* lens,
            float* out, int B, int H, int KVH, int D, int BS, int W, float scale, int nthreads, int window = 0) {
  const int G = H / KVH;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(nthreads)
  for (int b = 0; b < B; ++b) {
    for (int g = 0; g < KVH; ++g) {
      decode_group<T, DC>(q + static_cast<long>(b) * H * D, kc, vc, tables + static_cast<long>(b) * W, lens[b],
                          out + static_cast<long>(b) * H * D, H, KVH, D, BS, scale, g, 0, G,
                          window_lo(lens[b], window));
    }
  }
}

// Per-sequence variant, used when there are at least as many sequences as threads: one thread
// walks one sequence's blocks and handles every KV head of each block before moving on, so it
// streams each block as the contiguous run it is in the pool ([BS, KVH, D] per layer: 12 KB of K
// and 12 KB of V in fp32 for the default model) instead of reading one head's 1/KVH slice of it at
// a time, and it prefetches the next block of the table while computing this one (the table is
// arbitrary, so the hardware prefetcher cannot guess it). Same arithmetic, same order per head
// as `decode`, so both give the same result.
template <typename T, int DC>
void decode_seq(const float* q, const T* kc, const T* vc, const int32_t* tables, const int32_t* lens,
                float* out, int B, int H, int KVH, int D_, int BS, int W, float scale, int nthreads,
                int window = 0) {
  const int D = DC ? DC : D_;
  const int G = H / KVH;
  const long tok_stride = static_cast<long>(KVH) * (D + Row<T>::kExtra);
  const long blk_stride = tok_stride * BS;
  const long blk_bytes = blk_stride * static_cast<long>(sizeof(T));
#pragma omp parallel num_threads(nthreads)
  {
    std::vector<float> m(H), l(H), acc(static_cast<size_t>(H) * D), qv(static_cast<size_t>(H) * D),
        s(static_cast<size_t>(H) * BS);
#pragma omp for schedule(dynamic, 1)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < H; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.f;
        const float* qh = q + (static_cast<long>(b) * H + h) * D;
        for (int d = 0; d < D; ++d) { qv[h * D + d] = qh[d] * scale; acc[h * D + d] = 0.f; }
      }
      const int len = lens[b];
      const int nblk = (len + BS - 1) / BS;
      const int lo = window_lo(len, window);
      for (int j = lo / BS; j < nblk; ++j) {
        const long base = static_cast<long>(tables[static_cast<long>(b) * W + j]) * blk_stride;
        if (j + 1 < nblk) {
          const long next = static_cast<long>(tables[static_cast<long>(b) * W + j + 1]) * blk_stride;
          const char* nk = reinterpret_cast<const char*>(kc + next);
          const char* nv = reinterpret_cast<const char*>(vc + next);
          for (long off = 0; off < blk_bytes; off += 64) {
            __builtin_prefetch(nk + off, 0, 3);
            __builtin_prefetch(nv + off, 0, 3);
          }
        }
        const int t0 = std::max(0, lo - j * BS);     // window: the first block's first visible token
        const int n = std::min(BS, len - j * BS);
        if constexpr (kVecBlocks && DC > 0 && DC % 16 == 0) {
          if (t0 == 0) {    // a block the window cuts takes the per-token loop below
            for (int g = 0; g < KVH; ++g)
              block_heads<T, DC / 16>(&qv[g * G * D], kc + base + g * (D + Row<T>::kExtra),
                                      vc + base + g * (D + Row<T>::kExtra), tok_stride, n, D, G, &m[g * G],
                                      &l[g * G], &acc[static_cast<long>(g) * G * D], D, &s[g * G * BS], BS);
            continue;
          }
        }
        float kf[kMaxDim];
        for (int t = t0; t < n; ++t) {
          for (int g = 0; g < KVH; ++g) {
            const long kp = base + t * tok_stride + g * (D + Row<T>::kExtra);
            Row<T>::get(kc + kp, kf, D);
            for (int hh = 0; hh < G; ++hh) {
              const float* qh = &qv[(g * G + hh) * D];
              float dot = 0.f;
#pragma omp simd reduction(+ : dot)
              for (int d = 0; d < D; ++d) dot += qh[d] * kf[d];
              s[(g * G + hh) * BS + t - t0] = dot;
            }
          }
        }
        for (int h = 0; h < H; ++h) softmax_block(&s[h * BS], n - t0, m[h], l[h], &acc[h * D], D);
        for (int t = t0; t < n; ++t) {
          for (int g = 0; g < KVH; ++g) {
            const long vp = base + t * tok_stride + g * (D + Row<T>::kExtra);
            Row<T>::get(vc + vp, kf, D);
            for (int hh = 0; hh < G; ++hh) {
              const int h = g * G + hh;
              const float p = s[h * BS + t - t0];
              float* ah = &acc[h * D];
              for (int d = 0; d < D; ++d) ah[d] += p * kf[d];
            }
          }
        }
      }
      for (int h = 0; h < H; ++h) {
        float* oh = out + (static_cast<long>(b) * H + h) * D;
        const float inv = len > 0 ? 1.f / l[h] : 0.f;
        for (int d = 0; d < D; ++d) oh[d] = acc[h * D + d] * inv;
      }
    }
  }
}

// Blocks every sequence of the batch holds at the same table position, from the first: a shared
// system prompt's blocks (prefix caching hands each chat the same block ids). Only whole blocks.
inline int shared_prefix_blocks(const int32_t* tables, const int32_t* lens, int B, int W, int BS) {
  if (B < 2) return 0;
  int P = W;
  for (int b = 0; b < B; ++b) P = std::min(P, lens[b] / BS);
  for (int j = 0; j < P; ++j)
    for (int b = 1; b < B; ++b)
      if (tables[static_cast<long>(b) * W + j] != tables[j]) return j;
  return P;
}

// The shared prefix of one thread's sequences as two small matrix products, per KV head g: the
// R = nb * G query rows that read g against the prefix's Ts = P * BS tokens. Why: per sequence and
// head the block walk (block_heads) pays a reduction tree per 16 scores and an online-softmax
// rescale per block, and reloads each K / V row for every one of its query rows; over a prefix all
// rows read, the rows can share each load instead. Scores: each 16-token chunk of K is transposed
// once (dequantized: int8 codes times their scale, bf16 widened) into kt [D][16], then 8 query rows
// at a time sum q[d] * kt[d] over d, one token per lane, no reduction; then one softmax per row over
// the whole prefix; then P V with 16-lane V rows and the probabilities broadcast, RB rows at a time.
// Leaves each row's online-softmax state (max, sum, unnormalized output) for the sequence's own
// blocks, which block_heads walks as before. Numerics: fp32 throughout, sums in another order than
// block_heads' (a few ulps apart: tested against fp64 dense attention and the per-sequence walk).
// x in all 16 lanes (`v16f{} + x` would also add a zero, an instruction the compiler must keep)
inline lean::v16f splat(float x) {
#if defined(__AVX512F__)
  return _mm512_set1_ps(x);
#else
  return lean::v16f{} + x;
#endif
}

#if defined(__AVX512F__)
// r[i][j] -> r[j][i] for a 16 x 16 block of floats (four rounds of lane shuffles)
inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {     // rows 4i..4i+3 of column 4L + j in lane L of r[4i + j]
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
    t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);
    r[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);
    r[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xDD);
  }
}
#endif

template <typename T, int DC>
void shared_prefix(const float* qv, const T* kc, const T* vc, const int32_t* tables, int P, int BS, int nb,
                   int H, int KVH, long row, long tok_stride, long blk_stride, float* m, float* l, float* acc,
                   float* S) {
  using lean::v16f;
  constexpr int D = DC, NC = DC / 16, RB = NC <= 4 ? 6 : 3;   // P V: RB rows x NC accumulators
  const int G = H / KVH, R = nb * G;
  const long Ts = static_cast<long>(P) * BS;
  const long blk_bytes = blk_stride * static_cast<long>(sizeof(T));
  auto srow = [&](int g, int r) { return &S[(static_cast<size_t>(g) * R + r) * Ts]; };
  auto xrow = [&](int g, int r) { return static_cast<long>(r / G) * H + g * G + r % G; };   // state index
  auto prefetch = [&](const T* base) {
    const char* c = reinterpret_cast<const char*>(base);
    for (long off = 0; off < blk_bytes; off += 64) __builtin_prefetch(c + off, 0, 3);
  };
  alignas(64) float kt[D * 16];
  float tmp[D];
  // scores: block by block (each block's K read once, every KV head), 16 tokens at a time
  for (int j = 0; j < P; ++j) {
    const long blk = static_cast<long>(tables[j]) * blk_stride;
    if (j + 1 < P) prefetch(kc + static_cast<long>(tables[j + 1]) * blk_stride);
    for (int t0 = 0; t0 < BS; t0 += 16) {
      const int nt = std::min(16, BS - t0);
      for (int g = 0; g < KVH; ++g) {
#if defined(__AVX512F__)
        // 16 rows of 16 values at a time, widened (int8: times the row's scale, as Row::get) and
        // transposed in registers: one element at a time this was ~1,000 scalar moves a chunk,
        // as many instructions as the 8-row products below at a decode batch's 24 rows a head
        for (int c = 0; c < NC; ++c) {
          __m512 r[16];
          for (int t = 0; t < 16; ++t) {
            const T* kr = kc + blk + g * row + (t0 + t) * tok_stride;
            r[t] = t < nt ? __m512(lean::vload(kr + 16 * c) * row_scale(kr, D)) : _mm512_setzero_ps();
          }
          transpose16(r);
          for (int d = 0; d < 16; ++d) _mm512_store_ps(kt + (16 * c + d) * 16, r[d]);
        }
        (void)tmp;
#else
        for (int t = 0; t < 16; ++t) {
          if (t < nt) Row<T>::get(kc + blk + g * row + (t0 + t) * tok_stride, tmp, D);
          for (int d = 0; d < D; ++d) kt[d * 16 + t] = t < nt ? tmp[d] : 0.f;
        }
#endif
        for (int r0 = 0; r0 < R; r0 += 8) {
          const int rb = std::min(8, R - r0);
          v16f a[8];
          const float* qr[8];
          for (int k = 0; k < 8; ++k) { a[k] = v16f{}; qr[k] = qv + xrow(g, r0 + std::min(k, rb - 1)) * D; }
          for (int d = 0; d < D; ++d) {
            const v16f kv = lean::vload(kt + d * 16);
#pragma GCC unroll 8
            for (int k = 0; k < 8; ++k) a[k] = lean::madd(splat(qr[k][d]), kv, a[k]);
          }
          for (int k = 0; k < rb; ++k) {
            float* dst = srow(g, r0 + k) + j * BS + t0;
            if (nt == 16) std::memcpy(dst, &a[k], sizeof(v16f));
            else for (int t = 0; t < nt; ++t) dst[t] = a[k][t];
          }
        }
      }
    }
  }
  // one softmax per row over the whole prefix (Ts is whole blocks)
  for (int g = 0; g < KVH; ++g)
    for (int r = 0; r < R; ++r) {
      float* sr = srow(g, r);
      float mx = -INFINITY;
      for (long t = 0; t < Ts; ++t) mx = std::max(mx, sr[t]);
      v16f sum = v16f{};
      long t = 0;
      for (; t + 16 <= Ts; t += 16) {
        const v16f e = exp16(lean::vload(sr + t) - mx);
        std::memcpy(sr + t, &e, sizeof e);
        sum += e;
      }
      float tail = 0.f;
      for (; t < Ts; ++t) { sr[t] = fast_exp(sr[t] - mx); tail += sr[t]; }
      m[xrow(g, r)] = mx;
      l[xrow(g, r)] = lean::hsum(sum) + tail;
      std::memset(&acc[xrow(g, r) * D], 0, sizeof(float) * D);
    }
  // P V: block by block (each block's V read once), RB rows' outputs in registers over a block
  for (int j = 0; j < P; ++j) {
    const long blk = static_cast<long>(tables[j]) * blk_stride;
    if (j + 1 < P) prefetch(vc + static_cast<long>(tables[j + 1]) * blk_stride);
    for (int g = 0; g < KVH; ++g) {
      const T* vb = vc + blk + g * row;
      for (int r0 = 0; r0 < R; r0 += RB) {
        const int rb = std::min(RB, R - r0);
        v16f o[RB][NC];
        const float* pr[RB];
        for (int k = 0; k < RB; ++k) {
          const int r = r0 + std::min(k, rb - 1);
          pr[k] = srow(g, r) + static_cast<long>(j) * BS;
          for (int c = 0; c < NC; ++c) o[k][c] = lean::vload(&acc[xrow(g, r) * D + 16 * c]);
        }
        for (int t = 0; t < BS; ++t) {
          const T* vr = vb + t * tok_stride;
          const float sc = row_scale(vr, D);
          v16f v[NC];
          for (int c = 0; c < NC; ++c) v[c] = lean::vload(vr + 16 * c);
#pragma GCC unroll 6
          for (int k = 0; k < RB; ++k) {
            const v16f pk = splat(pr[k][t] * sc);
            for (int c = 0; c < NC; ++c) o[k][c] = lean::madd(pk, v[c], o[k][c]);
          }
        }
        for (int k = 0; k < rb; ++k)
          for (int c = 0; c < NC; ++c) std::memcpy(&acc[xrow(g, r0 + k) * D + 16 * c], &o[k][c], sizeof(v16f));
      }
    }
  }
}

// decode_seq for a batch whose sequences share their first P blocks (P >= 1), with AVX-512 and
// D % 16 == 0, no window: each thread takes a fixed share of the sequences; their shared prefix is
// computed as two small matrix products per KV head (shared_prefix), reading each prefix block once
// per thread for all its query rows; then each sequence's own blocks as decode_seq walks them.
// Floats of scratch decode_shared_rows needs for nb sequences: per sequence and head the
// online-softmax state (2), scaled query and output accumulator (2 D), a block's scores (BS); then
// the prefix's scores (P * BS per sequence and head).
inline size_t shared_rows_floats(int nb, int H, int D, int BS, int P) {
  return static_cast<size_t>(nb) * H * (2 + 2 * static_cast<size_t>(D) + BS + static_cast<size_t>(P) * BS);
}

// One thread's share of decode_shared: sequences [b0, b1) (q, out, tables and lens indexed by the
// batch's own b), in `scratch` of shared_rows_floats(b1 - b0, ...) floats, which the caller owns
// and keeps (allocating here cannot fail safely on the lean step's threads, and a fresh buffer a
// layer was mapped and cleared by the kernel every time: ~5% of a bf16 burst's samples). Also the
// lean C++ step's attention for a decode batch (kernels/csrc/cpu_lean_step.cpp), whose threads are
// its own, not OpenMP's.
template <typename T, int DC>
void decode_shared_rows(const float* q, const T* kc, const T* vc, const int32_t* tables, const int32_t* lens,
                        float* out, int b0, int b1, int H, int KVH, int BS, int W, float scale, int P,
                        float* scratch) {
  constexpr int D = DC;
  const int G = H / KVH;
  const long row = D + Row<T>::kExtra;
  const long tok_stride = static_cast<long>(KVH) * row;
  const long blk_stride = tok_stride * BS;
  const long blk_bytes = blk_stride * static_cast<long>(sizeof(T));
  auto prefetch = [&](long base) {
    const char* nk = reinterpret_cast<const char*>(kc + base);
    const char* nv = reinterpret_cast<const char*>(vc + base);
    for (long off = 0; off < blk_bytes; off += 64) {
      __builtin_prefetch(nk + off, 0, 3);
      __builtin_prefetch(nv + off, 0, 3);
    }
  };
  {
    const int nb = b1 - b0;
    const size_t rows = static_cast<size_t>(nb) * H;
    float* const m = scratch;
    float* const l = m + rows;
    float* const acc = l + rows;
    float* const qv = acc + rows * D;
    float* const s = qv + rows * D;
    float* const S = s + rows * BS;   // the prefix's scores [KVH][rows][Ts], each written before it is read
    for (int i = 0; i < nb; ++i)
      for (int h = 0; h < H; ++h) {
        const long x = static_cast<long>(i) * H + h;
        const float* qh = q + (static_cast<long>(b0 + i) * H + h) * D;
        for (int d = 0; d < D; ++d) qv[x * D + d] = qh[d] * scale;
      }
    if (nb > 0)
      shared_prefix<T, DC>(qv, kc, vc, tables, P, BS, nb, H, KVH, row, tok_stride, blk_stride, m, l, acc, S);
    auto block = [&](int i, long base, int n) {     // sequence b0 + i, one block: every KV head
      const long x = static_cast<long>(i) * H;
      for (int g = 0; g < KVH; ++g)
        block_heads<T, DC / 16>(&qv[(x + g * G) * D], kc + base + g * row, vc + base + g * row, tok_stride, n, D,
                                G, &m[x + g * G], &l[x + g * G], &acc[(x + g * G) * D], D,
                                &s[(x + g * G) * BS], BS);
    };
    for (int i = 0; i < nb; ++i) {      // then each sequence's own blocks
      const int b = b0 + i, len = lens[b];
      const int nblk = (len + BS - 1) / BS;
      const int32_t* tb = tables + static_cast<long>(b) * W;
      for (int j = P; j < nblk; ++j) {
        if (j + 1 < nblk) prefetch(static_cast<long>(tb[j + 1]) * blk_stride);
        block(i, static_cast<long>(tb[j]) * blk_stride, std::min(BS, len - j * BS));
      }
      for (int h = 0; h < H; ++h) {
        const long x = static_cast<long>(i) * H + h;
        float* oh = out + (static_cast<long>(b) * H + h) * D;
        const float inv = len > 0 ? 1.f / l[x] : 0.f;
        for (int d = 0; d < D; ++d) oh[d] = acc[x * D + d] * inv;
      }
    }
  }
}

template <typename T, int DC>
void decode_shared(const float* q, const T* kc, const T* vc, const int32_t* tables, const int32_t* lens,
                   float* out, int B, int H, int KVH, int BS, int W, float scale, int nthreads, int P) {
#pragma omp parallel num_threads(nthreads)
  {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int b0 = static_cast<int>(static_cast<long>(B) * tid / nt);
    const int b1 = static_cast<int>(static_cast<long>(B) * (tid + 1) / nt);
    thread_local std::vector<float> scratch;     // OpenMP's threads persist: kept across calls
    const size_t need = shared_rows_floats(b1 - b0, H, DC, BS, P);
    if (scratch.size() < need) scratch.resize(need);
    decode_shared_rows<T, DC>(q, kc, vc, tables, lens, out, b0, b1, H, KVH, BS, W, scale, P, scratch.data());
  }
}

// Whether decode_shared takes a batch of B sequences over nthreads whose shared prefix is P blocks:
// the scores' scratch is (sequences per thread) x H x prefix floats a thread, bounded here (a long
// prompt shared by many chats walks per sequence instead)
inline bool shared_fits(int B, int nthreads, int H, int P, int BS) {
  return P > 0 && (static_cast<long>(B) / nthreads + 1) * H * P * BS <= kSharedScratchMax;
}

template <typename T, int DC>
void run(const float* q, const T* kc, const T* vc, const int32_t* tables, const int32_t* lens,
         float* out, int B, int H, int KVH, int D, int BS, int W, float scale, int nthreads, int window = 0) {
  if constexpr (kVecBlocks && DC > 0 && DC % 16 == 0) {
    if (B >= nthreads && window == 0) {
      const int P = shared_prefix_blocks(tables, lens, B, W, BS);
      if (shared_fits(B, nthreads, H, P, BS)) {
        decode_shared<T, DC>(q, kc, vc, tables, lens, out, B, H, KVH, BS, W, scale, nthreads, P);
        return;
      }
    }
  }
  if (B >= nthreads && B > 1) {
    decode_seq<T, DC>(q, kc, vc, tables, lens, out, B, H, KVH, D, BS, W, scale, nthreads, window);
  } else {            // fewer sequences than threads: split each sequence's KV heads too
    decode<T, DC>(q, kc, vc, tables, lens, out, B, H, KVH, D, BS, W, scale, nthreads, window);
  }
}

template <typename T>
void dispatch(const float* q, const T* kc, const T* vc, const int32_t* tables, const int32_t* lens,
              float* out, int B, int H, int KVH, int D, int BS, int W, float scale, int nthreads, int window = 0) {
  switch (D) {        // the common head sizes get fully unrolled loops; any other D runs as is
    case 64: run<T, 64>(q, kc, vc, tables, lens, out, B, H, KVH, D, BS, W, scale, nthreads, window); break;
    case 128: run<T, 128>(q, kc, vc, tables, lens, out, B, H, KVH, D, BS, W, scale, nthreads, window); break;
    default: run<T, 0>(q, kc, vc, tables, lens, out, B, H, KVH, D, BS, W, scale, nthreads, window);
  }
}

}  // namespace paged_decode
