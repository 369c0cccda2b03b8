// One decode step of one sequence (one new token) through the whole decoder in a single call.
//
// Why: at batch 1 the fused Python loop (engine/exec/models/llama_cpu_fused.py) still makes ~10
// calls per layer (300 per token for the default model), each a Python -> C++ hop, and its GEMMs
// go through oneDNN, whose packed kernels are built for many rows and read one row's weights at
// ~20-24 GB/s here. This file runs embedding -> 30 layers -> final norm -> LM head without leaving
// C++: the small ops are the same templates as the fused loop (layer_ops.h), attention is the same
// paged decode kernel (paged_decode.h), and each linear is a matrix-vector product that streams
// its weight rows once, in the order they lie in memory, split across threads by rows.
//
// Numerics: the small ops and attention round exactly as the fused loop does (this file is built
// with -ffp-contract=off like cpu_layer_ops.cpp). The matrix-vector products sum each dot product
// in fp32 in another order than oneDNN (a few ulps); the tests check greedy tokens against HF and
// logits against the fused loop. Weights: plain row-major [N, K] in the activation dtype (fp32 or
// bf16), or int8 codes with one scale per output row (engine/exec/cpu_linear.py's Int8Linear:
// y = dtype(sum(x * q) * scale), as torch's _weight_int8pack_mm computes it).
//
// Per layer, the pointer table holds (int64, 0 = absent):
//   ln1, qkv, qkv_bias, o, o_bias, ln2, gate_up, down, qkv_scale, o_scale, gate_up_scale, down_scale
// KV pool: [2, L, num_blocks, block_size, KVH, D] contiguous in the activation dtype.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "layer_ops.h"
#include "paged_decode.h"

namespace {

constexpr int kPtrs = 12;
enum { LN1, QKV, QKV_B, O, O_B, LN2, GATE_UP, DOWN, QKV_S, O_S, GATE_UP_S, DOWN_S };

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

// Threads: the step makes its own (std::thread, once per call) and keeps them together with a
// spinning barrier between phases. Not OpenMP: a step has ~180 phases, and libgomp lets an idle
// worker spin only ~1,000 rounds when the process has more OpenMP threads than cores (the engine
// thread's team beside the main thread's), so every phase paid a futex wake-up (measured: 20-25
// ms per step instead of ~15 ms).
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void wait() {
    if (n_ == 1) return;
    const int gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_release);
      return;
    }
    for (int spins = 0; gen_.load(std::memory_order_acquire) == gen; ++spins) {
      if (spins > 4000) std::this_thread::yield();     // a busy machine: let the late thread run
    }
  }

 private:
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<int> gen_{0};
};

// y[n] = dtype(dot(W[n, :], x) (* scale[n]) (+ bias[n])) for rows n in [r0, r1); x already fp32.
// Four rows at a time share each load of x; a thread's rows are contiguous, so it streams its
// share of the weight once, front to back.
template <typename K, typename W>
void gemv(const W* w, const float* x, const typename K::T* bias, const float* scale,
          typename K::T* y, long r0, long r1, long Kd) {
  for (long n0 = r0; n0 < r1; n0 += 4) {
    const int rows = static_cast<int>(std::min(4L, r1 - n0));
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    if (rows == 4) {
      const W *w0 = w + n0 * Kd, *w1 = w0 + Kd, *w2 = w1 + Kd, *w3 = w2 + Kd;
      float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (long k = 0; k < Kd; ++k) {
        const float xv = x[k];
        s0 += Weight<W>::ld(w0, k) * xv;
        s1 += Weight<W>::ld(w1, k) * xv;
        s2 += Weight<W>::ld(w2, k) * xv;
        s3 += Weight<W>::ld(w3, k) * xv;
      }
      s[0] = s0; s[1] = s1; s[2] = s2; s[3] = s3;
    } else {
      for (int r = 0; r < rows; ++r) {
        const W* wr = w + (n0 + r) * Kd;
        float acc = 0.f;
#pragma omp simd reduction(+ : acc)
        for (long k = 0; k < Kd; ++k) acc += Weight<W>::ld(wr, k) * x[k];
        s[r] = acc;
      }
    }
    for (int r = 0; r < rows; ++r) {
      float v = s[r];
      if (scale != nullptr) v = K::rnd(v * scale[n0 + r]);   // int8: the product rounds first
      if (bias != nullptr) v += K::ld(bias, n0 + r);            // F.linear adds it before rounding
      K::st(y, n0 + r, v);
    }
  }
}

template <typename K>
void to_f32(const typename K::T* a, float* out, long n) {
  for (long i = 0; i < n; ++i) out[i] = K::ld(a, i);
}

inline long part(long n, int tid, int nt) { return n * tid / nt; }   // thread tid's share: [part(tid), part(tid+1))

template <typename K, typename W>
struct Step {
  using T = typename K::T;
  const int64_t* ptrs; int L, Dm, H, KVH, D, I; const T* embed; long token; const T* norm; const W* lm_head;
  const float* lm_scale; long V; const T* cos; const T* sin; long pos, slot; T* pool; long num_blocks;
  int BS; const int32_t* table; int seq_len; float eps, scale; float* logits; int nt;
  // shared between the threads
  std::vector<T> qkv, q, delta, gu, act, lg;
  std::vector<float> qf, of;

  void init() {
    qkv.resize(static_cast<long>(H + 2 * KVH) * D); q.resize(static_cast<long>(H) * D); delta.resize(Dm);
    gu.resize(2L * I); act.resize(I); lg.resize(V); qf.resize(static_cast<long>(H) * D);
    of.resize(static_cast<long>(H) * D);
  }

  template <typename WW>
  void lin(const int64_t* p, int wi, int bi, int si, const float* xf, T* y, long N, long Kd, int tid) {
    gemv<K, WW>(reinterpret_cast<const WW*>(p[wi]), xf, bi >= 0 ? reinterpret_cast<const T*>(p[bi]) : nullptr,
                si >= 0 && p[si] ? reinterpret_cast<const float*>(p[si]) : nullptr, y, part(N, tid, nt),
                part(N, tid + 1, nt), Kd);
  }

  void run(int tid, SpinBarrier& bar) {
    const long qkv_n = static_cast<long>(H + 2 * KVH) * D, hd = static_cast<long>(H) * D;
    const long slab = num_blocks * BS * KVH * static_cast<long>(D);     // one layer's K (or V)
    std::vector<T> x(Dm), a(Dm);                                        // every thread's own copy
    std::vector<float> xf(std::max<long>({static_cast<long>(Dm), static_cast<long>(I), hd}));
    std::memcpy(x.data(), embed + token * Dm, sizeof(T) * Dm);
    const int64_t p_pos = pos, p_slot = slot;
    const int G = H / KVH;
    for (int i = 0; i < L; ++i) {
      const int64_t* p = ptrs + static_cast<long>(i) * kPtrs;
      T* kc = pool + static_cast<long>(i) * slab;
      T* vc = pool + static_cast<long>(L + i) * slab;
      layer_ops::add_rms_norm<K>(x.data(), i ? delta.data() : nullptr, reinterpret_cast<const T*>(p[LN1]),
                                 a.data(), 1, Dm, eps, 1);
      to_f32<K>(a.data(), xf.data(), Dm);
      lin<W>(p, QKV, QKV_B, QKV_S, xf.data(), qkv.data(), qkv_n, Dm, tid);
      bar.wait();
      if (tid == 0) {
        layer_ops::rope_store<K>(qkv.data(), 1, H, KVH, D, cos, sin, &p_pos, &p_slot, q.data(), kc, vc, 1);
        to_f32<K>(q.data(), qf.data(), hd);
      }
      bar.wait();
      // attention: query heads split across threads; heads of one KV group stay together
      const int h0 = static_cast<int>(part(H, tid, nt)), h1 = static_cast<int>(part(H, tid + 1, nt));
      for (int g = h0 / G; g * G < h1; ++g) {
        const int lo = std::max(h0, g * G) - g * G, hi = std::min(h1, (g + 1) * G) - g * G;
        if (lo < hi) {
          if (D == 64) {
            paged_decode::decode_group<T, 64>(qf.data(), kc, vc, table, seq_len, of.data(), H, KVH, D, BS, scale, g, lo, hi);
          } else if (D == 128) {
            paged_decode::decode_group<T, 128>(qf.data(), kc, vc, table, seq_len, of.data(), H, KVH, D, BS, scale, g, lo, hi);
          } else {
            paged_decode::decode_group<T, 0>(qf.data(), kc, vc, table, seq_len, of.data(), H, KVH, D, BS, scale, g, lo, hi);
          }
        }
      }
      bar.wait();
      for (long j = 0; j < hd; ++j) xf[j] = K::rnd(of[j]);     // the loop's attention output in dtype
      lin<W>(p, O, O_B, O_S, xf.data(), delta.data(), Dm, hd, tid);
      bar.wait();
      layer_ops::add_rms_norm<K>(x.data(), delta.data(), reinterpret_cast<const T*>(p[LN2]), a.data(), 1, Dm,
                                 eps, 1);
      to_f32<K>(a.data(), xf.data(), Dm);
      // gate rows j and up rows I + j on the same thread, so it can finish silu(gate) * up alone
      const long j0 = part(I, tid, nt), j1 = part(I, tid + 1, nt);
      const W* wgu = reinterpret_cast<const W*>(p[GATE_UP]);
      const float* sgu = p[GATE_UP_S] ? reinterpret_cast<const float*>(p[GATE_UP_S]) : nullptr;
      gemv<K, W>(wgu, xf.data(), nullptr, sgu, gu.data(), j0, j1, Dm);
      gemv<K, W>(wgu, xf.data(), nullptr, sgu, gu.data(), I + j0, I + j1, Dm);
      for (long j = j0; j < j1; ++j) {        // layer_ops::silu_mul's arithmetic, on this thread's rows
        const float g = K::ld(gu.data(), j);
        const float s = g / (1.0f + fast_exp(-g));
        K::st(act.data(), j, K::rnd(s) * K::ld(gu.data(), I + j));
      }
      bar.wait();
      to_f32<K>(act.data(), xf.data(), I);
      lin<W>(p, DOWN, -1, DOWN_S, xf.data(), delta.data(), Dm, I, tid);
      bar.wait();
    }
    if (L > 0) for (int j = 0; j < Dm; ++j) K::st(x.data(), j, K::ld(x.data(), j) + K::ld(delta.data(), j));
    layer_ops::add_rms_norm<K>(x.data(), nullptr, norm, a.data(), 1, Dm, eps, 1);
    to_f32<K>(a.data(), xf.data(), Dm);
    // the LM head's logits, dtype-rounded like the loop's lm_head_linear(x).float()
    const long v0 = part(V, tid, nt), v1 = part(V, tid + 1, nt);
    gemv<K, W>(lm_head, xf.data(), nullptr, lm_scale, lg.data(), v0, v1, Dm);
    for (long v = v0; v < v1; ++v) logits[v] = K::ld(lg.data(), v);
  }
};

template <typename K, typename W>
void step(Step<K, W>& st) {
  st.init();
  SpinBarrier bar(st.nt);
  std::vector<std::thread> workers;
  for (int t = 1; t < st.nt; ++t) workers.emplace_back([&st, &bar, t] { st.run(t, bar); });
  st.run(0, bar);
  for (auto& w : workers) w.join();
}

}  // namespace

extern "C" {

int lean_step_ptrs_per_layer() { return kPtrs; }

#define LEAN_STEP(NAME, K, W)                                                                        \
  void NAME(const int64_t* ptrs, int L, int Dm, int H, int KVH, int D, int I, const void* embed,        \
            long token, const void* norm, const void* lm_head, const float* lm_scale, long V,           \
            const void* cos, const void* sin, long pos, long slot, void* pool, long num_blocks, int BS, \
            const int32_t* table, int W_, int seq_len, float eps, float scale, float* logits, int n) { \
    using T = K::T;                                                                                    \
    (void)W_;                                                                                          \
    Step<K, W> st{ptrs, L, Dm, H, KVH, D, I, static_cast<const T*>(embed), token,                     \
                  static_cast<const T*>(norm), static_cast<const W*>(lm_head), lm_scale, V,            \
                  static_cast<const T*>(cos), static_cast<const T*>(sin), pos, slot,                   \
                  static_cast<T*>(pool), num_blocks, BS, table, seq_len, eps, scale, logits,           \
                  std::max(1, n)};                                                                     \
    step<K, W>(st);                                                                                    \
  }

LEAN_STEP(lean_step_f32, layer_ops::F32, float)
LEAN_STEP(lean_step_bf16, layer_ops::BF16, uint16_t)
LEAN_STEP(lean_step_f32_i8, layer_ops::F32, int8_t)
LEAN_STEP(lean_step_bf16_i8, layer_ops::BF16, int8_t)

}
