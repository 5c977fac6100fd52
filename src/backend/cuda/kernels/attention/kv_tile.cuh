#pragma once
// K/V tiles in shared memory for the tensor-core attention kernels (flash_attention.cu for
// prefill, attention_decode_mma.cu for decode): [keys][64] bf16 tiles of 128-byte rows whose
// 16-byte chunks are XOR-swizzled by the row, so the 8 rows an ldmatrix phase reads hit 8
// different bank groups; fp8 (e4m3) pages widened to bf16 exactly; exp2 in the log2 domain.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/device_utils.cuh"

namespace gptoss::cuda {

constexpr float kLog2e = 1.4426950408889634f;

// Byte offset of (row, 16-byte chunk) in a [rows][64] bf16 tile.
__device__ __forceinline__ uint32_t kv_tile_swz(int row, int chunk) {
  return uint32_t(row * 128 + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Eight e4m3 values (one K or V row's 8 bytes) -> one 16-byte chunk of bf16 (e4m3 is exact in bf16).
__device__ __forceinline__ uint4 widen_fp8x8_to_bf16(uint2 v) {
  const uint32_t x[2] = {v.x, v.y};
  uint32_t w[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const __half2_raw h2 =
        __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t((x[e >> 1] >> (16 * (e & 1))) & 0xffffu), __NV_E4M3);
    const float2 f = __half22float2(__half2(h2));
    w[e] = pack_bf16x2(f.x, f.y);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

}  // namespace gptoss::cuda
