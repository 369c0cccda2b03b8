// The screened LM head of a greedy batch step on the loop path (kernels/greedy_head.py): given the
// approximate logits a [M, V] of a cheaper head copy (oneDNN's bf16 product), keep per row only
// the vocabulary rows that may be the argmax (greedy_screen.h) and compute those from the real
// fp32 weights, with the lean step's dot product (lean_gemm.h: 16 lanes in k order, a fixed tree).
// The others become -inf. Bounds per row m and vocabulary row v: n1[m] * c1[v] + n2[m] * c2[v].
// Also the copies' construction at load (one pass over the head instead of torch's dozen): the int8
// codes with their scales and each row's bound factor, and the bf16 copy's factors.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "greedy_screen.h"
#include "lean_gemm.h"

namespace {

// the bound's factor for one row (kernels/greedy_head.py): 2 (max|w - w^| + (2 gamma + 2^-22) max|w|),
// rounded up by 2^-20; gamma = (K + 2) 2^-24
inline float coef_of(double err, double big, long K) {
  const double gamma = (K + 2) * std::ldexp(1.0, -24);
  return static_cast<float>(2.0 * (err + (2.0 * gamma + std::ldexp(1.0, -22)) * big) * (1 + std::ldexp(1.0, -20)));
}

template <typename W>
void int8_copy(const W* w, long V, long K, int8_t* codes, float* scale, float* coef, int nthreads) {
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (long v = 0; v < V; ++v) {
    const W* wr = w + v * K;
    float amax = 0.f;
    for (long k = 0; k < K; ++k) amax = std::max(amax, std::fabs(lean::Weight<W>::ld(wr, k)));
    const float sc = std::max(amax / 127.0f, 1e-12f);
    double err = 0, big = 0;
    bool finite = true;
    for (long k = 0; k < K; ++k) {
      const float x = lean::Weight<W>::ld(wr, k);
      finite = finite && std::isfinite(x);
      const float c = std::min(127.f, std::max(-127.f, std::nearbyint(x / sc)));   // half to even
      codes[v * K + k] = static_cast<int8_t>(c);
      const double a = static_cast<double>(c) * sc;     // what the step sums: code x fp32 scale
      err = std::max(err, std::fabs(static_cast<double>(x) - a));
      big = std::max({big, std::fabs(static_cast<double>(x)), std::fabs(a)});
    }
    scale[v] = sc;
    coef[v] = finite ? coef_of(err, big, K) : INFINITY;   // a broken row is always computed
  }
}

}  // namespace

extern "C" {

// whether the lean step built on this machine takes the int8 copy in column blocks (AVX-512:
// lean_gemm.h gemm_i8_blocks); both libraries are built with -march=native here
int greedy_column_blocks() {
#if defined(__AVX512F__)
  return 1;
#else
  return 0;
#endif
}

// the lean step's int8 copy of a head [V, K] (fp32 or bf16 weights, `bf16` says which)
void greedy_int8_copy(const void* w, int bf16, long V, long K, int8_t* codes, float* scale, float* coef,
                      int nthreads) {
  if (bf16) int8_copy(static_cast<const uint16_t*>(w), V, K, codes, scale, coef, nthreads);
  else int8_copy(static_cast<const float*>(w), V, K, codes, scale, coef, nthreads);
}

// the bf16 copy's factors for an fp32 head: coef (as above, w^ = bf16(w) as given) and 2 max|w|
void greedy_bf16_coef(const float* w, const uint16_t* wb, long V, long K, float* coef, float* coef2,
                      int nthreads) {
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (long v = 0; v < V; ++v) {
    double err = 0, big = 0;
    bool finite = true;
    for (long k = 0; k < K; ++k) {
      const double x = w[v * K + k], a = lean::Weight<uint16_t>::ld(wb + v * K, k);
      finite = finite && std::isfinite(x);
      err = std::max(err, std::fabs(x - a));
      big = std::max({big, std::fabs(x), std::fabs(a)});
    }
    coef[v] = finite ? coef_of(err, big, K) : INFINITY;   // a broken row is always computed
    coef2[v] = static_cast<float>(2.0 * big * (1 + std::ldexp(1.0, -20)));
  }
}

// out [M, V] fp32; returns how many logits were computed (the candidates, all rows together)
long greedy_screen_rows(const float* a, int M, long V, const float* x, long Kd, const float* w,
                        const float* c1, const float* c2, const float* n1, const float* n2, float rho,
                        float* out, int nthreads) {
  const long K16 = Kd - Kd % 16;
  long computed = 0;
#pragma omp parallel for schedule(static) num_threads(nthreads) reduction(+ : computed)
  for (int m = 0; m < M; ++m) {
    const float* am = a + m * V;
    const float* xm = x + m * Kd;
    float* om = out + m * V;
    const auto r = greedy_screen::row([am](long v) { return am[v]; }, c1, c2, n1[m], n2[m], rho);
    const float tau = r.tau(0, V);
    for (long v = 0; v < V; ++v) om[v] = -INFINITY;
    for (long v = 0; v < V; ++v) {
      if (!r.may_reach(v, tau)) continue;
      const float* wr = w + v * Kd;
      float s = lean::hsum(lean::dot1(wr, xm, K16));
      for (long k = K16; k < Kd; ++k) s += wr[k] * xm[k];
      om[v] = s;
      ++computed;
    }
  }
  return computed;
}

}
