#pragma once
// Device-side helpers shared by the kernel files (bf16/fp8 conversions, warp reductions).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "backend/cuda/cuda_common.h"

namespace gptoss::cuda {

// The GPU's nanosecond clock (for timeouts in kernels that wait on other agents).
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
// Two floats -> two bf16 (round to nearest even) packed in a word, low half first.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return uint32_t(f32_to_bf16_bits(lo)) | (uint32_t(f32_to_bf16_bits(hi)) << 16);
}
// Two bf16 packed in a word -> two floats (low half first).
__device__ __forceinline__ float2 bf16x2_to_f32x2(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
// Two bf16 -> two fp16 in a word (rounded; exact for normalized activations).
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t w) {
  const float2 f = bf16x2_to_f32x2(w);
  __half2 h = __floats2half2_rn(f.x, f.y);
  return *reinterpret_cast<uint32_t*>(&h);
}
// Eight bf16 -> eight fp16 (exact for normalized activations; tiny values go subnormal).
__device__ __forceinline__ uint4 bf16x8_to_f16x8(uint4 v) {
  uint32_t* w = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float2 f = bf16x2_to_f32x2(w[q]);
    __half2 h = __floats2half2_rn(f.x, f.y);
    w[q] = *reinterpret_cast<uint32_t*>(&h);
  }
  return v;
}
__device__ __forceinline__ float fp8_bits_to_f32(uint8_t b) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(b, __NV_E4M3);
  return __half2float(__half(h));
}
__device__ __forceinline__ uint8_t f32_to_fp8_bits(float f) {
  return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
}

// The reductions' operations, and one butterfly over the warp (every lane gets the result).
struct SumOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, SumOp{}); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce(v, MaxOp{}); }

// Sum / max of one value per thread over a block of THREADS threads (red: THREADS / 32 slots of
// shared memory); every thread gets the result. Callable back to back with the same red (the
// first barrier waits for the previous reduction's reads).
template <int THREADS, class T, class Op>
__device__ __forceinline__ T block_reduce(T v, T* red, T identity, Op op) {
  v = warp_reduce(v, op);
  const int w = threadIdx.x / 32, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  const T t = lane < THREADS / 32 ? red[lane] : identity;
  return warp_reduce(t, op);
}
template <int THREADS>
__device__ __forceinline__ float block_sum(float v, float* red) { return block_reduce<THREADS>(v, red, 0.0f, SumOp{}); }
template <int THREADS>
__device__ __forceinline__ double block_sum_d(double v, double* red) {
  return block_reduce<THREADS>(v, red, 0.0, SumOp{});
}
template <int THREADS>
__device__ __forceinline__ float block_max(float v, float* red) {
  return block_reduce<THREADS>(v, red, -INFINITY, MaxOp{});
}

// e8m0 scale byte -> 2^(s-127) (s = 0 gives the subnormal 2^-127; 255 is NaN).
__device__ __forceinline__ float e8m0_to_f32_dev(uint32_t s) {
  if (s == 0) return __uint_as_float(0x00400000u);
  if (s == 255) return __uint_as_float(0x7fc00000u);
  return __uint_as_float(s << 23);
}

// e2m1 code (0..15) -> float without a memory table: twice the magnitudes 0,1,2,3,4,6,8,12 are
// packed as nibbles of one constant.
__device__ __forceinline__ float e2m1_to_f32(uint32_t code) {
  float mag = float((0xC8643210u >> ((code & 7u) * 4u)) & 15u) * 0.5f;
  return (code & 8u) ? -mag : mag;
}

// Programmatic dependent launch (sm_90+): every kernel of the forward pass is launched with
// programmatic stream serialization, so the next kernel's blocks start while this one drains and
// hide its launch latency. Each kernel calls pdl_wait() before touching memory an earlier kernel
// writes or reads (it returns once the previous grid has completed and flushed), then
// pdl_trigger() to let the following kernel launch.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_trigger();
}

// GPTOSS_PDL=0 (measurements only): launches without programmatic stream serialization, so no
// kernel starts before its predecessor has completed (bench-kernels' back-to-back timings then
// hold no overlap of a launch with the one before it). Read once (cuda_common.cu).
bool pdl_launches_enabled();

// Launches with programmatic stream serialization (see pdl_wait), the grid's blocks in
// thread-block clusters of `cluster` (all 1: no clusters).
template <typename... KArgs, typename... Args>
void launch_pdl_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, dim3 cluster, cudaStream_t s,
                        Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl_launches_enabled() ? 1 : 0;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = cluster.x;
  attr[1].val.clusterDim.y = cluster.y;
  attr[1].val.clusterDim.z = cluster.z;
  cfg.attrs = attr;
  cfg.numAttrs = cluster.x * cluster.y * cluster.z > 1 ? 2 : 1;
  GPTOSS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Without opting in, a kernel's dynamic shared memory may be 48 KB less its static arrays and
// the 1 KB the driver reserves a block; a launch past that fails with cudaErrorInvalidValue.
// Opts in wherever the dynamic part comes within 8 KB of 48 KB (our kernels' static arrays stay
// under 7 KB), so a size just under 48 KB is not missed (the twentieth session's rt8 units
// kernel at 2 tokens: 44.3 KB dynamic + 4.1 KB static failed).
template <typename... KArgs>
void allow_dynamic_smem(void (*kernel)(KArgs...), size_t bytes) {
  if (bytes > 40 * 1024)
    GPTOSS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  launch_pdl_cluster(kernel, grid, block, smem, dim3(1, 1, 1), s, std::forward<Args>(args)...);
}

}  // namespace gptoss::cuda
