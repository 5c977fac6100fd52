// One token's gate_up and down in one launch after a folded router (skinny::launch_experts_pair,
// linear_grouped_pair in kernels.h): the pair kernel and its launcher. The unit steps are
// skinny_units_device.cuh's, shared with skinny_units.cu's kernels, so its outputs are their
// two launches' bit for bit.
#include <cstdint>
#include <unordered_map>

#include "backend/cuda/bulk_copy_ptx.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/skinny_units.h"
#include "backend/cuda/kernels/linear/skinny_units_device.cuh"

namespace gptoss::cuda {

namespace {

using namespace skinny;

// One token after a folded router (RouterFold, n == 1): gate_up and down in one launch. Block b
// takes gate_up's unit b, then down's unit b: both cut an expert into the same number of units
// (gate_up's 360 row tiles in fours, down's 180 in twos, four row tiles a warp's K slice would
// not fit beside gate_up's), so block b's down unit is of the expert its gate_up unit was. An
// expert's down units need only that expert's gate_up rows: each block counts its finished
// gate_up unit into sync[slot] (release), and its down unit waits on sync[slot] (acquire) with
// the routing already known (gate_up's) and its first weights already asked for. Two launches
// cost down the whole of gate_up's end (its last block, the grid's flush), its own blocks'
// start (gate_up's grid fills the GPU), routing again from the fold's sums and only then its
// first weight loads: ~3,300 cycles to route and ~3,200 more to its loop in the thirty-third
// session's clocks (H200, 120b fp8), ~3.3 us of the 9.6 down added to the step.
// Every block must be resident at once (a waiting block holds its SM slot until the blocks it
// waits for have run): the launcher takes the grid only where it fits the GPU in one wave. The
// last of a slot's down blocks to pass its wait resets both of the slot's counters
// (sync[kMaxTopK + slot] counts the passes) for the next launch. Each row's sums are the two
// kernels' (the same unit helpers and shapes): the outputs equal theirs bit for bit.
// Measured slower (H100, forty-sixth session, s46r2-r3, traced 120b fp8 one-token step): 28.35 us
// a layer against 18.48 + 9.01 for the two launches, tg128 -1 to -3%, whether the waits polled
// with acquire loads or relaxed ones; so the backend runs it only where GPTOSS_EXPERT_PAIR=1.
// SD (GPTOSS_EXPERT_PAIR=2): down's whole unit (its two row tiles' 45 chunks, 46 KB, and their
// scale words, 2.8 KB: contiguous in the fragment layout) comes into shared memory by one bulk copy
// as soon as the routing is known, beside gate_up's stream, so that down's bytes are read while
// gate_up's are and only its math waits for the count (three blocks an SM: 3 x ~75 KB).
// A wait that outlasts kPairWaitUs traps (a launch error, not a hang) where the grid did not all
// come resident after all.
constexpr int kPairKs = 8, kPairRtGateUp = 4, kPairRtDown = 2, kPairPfDown = 2, kPairCc = 45;
constexpr uint32_t kPairWaitUs = 200000;
constexpr size_t kPairStagedW = size_t(kPairRtDown) * kPairCc * 512, kPairStagedS = size_t(kPairRtDown) * kPairCc * 32;
// The dynamic shared memory: the K slices' sums (and gate_up's row copy), the staged row, and with SD
// down's unit and an mbarrier.
constexpr size_t pair_smem_bytes(int K, bool sd) {
  return size_t(kPairKs) * kPairRtGateUp * 4 * 32 * sizeof(float) + ((size_t(K + 8) * 2 + 15) / 16) * 16 +
         (sd ? kPairStagedW + kPairStagedS + 16 : 0);
}
template <bool SD>
__global__ void __launch_bounds__(kPairKs * 32, skinny_min_blocks(1, kPairKs, kPairRtGateUp, 1))
    skinny_units_pair_kernel(SkinnyArgs gu, SkinnyArgs dn, int* sync) {
  constexpr int FMT = WeightMat::kFragMXFP4, KS = kPairKs, RTG = kPairRtGateUp, RTD = kPairRtDown, C = kPairCc;
  constexpr int kMaxGroups = KS * 32, FOLD_CAP = router_fold_capacity(1);
  static_assert(skinny_min_blocks(1, KS, RTD, kPairPfDown) >= skinny_min_blocks(1, KS, RTG, 1), "down's shape fits");
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2;
  extern __shared__ __align__(128) float red[];  // K floats (the row's copy), then the K slices' sums
  uint16_t* xs = reinterpret_cast<uint16_t*>(red + KS * RTG * 4 * 32);
  const int xs_ld = C * 64 + 8;
  const int my_n = C > warp ? (C - 1 - warp) / KS + 1 : 0;
  __shared__ int s_unit0[kMaxGroups], s_expert[kMaxGroups], s_start[kMaxGroups], s_end[kMaxGroups];
  __shared__ float s_inv_rms[FOLD_CAP], s_w[kMaxTopK];
  __shared__ int s_tok[FOLD_CAP * kMaxTopK];

  // gate_up: routes from the fold's sums after its wait, its one row staged from xg.
  const int Tg = gu.W.N / 16, TB = Tg / RTG;
  scan_units_fold<FOLD_CAP>(gu, TB, s_unit0, s_expert, s_start, s_end, red, s_inv_rms, s_w, s_tok);
  const int slot = blockIdx.x / TB;  // (the launcher: gridDim.x = k * TB, one pair a slot)
  const Unit x{int(blockIdx.x - slot * TB) * RTG, s_expert[slot], s_start[slot], s_end[slot]};
  const int Td = dn.W.N / 16;
  const Unit y{int(blockIdx.x - slot * TB) * RTD, x.expert, x.tok0, x.tok_end};
  MxChunk wg[1][RTG];
  const uint4* wl = nullptr;
  const uint32_t* sl = nullptr;
  unit_load_first<KS, RTG, 1, C>(gu, Tg, x, my_n, wg, wl, sl);
  // SD: down's unit after gate_up's first loads, into shared memory past the staged row.
  unsigned char* staged = reinterpret_cast<unsigned char*>(xs) + ((size_t(xs_ld) * 2 + 15) / 16) * 16;
  const uint32_t bar = ptx::smem_u32(staged + kPairStagedW + kPairStagedS);
  if constexpr (SD) {
    if (threadIdx.x == 0) {
      ptx::mbar_init(bar, 1);
      ptx::mbar_init_fence();
      const size_t tc0 = (size_t(y.expert) * Td + y.tile0) * C;
      ptx::mbar_arrive_expect_tx(bar, uint32_t(kPairStagedW + kPairStagedS));
      ptx::bulk_copy_g2s(ptx::smem_u32(staged), static_cast<const unsigned char*>(dn.W.w) + tc0 * 512,
                         uint32_t(kPairStagedW), bar);
      ptx::bulk_copy_g2s(ptx::smem_u32(staged + kPairStagedW), static_cast<const unsigned char*>(dn.W.scales) + tc0 * 32,
                         uint32_t(kPairStagedS), bar);
    }
  }
  pdl_trigger();
  stage_row_fold(gu, red, s_inv_rms, xs, xs_ld);  // under the first weight loads
  if (warp < RTG) prefetch_tile_rows<FMT>(gu, x.expert, x.tile0 + warp, g);
  {
    const uint16_t* xs_lane = xs + size_t(g < 1 ? s_tok[x.tok0 + g] : 0) * xs_ld + 8 * (lane & 3);
    float acc[RTG][1][4] = {};
    unit_chunks<KS, RTG, 1, C>(wg, wl, sl, xs_lane, g < 1, my_n, acc);
    // down's first weights go out now (SD: they are on their way); gate_up's reduction and stores
    // run under them.
    MxChunk wd[kPairPfDown][RTD];
    if constexpr (!SD) unit_load_first<KS, RTD, kPairPfDown, C>(dn, Td, y, my_n, wd, wl, sl);
    finish_tiles<FMT, 1, KS, RTG>(gu, red, acc, RTG, x.tile0, x.expert, x.tok0, x.tok_end);
    // This unit's rows are out: count it for the slot's down units (the block's stores, a
    // barrier, one release).
    __syncthreads();
    if (threadIdx.x == 0) red_add_release_gpu(sync + slot, 1);
    if (warp < RTD) prefetch_tile_rows<FMT>(dn, y.expert, y.tile0 + warp, g);
    if (threadIdx.x == 0) {
      wait_count_acquire_gpu(sync + slot, TB, kPairWaitUs);
      if (atomicAdd(sync + kMaxTopK + slot, 1) == TB - 1) {  // the slot's last down block: reset
        sync[slot] = 0;
        sync[kMaxTopK + slot] = 0;
      }
    }
    __syncthreads();
    // The slot's act row, written by other blocks of this launch: through L2 (cp.async.cg), not L1.
    stage_rows<false, true>(dn, y.tok0, 1, xs, xs_ld);  // (gate_up's fp16 rows: no conversion)
    __syncthreads();
    float acc2[RTD][1][4] = {};
    const uint16_t* xs_lane2 = xs + size_t(g) * xs_ld + 8 * (lane & 3);
    if constexpr (SD) {
      ptx::mbar_wait_bounded(bar, 0, kPairWaitUs);
      unit_load_first<KS, RTD, kPairPfDown, C, WLoad::kStaged>(dn, Td, y, my_n, wd, wl, sl,
                                                               reinterpret_cast<const uint4*>(staged),
                                                               reinterpret_cast<const uint32_t*>(staged + kPairStagedW));
      unit_chunks<KS, RTD, kPairPfDown, C, WLoad::kStaged>(wd, wl, sl, xs_lane2, g < 1, my_n, acc2);
    } else {
      unit_chunks<KS, RTD, kPairPfDown, C>(wd, wl, sl, xs_lane2, g < 1, my_n, acc2);
    }
    if (dn.r.fold.moe_out)
      finish_tiles_moe_out<KS, RTD>(dn, red, acc2, y.tile0, y.expert, s_w[y.tok0]);
    else
      finish_tiles<FMT, 1, KS, RTD>(dn, red, acc2, RTD, y.tile0, y.expert, y.tok0, y.tok_end);
  }
}

// The pair kernel's launch (launch_experts_pair), or false where it does not take the problem:
// SD needs the bulk-copy engine (sm_90+), and every block resident at once.
template <bool SD>
bool launch_pair(const SkinnyArgs& gu, const SkinnyArgs& dn, int* sync, cudaStream_t s) {
  auto k = skinny_units_pair_kernel<SD>;
  const size_t smem = pair_smem_bytes(gu.W.K, SD);
  thread_local std::unordered_map<int, int> blocks_an_sm;  // by device; 0 where it cannot run
  int dev = 0;
  GPTOSS_CUDA_CHECK(cudaGetDevice(&dev));
  auto it = blocks_an_sm.find(dev);
  if (it == blocks_an_sm.end()) {
    int major = 0, b = 0;
    GPTOSS_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (!SD || major >= 9) {
      allow_dynamic_smem(k, smem);
      // SD's three blocks an SM need nearly all of it as shared memory.
      if (SD) GPTOSS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
      GPTOSS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, k, kPairKs * 32, smem));
    }
    it = blocks_an_sm.emplace(dev, b).first;
  }
  const int units = gu.r.fold.k * (gu.W.N / 16 / kPairRtGateUp);
  if (size_t(units) > size_t(sm_count()) * it->second) return false;  // not one wave: a wait could hold a slot forever
  launch_pdl(k, dim3(unsigned(units)), dim3(kPairKs * 32), smem, s, gu, dn, sync);
  return true;
}

}  // namespace

namespace skinny {

bool launch_experts_pair(const SkinnyArgs& gu, const SkinnyArgs& dn, bool stage_down, int* sync, cudaStream_t s) {
  const RouterFold& f = gu.r.fold;
  if (!sync || !f.acc || !f.gate_up || f.n != 1 || dn.r.fold.gate_up || f.k < 1 || f.k > kMaxTopK) return false;
  if (!gu.grouped || !dn.grouped || dn.gather_a || !skinny_cc_enabled() || gu.W.K != 2880 || dn.W.K != 2880)
    return false;
  // The same units an expert: gate_up's row tiles in fours, down's in twos.
  if (gu.W.N % (16 * kPairRtGateUp) != 0 || dn.W.N % (16 * kPairRtDown) != 0 ||
      gu.W.N / (16 * kPairRtGateUp) != dn.W.N / (16 * kPairRtDown))
    return false;
  if (!stage_down) return launch_pair<false>(gu, dn, sync, s);
  // The staged unit's bulk copies need 16-byte aligned sources (the fragment layout's offsets are).
  if (reinterpret_cast<uintptr_t>(dn.W.w) % 16 != 0 || reinterpret_cast<uintptr_t>(dn.W.scales) % 16 != 0) return false;
  return launch_pair<true>(gu, dn, sync, s);
}

}  // namespace skinny

}  // namespace gptoss::cuda
