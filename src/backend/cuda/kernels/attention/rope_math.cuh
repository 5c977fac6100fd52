#pragma once
// RoPE (YaRN) arithmetic and the K/V store shared by the kernels that rotate q and k and store the
// new k and v: rope_kv_store and the decode attention kernels that fold them in (attention.cu,
// attention_decode_mma.cu). Written with explicit roundings (no contraction left to the compiler)
// so that all give the same bits for the same input.
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace gptoss::cuda {

// cos and sin of frequency `inv_freq` at `pos`, times YaRN's attention scaling. Precise sincosf:
// pos * inv_freq reaches ~1e5 radians at long contexts.
__device__ __forceinline__ void rope_cos_sin(int pos, float inv_freq, float scaling, float* c, float* s) {
  float sv, cv;
  sincosf(__fmul_rn(float(pos), inv_freq), &sv, &cv);
  *c = __fmul_rn(cv, scaling);
  *s = __fmul_rn(sv, scaling);
}

// The pair (x1, x2) = dims (j, j + D/2) rotated: (x1 c - x2 s, x2 c + x1 s).
__device__ __forceinline__ float2 rope_rotate(float x1, float x2, float c, float s) {
  return make_float2(__fmaf_rn(x1, c, -__fmul_rn(x2, s)), __fmaf_rn(x2, c, __fmul_rn(x1, s)));
}

// A float rounded to the nearest bf16, as a float.
__device__ __forceinline__ float round_to_bf16(float x) { return bf16_bits_to_f32(f32_to_bf16_bits(x)); }

// Stores x (a bf16 value: a rounded k, or a v as it came) at element o of the pages, as bf16 or
// rounded to fp8 e4m3, and returns the value the cache now holds.
__device__ __forceinline__ float store_kv_value(const KvLayer& kv, size_t o, float x) {
  if (kv.fp8) {
    const uint8_t b = f32_to_fp8_bits(x);
    static_cast<uint8_t*>(kv.base)[o] = b;
    return fp8_bits_to_f32(b);
  }
  static_cast<uint16_t*>(kv.base)[o] = f32_to_bf16_bits(x);
  return x;
}

}  // namespace gptoss::cuda
