// LL all-reduce over peer memory: see ll_allreduce.h for the protocol.
#include "backend/cuda/kernels/comm/ll_allreduce.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "backend/cuda/cluster.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels/comm/peer_sync.cuh"
#include "common/error.h"

namespace gptoss::cuda {
namespace {

constexpr int kMaxTopK = 8;  // as moe_combine

// One slot: two floats, each beside the epoch, in one 16-byte store (each 8-byte half lands
// whole, so a reader that sees both flags sees both values).
__device__ __forceinline__ void store_slot(uint4* p, float a, float b, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(__float_as_uint(a)), "r"(flag),
               "r"(__float_as_uint(b)), "r"(flag)
               : "memory");
}
__device__ __forceinline__ uint4 load_slot(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// Slot `u` of (parity, source rank) in the area at `area` (of a group of `world`).
__device__ __forceinline__ uint4* slot_at(char* area, size_t slots, int world, uint32_t parity, int src, size_t u) {
  return reinterpret_cast<uint4*>(area) + (size_t(parity) * world + src) * slots + u;
}

struct Epoch {
  uint32_t value, parity;
};

// Slot q from rank `src` once both its flags carry this call's epoch (`what` names the
// collective in check_wait's message).
__device__ __forceinline__ uint4 wait_slot(const uint4* q, Epoch e, LLPeers p, int src, const char* what) {
  uint4 v = load_slot(q);
  if (v.y != e.value || v.w != e.value) {
    const uint64_t t0 = global_timer_ns();
    uint32_t spins = 0;
    do {
      check_wait(spins, t0, p.timeout_ns, p.abort_flag, what, p.rank, src, e.value);
      v = load_slot(q);
    } while (v.y != e.value || v.w != e.value);
  }
  return v;
}
__device__ __forceinline__ Epoch ll_begin(LLPeers p) {
  const uint32_t e = epoch_begin(p.state);
  return Epoch{e, e & 1u};
}
__device__ __forceinline__ void ll_end(LLPeers p, uint32_t epoch) { epoch_end(p.state, epoch); }

// This rank's contribution of two floats to every peer's slot u.
// (Loops over ranks run to the constant kLLMaxRanks, unrolled, so `area` is indexed by constants
// and stays in the kernel's parameters instead of a local copy.)
__device__ __forceinline__ void push(LLPeers p, Epoch e, size_t u, float a, float b) {
#pragma unroll
  for (int r = 0; r < kLLMaxRanks; ++r)
    if (r < p.world && r != p.rank) store_slot(slot_at(p.area[r], p.slots, p.world, e.parity, p.rank, u), a, b, e.value);
}

// The sum in rank order of slot u's two floats, this rank's own (a, b) taken as they are.
__device__ __forceinline__ float2 gather_sum(LLPeers p, Epoch e, size_t u, float a, float b) {
  float2 s = make_float2(0.f, 0.f);
  char* const mine = p.own;
#pragma unroll
  for (int r = 0; r < kLLMaxRanks; ++r) {
    if (r >= p.world) break;
    float va = a, vb = b;
    if (r != p.rank) {
      const uint4 v = wait_slot(slot_at(mine, p.slots, p.world, e.parity, r, u), e, p, r, "LL all-reduce");
      va = __uint_as_float(v.x);
      vb = __uint_as_float(v.z);
    }
    // Rank 0's value is taken as it is (0 + v would turn -0 into +0), then added in order.
    s.x = r == 0 ? va : s.x + va;
    s.y = r == 0 ? vb : s.y + vb;
  }
  return s;
}

// Flat: slot u holds elements 2u, 2u + 1 (the last one padded when n is odd); grid-stride.
constexpr int kFlatThreads = 256, kFlatMaxBlocks = 64;

__global__ void __launch_bounds__(kFlatThreads) ll_all_reduce_kernel(LLPeers p, float* data, size_t n) {
  pdl_wait();
  const Epoch e = ll_begin(p);
  const size_t units = (n + 1) / 2, stride = size_t(gridDim.x) * blockDim.x;
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t u = first; u < units; u += stride) {
    const size_t i = 2 * u;
    push(p, e, u, data[i], i + 1 < n ? data[i + 1] : 0.f);
  }
  for (size_t u = first; u < units; u += stride) {
    const size_t i = 2 * u;
    const float2 s = gather_sum(p, e, u, data[i], i + 1 < n ? data[i + 1] : 0.f);
    data[i] = s.x;
    if (i + 1 < n) data[i + 1] = s.y;
  }
  pdl_trigger();
  ll_end(p, e.value);
}

// All-gather: slot u carries 8 bytes (as two words) of the sender's part; grid-stride.
__device__ __forceinline__ uint2 load8(const unsigned char* p, bool aligned) {
  if (aligned) return *reinterpret_cast<const uint2*>(p);
  uint2 v;
  unsigned char* d = reinterpret_cast<unsigned char*>(&v);
  for (int i = 0; i < 8; ++i) d[i] = p[i];
  return v;
}
__device__ __forceinline__ void store8(unsigned char* p, uint2 v, bool aligned) {
  if (aligned) {
    *reinterpret_cast<uint2*>(p) = v;
    return;
  }
  const unsigned char* s = reinterpret_cast<const unsigned char*>(&v);
  for (int i = 0; i < 8; ++i) p[i] = s[i];
}

__global__ void __launch_bounds__(kFlatThreads) ll_all_gather_kernel(LLPeers p, const unsigned char* send,
                                                                     unsigned char* recv, size_t bytes) {
  pdl_wait();
  const Epoch e = ll_begin(p);
  const size_t units = bytes / 8, stride = size_t(gridDim.x) * blockDim.x;
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool aligned = ((reinterpret_cast<uintptr_t>(send) | reinterpret_cast<uintptr_t>(recv)) & 7) == 0;
  for (size_t u = first; u < units; u += stride) {
    const uint2 v = load8(send + 8 * u, aligned);
    push(p, e, u, __uint_as_float(v.x), __uint_as_float(v.y));
    store8(recv + size_t(p.rank) * bytes + 8 * u, v, aligned);  // send may alias this: same thread, read first
  }
  for (size_t u = first; u < units; u += stride) {
#pragma unroll
    for (int r = 0; r < kLLMaxRanks; ++r) {
      if (r >= p.world) break;
      if (r == p.rank) continue;
      const uint4 v = wait_slot(slot_at(p.own, p.slots, p.world, e.parity, r, u), e, p, r, "LL all-gather");
      store8(recv + size_t(r) * bytes + 8 * u, make_uint2(v.x, v.z), aligned);
    }
  }
  pdl_trigger();
  ll_end(p, e.value);
}

// Rows: a cluster of kRowBlocks blocks per row of H (as moe_combine), each over a slice of the
// row; the combine's terms, the all-reduce, then the row's sum of squares met through
// distributed shared memory for the norm. Slot u = (t * H + h) / 2.
constexpr int kRowBlocks = 8, kRowThreads = 128;

__global__ void __cluster_dims__(kRowBlocks, 1, 1) __launch_bounds__(kRowThreads)
    ll_residual_kernel(LLPeers p, ResidualAllReduce op) {
  pdl_wait();
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const Epoch e = ll_begin(p);
  const int crank = int(cluster.block_rank());
  const int t = blockIdx.x / kRowBlocks, H = op.H, k = op.k;
  const int per = ((H + kRowBlocks - 1) / kRowBlocks + 1) & ~1;  // even: slices start on a slot
  const int h0 = min(H, crank * per), h1 = min(H, h0 + per);
  float* xr = op.x + size_t(t) * H;
  int slot[kMaxTopK];
  float w[kMaxTopK];
#pragma unroll
  for (int j = 0; j < kMaxTopK; ++j) {
    slot[j] = j < k ? op.routing.slot_pair[t * k + j] : 0;
    w[j] = j < k ? op.routing.topk_w[t * k + j] : 0.f;
  }
  // This rank's contribution (moe_combine's sums: xr[h] + sum, experts in order j), kept in xr
  // for the rank-order sum below.
  for (int h = h0 + 2 * int(threadIdx.x); h < h1; h += 2 * kRowThreads) {
    float c[2];
    for (int q = 0; q < 2; ++q) {
      float v = op.add_x ? xr[h + q] : 0.f;
      if (op.y) {
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kMaxTopK; ++j)
          if (j < k) sum = fmaf(w[j], op.y[size_t(slot[j]) * H + h + q], sum);
        v = op.add_x ? v + sum : sum;
      }
      c[q] = v;
    }
    if (op.y) { xr[h] = c[0]; xr[h + 1] = c[1]; }
    push(p, e, (size_t(t) * H + h) / 2, c[0], c[1]);
  }
  float ss = 0.f;
  for (int h = h0 + 2 * int(threadIdx.x); h < h1; h += 2 * kRowThreads) {
    const float2 s = gather_sum(p, e, (size_t(t) * H + h) / 2, xr[h], xr[h + 1]);
    xr[h] = s.x;
    xr[h + 1] = s.y;
    ss += s.x * s.x + s.y * s.y;
  }
  pdl_trigger();
  if (op.norm_w) {  // uniform over the grid
    const float total = cluster_sum<kRowThreads, kRowBlocks>(cluster, ss);
    const float inv = 1.0f / sqrtf(total / float(H) + op.eps);
    uint16_t* xn = reinterpret_cast<uint16_t*>(op.xn) + size_t(t) * H;
    for (int h = h0 + int(threadIdx.x); h < h1; h += kRowThreads) xn[h] = f32_to_bf16_bits(xr[h] * inv * op.norm_w[h]);
    cluster.sync();  // the others' shared memory stays alive until all have read it
  }
  ll_end(p, e.value);
}

}  // namespace

size_t ll_area_bytes(size_t max_floats, int world) {
  return size_t(2) * world * ((max_floats + 1) / 2) * sizeof(uint4);
}

void ll_all_reduce_f32(const LLPeers& peers, float* data, size_t n, cudaStream_t stream) {
  if (n == 0 || peers.world < 2) return;
  if ((n + 1) / 2 > peers.slots) throw Error("LL all-reduce: " + std::to_string(n) + " floats exceed the receive area");
  const size_t units = (n + 1) / 2;
  // About two slots a thread; every block resident at once (the peers' blocks wait on each other).
  const int blocks = int(std::clamp<size_t>((units + 2 * kFlatThreads - 1) / (2 * kFlatThreads), 1, kFlatMaxBlocks));
  launch_pdl(ll_all_reduce_kernel, dim3(blocks), dim3(kFlatThreads), 0, stream, peers, data, n);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

void ll_all_gather(const LLPeers& peers, const void* send, void* recv, size_t bytes, cudaStream_t stream) {
  if (bytes == 0 || peers.world < 2) return;
  if (bytes % 8 != 0 || bytes / 8 > peers.slots)
    throw Error("LL all-gather: " + std::to_string(bytes) + " bytes (a multiple of 8 up to the receive area)");
  const size_t units = bytes / 8;
  const int blocks = int(std::clamp<size_t>((units + kFlatThreads - 1) / kFlatThreads, 1, kFlatMaxBlocks));
  launch_pdl(ll_all_gather_kernel, dim3(blocks), dim3(kFlatThreads), 0, stream, peers,
             static_cast<const unsigned char*>(send), static_cast<unsigned char*>(recv), bytes);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

bool ll_residual_fits(const LLPeers& peers, const ResidualAllReduce& op) {
  return peers.world >= 2 && op.H > 0 && op.H % 2 == 0 && op.n > 0 && op.k <= kMaxTopK &&
         size_t(op.n) * op.H / 2 <= peers.slots && (op.y || op.add_x) && (!op.norm_w || op.xn) &&
         // a cluster per row, every block resident at once (the peers' blocks wait on each other)
         op.n <= 64;
}

void ll_residual_all_reduce(const LLPeers& peers, const ResidualAllReduce& op, cudaStream_t stream) {
  if (!ll_residual_fits(peers, op)) throw Error("LL residual all-reduce: the call does not fit (ll_residual_fits)");
  launch_pdl(ll_residual_kernel, dim3(op.n * kRowBlocks), dim3(kRowThreads), 0, stream, peers, op);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
