// exp in a form the compiler vectorizes, shared by the CPU kernels (attention softmax, SiLU,
// the sampler's normaliser). glibc's expf has no vector variant without -ffast-math, and a scalar
// call per element was a large share of each of those loops.
//
// x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact n ln2), a degree-6 polynomial
// for e^r, and 2^n built from the exponent bits. Relative error ~2e-7; like torch's own vector
// exp it is not correctly rounded. Saturates to 0 below -87 and to +inf above 88.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

inline float fast_exp(float x) {
  const float xc = std::min(std::max(x, -87.0f), 88.0f);
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
  const float e = p * scale;
  return x < -87.0f ? 0.0f : (x > 88.0f ? INFINITY : e);
}
