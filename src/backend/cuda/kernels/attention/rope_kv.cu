// RoPE (YaRN) on q and k, and the K/V store into the paged cache (backend/kv_layout.h).
#include <cooperative_groups.h>

#include <cstdio>
#include <string>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/attention/rope_math.cuh"
#include "backend/kv_layout.h"

namespace gptoss::cuda {

__device__ __forceinline__ size_t kv_offset(int page, int kv, int slot, int h, int d, int ps, int Hkv, int D) {
  return PagedKvLayout{ps, Hkv, D}.offset(page, kv, slot, h, d);
}

__global__ void rope_kv_kernel(uint16_t* __restrict__ qkv, int Hq, int Hkv, int D,
                               const float* __restrict__ inv_freq, float scaling, TokenMeta tm, KvLayer kv) {
  pdl_begin();
  int t = blockIdx.x;
  int pos = tm.pos[t];
  int half = D / 2;
  int row_len = (Hq + 2 * Hkv) * D;
  uint16_t* row = qkv + size_t(t) * row_len;
  int page = tm.pt[tm.pt_off[t] + pos / kv.page_size];
  int slot = pos % kv.page_size;
  // cos/sin once per frequency (not per head): precise sincosf is the costly part.
  __shared__ float cs[64], sn_s[64];
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    rope_cos_sin(pos, inv_freq[j], scaling, &cs[j], &sn_s[j]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < (Hq + Hkv) * half; i += blockDim.x) {
    int h = i / half, j = i % half;
    float c = cs[j], sn = sn_s[j];
    uint16_t* hp = row + size_t(h) * D;
    float x1 = bf16_bits_to_f32(hp[j]), x2 = bf16_bits_to_f32(hp[j + half]);
    const float2 r = rope_rotate(x1, x2, c, sn);
    const float o1 = r.x, o2 = r.y;
    if (h < Hq) {
      hp[j] = f32_to_bf16_bits(o1);
      hp[j + half] = f32_to_bf16_bits(o2);
    } else {
      int kh = h - Hq;
      // Round through bf16 first so the cache holds what a bf16 k would be.
      const size_t o = kv_offset(page, 0, slot, kh, j, kv.page_size, Hkv, D);
      store_kv_value(kv, o, round_to_bf16(o1));
      store_kv_value(kv, o + half, round_to_bf16(o2));
    }
  }
  const uint16_t* v = row + size_t(Hq + Hkv) * D;
  for (int i = threadIdx.x; i < Hkv * D; i += blockDim.x)
    store_kv_value(kv, kv_offset(page, 1, slot, i / D, i % D, kv.page_size, Hkv, D), bf16_bits_to_f32(v[i]));
}

void rope_kv_store(bf16_t* qkv, int n, int Hq, int Hkv, int D, const float* inv_freq, float attn_scaling,
                   const TokenMeta& tm, const KvLayer& kv, cudaStream_t s) {
  if (n <= 0) return;
  if (D > 128) throw Error("rope: head_dim must be <= 128");
  launch_pdl(rope_kv_kernel, dim3(n), dim3(512), 0, s, qkv, Hq, Hkv, D, inv_freq, attn_scaling, tm, kv);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
