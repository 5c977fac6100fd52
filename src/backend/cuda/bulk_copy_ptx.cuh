#pragma once
// The PTX of copies by the bulk-copy engine (sm_90+): transaction-counting mbarriers and
// cp.async.bulk global -> shared. One thread arms a barrier with the bytes it is about to copy and
// issues the copies against it; the barrier's phase completes when every byte has landed, and
// readers wait on it. A wait names the parity of the phase it waits to see completed (0 for a
// fresh barrier's first). Used by the dense decode kernels (skinny_mma.cu) to stage weights
// before griddepcontrol.wait, and by the prefill expert GEMM (expert_gemm_wgmma_wa.cu: to hand
// cp.async copies between warpgroups; expert_gemm_v5_ws.cu: a producer warp's bulk and tensor copies).
#include <cuda_runtime.h>

#include <cstdint>

namespace gptoss::cuda::ptx {

// A shared-memory pointer as the 32-bit address the instructions below take.
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
// Makes initialised barriers visible to the async proxy (the bulk copies); other threads see them
// after a block barrier.
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// One arrival that also announces `bytes` of transactions in this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
// Returns once the phase of parity `parity` has completed.
// One try (the hardware suspends the thread a while before saying no): 1 once the phase of parity
// `parity` has completed.
__device__ __forceinline__ uint32_t mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.b32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
#endif
  return done;
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  while (!mbar_try_wait(bar, parity)) {
  }
#endif
}
// mbar_wait with a deadline: after `timeout_us` of waiting (the GPU's global timer, in 1.024 us
// units kept in one 32-bit register) the thread traps, so a pipeline that never fills fails its
// launch (an error at the next synchronize) instead of hanging the process. The kernels not yet
// proven on a GPU wait this way (expert_gemm_v5_ws.cu); the timer is read only after a failed
// try_wait, which already suspends the thread a while.
__device__ __forceinline__ void mbar_wait_bounded(uint32_t bar, uint32_t parity, uint32_t timeout_us) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t start = 0;  // 0: not read yet (a read of 0 is taken as 1)
  for (;;) {
    if (mbar_try_wait(bar, parity)) return;
    uint64_t ns;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(ns));
    const uint32_t now = uint32_t(ns >> 10) | 1u;
    if (start == 0)
      start = now;
    else if (now - start > timeout_us)
      __trap();
  }
#endif
}
// One plain arrival (release: this thread's earlier shared-memory reads and writes happen before
// the phase completes for a waiter).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// One arrival made when every cp.async this thread issued before it has landed (the pending
// count was set for it at init: .noinc). Lets a reader wait for other threads' cp.async copies
// without a block barrier.
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#endif
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) global -> shared, counted on `bar`.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
#endif
}
// The same copy delivered by the bulk-copy engine into every block of the cluster named in
// cta_mask (bit r: rank r), at dst's offset in each, counted on the barrier at bar's offset in
// each: one L2 read for the whole cluster. Every destination's barrier must be initialised (and
// the cluster synchronised after) before the copy is issued. sm_90a only (the host launches it
// where expert_gemm_v3_available()); elsewhere it traps.
__device__ __forceinline__ void bulk_copy_g2s_multicast(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                                        uint16_t cta_mask) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "h"(cta_mask)
      : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}
// A two-dimensional box of a tensor map (`tmap`: the generic address of a __grid_constant__
// CUtensorMap) at element coordinates (c0 innermost, c1) into shared memory at dst, counted on
// `bar` (the box's bytes, as the map's swizzle lays them out by dst's address bits).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, int c0, int c1, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#endif
}
// Brings a tensor map into the cache the copies above read it through.
__device__ __forceinline__ void prefetch_tensormap(const void* tmap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
#endif
}
}  // namespace gptoss::cuda::ptx
