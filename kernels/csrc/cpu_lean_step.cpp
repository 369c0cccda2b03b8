// One step of one sequence — one new token, or a speculative step's few — through the whole
// decoder in a single call: embedding, every layer, final norm, LM head.
//
// Why: at batch 1 the fused Python loop (engine/exec/models/llama_cpu_fused.py) still makes ~10
// calls per layer (300 per token for the default model), each a Python -> C++ hop, and its GEMMs
// go through oneDNN, whose packed kernels are built for many rows and read one row's weights at
// ~20-24 GB/s here. This file never leaves C++ during the step: the small ops are the fused loop's
// own templates (layer_ops.h), attention is the paged decode kernel's per-head code (paged_decode.h),
// and each linear streams its weight rows once (with software prefetch) against the step's 1..17
// activation rows.
//
// Numerics: the small ops and attention round exactly as the fused loop does (this file is built
// with -ffp-contract=off like cpu_layer_ops.cpp). The matrix products sum each dot product in fp32
// in another order than oneDNN (a few ulps); the tests check greedy tokens against HF and logits
// against the loop. They are batch-invariant: a row's result does not depend on how many rows the
// step has, so a speculative step's logits are bit-identical to the one-token steps'. Weights:
// plain row-major [N, K] in the activation dtype (fp32 or bf16), or int8 codes with one scale per
// output row (engine/exec/cpu_linear.py's Int8Linear: y = dtype(dot * scale), then + bias).
//
// Per layer, the pointer table holds (int64, 0 = absent):
//   ln1, qkv, qkv_bias, o, o_bias, ln2, gate_up, down, qkv_scale, o_scale, gate_up_scale, down_scale
// KV pool: [2, L, num_blocks, block_size, KVH, D] contiguous in the activation dtype.
#include <immintrin.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <chrono>

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
// barrier between phases. Not OpenMP: a step has ~180 phases, and libgomp lets an idle worker spin
// only ~1,000 rounds when the process has more OpenMP threads than cores (the engine thread's team
// beside the main thread's), so every phase paid a futex wake-up (measured: 20-25 ms per fp32 step
// instead of ~15 ms). This barrier spins up to kSpinNs, which covers a phase's imbalance on an idle
// machine, then sleeps on a futex, so a busy machine (other processes, a second engine) does not
// lose a core to a waiting thread.
constexpr long kSpinNs = 50000;

class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void wait() {
    if (n_ == 1) return;
    const int gen = gen_.load(std::memory_order_seq_cst);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_seq_cst);
      if (sleepers_.load(std::memory_order_seq_cst) > 0) wake();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 1; gen_.load(std::memory_order_acquire) == gen; ++spins) {
      if (spins % 64 == 0 && std::chrono::steady_clock::now() - start > std::chrono::nanoseconds(kSpinNs)) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        while (gen_.load(std::memory_order_seq_cst) == gen) sleep(gen);
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        return;
      }
      _mm_pause();
    }
  }

 private:
#if defined(__linux__)
  void sleep(int gen) {
    syscall(SYS_futex, reinterpret_cast<int*>(&gen_), FUTEX_WAIT_PRIVATE, gen, nullptr, nullptr, 0);
  }
  void wake() { syscall(SYS_futex, reinterpret_cast<int*>(&gen_), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0); }
#else
  void sleep(int) { std::this_thread::yield(); }
  void wake() {}
#endif
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<int> gen_{0};
  std::atomic<int> sleepers_{0};
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

// Four weight rows against MS activation rows: 4 x MS accumulators of 16 lanes, in registers
// (locals, copied out once at the end).
template <typename W, int MS>
inline void tile4(const W* w, long Kd, long K16, const float* X, v16f (&out)[4][4], const W* pf) {
  v16f acc[4][MS];
  for (int r = 0; r < 4; ++r)
    for (int m = 0; m < MS; ++m) acc[r][m] = v16f{};
  const W *w0 = w, *w1 = w + Kd, *w2 = w + 2 * Kd, *w3 = w + 3 * Kd;
  for (long k = 0; k < K16; k += 16) {
    const v16f a0 = vload(w0 + k), a1 = vload(w1 + k), a2 = vload(w2 + k), a3 = vload(w3 + k);
    if (pf != nullptr && (k * sizeof(W)) % 64 == 0) {
      for (int r = 0; r < 4; ++r) __builtin_prefetch(pf + r * Kd + k, 0, 0);
    }
#pragma GCC unroll 4
    for (int m = 0; m < MS; ++m) {
      const v16f xv = vload(X + m * Kd + k);
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

// Y[m, n] = dtype(dot(W[n, :], X[m, :]) (* scale[n]) (+ bias[n])) for rows n in [r0, r1) and the M
// activation rows of X ([M, Kd] fp32; Y rows ldy apart). Batch-invariant: each dot product is 16
// lanes summed in k order, then the same tree and tail, whatever M is and wherever the row falls,
// so a token's logits in a k+1-token speculative step are bit-identical to the one-token step's.
// Weights are read once per call: four rows (<= 24 KB) stay in L1 while the activation rows pass.
template <typename K, typename W>
void gemm(const W* w, const float* X, int M, const typename K::T* bias, const float* scale,
          typename K::T* Y, long ldy, long r0, long r1, long Kd) {
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
  // software prefetch ~10 KB ahead (whole tiles), spread over the tile's k loop: with only the
  // hardware prefetcher the weight loads waited on memory (int8: 9.3 -> 4.7 ms a step, measured)
  const long tile_bytes = 4 * Kd * static_cast<long>(sizeof(W));
  const long ahead_rows = 4 * std::max(1L, kPrefetchBytes / tile_bytes);
  for (; n0 + 4 <= r1; n0 += 4) {
    const W* w4 = w + n0 * Kd;
    const W* pf = n0 + 4 + ahead_rows <= r1 ? w4 + ahead_rows * Kd : nullptr;
    for (int m0 = 0; m0 < M; m0 += 4) {
      const int ms = std::min(4, M - m0);
      const float* X4 = X + m0 * Kd;
      v16f acc[4][4];
      switch (ms) {
        case 4: tile4<W, 4>(w4, Kd, K16, X4, acc, m0 ? nullptr : pf); break;
        case 3: tile4<W, 3>(w4, Kd, K16, X4, acc, m0 ? nullptr : pf); break;
        case 2: tile4<W, 2>(w4, Kd, K16, X4, acc, m0 ? nullptr : pf); break;
        default: tile4<W, 1>(w4, Kd, K16, X4, acc, m0 ? nullptr : pf);
      }
      for (int r = 0; r < 4; ++r)
        for (int m = 0; m < ms; ++m) finish(n0 + r, m0 + m, acc[r][m]);
    }
  }
  for (; n0 < r1; ++n0)
    for (int m = 0; m < M; ++m) finish(n0, m, dot1(w + n0 * Kd, X + m * Kd, K16));
}

template <typename K>
void to_f32(const typename K::T* a, float* out, long n) {
  for (long i = 0; i < n; ++i) out[i] = K::ld(a, i);
}

inline long part(long n, int tid, int nt) { return n * tid / nt; }   // thread tid's share: [part(tid), part(tid+1))
inline long part4(long n, int tid, int nt) {                          // the same, cut at multiples of 4 rows
  return tid >= nt ? n : (n / 4) * tid / nt * 4;
}

constexpr int kMaxTokens = 17;     // one token plus a speculative draft of up to 16 (EngineConfig's limit)

// The step's inputs and the buffers its threads share. Each thread keeps its own copy of the
// residual stream x and of the normed activations (cheap to recompute, so no barrier for them).
template <typename K, typename W>
struct Step {
  using T = typename K::T;
  const int64_t* ptrs; int L, Dm, H, KVH, D, I; const T* embed; const int64_t* tokens; const int64_t* positions;
  const int64_t* slots; int nT; const int64_t* rows; int R; const T* norm; const W* lm_head; const float* lm_scale;
  long V; const T* cos; const T* sin; T* pool; long num_blocks; int BS; const int32_t* tables; int W_;
  const int32_t* tok_seq; const int32_t* tok_len;     // per token: its sequence (table row) and context
  float eps, scale; float* logits; int nt;
  std::vector<T> qkv, q, delta, gu, act, lg;
  std::vector<float> qf, of;
  std::vector<std::vector<T>> own_x, own_a;      // per thread: the residual stream and its norm
  std::vector<std::vector<float>> own_xf;        // per thread: the fp32 activations of a product

  void init() {               // every allocation of the step, before any thread starts
    const long hd = static_cast<long>(H) * D;
    own_x.assign(nt, std::vector<T>(nT * static_cast<long>(Dm)));
    own_a.assign(nt, std::vector<T>(nT * static_cast<long>(Dm)));
    own_xf.assign(nt, std::vector<float>(nT * std::max<long>({static_cast<long>(Dm), static_cast<long>(I), hd})));
    qkv.resize(nT * static_cast<long>(H + 2 * KVH) * D); q.resize(nT * hd); delta.resize(nT * static_cast<long>(Dm));
    gu.resize(nT * 2L * I); act.resize(nT * static_cast<long>(I)); lg.resize(R * V);
    qf.resize(nT * hd); of.resize(nT * hd);
  }

  void lin(const int64_t* p, int wi, int bi, int si, const float* xf, T* y, long N, long Kd, int tid) {
    gemm<K, W>(reinterpret_cast<const W*>(p[wi]), xf, nT, bi >= 0 ? reinterpret_cast<const T*>(p[bi]) : nullptr,
               p[si] ? reinterpret_cast<const float*>(p[si]) : nullptr, y, N, part4(N, tid, nt),
               part4(N, tid + 1, nt), Kd);
  }

  void attention(const float* qt, const T* kc, const T* vc, const int32_t* table, int len, float* ot, int tid) {
    const int G = H / KVH;
    const int h0 = static_cast<int>(part(H, tid, nt)), h1 = static_cast<int>(part(H, tid + 1, nt));
    for (int g = h0 / G; g * G < h1; ++g) {       // query heads split; a KV group's heads stay together
      const int lo = std::max(h0, g * G) - g * G, hi = std::min(h1, (g + 1) * G) - g * G;
      if (lo >= hi) continue;
      if (D == 64) {
        paged_decode::decode_group<T, 64>(qt, kc, vc, table, len, ot, H, KVH, D, BS, scale, g, lo, hi);
      } else if (D == 128) {
        paged_decode::decode_group<T, 128>(qt, kc, vc, table, len, ot, H, KVH, D, BS, scale, g, lo, hi);
      } else {
        paged_decode::decode_group<T, 0>(qt, kc, vc, table, len, ot, H, KVH, D, BS, scale, g, lo, hi);
      }
    }
  }

  void run(int tid, SpinBarrier& bar) {
    const long qkv_n = static_cast<long>(H + 2 * KVH) * D, hd = static_cast<long>(H) * D;
    const long slab = num_blocks * BS * KVH * static_cast<long>(D);     // one layer's K (or V)
    std::vector<T>& x = own_x[tid];
    std::vector<T>& a = own_a[tid];
    std::vector<float>& xf = own_xf[tid];
    for (int t = 0; t < nT; ++t) std::memcpy(&x[t * static_cast<long>(Dm)], embed + tokens[t] * Dm, sizeof(T) * Dm);
    const long j0 = part4(I, tid, nt), j1 = part4(I, tid + 1, nt);   // this thread's gate/up rows
    for (int i = 0; i < L; ++i) {
      const int64_t* p = ptrs + static_cast<long>(i) * kPtrs;
      T* kc = pool + static_cast<long>(i) * slab;
      T* vc = pool + static_cast<long>(L + i) * slab;
      layer_ops::add_rms_norm<K>(x.data(), i ? delta.data() : nullptr, reinterpret_cast<const T*>(p[LN1]),
                                 a.data(), nT, Dm, eps, 1);
      to_f32<K>(a.data(), xf.data(), nT * static_cast<long>(Dm));
      lin(p, QKV, QKV_B, QKV_S, xf.data(), qkv.data(), qkv_n, Dm, tid);
      bar.wait();
      if (tid == 0) {
        layer_ops::rope_store<K>(qkv.data(), nT, H, KVH, D, cos, sin, positions, slots, q.data(), kc, vc, 1);
        to_f32<K>(q.data(), qf.data(), nT * hd);
      }
      bar.wait();
      for (int t = 0; t < nT; ++t)           // causal: token t sees its sequence up to itself
        attention(&qf[t * hd], kc, vc, tables + static_cast<long>(tok_seq[t]) * W_, tok_len[t], &of[t * hd], tid);
      bar.wait();
      for (long j = 0; j < nT * hd; ++j) xf[j] = K::rnd(of[j]);     // the loop's attention output in dtype
      lin(p, O, O_B, O_S, xf.data(), delta.data(), Dm, hd, tid);
      bar.wait();
      layer_ops::add_rms_norm<K>(x.data(), delta.data(), reinterpret_cast<const T*>(p[LN2]), a.data(), nT, Dm,
                                 eps, 1);
      to_f32<K>(a.data(), xf.data(), nT * static_cast<long>(Dm));
      // gate rows j and up rows I + j on the same thread, so it can finish silu(gate) * up alone
      const W* wgu = reinterpret_cast<const W*>(p[GATE_UP]);
      const float* sgu = p[GATE_UP_S] ? reinterpret_cast<const float*>(p[GATE_UP_S]) : nullptr;
      gemm<K, W>(wgu, xf.data(), nT, nullptr, sgu, gu.data(), 2L * I, j0, j1, Dm);
      gemm<K, W>(wgu, xf.data(), nT, nullptr, sgu, gu.data(), 2L * I, I + j0, I + j1, Dm);
      for (int t = 0; t < nT; ++t) {
        const T* g = &gu[t * 2L * I];
        for (long j = j0; j < j1; ++j) {     // layer_ops::silu_mul's arithmetic, on this thread's rows
          const float gv = K::ld(g, j);
          const float sv = gv / (1.0f + fast_exp(-gv));
          K::st(&act[t * static_cast<long>(I)], j, K::rnd(sv) * K::ld(g, I + j));
        }
      }
      bar.wait();
      to_f32<K>(act.data(), xf.data(), nT * static_cast<long>(I));
      lin(p, DOWN, -1, DOWN_S, xf.data(), delta.data(), Dm, I, tid);
      bar.wait();
    }
    // the rows whose logits are wanted: x += delta, final norm, LM head (dtype-rounded like the
    // loop's lm_head_linear(x).float())
    for (int r = 0; r < R; ++r) {
      T* xr = &x[rows[r] * Dm];
      if (L > 0) {
        const T* dr = &delta[rows[r] * Dm];
        for (int j = 0; j < Dm; ++j) K::st(xr, j, K::ld(xr, j) + K::ld(dr, j));
      }
      layer_ops::add_rms_norm<K>(xr, nullptr, norm, &a[r * static_cast<long>(Dm)], 1, Dm, eps, 1);
    }
    to_f32<K>(a.data(), xf.data(), R * static_cast<long>(Dm));
    const long v0 = part4(V, tid, nt), v1 = part4(V, tid + 1, nt);
    gemm<K, W>(lm_head, xf.data(), R, nullptr, lm_scale, lg.data(), V, v0, v1, Dm);
    for (int r = 0; r < R; ++r)
      for (long v = v0; v < v1; ++v) logits[r * V + v] = K::ld(&lg[r * V], v);
  }
};

template <typename K, typename W>
bool step(Step<K, W>& st) {
  // nothing may throw once a thread runs (an exception there would end the process), so the
  // buffers are allocated and every worker is started, parked, before any of them computes;
  // if memory or a thread is refused, the parked ones are released and nothing was written
  std::atomic<int> go{0};     // 0: wait, 1: run, -1: give up
  std::vector<std::thread> workers;
  SpinBarrier bar(st.nt);
  try {
    st.init();
    workers.reserve(st.nt);
    for (int t = 1; t < st.nt; ++t)
      workers.emplace_back([&st, &bar, &go, t] {
        while (go.load(std::memory_order_acquire) == 0) std::this_thread::yield();
        if (go.load(std::memory_order_acquire) == 1) st.run(t, bar);
      });
  } catch (...) {
    go.store(-1, std::memory_order_release);
    for (auto& w : workers) w.join();
    return false;
  }
  go.store(1, std::memory_order_release);
  st.run(0, bar);
  for (auto& w : workers) w.join();
  return true;
}

}  // namespace

extern "C" {

int lean_step_ptrs_per_layer() { return kPtrs; }
int lean_step_max_tokens() { return kMaxTokens; }

// 0 on success; otherwise which input is out of range (checked before anything is written):
// 1 token id, 2 position (RoPE table of P rows), 3 KV slot (-1 = store nothing: a padded row), 4 block table (too short, or a block
// beyond the pool), 5 logits row, 6 token count (1..kMaxTokens) or sequence layout (cu_seqlens_q
// not rising from 0 to the token count, a sequence with more new tokens than context); 7: no
// memory or threads for the step (nothing written).
// S sequences: tables [S, W_], seq_lens [S] (context incl. this step's tokens), cu [S + 1] (query
// token offsets), as AttentionMetadata holds them.
#define LEAN_STEP(NAME, K, W)                                                                            \
  int NAME(const int64_t* ptrs, int L, int Dm, int H, int KVH, int D, int I, const void* embed, long vocab,  \
           const int64_t* tokens, const int64_t* positions, const int64_t* slots, int nT,                   \
           const int64_t* rows, int R, const void* norm, const void* lm_head, const float* lm_scale, long V, \
           const void* cos, const void* sin, long P, void* pool, long num_blocks, int BS,                   \
           const int32_t* tables, int W_, int S, const int32_t* seq_lens, const int32_t* cu, float eps,    \
           float scale, float* logits, int n) {                                                            \
    using T = K::T;                                                                                        \
    if (nT < 1 || nT > kMaxTokens || S < 1 || cu[0] != 0 || cu[S] != nT) return 6;                         \
    int32_t tok_seq[kMaxTokens], tok_len[kMaxTokens];                                                      \
    for (int s = 0; s < S; ++s) {                                                                          \
      const int q = cu[s + 1] - cu[s];                                                                     \
      if (q < 0 || q > seq_lens[s]) return 6;                                                              \
      const long nblk = (static_cast<long>(seq_lens[s]) + BS - 1) / BS;                                   \
      if (nblk > W_) return 4;                                                                             \
      for (long j = 0; j < nblk; ++j) {                                                                    \
        const int32_t b = tables[static_cast<long>(s) * W_ + j];                                           \
        if (b < 0 || b >= num_blocks) return 4;                                                            \
      }                                                                                                    \
      for (int t = cu[s]; t < cu[s + 1]; ++t) {                                                            \
        tok_seq[t] = s;                                                                                    \
        tok_len[t] = seq_lens[s] - q + (t - cu[s]) + 1;                                                    \
      }                                                                                                    \
    }                                                                                                      \
    for (int t = 0; t < nT; ++t) {                                                                         \
      if (tokens[t] < 0 || tokens[t] >= vocab) return 1;                                                   \
      if (positions[t] < 0 || positions[t] >= P) return 2;                                                 \
      if (slots[t] < -1 || slots[t] >= num_blocks * BS) return 3;   /* -1: a pad row, nothing stored */ \
    }                                                                                                      \
    for (int r = 0; r < R; ++r)                                                                            \
      if (rows[r] < 0 || rows[r] >= nT) return 5;                                                          \
    Step<K, W> st{ptrs, L, Dm, H, KVH, D, I, static_cast<const T*>(embed), tokens, positions, slots, nT,    \
                  rows, R, static_cast<const T*>(norm), static_cast<const W*>(lm_head), lm_scale, V,       \
                  static_cast<const T*>(cos), static_cast<const T*>(sin), static_cast<T*>(pool),           \
                  num_blocks, BS, tables, W_, tok_seq, tok_len, eps, scale, logits, std::max(1, n)};       \
    return step<K, W>(st) ? 0 : 7;                                                                         \
  }

LEAN_STEP(lean_step_f32, layer_ops::F32, float)
LEAN_STEP(lean_step_bf16, layer_ops::BF16, uint16_t)
LEAN_STEP(lean_step_f32_i8, layer_ops::F32, int8_t)
LEAN_STEP(lean_step_bf16_i8, layer_ops::BF16, int8_t)

}
