// The test that lets a greedy step skip most of the LM head (kernels/greedy_head.py has the why
// and the derivation). For each vocabulary row v an approximate logit a (from a cheaper copy of
// the head) and a bound e = n1 * c1[v] + n2 * c2[v] with |exact - a| <= e + rho * |a| are known.
// tau, the largest lower bound of any row, is at most the argmax's exact logit; a row whose upper
// bound stays below tau (with a margin of rho * |tau| for a logit rounded to bf16, where two
// different sums can round to one value) cannot be the argmax and is never computed.
#pragma once

#include <cmath>

namespace greedy_screen {

// what is known of one row of approximate logits: its values (through ld, fp32 or bf16) and bounds
template <typename LD>
struct Row {
  LD ld; const float* c1; const float* c2; float n1, n2, rho;   // c2 may be null (n2 unused)

  float bound(long v) const { return n1 * c1[v] + (c2 != nullptr ? n2 * c2[v] : 0.f); }

  // the largest lower bound over rows [v0, v1): 16 running maxima the compiler keeps in vector
  // lanes; the ternary is a vector max (a NaN lower bound is skipped)
  float tau(long v0, long v1) const {
    float m[16];
    for (int l = 0; l < 16; ++l) m[l] = -INFINITY;
    long v = v0;
    for (; v + 16 <= v1; v += 16)
      for (int l = 0; l < 16; ++l) {
        const float a = ld(v + l), lo = a - bound(v + l) - rho * std::fabs(a);
        m[l] = lo > m[l] ? lo : m[l];
      }
    float t = -INFINITY;
    for (; v < v1; ++v) {
      const float a = ld(v), lo = a - bound(v) - rho * std::fabs(a);
      t = lo > t ? lo : t;
    }
    for (int l = 0; l < 16; ++l) t = m[l] > t ? m[l] : t;
    return t;
  }

  // whether row v may reach tau (a NaN approximation counts as a candidate: its exact logit is
  // computed, so a broken row reaches the sampler as it would without the screen)
  bool may_reach(long v, float tau) const {
    const float a = ld(v), e = bound(v);
    return !(a + e + rho * (std::fabs(a) + e + std::fabs(tau)) < tau);
  }
};

template <typename LD>
Row<LD> row(LD ld, const float* c1, const float* c2, float n1, float n2, float rho) {
  return Row<LD>{ld, c1, c2, n1, n2, rho};
}

}  // namespace greedy_screen
