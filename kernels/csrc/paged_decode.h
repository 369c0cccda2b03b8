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
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <vector>

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

template <typename T, int DC>
void run(const float* q, const T* kc, const T* vc, const int32_t* tables, const int32_t* lens,
         float* out, int B, int H, int KVH, int D, int BS, int W, float scale, int nthreads, int window = 0) {
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
