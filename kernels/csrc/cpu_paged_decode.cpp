// Decode attention over the paged KV pool, read in place (no per-layer gather of K/V).
//
// Why a hand-written loop: the torch path gathers every sequence's K and V into contiguous
// copies per layer before SDPA; at chat context lengths that copy is a large share of a step.
// Here each (sequence, KV head) pair walks its block table and streams K and V straight from the
// pool with an online softmax, so every byte of K/V is read once from where it lives.
//
// Layout (docs/DESIGN.md): cache [num_blocks, block_size, kv_heads, head_dim], contiguous.
// Query/out: [B, H, D] fp32 contiguous. GQA: query head h uses KV head h / (H / KVH).
// Parallel over (sequence, KV head) with OpenMP; the process's OpenMP runtime is torch's own
// (libgomp.so.1 is already loaded by torch when this library is opened).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>

namespace {

inline float load(const float* p, long i) { return p[i]; }
inline float load(const uint16_t* p, long i) {
  uint32_t bits = static_cast<uint32_t>(p[i]) << 16;   // bf16 -> fp32 is a 16-bit shift
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// exp for x <= 0 in a form the compiler vectorizes (glibc's expf has no vector variant without
// -ffast-math, and a scalar call per score was a large share of the kernel): x = n ln2 + r,
// |r| <= ln2/2, degree-6 polynomial for e^r, 2^n from the exponent bits. Relative error ~2e-7.
inline float exp_nonpos(float x) {
  const float xc = std::max(x, -87.0f);
  const float n = std::nearbyint(xc * 1.44269504088896341f);
  const float r = (xc - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
  float p = 1.3888889e-3f;
  p = p * r + 8.3333337e-3f;
  p = p * r + 4.1666668e-2f;
  p = p * r + 1.6666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < -87.0f ? 0.0f : p * scale;
}

constexpr int kMaxGroup = 16;
constexpr int kMaxDim = 256;
constexpr int kMaxBlock = 128;

template <typename T>
void decode(const float* q, const T* kc, const T* vc, const int32_t* tables, const int32_t* lens,
            float* out, int B, int H, int KVH, int D, int BS, int W, float scale, int nthreads) {
  const int G = H / KVH;
  const long tok_stride = static_cast<long>(KVH) * D;
  const long blk_stride = tok_stride * BS;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(nthreads)
  for (int b = 0; b < B; ++b) {
    for (int g = 0; g < KVH; ++g) {
      float m[kMaxGroup], l[kMaxGroup];
      float acc[kMaxGroup][kMaxDim];
      float qv[kMaxGroup][kMaxDim];
      float s[kMaxGroup][kMaxBlock];
      float kf[kMaxDim];
      for (int h = 0; h < G; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.f;
        const float* qh = q + (static_cast<long>(b) * H + g * G + h) * D;
        for (int d = 0; d < D; ++d) { qv[h][d] = qh[d] * scale; acc[h][d] = 0.f; }
      }
      const int len = lens[b];
      const int nblk = (len + BS - 1) / BS;
      for (int j = 0; j < nblk; ++j) {
        const long base = static_cast<long>(tables[static_cast<long>(b) * W + j]) * blk_stride + g * D;
        const int n = std::min(BS, len - j * BS);
        for (int t = 0; t < n; ++t) {
          const long kp = base + t * tok_stride;
          for (int d = 0; d < D; ++d) kf[d] = load(kc, kp + d);
          for (int h = 0; h < G; ++h) {
            float dot = 0.f;
            // without this the reduction is a scalar FMA chain (no -ffast-math reassociation)
#pragma omp simd reduction(+ : dot)
            for (int d = 0; d < D; ++d) dot += qv[h][d] * kf[d];
            s[h][t] = dot;
          }
        }
        for (int h = 0; h < G; ++h) {
          float bm = m[h];
          for (int t = 0; t < n; ++t) bm = std::max(bm, s[h][t]);
          const float corr = std::exp(m[h] - bm);   // exp(-inf) = 0 on the first block
          l[h] *= corr;
          for (int d = 0; d < D; ++d) acc[h][d] *= corr;
          m[h] = bm;
          float sum = 0.f;
          float* sh = s[h];
#pragma omp simd reduction(+ : sum)
          for (int t = 0; t < n; ++t) {
            sh[t] = exp_nonpos(sh[t] - bm);
            sum += sh[t];
          }
          l[h] += sum;
        }
        for (int t = 0; t < n; ++t) {
          const long vp = base + t * tok_stride;
          for (int d = 0; d < D; ++d) kf[d] = load(vc, vp + d);
          for (int h = 0; h < G; ++h) {
            const float p = s[h][t];
            for (int d = 0; d < D; ++d) acc[h][d] += p * kf[d];
          }
        }
      }
      for (int h = 0; h < G; ++h) {
        float* oh = out + (static_cast<long>(b) * H + g * G + h) * D;
        const float inv = len > 0 ? 1.f / l[h] : 0.f;
        for (int d = 0; d < D; ++d) oh[d] = acc[h][d] * inv;
      }
    }
  }
}

}  // namespace

extern "C" {

int paged_decode_limits(int* max_group, int* max_dim, int* max_block) {
  *max_group = kMaxGroup; *max_dim = kMaxDim; *max_block = kMaxBlock;
  return 0;
}

void paged_decode_f32(const float* q, const float* kc, const float* vc, const int32_t* tables,
                      const int32_t* lens, float* out, int B, int H, int KVH, int D, int BS, int W,
                      float scale, int nthreads) {
  decode<float>(q, kc, vc, tables, lens, out, B, H, KVH, D, BS, W, scale, nthreads);
}

void paged_decode_bf16(const float* q, const uint16_t* kc, const uint16_t* vc, const int32_t* tables,
                       const int32_t* lens, float* out, int B, int H, int KVH, int D, int BS, int W,
                       float scale, int nthreads) {
  decode<uint16_t>(q, kc, vc, tables, lens, out, B, H, KVH, D, BS, W, scale, nthreads);
}

}
