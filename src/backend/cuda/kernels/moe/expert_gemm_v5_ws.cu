// Prefill expert GEMM version 5, warp-specialized (opt-in, GPTOSS_EXPERT_GEMM_V5_WS=1; Hopper,
// sm_90a only): the 128-pair, four-warpgroup tiles of expert_gemm_wgmma_wa.cu's mbarrier kernel
// with every copy moved out of the warps that decode and multiply.
//
// Why: Nsight Compute of that kernel (thirty-seventh session, docs/BENCHMARKS.md "Where version 5
// waits") counted ~240 warp instructions a warp a K step, issue slots ~50% busy, and ~60 of the
// 240 spent on copies: each lane's cp.async of its weight chunk and scale word, the owners'
// activation half-rows, their mbarrier arrivals and the spin loops of the waits for them.
//
// Here a fifth warpgroup produces (its four warps), and the 16 consumer warps only wait, read their 16 bytes and scale
// word, decode and issue wgmma:
// - the activation tile: one tensor copy (TMA) a pair row, 64 bf16 of K into its 128-byte row of
//   the stage, swizzled by the copy engine (128-byte swizzle, which follows the shared address, so
//   row r of a 1024-aligned tile lands where wgmma's descriptor looks: ptx::sw128_offset); the rows
//   are gathered by pair_token (gate_up) or taken in order (down). Only k-permuted activations (the
//   model's: permute_rows_frag_k, the k-permuted SwiGLU epilogue), as the mbarrier kernel takes;
// - the weights: one bulk copy of each tile's 512-byte chunk and one of its 32-byte scale sector;
// all of a step counted on the stage's "full" barrier (one arrival with the step's bytes). Each
// consumer warp arrives on the stage's "empty" barrier once its MMAs of the step are done; the
// producer waits for all 16 before it refills the stage. No block barrier after the start.
//
// Same sums as the mbarrier kernel bit for bit (the same decode, the same wgmma order per tile),
// so Kernels.MoeMxfp4ExpertGemmV5 checks it against the CPU with the same bounds.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "backend/cuda/bulk_copy_ptx.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/frag_layout.cuh"
#include "backend/cuda/kernels/moe/expert_gemm_common.cuh"
#include "backend/cuda/kernels/moe/expert_gemm_v5_device.cuh"
#include "backend/cuda/tensor_core_ptx.cuh"
#include "backend/cuda/wgmma_ptx.cuh"
#include "common/error.h"

namespace gptoss::cuda {

namespace {

using namespace moe_gemm;

// The CTA: four consumer warpgroups over 16 tiles of 16 weight rows (256 rows) x 128 sorted pairs,
// and a producer warpgroup; one CTA an SM. A stage: the activation tile, then the 16 tiles' code
// chunks, then their scale sectors, padded to 1 KB (the next tile's swizzle alignment).
template <bool kTma>
struct WsTile {
  static constexpr int kBN = 128;
  // A fifth warpgroup produces (its four warps copy; a fifth warpgroup, not a lone warp, because):
  // with 17 warps the fifth warp of an SM sub-partition would cap every warp at 96 registers
  // (16K a sub-partition / 5 warps), and the consumers' wgmmas were serialized for want of them.
  // The producer warpgroup lowers itself to kProducerRegs and the consumers rise to kConsumerRegs.
  // setmaxnreg moves registers within the CTA's own pool, the registers it was launched with
  // (kThreads x the kernel's count, at most kLaunchRegs = 96 at 640 threads), not the SM's: the
  // raises block until the pool holds them, so 128 x kProducerRegs + 512 x kConsumerRegs must fit
  // in 640 x 96 = 61,440, or the consumers wait forever. 112 each (ptxas: no spills, the wgmmas
  // not serialized; 104 serializes them). One A buffer a warp: a second (the next step's decode
  // beside this step's MMAs) does not fit; ptxas then serializes the wgmmas (tried at 120).
  // kTma false (GPTOSS_EXPERT_GEMM_V5_WS=2): the producer warp copies the activation rows with
  // cp.async instead (128 x 8 16-byte copies a step, the swizzle computed), in case the tensor
  // copies' per-row destinations do not serve; it takes 32 registers, the pool's remainder (the
  // thirty-ninth session gave it 40, which with the consumers' 112 overdrew the pool).
  static constexpr int kConsumerWarps = 16, kThreads = (kConsumerWarps + 4) * 32;
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = kTma ? 24 : 32, kConsumerRegs = 112;
  static constexpr int kPoolNeeded = 128 * kProducerRegs + 32 * kConsumerWarps * kConsumerRegs;
  static constexpr int kTiles = 16;
  static constexpr int kActBytes = kBN * 128;  // 128 rows x 64 bf16
  static constexpr int kWBytes = kTiles * 512;
  static constexpr int kSBytes = kTiles * 32;
  // What a step's full barrier counts: its bytes (tensor and bulk copies), and arrivals: the
  // producer lane 0's, plus (cp.async) each producer lane's once its copies have landed.
  static constexpr int kTxBytes = (kTma ? kActBytes : 0) + kWBytes + kSBytes;
  static constexpr int kFullArrivals = kTma ? 1 : 1 + 128;  // (cp.async: every producer lane's, once its copies land)
  static constexpr int kStageBytes = (kActBytes + kWBytes + kSBytes + 1023) / 1024 * 1024;
  static constexpr int kStages = 8;
  static constexpr int kBarBytes = 2 * kStages * 8;
  static constexpr int kTokBytes = kTma ? 0 : kBN * 4;  // cp.async: the tile's token rows, after the barriers
  static constexpr size_t kSmem = size_t(kStages) * kStageBytes + 1024 + kBarBytes + kTokBytes;
  static_assert(kTiles == 4 * kWaTilesWg && kSmem <= 227 * 1024, "four warpgroups; one CTA an SM");
  static_assert(kPoolNeeded <= kThreads * kLaunchRegs, "the CTA's register pool (setmaxnreg.inc would block)");
  static_assert(kTxBytes % 16 == 0, "the copies' bytes");
};

template <bool kTma>
__global__ void __launch_bounds__(WsTile<kTma>::kThreads, 1)
    expert_gemm_ws_kernel(const __grid_constant__ CUtensorMap act, const ExpertGemmArgs a) {
#ifdef SM90A_WGMMA
  using L = WsTile<kTma>;
  constexpr int BN = L::kBN;
  constexpr unsigned S = L::kStages;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2;
  const bool producer = warp >= L::kConsumerWarps;
  pdl_begin();  // (never a split tiling's remainder launch: those tiles are narrower than 128 pairs)
  int grp, within;
  find_row_tile<BN>(a.r, int(blockIdx.y), lane, grp, within, a.tile_rem_max, a.tile_bulk);
  if (grp < 0) return;  // uniform over the CTA
  const auto [expert, row0, row_end] = row_tile_rows<BN>(a.r, grp, within, a.tile_bulk);
  const int T = a.N / 16, C = a.K / 64;
  uint8_t* smem = wa_align1024(smem_raw);
  const uint32_t s_base = ptx::smem_addr(smem);
  // Stage s's full barrier at bar_base + 8 s (the producer's one arrival and the step's bytes), its
  // empty barrier at bar_base + 8 (S + s) (an arrival a consumer warp).
  const uint32_t bar_base = s_base + S * uint32_t(L::kStageBytes);
  auto full_bar = [&](int kt) { return bar_base + 8u * (unsigned(kt) % S); };
  auto empty_bar = [&](int kt) { return bar_base + 8u * (S + unsigned(kt) % S); };
  auto stage_off = [&](int kt) { return (unsigned(kt) % S) * uint32_t(L::kStageBytes); };
  // The parity of the phase in which step kt's use of its stage completes (the (kt / S)-th).
  auto use_parity = [&](int kt) { return (unsigned(kt) / S) & 1u; };
  // Every wait gives up after 20 s (a launch error, not a hung process: this kernel has yet to run
  // on a GPU; a step's wait takes microseconds, under compute-sanitizer milliseconds).
  auto wait = [](uint32_t bar, uint32_t parity) { ptx::mbar_wait_bounded(bar, parity, 20'000'000u); };
  if (tid == 0) {
    for (unsigned st = 0; st < S; ++st) {
      ptx::mbar_init(full_bar(int(st)), L::kFullArrivals);
      ptx::mbar_init(empty_bar(int(st)), L::kConsumerWarps);
    }
    ptx::mbar_init_fence();
  }
  // This warp's weight tile (a warpgroup past the last tile, N % 256 == 64, runs on tile 0's weights
  // and stores nothing, as in expert_gemm_wa_kernel; T % 4 == 0, so a tile is live with its warpgroup).
  const int tile = int(blockIdx.x) * L::kTiles + (producer ? 0 : warp);
  const bool live = tile < T;
  const size_t tc0 = (size_t(expert) * T + (live ? tile : 0)) * C;
  // One bf16 factor a register for the whole CTA where every scale of its tiles allows it; the
  // block barrier also publishes the initialised mbarriers.
  bool one = producer || wa_tile_takes_one_factor(a.scales, tc0, C, lane);
  one = __syncthreads_and(one) != 0;

  if (producer) {
    ptx::setmaxnreg_dec<L::kProducerRegs>();
    // The producer warpgroup's four warps copy (one warp alone measured 3.2-4.7x slower than the
    // mbarrier kernel: 128 tensor copies, or 1,024 cp.async, a step from one warp do not keep up
    // with the wgmmas; fortieth session). Warp pw copies pair rows 32 pw .. 32 pw + 31 of the
    // tile, warp 0 also the weights. A pair past the tile's end copies row0's row (its bytes must
    // arrive all the same; its columns are never stored). cp.async: the rows' tokens in shared
    // memory (-1 past the end: a zero-filled copy), lane l copying 16-byte chunk l % 8 of rows
    // 32 pw + l / 8 + 4 i.
    const int pw = warp - L::kConsumerWarps;
    int* s_tok = reinterpret_cast<int*>(smem + S * L::kStageBytes + L::kBarBytes);
    const int my_row = 32 * pw + lane;
    int arow = 0;
    {
      const int p = row0 + my_row, pp = p < row_end ? p : row0;
      const int tok = a.gather_a ? a.r.pair_token[pp] : pp;
      if constexpr (kTma)
        arow = tok;
      else
        s_tok[my_row] = p < row_end ? tok : -1;
    }
    __syncwarp();
    // Warp 0, lanes 0-15: tile l's 512-byte code chunk of the step; lanes 16-31: tile l - 16's scale sector.
    const bool codes = lane < 16;
    const int pt = int(blockIdx.x) * L::kTiles + (lane & 15);
    const size_t ptc = (size_t(expert) * T + (pt < T ? pt : 0)) * C;
    const uint8_t* src = codes ? a.w + ptc * 512 : a.scales + ptc * 32;
    const uint32_t bytes = codes ? 512u : 32u;
    const uint32_t dst = uint32_t(L::kActBytes) +
                         (codes ? uint32_t(lane) * 512u : uint32_t(L::kWBytes) + uint32_t(lane - 16) * 32u);
    if (kTma && lane == 0) ptx::prefetch_tensormap(&act);
    const int cc = lane & 7, rr = 32 * pw + (lane >> 3);  // (cp.async: this lane's chunk and first row)
    for (int kt = 0; kt < C; ++kt) {
      // The stage's last use (step kt - S) done in every consumer warp.
      if (kt >= int(S)) wait(empty_bar(kt), use_parity(kt) ^ 1u);
      const uint32_t st = s_base + stage_off(kt);
      // (The step's bytes are announced once; copies of the other warps may land before it: a
      // phase's transaction count may go below zero, and the phase waits for this arrival.)
      if (pw == 0 && lane == 0) ptx::mbar_arrive_expect_tx(full_bar(kt), uint32_t(L::kTxBytes));
      if constexpr (kTma) {
        ptx::tma_load_2d(st + uint32_t(my_row) * 128u, &act, kt * 64, arow, full_bar(kt));
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int r = rr + 4 * i, tok = s_tok[r];
          const uint16_t* src_row = a.A + size_t(tok >= 0 ? tok : 0) * a.lda + kt * 64 + cc * 8;
          ptx::cp_async16(st + uint32_t(r) * 128u + (uint32_t((cc ^ r) & 7) << 4), src_row, tok >= 0);
        }
        ptx::cp_async_mbar_arrive_noinc(full_bar(kt));
        ptx::cp_async_commit();
      }
      if (pw == 0) ptx::bulk_copy_g2s(st + dst, src + size_t(kt) * bytes, bytes, full_bar(kt));
    }
    return;
  }

  ptx::setmaxnreg_inc<L::kConsumerRegs>();
  // The epilogue's rows and biases, loaded now.
  const int n_g = frag::tile_row(tile, g, a.swiglu_rows), n_g8 = frag::tile_row(tile, g + 8, a.swiglu_rows);
  const float b_g = a.bias && live ? __ldg(a.bias + size_t(expert) * a.N + n_g) : 0.f;
  const float b_g8 = a.bias && live ? __ldg(a.bias + size_t(expert) * a.N + n_g8) : 0.f;
  // This lane's 16 bytes of its warp's chunk and its scale word (row g's and g + 8's blocks) in a stage.
  const uint32_t w_off = uint32_t(L::kActBytes) + uint32_t(warp) * 512u + uint32_t(lane) * 16u;
  const uint32_t s_off = uint32_t(L::kActBytes + L::kWBytes) + uint32_t(warp) * 32u + uint32_t(g) * 4u;
  auto read_weights = [&](int kt, uint4& q, uint32_t& fs) {
    const uint8_t* st = smem + stage_off(kt);
    q = *reinterpret_cast<const uint4*>(st + w_off);
    fs = *reinterpret_cast<const uint32_t*>(st + s_off);
  };
  // wgmma's B descriptor of stage 0 (a stage or k16 slice further: its byte offset / 16 added).
  const uint64_t desc0 = ptx::sw128_desc(s_base);
  constexpr int kAcc = BN / 2;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
  uint4 q;
  uint32_t fs;
  // cp.async's rows are ordinary shared-memory writes: to the async proxy wgmma reads through.
  // The first step's wait has the deadline (every step counts the same bytes, so a miscount shows
  // there); the loop's waits cannot: any bound beside the in-flight wgmmas, even a try counter,
  // takes registers ptxas then finds only by serializing the wgmmas.
  auto wait_full = [&](int kt) {
    if (kt == 0)
      wait(full_bar(kt), use_parity(kt));
    else
      ptx::mbar_wait(full_bar(kt), use_parity(kt));
    if constexpr (!kTma) ptx::fence_proxy_async();
  };
  wait_full(0);
  read_weights(0, q, fs);
  uint32_t A[16];
  for (int kt = 0; kt < C; ++kt) {
    if (one)  // CTA-uniform
      wa_decode<true>(q, fs, A);
    else
      wa_decode<false>(q, fs, A);
    const uint64_t desc = desc0 + (stage_off(kt) >> 4);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) ptx::fence_operand(acc[i]);
    ptx::wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) ptx::wgmma_bf16_ra<BN>(acc, &A[4 * j], desc + 2 * j, 1);
    ptx::wgmma_commit();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) ptx::fence_operand(acc[i]);
    // The next step's weights while this step's MMAs run.
    if (kt + 1 < C) {
      wait_full(kt + 1);
      read_weights(kt + 1, q, fs);
    }
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) ptx::fence_operand(acc[i]);
    if (lane == 0) ptx::mbar_arrive(empty_bar(kt));  // this warp is done with stage kt
  }
  if (!live) return;
  wa_epilogue<BN>(a, acc, tile, lane, row0, row_end, n_g, n_g8, b_g, b_g8);
#else
  __trap();  // launched only where expert_gemm_v3_available() (sm_90a code on a 9.0 device)
#endif
}

// cuTensorMapEncodeTiled from the driver the runtime runs on (no link to libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !f)
      throw Error("expert_gemm_v5 (warp-specialized): the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A's rows (rows x K bf16, lda apart) as the kernel's tensor copies read them: a box of one row x
// 64 columns, 128-byte swizzle.
CUtensorMap activation_map(const uint16_t* A, int lda, int K, int rows) {
  CUtensorMap m{};
  const cuuint64_t dims[2] = {cuuint64_t(K), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(lda) * 2};
  const cuuint32_t box[2] = {64, 1}, elem[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(A), dims,
                                          strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error("expert_gemm_v5 (warp-specialized): cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ")");
  return m;
}

// The registers the kernel is launched with (the CTA's setmaxnreg pool) must hold what its
// warpgroups raise themselves to: a build whose ptxas gave the kernel fewer than WsTile assumes
// would hang at the consumers' setmaxnreg.inc, so it is refused here, once a mode.
template <bool kTma>
void check_register_pool() {
  static const int regs = [] {
    cudaFuncAttributes fa{};
    GPTOSS_CUDA_CHECK(cudaFuncGetAttributes(&fa, expert_gemm_ws_kernel<kTma>));
    return fa.numRegs;
  }();
  using L = WsTile<kTma>;
  if (regs * L::kThreads < L::kPoolNeeded)
    throw Error("expert_gemm_v5 (warp-specialized): the kernel was built with " + std::to_string(regs) +
                " registers a thread; its warpgroups need " + std::to_string(L::kPoolNeeded) + " in all, " +
                std::to_string(L::kThreads) + " threads launched");
}

}  // namespace

namespace moe_gemm {

void launch_expert_gemm_v5_ws(const ExpertGemmArgs& a, int a_rows, int pairs, int E, bool tma, cudaStream_t s) {
  if (!a.a_k_permuted) throw Error("expert_gemm_v5 (warp-specialized): k-permuted activations only");
  if (a_rows <= 0) throw Error("expert_gemm_v5 (warp-specialized): the activations' row count is needed");
  if (a.tile_bulk > 0) throw Error("expert_gemm_v5 (warp-specialized): 128-pair tiles only, never a remainder launch");
  constexpr int BN = WsTile<true>::kBN, kTiles = WsTile<true>::kTiles;
  static std::atomic<uint64_t> attr_set{0};
  opt_in_smem_once_per_device(attr_set, std::max(WsTile<true>::kSmem, WsTile<false>::kSmem), expert_gemm_ws_kernel<true>,
                              expert_gemm_ws_kernel<false>);
  const int max_tiles = (pairs + BN - 1) / BN + std::min(pairs, E);
  if (max_tiles > 65535) throw Error("expert_gemm_v5: too many row tiles (" + std::to_string(max_tiles) + ")");
  const int T = a.N / 16;
  const dim3 grid((T + kTiles - 1) / kTiles, max_tiles);
  if (tma) {
    check_register_pool<true>();
    const CUtensorMap m = activation_map(a.A, a.lda, a.K, a_rows);
    launch_pdl(expert_gemm_ws_kernel<true>, grid, dim3(WsTile<true>::kThreads), WsTile<true>::kSmem, s, m, a);
  } else {
    check_register_pool<false>();
    const CUtensorMap none{};  // (unused)
    launch_pdl(expert_gemm_ws_kernel<false>, grid, dim3(WsTile<false>::kThreads), WsTile<false>::kSmem, s, none, a);
  }
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace moe_gemm

}  // namespace gptoss::cuda
