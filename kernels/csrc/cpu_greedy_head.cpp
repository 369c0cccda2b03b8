// The screened LM head of a greedy batch step on the loop path (kernels/greedy_head.py): given the
// approximate logits a [M, V] of a cheaper head copy (oneDNN's bf16 product), keep per row only
// the vocabulary rows that may be the argmax (greedy_screen.h) and compute those from the real
// fp32 weights, with the lean step's dot product (lean_gemm.h: 16 lanes in k order, a fixed tree).
// The others become -inf. Bounds per row m and vocabulary row v: n1[m] * c1[v] + n2[m] * c2[v].
#include <cmath>
#include <cstdint>

#include "greedy_screen.h"
#include "lean_gemm.h"

extern "C" {

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
