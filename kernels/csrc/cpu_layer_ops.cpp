// The fused layer ops of layer_ops.h, exported for kernels/cpu_layer_ops.py (ctypes).
#include "layer_ops.h"

using namespace layer_ops;

extern "C" {

void add_rms_norm_f32(float* x, const float* d, const float* w, float* o, long T, long D, float eps, int n) {
  add_rms_norm<F32>(x, d, w, o, T, D, eps, n);
}
void add_rms_norm_bf16(uint16_t* x, const uint16_t* d, const uint16_t* w, uint16_t* o, long T, long D,
                       float eps, int n) {
  add_rms_norm<BF16>(x, d, w, o, T, D, eps, n);
}
void rope_store_f32(const float* qkv, long T, int H, int KVH, int D, const float* c, const float* s,
                    const int64_t* pos, const int64_t* slots, float* q, float* kc, float* vc, int n) {
  rope_store<F32>(qkv, T, H, KVH, D, c, s, pos, slots, q, kc, vc, n);
}
void rope_store_bf16(const uint16_t* qkv, long T, int H, int KVH, int D, const uint16_t* c, const uint16_t* s,
                     const int64_t* pos, const int64_t* slots, uint16_t* q, uint16_t* kc, uint16_t* vc, int n) {
  rope_store<BF16>(qkv, T, H, KVH, D, c, s, pos, slots, q, kc, vc, n);
}
void silu_mul_f32(const float* gu, float* o, long T, long I, int n) { silu_mul<F32>(gu, o, T, I, n); }
void silu_mul_bf16(const uint16_t* gu, uint16_t* o, long T, long I, int n) { silu_mul<BF16>(gu, o, T, I, n); }

}
