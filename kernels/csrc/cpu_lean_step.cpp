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
// KV pool: [2, PL, num_blocks, block_size, KVH, D] (PL = L, or a KV cache group's P layer slots)
// contiguous in the activation dtype, or an int8
// pool [2, L, num_blocks, block_size, KVH, D + 4] (kernels/kv_quant.py: D codes, then the row's fp32
// scale), optionally stored rotated by R [D, D] fp32 (symmetric, R R = I). For int8 the step does
// what the loop does around its kernels (engine/exec/models/llama_cpu_fused.py): RoPE into a scratch
// row in dtype, k and v times R in fp32, quantized as kv_quant.quantize_rows quantizes (scale =
// amax / 127, codes = round-half-even(x * (1 / scale)) clamped to +-127); q times R rounded to dtype;
// the attention output (in dtype) times R, rounded to dtype. The products with R sum in index order,
// where torch's matmul may not: a code can differ from the loop's by one step where x * (1 / scale)
// falls within an ulp of a half.
//
// Families beyond Llama (issue 45; this block and every `ext` branch below are additive: with
// ext == nullptr, embed_scale == 0 and act_kind == 0 the step runs exactly as before). A second
// per-layer table `ext` (kExt int64 entries, 0 = absent) says what a layer adds:
//   q_norm, k_norm   RMSNorm of each q / k head over D before RoPE (Qwen3, Gemma 3)
//   post_attn, post_ff   Gemma's norms of the attention and MLP outputs before the residual add
//   cos, sin         this layer's RoPE table (Gemma 3: local and global bases), [P, D]
//   no_rope          1: no RoPE (SmolLM3): the layer's table is one identity row read at position 0
//   window           sliding-window attention over this many positions (0: full)
// Model-wide: embed_scale (Gemma: embeddings times dtype(sqrt(hidden)); 0 = none) and act_kind
// (0 SiLU, 1 GELU with the tanh approximation, as torch's gelu(approximate="tanh")).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "layer_ops.h"
#include "greedy_screen.h"
#include "lean_gemm.h"
#include "paged_decode.h"
#include "spin_barrier.h"

namespace {

using lean::SpinBarrier;
using lean::gemm;

constexpr int kPtrs = 12;
enum { LN1, QKV, QKV_B, O, O_B, LN2, GATE_UP, DOWN, QKV_S, O_S, GATE_UP_S, DOWN_S };
constexpr int kExt = 8;       // the `ext` table (see the header): its entries per layer
enum { X_QNORM, X_KNORM, X_POST_ATTN, X_POST_FF, X_COS, X_SIN, X_NO_ROPE, X_WINDOW };

// torch's gelu(x, approximate="tanh"): 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
inline float gelu_tanh(float x) {
  const float kBeta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5);
  const float inner = kBeta * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

template <typename K>
void to_f32(const typename K::T* a, float* out, long n) {
  for (long i = 0; i < n; ++i) out[i] = K::ld(a, i);
}

inline long part(long n, int tid, int nt) { return n * tid / nt; }   // thread tid's share: [part(tid), part(tid+1))
inline long part4(long n, int tid, int nt, long q = 4) {              // the same, cut at multiples of q rows
  return tid >= nt ? n : (n / q) * tid / nt * q;
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
  bool tiled;              // the layer linears are in lean_gemm.h's column-block layout (the LM head never)
  bool q8;                 // the pool holds int8 rows (codes + scale), not dtype values
  const float* rot;        // the pool's rotation R [D, D], or null
  const int64_t* ext;      // per layer kExt entries (header), or null: a plain Llama layer
  float embed_scale;       // Gemma: embeddings times dtype(embed_scale); 0: none
  int act_kind;            // 0: SiLU, 1: GELU-tanh
  // KV cache groups (engine/kv/cache_spec.py): layer i's pool slot and group, [L, 2], or null (slot i,
  // group 0); the pool has PL layer slots; slots are [G, nT] and tables [G, S, W_], one per group
  const int32_t* layer_kv; int PL; int S;
  // a greedy step's screened LM head (kernels/greedy_head.py): int8 codes [V, Dm] of the head with
  // fp32 scales [V] and bound coefficients [V]; null: the whole head is computed
  const int8_t* scr_codes; const float* scr_scale; const float* scr_coef;
  int NG;                                 // KV cache groups (tables [NG, S, W_])
  bool scr_blocked;                       // scr_codes in column blocks [V / 16][Dm][16], not row-major
  long rq() const { return tiled ? 16 : 4; }   // a thread's rows of a linear start at multiples of this
  std::vector<float> tau_part;            // screen: per thread, each row's largest lower bound
  std::vector<T> qkv, q, delta, gu, act, lg;
  std::vector<std::vector<T>> own_d;      // ext post norms: per thread, the normed delta
  std::vector<int64_t> zpos;              // ext no-RoPE layers: position 0 for every token
  std::vector<T> ks, vs;                  // int8 pool: this step's k and v rows after RoPE, in dtype
  std::vector<int64_t> scratch_slots;     // int8 pool: token t's row in ks / vs (-1: a pad row)
  std::vector<float> qf, of;
  std::vector<std::vector<T>> own_x, own_a;      // per thread: the residual stream and its norm
  std::vector<std::vector<float>> own_xf;        // per thread: the fp32 activations of a product
  std::vector<std::vector<uint32_t>> own_pairs;  // per thread: those activations as bf16 pairs (tiled bf16)
  // a decode batch over a shared prompt (paged_decode.h decode_shared_rows): each KV cache group's
  // shared blocks (0: none, or not this kind of step) and each thread's scratch, kept by the calling
  // thread across steps (allocated here, where a refusal is still safe; a fresh one every step was
  // mapped and cleared by the kernel)
  std::vector<int> pfx;
  std::vector<std::vector<float>>* shared_scratch = nullptr;

  void init() {               // every allocation of the step, before any thread starts
    const long hd = static_cast<long>(H) * D;
    own_pairs.assign(nt, std::vector<uint32_t>(tiled ? nT * std::max<long>({static_cast<long>(Dm), static_cast<long>(I), hd}) / 2 + 1 : 1));
    pfx.assign(NG, 0);
    size_t need = 0;
    if (paged_decode::kVecBlocks && D == 64 && nT == S && S > 1) {
      for (int g = 0; g < NG; ++g) {
        const int P = paged_decode::shared_prefix_blocks(tables + static_cast<long>(g) * S * W_, tok_len, S, W_, BS);
        pfx[g] = paged_decode::shared_fits(S, nt, H, P, BS) ? P : 0;
        need = std::max(need, paged_decode::shared_rows_floats((S + nt - 1) / nt, H, D, BS, pfx[g]));
      }
    }
    thread_local std::vector<std::vector<float>> keep;
    if (keep.size() < static_cast<size_t>(nt)) keep.resize(nt);
    for (int t = 0; t < nt && need > 0; ++t)
      if (keep[t].size() < need) keep[t].resize(need);
    shared_scratch = &keep;
    own_x.assign(nt, std::vector<T>(nT * static_cast<long>(Dm)));
    own_a.assign(nt, std::vector<T>(nT * static_cast<long>(Dm)));
    own_xf.assign(nt, std::vector<float>(nT * std::max<long>({static_cast<long>(Dm), static_cast<long>(I), hd})));
    qkv.resize(nT * static_cast<long>(H + 2 * KVH) * D); q.resize(nT * hd); delta.resize(nT * static_cast<long>(Dm));
    gu.resize(nT * 2L * I); act.resize(nT * static_cast<long>(I)); lg.resize(R * V);
    qf.resize(nT * hd); of.resize(nT * hd);
    if (scr_codes != nullptr) tau_part.assign(static_cast<long>(nt) * R, 0.f);
    if (ext != nullptr) {
      own_d.assign(nt, std::vector<T>(nT * static_cast<long>(Dm)));
      zpos.assign(nT, 0);
    }
    if (q8) {
      ks.resize(nT * static_cast<long>(KVH) * D); vs.resize(ks.size());
      scratch_slots.resize(nT);
      for (int t = 0; t < nT; ++t) scratch_slots[t] = slots[t] < 0 ? -1 : t;
    }
  }

  // x [D] times R, in fp32, the sum in index order (the pool's rotation; x may alias nothing)
  void times_r(const float* x, float* out) const {
    for (int j = 0; j < D; ++j) out[j] = 0.f;
    for (int i = 0; i < D; ++i) {
      const float xi = x[i];
      const float* r = rot + static_cast<long>(i) * D;
      for (int j = 0; j < D; ++j) out[j] += xi * r[j];
    }
  }

  // rows [n, D] in place: dtype(row times R) (q before attention, the output after it)
  void rotate_rows(float* rows, long n) const {
    float tmp[paged_decode::kMaxDim];
    for (long r = 0; r < n; ++r) {
      float* x = rows + r * D;
      times_r(x, tmp);
      for (int j = 0; j < D; ++j) x[j] = K::rnd(tmp[j]);
    }
  }

  // one k or v row (dtype) -> the int8 pool row at dst: rotated, then kv_quant.quantize_rows' code
  void store_q8(const T* x, int8_t* dst) const {
    float f[paged_decode::kMaxDim], g[paged_decode::kMaxDim];
    for (int d = 0; d < D; ++d) f[d] = K::ld(x, d);
    const float* v = f;
    if (rot != nullptr) { times_r(f, g); v = g; }
    float amax = 0.f;
    for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(v[d]));
    const float sc = amax / 127.0f;
    const float inv = sc > 0.f ? 1.0f / sc : 0.f;
    for (int d = 0; d < D; ++d) {
      const float c = std::nearbyint(v[d] * inv);         // half to even, as torch.round
      dst[d] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, c)));
    }
    std::memcpy(dst + D, &sc, sizeof sc);
  }

  void lin(const int64_t* p, int wi, int bi, int si, const float* xf, T* y, long N, long Kd, int tid) {
    gemm<K, W>(reinterpret_cast<const W*>(p[wi]), xf, nT, bi >= 0 ? reinterpret_cast<const T*>(p[bi]) : nullptr,
               p[si] ? reinterpret_cast<const float*>(p[si]) : nullptr, y, N, part4(N, tid, nt, rq()),
               part4(N, tid + 1, nt, rq()), Kd, tiled, own_pairs[tid].data());
  }

  // ext: the residual a layer adds, `d` normed by ext entry `which` of layer table xe into this
  // thread's own buffer (Gemma's post-attention / post-MLP norm); `d` itself when there is none
  const T* resid(const T* d, const int64_t* xe, int which, int tid) {
    if (xe == nullptr || xe[which] == 0) return d;
    T* out = own_d[tid].data();
    layer_ops::add_rms_norm<K>(const_cast<T*>(d), nullptr, reinterpret_cast<const T*>(xe[which]), out, nT, Dm,
                               eps, 1);
    return out;
  }

  template <typename P>
  void attention(const float* qt, const P* kc, const P* vc, const int32_t* table, int len, float* ot, int tid,
                 int first = 0) {   // first: the window's first position (ext)
    const int G = H / KVH;
    const int h0 = static_cast<int>(part(H, tid, nt)), h1 = static_cast<int>(part(H, tid + 1, nt));
    for (int g = h0 / G; g * G < h1; ++g) {       // query heads split; a KV group's heads stay together
      const int lo = std::max(h0, g * G) - g * G, hi = std::min(h1, (g + 1) * G) - g * G;
      if (lo >= hi) continue;
      if (D == 64) {
        paged_decode::decode_group<P, 64>(qt, kc, vc, table, len, ot, H, KVH, D, BS, scale, g, lo, hi, first);
      } else if (D == 128) {
        paged_decode::decode_group<P, 128>(qt, kc, vc, table, len, ot, H, KVH, D, BS, scale, g, lo, hi, first);
      } else {
        paged_decode::decode_group<P, 0>(qt, kc, vc, table, len, ot, H, KVH, D, BS, scale, g, lo, hi, first);
      }
    }
  }

  void run(int tid, SpinBarrier& bar) {
    const long qkv_n = static_cast<long>(H + 2 * KVH) * D, hd = static_cast<long>(H) * D;
    const long slab = num_blocks * BS * KVH * static_cast<long>(D);     // one layer's K (or V)
    const long row8 = D + paged_decode::Row<int8_t>::kExtra;             // an int8 row: codes + scale (bytes)
    const long slab8 = num_blocks * BS * KVH * row8;                    // one layer's K (or V), int8 rows
    int8_t* pool8 = reinterpret_cast<int8_t*>(pool);
    std::vector<T>& x = own_x[tid];
    std::vector<T>& a = own_a[tid];
    std::vector<float>& xf = own_xf[tid];
    for (int t = 0; t < nT; ++t) std::memcpy(&x[t * static_cast<long>(Dm)], embed + tokens[t] * Dm, sizeof(T) * Dm);
    if (embed_scale != 0.f) {             // ext (Gemma): times the scale rounded to dtype, rounded
      const float es = K::rnd(embed_scale);
      for (long j = 0; j < nT * static_cast<long>(Dm); ++j) K::st(x.data(), j, K::ld(x.data(), j) * es);
    }
    const long j0 = part4(I, tid, nt, rq()), j1 = part4(I, tid + 1, nt, rq());   // this thread's gate/up rows
    for (int i = 0; i < L; ++i) {
      const int64_t* p = ptrs + static_cast<long>(i) * kPtrs;
      const int64_t* xe = ext ? ext + static_cast<long>(i) * kExt : nullptr;          // this layer's ext
      const int64_t* xprev = ext && i ? ext + static_cast<long>(i - 1) * kExt : nullptr;
      const T* lcos = xe && xe[X_COS] ? reinterpret_cast<const T*>(xe[X_COS]) : cos;
      const T* lsin = xe && xe[X_SIN] ? reinterpret_cast<const T*>(xe[X_SIN]) : sin;
      const int64_t* lpos = xe && xe[X_NO_ROPE] ? zpos.data() : positions;
      const int window = xe ? static_cast<int>(xe[X_WINDOW]) : 0;
      const long kslot = layer_kv ? layer_kv[2L * i] : i;                 // the layer's pool slot
      const long grp = layer_kv ? layer_kv[2L * i + 1] : 0;                // and its KV cache group
      const int64_t* lslots = slots + grp * nT;
      const int32_t* ltables = tables + grp * S * static_cast<long>(W_);
      T* kc = q8 ? nullptr : pool + kslot * slab;
      T* vc = q8 ? nullptr : pool + (PL + kslot) * slab;
      int8_t* kc8 = q8 ? pool8 + kslot * slab8 : nullptr;
      int8_t* vc8 = q8 ? pool8 + (PL + kslot) * slab8 : nullptr;
      layer_ops::add_rms_norm<K>(x.data(), i ? resid(delta.data(), xprev, X_POST_FF, tid) : nullptr,
                                 reinterpret_cast<const T*>(p[LN1]), a.data(), nT, Dm, eps, 1);
      to_f32<K>(a.data(), xf.data(), nT * static_cast<long>(Dm));
      lin(p, QKV, QKV_B, QKV_S, xf.data(), qkv.data(), qkv_n, Dm, tid);
      bar.wait();
      if (tid == 0) {
        if (xe && xe[X_QNORM]) {          // ext (Qwen3, Gemma 3): RMSNorm of each q and k head, in place
          for (int t = 0; t < nT; ++t)
            for (int h = 0; h < H + KVH; ++h) {
              T* hp = &qkv[t * qkv_n + static_cast<long>(h) * D];
              layer_ops::add_rms_norm<K>(hp, nullptr, reinterpret_cast<const T*>(xe[h < H ? X_QNORM : X_KNORM]),
                                         hp, 1, D, eps, 1);
            }
        }
        if (!q8) {
          layer_ops::rope_store<K>(qkv.data(), nT, H, KVH, D, lcos, lsin, lpos, lslots, q.data(), kc, vc, 1);
        } else {
          layer_ops::rope_store<K>(qkv.data(), nT, H, KVH, D, lcos, lsin, lpos, scratch_slots.data(), q.data(),
                                   ks.data(), vs.data(), 1);
          for (int t = 0; t < nT; ++t) {
            if (lslots[t] < 0) continue;
            for (int h = 0; h < KVH; ++h) {
              const long src = (static_cast<long>(t) * KVH + h) * D, dst = (lslots[t] * KVH + h) * row8;
              store_q8(&ks[src], kc8 + dst);
              store_q8(&vs[src], vc8 + dst);
            }
          }
        }
        to_f32<K>(q.data(), qf.data(), nT * hd);
        if (rot != nullptr) rotate_rows(qf.data(), static_cast<long>(nT) * H);
      }
      bar.wait();
      // a decode batch (one token a sequence) whose chats share a prompt's first blocks: the prefix as
      // two small matrix products per KV head, each thread its share of the sequences (the loop's
      // kernel for such a batch, paged_decode.h decode_shared); otherwise each token's heads split
      const int shared = window == 0 ? pfx[grp] : 0;
      if (shared > 0) {
        const int b0 = static_cast<int>(part(S, tid, nt)), b1 = static_cast<int>(part(S, tid + 1, nt));
        float* scr = (*shared_scratch)[tid].data();
        if (q8)
          paged_decode::decode_shared_rows<int8_t, 64>(qf.data(), kc8, vc8, ltables, tok_len, of.data(), b0, b1, H,
                                                       KVH, BS, W_, scale, shared, scr);
        else
          paged_decode::decode_shared_rows<T, 64>(qf.data(), kc, vc, ltables, tok_len, of.data(), b0, b1, H, KVH, BS,
                                                  W_, scale, shared, scr);
      } else {
        for (int t = 0; t < nT; ++t) {         // causal: token t sees its sequence up to itself
          const int32_t* table = ltables + static_cast<long>(tok_seq[t]) * W_;
          const int first = paged_decode::window_lo(tok_len[t], window);     // ext: a sliding window
          if (q8) attention<int8_t>(&qf[t * hd], kc8, vc8, table, tok_len[t], &of[t * hd], tid, first);
          else attention<T>(&qf[t * hd], kc, vc, table, tok_len[t], &of[t * hd], tid, first);
        }
      }
      bar.wait();
      for (long j = 0; j < nT * hd; ++j) xf[j] = K::rnd(of[j]);     // the loop's attention output in dtype
      if (rot != nullptr) rotate_rows(xf.data(), static_cast<long>(nT) * H);   // each thread its own copy
      lin(p, O, O_B, O_S, xf.data(), delta.data(), Dm, hd, tid);
      bar.wait();
      layer_ops::add_rms_norm<K>(x.data(), resid(delta.data(), xe, X_POST_ATTN, tid),
                                 reinterpret_cast<const T*>(p[LN2]), a.data(), nT, Dm, eps, 1);
      to_f32<K>(a.data(), xf.data(), nT * static_cast<long>(Dm));
      // gate rows j and up rows I + j on the same thread, so it can finish silu(gate) * up alone
      const W* wgu = reinterpret_cast<const W*>(p[GATE_UP]);
      const float* sgu = p[GATE_UP_S] ? reinterpret_cast<const float*>(p[GATE_UP_S]) : nullptr;
      gemm<K, W>(wgu, xf.data(), nT, nullptr, sgu, gu.data(), 2L * I, j0, j1, Dm, tiled, own_pairs[tid].data());
      gemm<K, W>(wgu, xf.data(), nT, nullptr, sgu, gu.data(), 2L * I, I + j0, I + j1, Dm, tiled, own_pairs[tid].data());
      for (int t = 0; t < nT; ++t) {       // layer_ops::silu_mul's arithmetic, on this thread's rows
        const T* g = &gu[t * 2L * I];
        T* at = &act[t * static_cast<long>(I)];
        float sv[256];
        for (long c = j0; c < j1; c += 256) {
          const long n = std::min(j1 - c, 256L);
          if (act_kind == 1) {
            for (long j = 0; j < n; ++j) sv[j] = gelu_tanh(K::ld(g, c + j));
          } else {
            // vectorized as layer_ops::silu_mul is (no contraction here: the same roundings as
            // one element at a time); one at a time it was ~4 ms of a 16-chat step's ~35
#pragma omp simd
            for (long j = 0; j < n; ++j) {
              const float gv = K::ld(g, c + j);
              sv[j] = gv / (1.0f + fast_exp(-gv));
            }
          }
          for (long j = 0; j < n; ++j) K::st(at, c + j, K::rnd(sv[j]) * K::ld(g, I + c + j));
        }
      }
      bar.wait();
      to_f32<K>(act.data(), xf.data(), nT * static_cast<long>(I));
      lin(p, DOWN, -1, DOWN_S, xf.data(), delta.data(), Dm, I, tid);
      bar.wait();
    }
    // the rows whose logits are wanted: x += delta, final norm, LM head (dtype-rounded like the
    // loop's lm_head_linear(x).float())
    const T* last = L > 0 ? resid(delta.data(), ext ? ext + static_cast<long>(L - 1) * kExt : nullptr, X_POST_FF, tid)
                          : nullptr;
    for (int r = 0; r < R; ++r) {
      T* xr = &x[rows[r] * Dm];
      if (L > 0) {
        const T* dr = &last[rows[r] * Dm];
        for (int j = 0; j < Dm; ++j) K::st(xr, j, K::ld(xr, j) + K::ld(dr, j));
      }
      layer_ops::add_rms_norm<K>(xr, nullptr, norm, &a[r * static_cast<long>(Dm)], 1, Dm, eps, 1);
    }
    to_f32<K>(a.data(), xf.data(), R * static_cast<long>(Dm));
    const long vq = scr_codes != nullptr && scr_blocked ? 16 : 4;     // the screen's blocks are 16 rows
    const long v0 = part4(V, tid, nt, vq), v1 = part4(V, tid + 1, nt, vq);
    if (scr_codes != nullptr) {
      screened_head(xf.data(), v0, v1, tid, bar);
      return;
    }
    gemm<K, W>(lm_head, xf.data(), R, nullptr, lm_scale, lg.data(), V, v0, v1, Dm);
    for (int r = 0; r < R; ++r)
      for (long v = v0; v < v1; ++v) logits[r * V + v] = K::ld(&lg[r * V], v);
  }

  // A greedy step's LM head (greedy_screen.h): the int8 copy for every row of this thread's
  // share, then the real weights only for the rows that may be the argmax; the others get -inf.
  // A computed row's logit is the one the whole head gives (gemm is batch- and range-invariant).
  // rho: the approximation is rounded to dtype (bf16: 2^-8 relative), and so is the exact logit.
  void screened_head(const float* xr, long v0, long v1, int tid, SpinBarrier& bar) {
    const float rho = sizeof(T) == 2 ? 1.0f / 64 : 1.0f / (1 << 20);
    if (!scr_blocked || !lean::kColumnBlocksF32) gemm<K, int8_t>(scr_codes, xr, R, nullptr, scr_scale, lg.data(), V, v0, v1, Dm);
#if defined(__AVX512F__)
    else lean::gemm_i8_blocks<K>(scr_codes, xr, R, scr_scale, lg.data(), V, v0, v1, Dm);
#endif
    float n1[kMaxTokens];
    for (int r = 0; r < R; ++r) {
      double s = 0;                               // ||x||_1, rounded up below
      for (int j = 0; j < Dm; ++j) s += std::fabs(xr[r * static_cast<long>(Dm) + j]);
      n1[r] = static_cast<float>(s * (1 + 1e-6));
      const T* a = &lg[r * V];
      const auto row = greedy_screen::row([a](long v) { return K::ld(a, v); }, scr_coef, nullptr, n1[r], 0.f, rho);
      tau_part[static_cast<long>(tid) * R + r] = row.tau(v0, v1);
    }
    bar.wait();
    for (int r = 0; r < R; ++r) {
      float tau = -INFINITY;
      for (int j = 0; j < nt; ++j) tau = std::max(tau, tau_part[static_cast<long>(j) * R + r]);
      T* a = &lg[r * V];
      const float* xm = xr + r * static_cast<long>(Dm);
      const auto row = greedy_screen::row([a](long v) { return K::ld(a, v); }, scr_coef, nullptr, n1[r], 0.f, rho);
      float* out = logits + r * V;
      for (long v = v0; v < v1; ++v) out[v] = -INFINITY;
      for (long v = v0; v < v1; ++v) {
        if (!row.may_reach(v, tau)) continue;
        gemm<K, W>(lm_head, xm, 1, nullptr, lm_scale, a, V, v, v + 1, Dm);    // writes a[v]
        out[v] = K::ld(a, v);
      }
    }
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
int lean_step_ext_per_layer() { return kExt; }
int lean_step_max_tokens() { return kMaxTokens; }
// whether this build has lean_gemm.h's column-block kernels: bit 0 for fp32 weights, bit 1 for bf16
int lean_step_column_blocks() { return (lean::kColumnBlocksF32 ? 1 : 0) | (lean::kColumnBlocksBF16 ? 2 : 0); }

// 0 on success; otherwise which input is out of range (checked before anything is written):
// 1 token id, 2 position (RoPE table of P rows), 3 KV slot (-1 = store nothing: a padded row), 4 block table (too short, or a block
// beyond the pool), 5 logits row, 6 token count (1..kMaxTokens) or sequence layout (cu_seqlens_q
// not rising from 0 to the token count, a sequence with more new tokens than context); 7: no
// memory or threads for the step (nothing written); 8: a screened LM head (scr_codes, a greedy
// step: kernels/greedy_head.py) without its scales and bounds, or over an int8 head, or its codes in
// column blocks (scr_blocked) where this build has no kernel for them or V % 16 != 0; 9: weights in
// the column-block layout (tiled) where this build has no kernel for them.
// S sequences: tables [G, S, W_], seq_lens [S] (context incl. this step's tokens), cu [S + 1] (query
// token offsets), slots [G, nT], as AttentionMetadata holds them per KV cache group; layer_kv [L, 2]
// (pool slot, group) of each layer, or null for one group (slot = layer, PL = L, G = 1).
#define LEAN_STEP(NAME, K, W)                                                                            \
  int NAME(const int64_t* ptrs, int L, int Dm, int H, int KVH, int D, int I, const void* embed, long vocab,  \
           const int64_t* tokens, const int64_t* positions, const int64_t* slots, int nT,                   \
           const int64_t* rows, int R, const void* norm, const void* lm_head, const float* lm_scale, long V, \
           const void* cos, const void* sin, long P, void* pool, long num_blocks, int BS,                   \
           const int32_t* tables, int W_, int S, const int32_t* seq_lens, const int32_t* cu, float eps,    \
           float scale, float* logits, int n, int tiled, int q8, const float* rot, const int64_t* ext,       \
           float embed_scale, int act_kind, const int32_t* layer_kv, int PL, int G, const int8_t* scr_codes,  \
           const float* scr_scale, const float* scr_coef, int scr_blocked) {                              \
    using T = K::T;                                                                                        \
    if (nT < 1 || nT > kMaxTokens || S < 1 || cu[0] != 0 || cu[S] != nT) return 6;                         \
    if (scr_codes != nullptr && (lm_scale != nullptr || scr_scale == nullptr || scr_coef == nullptr ||      \
                             (scr_blocked && (!lean::kColumnBlocksF32 || V % 16 != 0))))                   \
      return 8;                                                                                            \
    if (tiled && !((std::is_same<W, float>::value && lean::kColumnBlocksF32) ||                           \
                   (std::is_same<W, uint16_t>::value && lean::kColumnBlocksBF16)))                         \
      return 9;                                                                                            \
    if (G < 1 || PL < 1 || (layer_kv == nullptr && (G != 1 || PL != L))) return 4;                         \
    for (int i = 0; layer_kv != nullptr && i < L; ++i)                                                      \
      if (layer_kv[2 * i] < 0 || layer_kv[2 * i] >= PL || layer_kv[2 * i + 1] < 0 || layer_kv[2 * i + 1] >= G) \
        return 4;                                                                                          \
    int32_t tok_seq[kMaxTokens], tok_len[kMaxTokens];                                                      \
    for (int s = 0; s < S; ++s) {                                                                          \
      const int q = cu[s + 1] - cu[s];                                                                     \
      if (q < 0 || q > seq_lens[s]) return 6;                                                              \
      const long nblk = (static_cast<long>(seq_lens[s]) + BS - 1) / BS;                                   \
      if (nblk > W_) return 4;                                                                             \
      for (long g = 0; g < G; ++g)                   /* every group's table (released: block 0) */         \
        for (long j = 0; j < nblk; ++j) {                                                                  \
          const int32_t b = tables[(g * S + s) * W_ + j];                                                  \
          if (b < 0 || b >= num_blocks) return 4;                                                          \
        }                                                                                                  \
      for (int t = cu[s]; t < cu[s + 1]; ++t) {                                                            \
        tok_seq[t] = s;                                                                                    \
        tok_len[t] = seq_lens[s] - q + (t - cu[s]) + 1;                                                    \
      }                                                                                                    \
    }                                                                                                      \
    for (int t = 0; t < nT; ++t) {                                                                         \
      if (tokens[t] < 0 || tokens[t] >= vocab) return 1;                                                   \
      if (positions[t] < 0 || positions[t] >= P) return 2;                                                 \
      for (long g = 0; g < G; ++g)                   /* -1: a pad row, nothing stored */                   \
        if (slots[g * nT + t] < -1 || slots[g * nT + t] >= num_blocks * BS) return 3;                      \
    }                                                                                                      \
    if (R < 0 || R > kMaxTokens) return 5;                                                                \
    for (int r = 0; r < R; ++r)                                                                            \
      if (rows[r] < 0 || rows[r] >= nT) return 5;                                                          \
    Step<K, W> st{ptrs, L, Dm, H, KVH, D, I, static_cast<const T*>(embed), tokens, positions, slots, nT,    \
                  rows, R, static_cast<const T*>(norm), static_cast<const W*>(lm_head), lm_scale, V,       \
                  static_cast<const T*>(cos), static_cast<const T*>(sin), static_cast<T*>(pool),           \
                  num_blocks, BS, tables, W_, tok_seq, tok_len, eps, scale, logits, std::max(1, n),        \
                  tiled != 0, q8 != 0, rot, ext, embed_scale, act_kind, layer_kv, PL, S, scr_codes,       \
                  scr_scale, scr_coef, G, scr_blocked != 0};                                                                \
    return step<K, W>(st) ? 0 : 7;                                                                         \
  }

// One of the step's products alone (tests, benchmarks): Y [M, N] = X [M, Kd] (fp32, values of the
// dtype) times W (+ bias), W row-major [N, Kd] or, tiled, in the column-block layout; one thread.
// Returns 9 where tiled and this build has no column-block kernel for W.
int lean_linear_f32(const float* w, int tiled, const float* x, int M, const float* bias, float* y, long N, long Kd) {
  if (tiled && !lean::kColumnBlocksF32) return 9;
  lean::gemm<layer_ops::F32, float>(w, x, M, bias, nullptr, y, N, 0, N, Kd, tiled != 0);
  return 0;
}
int lean_linear_bf16(const uint16_t* w, int tiled, const float* x, int M, const uint16_t* bias, uint16_t* y, long N,
                     long Kd) {
  if (tiled && !lean::kColumnBlocksBF16) return 9;
  lean::gemm<layer_ops::BF16, uint16_t>(w, x, M, bias, nullptr, y, N, 0, N, Kd, tiled != 0);
  return 0;
}

// The greedy screen's product alone (tests): Y [M, N] fp32 = X [M, Kd] times int8 codes times
// scale[n], codes row-major [N, Kd] or, blocked, in column blocks [N / 16][Kd][16]; one thread.
int lean_linear_i8(const int8_t* codes, int blocked, const float* x, int M, const float* scale, float* y, long N,
                   long Kd) {
  if (blocked) {
#if defined(__AVX512F__)
    if (N % 16 != 0) return 9;
    lean::gemm_i8_blocks<layer_ops::F32>(codes, x, M, scale, y, N, 0, N, Kd);
    return 0;
#else
    return 9;
#endif
  }
  lean::gemm<layer_ops::F32, int8_t>(codes, x, M, nullptr, scale, y, N, 0, N, Kd);
  return 0;
}

LEAN_STEP(lean_step_f32, layer_ops::F32, float)
LEAN_STEP(lean_step_bf16, layer_ops::BF16, uint16_t)
LEAN_STEP(lean_step_f32_i8, layer_ops::F32, int8_t)
LEAN_STEP(lean_step_bf16_i8, layer_ops::BF16, int8_t)

}
