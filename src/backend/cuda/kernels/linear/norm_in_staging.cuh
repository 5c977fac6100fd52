#pragma once
// The one-token qkv's input row, staged into shared memory as rmsnorm(x + moe x 2^-32) * norm_w
// (NormIn: the combine folded into the next layer), in its three forms: each block reading the
// whole row (stage_row_norm_in), clusters each block of which reads a slice and stores it into
// the others (stage_row_norm_in_cluster), and the bulk-copy engine's multicast of the slices
// (stage_row_norm_in_multicast). Their arithmetic, and its order, is one (stage_row_norm_in_from),
// so every form stages the same bits. Included by skinny_mma.cu only (its kernel's NORM_IN launches).
#include <cuda_fp16.h>

#include "backend/cuda/bulk_copy_ptx.cuh"
#include "backend/cuda/cluster.cuh"
#include "backend/cuda/diag_clocks.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/skinny_chunk.cuh"
#include "backend/cuda/kernels/moe/router_fold.cuh"

namespace gptoss::cuda {
namespace {

using namespace skinny;

// Float4s of a row each thread of a NORM_IN block holds (K / 4 <= kNormPer * threads).
constexpr int kNormPer = 3;

#ifdef GPTOSS_DIAG_MMA_CLOCKS
// Diagnostic builds only: the norm-in staging's own stages, thread 0's cycles summed into
// [0: each block reads the row, 1: clusters, 2: multicast][stage], a count in [.][7] (printed with
// the others):
// the wait returned -> the row's loads in -> the sums of squares met (the block's or the
// cluster's barrier) -> the normalized row written.
__device__ unsigned long long g_norm_clocks[3][8];
#define NORM_CLOCK(i) GPTOSS_STAGE_CLOCK(nclk, i)
#define NORM_CLOCKS_ADD(kind)                                                            \
  do {                                                                                   \
    if (threadIdx.x == 0) {                                                              \
      for (int i_ = 0; i_ < 3; ++i_)                                                     \
        atomicAdd(&g_norm_clocks[kind][i_], (unsigned long long)(nclk[i_ + 1] - nclk[i_])); \
      atomicAdd(&g_norm_clocks[kind][7], 1ull);                                          \
    }                                                                                    \
  } while (0)
#define NORM_CLOCKS_DECL long long nclk[4] = {0, 0, 0, 0}
#define NORM_CLOCK_AFTER(v, i)            \
  do {                                    \
    asm volatile("" ::"f"(v) : "memory"); \
    NORM_CLOCK(i);                        \
  } while (0)
#else
#define NORM_CLOCKS_DECL do {} while (0)
#define NORM_CLOCK(i) do {} while (0)
#define NORM_CLOCK_AFTER(v, i) do {} while (0)
#define NORM_CLOCKS_ADD(kind) do {} while (0)
#endif
// Float4s of the row a cluster's norm-in staging holds in each block (stage_row_norm_in_cluster).
constexpr int kNormInRowMax = 720;
// Four values of the next layer's input before its norm (NormIn): the residual plus the MoE's
// fixed-point sums, x + moe x 2^-32.
__device__ __forceinline__ float4 add_moe_fixed(float4 xv, longlong2 lo, longlong2 hi) {
  xv.x += router_fold::from_fixed_logit(lo.x);
  xv.y += router_fold::from_fixed_logit(lo.y);
  xv.z += router_fold::from_fixed_logit(hi.x);
  xv.w += router_fold::from_fixed_logit(hi.y);
  return xv;
}
// Float4 i of it, both read from L2.
__device__ __forceinline__ float4 norm_in_residual(const NormIn& in, int i) {
  const longlong2* m2 = reinterpret_cast<const longlong2*>(in.moe);
  return add_moe_fixed(__ldcg(reinterpret_cast<const float4*>(in.x) + i), __ldcg(m2 + 2 * i), __ldcg(m2 + 2 * i + 1));
}

// qkv after a folded combine (NormIn, one token): stages rmsnorm(x + moe x 2^-32) * norm_w into
// xs (bf16, or fp16 where F16), every thread; norm_w's lines were prefetched into L2 before the
// wait. The sum of squares meets in `scratch` (a float a warp), summed by a fixed butterfly. The
// caller brackets it with __syncthreads. norm_w's loads go out with x's and moe's (one round trip), or
// with LATE_NW after the sum of squares' barrier instead of held in registers across it (the
// MXFP4 kernel's decode keeps more registers live; held, they spill there).
// (stage_row_norm_in_multicast takes the same arithmetic from shared memory: residual(i) gives
// float4 i of x + moe, weight(i) norm_w's, after arrive() has returned; clock_kind: g_norm_clocks' row.)
template <bool F16, bool LATE_NW, class Arrive, class Residual, class Weight>
__device__ __forceinline__ void stage_row_norm_in_from(const SkinnyArgs& a, uint16_t* xs, float* scratch, Arrive arrive,
                                                       Residual residual, Weight weight, int clock_kind) {
  const NormIn& in = a.norm_in;
  const int n4 = a.W.K / 4, tid = threadIdx.x, nwarps = blockDim.x / 32;
  float4 v[kNormPer], nw[kNormPer];
  float ss = 0.f;
  NORM_CLOCKS_DECL;
  NORM_CLOCK(0);
  arrive();
#pragma unroll
  for (int u = 0; u < kNormPer; ++u) {
    const int i = tid + u * blockDim.x;
    if (i < n4) {
      if constexpr (!LATE_NW) nw[u] = weight(i);
      const float4 xv = residual(i);
      v[u] = xv;
      ss += xv.x * xv.x + xv.y * xv.y + xv.z * xv.z + xv.w * xv.w;
    }
  }
  NORM_CLOCK_AFTER(ss, 1);
  ss = warp_sum(ss);
  if ((tid & 31) == 0) scratch[tid >> 5] = ss;
  __syncthreads();
  NORM_CLOCK(2);
  // (A butterfly over the warps' sums, where a loop of dependent shared loads took ~300 cycles.)
  const float tot = warp_sum((tid & 31) < nwarps ? scratch[tid & 31] : 0.f);
  const float inv = rsqrtf(tot / float(a.W.K) + in.eps);
#pragma unroll
  for (int u = 0; u < kNormPer; ++u) {
    const int i = tid + u * blockDim.x;
    if (i < n4) {
      float4 w;
      if constexpr (LATE_NW) w = weight(i);
      else w = nw[u];
      store_staged4<F16>(xs + 4 * i, v[u].x * inv * w.x, v[u].y * inv * w.y, v[u].z * inv * w.z, v[u].w * inv * w.w);
    }
  }
  NORM_CLOCK(3);
  NORM_CLOCKS_ADD(clock_kind);
}
template <bool F16, bool LATE_NW = false>
__device__ __forceinline__ void stage_row_norm_in(const SkinnyArgs& a, uint16_t* xs, float* scratch) {
  const float4* w4 = reinterpret_cast<const float4*>(a.norm_in.norm_w);
  stage_row_norm_in_from<F16, LATE_NW>(
      a, xs, scratch, [] {}, [&](int i) { return norm_in_residual(a.norm_in, i); }, [&](int i) { return __ldg(w4 + i); },
      0);
}

// The same row brought in by the bulk-copy engine's multicast over a cluster of CL blocks (NMC):
// block r asks L2 once for slice r of x, of the MoE sums and of norm_w, and the engine delivers
// each slice into every block of the cluster (NormInRow, one transaction barrier a block armed
// for the whole row), so the cluster reads the row once, as stage_row_norm_in_cluster's does, but
// without its stores into other blocks and its cluster barrier after the loads. Then each block
// normalizes the whole row from its shared memory by stage_row_norm_in's arithmetic (the same
// bits as each block reading the row itself). norm_w's slices go before the wait. (H200,
// thirty-sixth session, 120b fp8: the row is in ~4,500 cycles after the wait, ~1,800 of them
// thread 0's issue of the two copies, against the clusters' 1,215 for the loads and ~2,400 for the
// stores and barrier; qkv's rows staged 5,943 cycles against 7,263, tg128 +0.7-2.7%. Staging the
// weights by cp.async instead, so that the bulk-copy engine is idle at the wait, did not bring the
// row in sooner; nor did the clusters' slices pushed by st.async onto transaction barriers.)
struct NormInRow {
  float4* x;         // [K / 4]
  longlong2* moe;    // [K / 2]
  float4* w;         // [K / 4]
  uint64_t* full;    // the transaction barrier, armed for K * 16 bytes
};
// Thread 0, once every block of the cluster has initialised its barrier: slice `rank` of the row
// named by src (x, moe or norm_w, `bytes_per` bytes an element) into dst in every block.
template <int CL>
__device__ __forceinline__ void multicast_norm_slice(const void* src, void* dst, int K, int bytes_per, const NormInRow& row) {
  const int rank = int(cooperative_groups::this_cluster().block_rank());
  const uint32_t slice = uint32_t(K / CL * bytes_per);
  ptx::bulk_copy_g2s_multicast(ptx::smem_u32(static_cast<char*>(dst) + rank * slice),
                               static_cast<const char*>(src) + size_t(rank) * slice, slice, ptx::smem_u32(row.full),
                               uint16_t((1u << CL) - 1));
}
template <bool F16>
__device__ __forceinline__ void stage_row_norm_in_multicast(const SkinnyArgs& a, uint16_t* xs, float* scratch,
                                                            const NormInRow& row) {
  stage_row_norm_in_from<F16, true>(
      a, xs, scratch, [&] { ptx::mbar_wait(ptx::smem_u32(row.full), 0); },
      [&](int i) { return add_moe_fixed(row.x[i], row.moe[2 * i], row.moe[2 * i + 1]); }, [&](int i) { return row.w[i]; },
      2);
}

// The same row staged by a cluster of CL blocks (qkv's 320 one-token blocks in clusters; NormIn).
// Each block reading the whole row (46 KB: x, moe and norm_w) asks L2 for 14.7 MB a launch, which
// at L2's ~5.5 TB/s took ~5,200 cycles (thirty-fifth session's clocks); here block r reads only
// slice r and stores the slice's (x + moe x 2^-32) * norm_w as f32, and its warps' sums of
// squares, into every block's row_s and ss_s. After the cluster barrier each block scales its
// full row by the inverse RMS, its sum taken in the same order everywhere (a fixed butterfly over
// the cluster's warp sums), so every block and every cluster stages the same bits. (It rounds
// (x + moe) * norm_w * inv where stage_row_norm_in rounds (x + moe) * inv * norm_w.)
// nw: this thread's norm_w pieces, loaded before the wait. The kernel arrived (relaxed) on the
// cluster barrier at its start; the wait here makes the remote stores safe.
constexpr int kNormClusterWarps = 8;  // ss_s's entries a rank (the norm-in launch's warps)
template <int CL>
constexpr int norm_pieces() { return CL == 2 ? 2 : 1; }  // float4s of the slice a thread holds (720 / CL over 256)
template <int CL>
__device__ __forceinline__ int norm_slice(const SkinnyArgs& a) { return a.W.K / 4 / CL; }
template <bool F16, int CL>
__device__ __forceinline__ void stage_row_norm_in_cluster(const SkinnyArgs& a, uint16_t* xs, float4* row_s, float* ss_s,
                                                          const float4 (&nw)[norm_pieces<CL>()]) {
  constexpr int kP = norm_pieces<CL>();
  const NormIn& in = a.norm_in;
  const int n4 = a.W.K / 4, slice = n4 / CL, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rank = int(cooperative_groups::this_cluster().block_rank());
  NORM_CLOCKS_DECL;
  NORM_CLOCK(0);
  float ss = 0.f;
  float4 vw[kP];
#pragma unroll
  for (int p = 0; p < kP; ++p) {
    const int e = tid + p * int(blockDim.x);
    vw[p] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (e < slice) {
      const float4 xv = norm_in_residual(in, rank * slice + e);
      ss += xv.x * xv.x + xv.y * xv.y + xv.z * xv.z + xv.w * xv.w;
      vw[p] = make_float4(xv.x * nw[p].x, xv.y * nw[p].y, xv.z * nw[p].z, xv.w * nw[p].w);
    }
  }
  NORM_CLOCK_AFTER(ss, 1);
  ss = warp_sum(ss);
  cluster_wait();  // every block has started (the kernel's first arrive): its shared memory takes stores
#pragma unroll
  for (int p = 0; p < kP; ++p) {
    const int e = tid + p * int(blockDim.x);
    if (e < slice)
#pragma unroll
      for (int b = 0; b < CL; ++b) *in_block(row_s + rank * slice + e, b) = vw[p];
  }
  if (lane == 0)  // (every warp, 0 where it held none of the slice)
#pragma unroll
    for (int b = 0; b < CL; ++b) *in_block(ss_s + rank * kNormClusterWarps + warp, b) = ss;
  cluster_sync_all();
  NORM_CLOCK(2);
  constexpr int kSums = CL * kNormClusterWarps;
  float part = 0.f;
#pragma unroll
  for (int q = 0; q < kSums; q += 32)
    if (q + lane < kSums) part += ss_s[q + lane];
  const float tot = warp_sum(part);
  const float inv = rsqrtf(tot / float(a.W.K) + in.eps);
  for (int j = tid; j < n4; j += blockDim.x) {
    const float4 v = row_s[j];
    store_staged4<F16>(xs + 4 * j, v.x * inv, v.y * inv, v.z * inv, v.w * inv);
  }
  NORM_CLOCK(3);
  NORM_CLOCKS_ADD(1);
}

}  // namespace
}  // namespace gptoss::cuda
