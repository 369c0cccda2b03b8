// One pass per logits row for the sampler: the row's log-sum-exp and its K largest entries.
//
// Why: the sampler's fast path needs, per row, the top-K candidates and the normaliser of the
// whole row. In torch that is `topk` plus a full `log_softmax` (which also writes a 49k-wide
// output nobody reads) — two parallel passes over [B, V], each of which costs a scheduling slice
// on a busy 2-core machine. Here one OpenMP region walks each row once while it is in cache:
// running max and rescaled sum of exponentials (online softmax), and a min-heap of the K best
// (value, index) pairs; a value at or below the heap's minimum is rejected with one compare, so
// after the first few hundred entries the heap is almost never touched.
//
// Output order of the candidates is unspecified (the caller sorts them canonically). Among
// entries tied with the K-th value an arbitrary subset is kept, as with torch.topk; the sampler
// never trusts a tie at the candidate boundary. NaN rows are the caller's to reject.
#include <cmath>
#include "fast_exp.h"
#include <cstdint>
#include <algorithm>
#include <utility>

namespace {

struct Greater {   // min-heap on value; among equal values, the larger index is evicted first
  bool operator()(const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) const {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  }
};

constexpr long kChunk = 64;

}  // namespace

extern "C" {

void sampler_row_stats(const float* x, int R, long V, int K, float* top_vals, int64_t* top_idx,
                       float* lse, int nthreads) {
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (int r = 0; r < R; ++r) {
    const float* row = x + static_cast<long>(r) * V;
    const long k0 = std::min<long>(K, V);
    std::pair<float, int64_t>* heap = new std::pair<float, int64_t>[k0];
    for (long j = 0; j < k0; ++j) heap[j] = {row[j], j};
    std::make_heap(heap, heap + k0, Greater());
    float m = -INFINITY;
    for (long j = 0; j < k0; ++j) m = std::max(m, row[j]);
    // candidates: a chunk whose max is not above the heap's minimum is skipped in one compare;
    // the chunk maxima also give the row max (one pass for both)
    for (long c = k0; c < V; c += kChunk) {
      const long e = std::min(V, c + kChunk);
      float cm = -INFINITY;
#pragma omp simd reduction(max : cm)
      for (long j = c; j < e; ++j) cm = std::max(cm, row[j]);
      m = std::max(m, cm);
      if (!(cm > heap[0].first)) continue;
      for (long j = c; j < e; ++j) {
        const float v = row[j];
        if (v > heap[0].first) {
          std::pop_heap(heap, heap + k0, Greater());
          heap[k0 - 1] = {v, j};
          std::push_heap(heap, heap + k0, Greater());
        }
      }
    }
    float s = 0.f;
    if (m != -INFINITY && m != INFINITY) {
#pragma omp simd reduction(+ : s)
      for (long j = 0; j < V; ++j) s += fast_exp(row[j] - m);
    }
    lse[r] = m == INFINITY ? m : m + std::log(s);
    for (long j = 0; j < k0; ++j) {
      top_vals[static_cast<long>(r) * K + j] = heap[j].first;
      top_idx[static_cast<long>(r) * K + j] = heap[j].second;
    }
    delete[] heap;
  }
}

}
