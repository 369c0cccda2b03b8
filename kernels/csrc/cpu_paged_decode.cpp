// Decode attention of paged_decode.h, exported for kernels/cpu_attention.py (ctypes).
#include "paged_decode.h"

using namespace paged_decode;

extern "C" {

int paged_decode_limits(int* max_group, int* max_dim, int* max_block) {
  *max_group = kMaxGroup; *max_dim = kMaxDim; *max_block = kMaxBlock;
  return 0;
}

void paged_decode_f32(const float* q, const float* kc, const float* vc, const int32_t* tables,
                      const int32_t* lens, float* out, int B, int H, int KVH, int D, int BS, int W,
                      float scale, int nthreads, int window) {
  dispatch<float>(q, kc, vc, tables, lens, out, B, H, KVH, D, BS, W, scale, nthreads, window);
}

void paged_decode_bf16(const float* q, const uint16_t* kc, const uint16_t* vc, const int32_t* tables,
                       const int32_t* lens, float* out, int B, int H, int KVH, int D, int BS, int W,
                       float scale, int nthreads, int window) {
  dispatch<uint16_t>(q, kc, vc, tables, lens, out, B, H, KVH, D, BS, W, scale, nthreads, window);
}

// int8 pool: rows of D codes + one fp32 scale (D is the head_dim, not the row width)
// window: sliding-window attention, each query sees its last `window` positions (0 = all)
void paged_decode_i8(const float* q, const int8_t* kc, const int8_t* vc, const int32_t* tables,
                     const int32_t* lens, float* out, int B, int H, int KVH, int D, int BS, int W,
                     float scale, int nthreads, int window) {
  dispatch<int8_t>(q, kc, vc, tables, lens, out, B, H, KVH, D, BS, W, scale, nthreads, window);
}

}
