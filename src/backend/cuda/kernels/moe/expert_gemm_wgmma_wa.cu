// Grouped MoE expert GEMM for prefill, version 5: MXFP4 weights as wgmma's A operand, decoded
// straight into registers; bf16 activations as B from shared memory (Hopper, sm_90a only).
//
// Why: version 3 (expert_gemm_wgmma.cu) puts the tokens on wgmma's M side, so the weights must be
// B, which wgmma reads only from shared memory: every K step its threads decode the e2m1 codes,
// store the bf16 tile, fence the async proxy and meet at a barrier before the tensor cores may
// read it (Nsight Compute, 120b gate_up at 2048 tokens: 46% of issue slots busy, the top stalls in
// that decode and its fences; 2.08 ms a layer against issue 11's 1.5). wgmma takes A from
// registers, and the fragment layout (frag_layout.cuh) already holds each lane's A registers of
// a 16-row tile: a warp loads its tile's 512-byte chunk a K step (one 16-byte load a lane, plus
// its scale word), decodes it exactly to bf16 (value x 2^(scale - 127), v3's decode) and issues
// the MMAs. No weight tile passes through shared memory.
//
// The catch is the K order. The fragment layout permutes K inside each 64-wide chunk (k-step j
// of lane quad tq holds natural K 32 (j / 2) + 8 tq + 4 (j % 2) + [0, 4)), and mma.sync's decode
// kernels read the activations in that order from registers; wgmma reads B from shared memory in
// stored order. So the activation rows are stored permuted: stored k16 slice j, position 2 q + e
// holds natural K 32 (j / 2) + 8 (q % 4) + 4 (j % 2) + 2 (q / 4) + e. In 4-byte pairs that is a
// 4 x 4 transpose inside each 64-byte half of a 128-byte row (natural 16-byte chunk c of half h,
// pair m -> stored chunk 4 h + m, pair c % 4), which maps the half's four swizzled 16-byte slots
// onto themselves: the thread that copied a half (cp.async, natural order) reads its four chunks
// back and writes them transposed in place, moving words between registers and nothing else.
//
// CTA: 2 or 4 warpgroups over 128 or 256 weight rows (8 or 16 tiles; warp w of warpgroup wg owns
// tile 4 WGS x + 4 wg + w) x BN sorted pairs of one expert (wgmma N: 32, 48, 64, 80, 96 or 128, chosen per launch by
// expert_gemm_v5_auto_tile_pairs), sharing the activation tile; K in steps of 64 (one chunk a
// warp). Per step: 4 wgmma m64nBNk16, A from registers. Every step's weights (each lane its own 16
// bytes and scale word) and activations (pair rows gathered by pair_token, each half-row copied by
// one thread) travel in one cp.async group issued kLead steps ahead into a ring of stages (WaTile:
// 8 x 13 KB at 64 pairs down to 4 x 21 KB at 128 with 2 CTAs an SM; with four warpgroups one CTA an
// SM, 8 stages of 18-26 KB), so a step waits on DRAM or L2
// once, not every step. Activations arrive in the fragment K order when their producer stored them
// so (a_k_permuted: permute_rows_frag_k for gate_up's input, a k_permuted SwiGLU epilogue for
// down's); otherwise the thread that copied a half-row transposes it in place one step ahead.
// Epilogue from the accumulators: rows are weight rows (gate g / up g + 8 of a tile for SwiGLU),
// columns sorted pairs.
//
// Where it stands (H200, fourteenth session; docs/BENCHMARKS.md): still issue-bound (~200 warp
// instructions a warp a K step, a third of them the e2m1 decode), so the tile width matters most:
// each tile decodes its CTA's weights once, and at 120b's 64 pairs an expert (2048 tokens) 64-pair
// tiles decoded ~1.5 times a weight, 80-pair tiles ~1.0. 120b gate_up + down at 2048 tokens:
// 1762 us (64 pairs, transposed here) -> 1401 (80 pairs, k-permuted); 20b 1362 -> 1120 (96).
// Four warpgroups a CTA (twenty-fourth session; the default for 64-pair tiles and up in launches
// of 8192 pairs and up, expert_gemm_v5_chosen_warpgroups): every
// activation row a tile gathers is read from L2 by half as many CTAs (at 120b's gate_up a tile's
// 45 CTAs of 128 rows read ~2.8x the bytes of its weights), and the dense CTA keeps 16 warps an
// SM: 120b at 8192 tokens 4864 -> 4554 us, 20b 4647 -> 4037.
// The mbarrier hand-off (twenty-fifth session; kMbar below, 128-pair tiles with four warpgroups,
// GPTOSS_EXPERT_GEMM_V5_MBAR): Nsight Compute of the four-warpgroup kernel (120b gate_up, 80
// pairs) found the warps in lockstep: 10% of the stall samples at the block barrier before the
// first wgmma, the ALU-heavy decode of every warp at once (math-pipe throttle 13%, not selected
// 14%), 1.05 eligible warps a scheduler. Without the barrier, at 128 pairs, 120b at 8192 tokens
// 4657 -> 4363 us and the model's pp4096 +7.7%; at 32-96 pairs it lost.

#include <algorithm>
#include <atomic>
#include <string>

#include "backend/cuda/bulk_copy_ptx.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/frag_layout.cuh"
#include "backend/cuda/kernels/moe/expert_gemm_v5.h"
#include "backend/cuda/kernels/moe/expert_gemm_common.cuh"
#include "backend/cuda/kernels/moe/expert_gemm_v5_device.cuh"
#include "backend/cuda/tensor_core_ptx.cuh"
#include "backend/cuda/wgmma_ptx.cuh"

namespace gptoss::cuda {

namespace {

using namespace moe_gemm;
using ptx::sw128_offset;

// One 64-byte half of a 128-byte activation row (four 16-byte chunks in natural order) -> the
// same half in the fragment K order: a 4 x 4 transpose of its 4-byte pairs (see the head).
__device__ __forceinline__ void wa_transpose_half(const uint4 (&in)[4], uint4 (&out)[4]) {
  out[0] = make_uint4(in[0].x, in[1].x, in[2].x, in[3].x);
  out[1] = make_uint4(in[0].y, in[1].y, in[2].y, in[3].y);
  out[2] = make_uint4(in[0].z, in[1].z, in[2].z, in[3].z);
  out[3] = make_uint4(in[0].w, in[1].w, in[2].w, in[3].w);
}

// The CTA shape of BN sorted pairs a tile (wgmma N = 32, 48, 64, 80, 96 or 128). An expert's pairs come
// in tiles of BN, and every tile decodes all of the CTA's weights, so the width sets how often a
// weight is decoded: 120b at 2048 tokens averages 64 pairs an expert (random routing: about half
// the experts have 65-90), where 64-pair tiles decode ~1.5 times a weight and 80-pair tiles ~1.0.
//
// WGS warpgroups a CTA share one activation tile: 2 (128 weight rows, two CTAs an SM) or 4 (256
// rows, one CTA an SM: the same 16 warps an SM, each activation row read from L2 half as often).
template <int BN, int WGS = 2>
struct WaTile {
  static constexpr int kThreads = 128 * WGS;
  static constexpr int kTiles = kWaTilesWg * WGS;  // 16-row weight tiles a CTA
  static constexpr int kCtasPerSm = WGS == 2 ? 2 : 1;
  static constexpr int kWBytes = kTiles * 32 * 16;  // a stage's weights: a 512-byte chunk a warp
  static constexpr int kSBytes = kTiles * 32 * 4;   // its scales: a word a lane
  // 32-96: A double-buffered (the decode of step kt + 1 overlaps step kt's MMAs; 126 registers at
  // 96, no spills); 128: the accumulators leave room for one A buffer (a warpgroup decodes after
  // its MMAs, the other warpgroup's MMAs fill the gap).
  static constexpr int kABufs = BN <= 96 ? 2 : 1;
  static constexpr int kActBytes = BN * 128;  // a stage's activations: BN rows x 64 bf16
  static constexpr int kStageBytes = kActBytes + kWBytes + kSBytes;
  // Stages: two CTAs an SM, as measured (s14r1); one CTA an SM, as many as fit (at most 8).
  static constexpr int kBarBytes = 2 * 8 * 8;  // the mbarrier hand-off's full and empty barriers a stage
  static constexpr int kStages = WGS == 2 ? (BN <= 64 ? 8 : BN == 80 ? 7 : BN == 96 ? 6 : 4)
                                          : std::min(8, (227 * 1024 - 1024 - kBarBytes) / kStageBytes);
  static constexpr int kLead = kStages - 2;  // a stage is rewritten two steps after its last reader
  // The stages from a 1024-byte boundary (the 128-byte swizzle's), then the barriers.
  static constexpr size_t kSmem = size_t(kStages) * kStageBytes + 1024 + kBarBytes;
  // Half-rows a step: 2 BN. Two warpgroups at 64 pairs: they take alternate steps' copies (128
  // threads, one half-row each); otherwise every thread every step, those past 2 BN none.
  static constexpr bool kAlternate = WGS == 2 && 2 * BN == kThreads / 2;
  static_assert(WGS == 2 || WGS == 4, "two or four warpgroups");
  static_assert(2 * BN <= kThreads && kStageBytes % 1024 == 0, "a half-row a thread; aligned tiles");
  static_assert(kCtasPerSm * kSmem <= 227 * 1024, "the CTAs an SM fit");
};

// kMbar: how step kt's activations reach every warpgroup. false: each owner waits for its own
// copies, transposes them if they came in natural order, and the CTA meets at a block barrier
// every step. true (activations already in the fragment K order only): each owner's copies of a
// step arrive on the stage's "full" mbarrier as they land (cp.async.mbarrier.arrive.noinc), each
// warp arrives on its "empty" mbarrier once its MMAs of the step are done, and an owner waits for
// "empty" before it refills the stage; so no warp waits for another at a block barrier, and the
// warpgroups may drift apart by up to two steps (one decoding while another's MMAs run, as two
// CTAs an SM do), instead of all decoding, then all waiting at the barrier, in lockstep.
template <int BN, int WGS, bool kMbar>
__global__ void __launch_bounds__(WaTile<BN, WGS>::kThreads, WaTile<BN, WGS>::kCtasPerSm)
    expert_gemm_wa_kernel(ExpertGemmArgs a) {
#ifdef SM90A_WGMMA
  using L = WaTile<BN, WGS>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2;
  const int wg = tid >> 7, wtid = tid & 127;
  // The remainder launch of a split tiling (a.tile_bulk > 0) reads only what the bulk launch just
  // before it reads, and writes other rows; this grid launches only once every bulk block has
  // passed its own wait. So it starts at once, filling the SMs the bulk launch's last wave leaves
  // idle, and thread 0 of each block waits for the bulk launch as the block exits: this grid's
  // completion, which the next kernel waits for, still implies the bulk launch's.
  struct WaitAtExit {
    bool on;
    __device__ ~WaitAtExit() {
      if (on) pdl_wait();
    }
  } wait_at_exit{a.tile_bulk > 0 && tid == 0};
  if (a.tile_bulk > 0)
    pdl_trigger();
  else
    pdl_begin();
  int grp, within;
  find_row_tile<BN>(a.r, int(blockIdx.y), lane, grp, within, a.tile_rem_max, a.tile_bulk);
  if (grp < 0) return;
  const auto [expert, row0, row_end] = row_tile_rows<BN>(a.r, grp, within, a.tile_bulk);
  const int T = a.N / 16, C = a.K / 64;
  const int tile = int(blockIdx.x) * L::kTiles + warp;  // this warp's weight tile (T % 4 == 0)
  const bool wg_live = int(blockIdx.x) * L::kTiles + kWaTilesWg * wg < T;
  uint8_t* smem = wa_align1024(smem_raw);
  const uint32_t s_base = ptx::smem_addr(smem);
  // kMbar: stage s's full barrier (its activations landed: 2 BN owner arrivals) at bar_base + 8 s,
  // its empty barrier (every warp's MMAs of it done: one arrival a warp) at bar_base + 8 (kStages + s).
  const uint32_t bar_base = s_base + uint32_t(L::kStages * L::kStageBytes);
  auto full_bar = [&](int kt) { return bar_base + 8u * (unsigned(kt) % unsigned(L::kStages)); };
  auto empty_bar = [&](int kt) { return bar_base + 8u * (L::kStages + unsigned(kt) % unsigned(L::kStages)); };
  // The parity of the phase in which step kt's use of its stage completes (the (kt / kStages)-th).
  auto use_parity = [&](int kt) { return (unsigned(kt) / unsigned(L::kStages)) & 1u; };
  if constexpr (kMbar) {
    if (tid == 0) {
      for (int st = 0; st < L::kStages; ++st) {
        ptx::mbar_init(full_bar(st), 2 * BN);
        ptx::mbar_init(empty_bar(st), 4 * WGS);
      }
      ptx::mbar_init_fence();
    }
    __syncthreads();
  }

  // Step kt's stage: activations (swizzled BN x 128 B), then this CTA's weight chunks (warp w's
  // 512 bytes at w x 512, lane order) and scale words (lane l of warp w at (32 w + l) x 4).
  auto stage_off = [&](int kt) { return uint32_t(unsigned(kt) % unsigned(L::kStages)) * L::kStageBytes; };
  // Activations: thread t (64 pairs: thread wtid of the warpgroup that owns step kt, kt % 2) copies
  // half h = t % 2 of row t / 2, in natural order.
  const int a_t = L::kAlternate ? wtid : tid;
  const int a_row = a_t >> 1, a_half = a_t & 1;
  const bool a_live = a_row < BN;  // (threads past 2 BN half-rows copy nothing: 80 and 96 pairs)
  auto owns = [&](int kt) { return a_live && (!L::kAlternate || (kt & 1) == wg); };
  const int a_pair = row0 + a_row;
  const bool a_ok = a_pair < row_end;
  // The half-row's four 16-byte chunks: their swizzled slots differ only in bits 4-5 (chunk m of
  // the half at slot (4 a_half + m) ^ row), so each is the first one's offset XOR 16 m, which
  // costs one instruction where the compiler recomputes it instead of holding four registers.
  const uint32_t a_dst0 = sw128_offset(a_row, 32 * a_half);
  auto a_dst = [&](int m) { return a_dst0 ^ uint32_t(m << 4); };
  // Weights: this lane's 16 bytes and scale word of chunk kt of its tile. A warpgroup past the
  // last tile (N % 128 == 64) runs on tile 0's weights and stores nothing: every warp issues the
  // same wgmmas (a branch around them made ptxas serialise them).
  const size_t tc0 = (size_t(expert) * T + (wg_live ? tile : 0)) * C;
  const uint32_t w_dst = L::kActBytes + uint32_t(warp * 32 + lane) * 16;
  const uint32_t s_dst = L::kActBytes + L::kWBytes + uint32_t(warp * 32 + lane) * 4;

  // One cp.async group a step, every thread (empty past the last step), steps in order from 0:
  // step kt's weights (each lane its own bytes, so its own wait makes them readable) and
  // activations (owner warpgroup). Running source pointers, advanced before their copies (a
  // pointer register rewritten right after the copy that reads it waits for that copy's issue:
  // Nsight Compute counted those waits), so no 64-bit index math a step.
  int kt_cp = -1;
  const uint8_t* w_cp = a.w + (tc0 * 32 + lane) * 16 - 512;
  const uint8_t* s_cp = a.scales + (tc0 * 8 + g) * 4 - 32;
  const uint16_t* a_cp = a.A + size_t(a_ok ? (a.gather_a ? a.r.pair_token[a_pair] : a_pair) : 0) * a.lda + 32 * a_half - 64;
  auto copy_next = [&]() {
    ++kt_cp;
    w_cp += 512;
    s_cp += 32;
    a_cp += 64;
    if (kt_cp < C) {
      const uint32_t d = s_base + stage_off(kt_cp);
      ptx::cp_async16(d + w_dst, w_cp, true);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d + s_dst), "l"(s_cp));
      if (owns(kt_cp)) {
        // The stage's last use (step kt_cp - kStages) must be done in every warp before it is
        // rewritten: the block barrier of step kt_cp - kLead said so; with kMbar, its empty barrier.
        if constexpr (kMbar)
          if (kt_cp >= L::kStages) ptx::mbar_wait(empty_bar(kt_cp), use_parity(kt_cp) ^ 1u);
#pragma unroll
        for (int m = 0; m < 4; ++m) ptx::cp_async16(d + a_dst(m), a_cp + 8 * m, a_ok);
        if constexpr (kMbar) ptx::cp_async_mbar_arrive_noinc(full_bar(kt_cp));
      }
    }
    ptx::cp_async_commit();
  };
  // The owner's half-row of step kt, transposed in place into the fragment K order (see the head).
  auto permute_act = [&](int kt) {
    if (!kMbar && kt < C && owns(kt) && !a.a_k_permuted) {  // (k-permuted rows arrive in that order)
      uint8_t* d = smem + stage_off(kt);
      uint4 in[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) in[m] = *reinterpret_cast<const uint4*>(d + a_dst(m));
      uint4 out[4];
      wa_transpose_half(in, out);
#pragma unroll
      for (int m = 0; m < 4; ++m) *reinterpret_cast<uint4*>(d + a_dst(m)) = out[m];
    }
  };
  // This lane's weight chunk and scale word of step kt (landed: its own copies).
  auto read_weights = [&](int kt, uint4& q, uint32_t& fs) {
    const uint8_t* st = smem + stage_off(kt);
    q = *reinterpret_cast<const uint4*>(st + w_dst);
    fs = *reinterpret_cast<const uint32_t*>(st + s_dst);
  };
  // wgmma's B descriptor of stage 0; a stage or k16 slice further is its byte offset / 16 added to
  // the start-address field (every shared address here is below 2^18, so the field never carries).
  const uint64_t desc0 = ptx::sw128_desc(s_base);

  // The epilogue's rows and biases, loaded now (in the epilogue their latency stood alone).
  const int n_g = frag::tile_row(tile, g, a.swiglu_rows), n_g8 = frag::tile_row(tile, g + 8, a.swiglu_rows);
  const float b_g = a.bias && wg_live ? __ldg(a.bias + size_t(expert) * a.N + n_g) : 0.f;
  const float b_g8 = a.bias && wg_live ? __ldg(a.bias + size_t(expert) * a.N + n_g8) : 0.f;

  // Prologue: steps 0 .. kLead - 1 in flight; step 0's activations transposed, its weights read.
#pragma unroll
  for (int kt = 0; kt < L::kLead; ++kt) copy_next();
  // One factor a register for the whole CTA when every scale of its tiles allows it (the
  // warpgroups' wgmmas need one code path); read once here, while the first copies fly, instead
  // of tested every step.
  bool one = wa_tile_takes_one_factor(a.scales, tc0, C, lane);
  one = __syncthreads_and(one) != 0;
  ptx::cp_async_wait<L::kLead - 1>();
  permute_act(0);
  if (!kMbar && owns(0)) ptx::fence_proxy_async();  // before step 0's barrier (the loop fences steps 1 on)
  // Weights of steps of either parity (the step loop is unrolled by two, so these stay registers
  // with no copies between steps).
  uint4 qw[2];
  uint32_t fw[2];
  read_weights(0, qw[0], fw[0]);

  constexpr int kAcc = BN / 2;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;

  {
    uint32_t A[L::kABufs][16];
    for (int kt0 = 0; kt0 < C; kt0 += 2) {
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int kt = kt0 + v;
        if (kt < C) {  // uniform over the CTA
          // This thread's copies of steps kt and kt + 1 have landed (kt + 2 .. kt + kLead - 1 may not).
          ptx::cp_async_wait<L::kLead - 2>();
          // Step kt's weights were read a step ago (kt % 2 == v); step kt + 1's are read now, their
          // shared-memory latency hidden behind this step's decode.
          if (kt + 1 < C) read_weights(kt + 1, qw[v ^ 1], fw[v ^ 1]);
          permute_act(kt + 1);
          // Decode step kt into A buffer v % kABufs (last read by step kt - kABufs's MMAs, waited for below).
          uint32_t (&Av)[16] = A[v % L::kABufs];
          if (one)  // CTA-uniform
            wa_decode<true>(qw[v], fw[v], Av);
          else
            wa_decode<false>(qw[v], fw[v], Av);
          if constexpr (kMbar) {
            // Step kt's activations landed (every owner's copies), then to the async proxy that
            // wgmma reads shared memory through.
            ptx::mbar_wait(full_bar(kt), use_parity(kt));
            ptx::fence_proxy_async();
          } else {
            // Step kt + 1's activations, transposed just now by their owners, to the async proxy
            // before the barrier (only owners stored: the others skip the fence and its wait on
            // their memory operations in flight); step kt's -> the tensor cores.
            if (owns(kt + 1)) ptx::fence_proxy_async();
            __syncthreads();
          }
          const uint64_t desc = desc0 + (stage_off(kt) >> 4);
#pragma unroll
          for (int i = 0; i < kAcc; ++i) ptx::fence_operand(acc[i]);
          ptx::wgmma_fence();
#pragma unroll
          for (int j = 0; j < 4; ++j) ptx::wgmma_bf16_ra<BN>(acc, &Av[4 * j], desc + 2 * j, 1);
          ptx::wgmma_commit();
#pragma unroll
          for (int i = 0; i < kAcc; ++i) ptx::fence_operand(acc[i]);
          // Step kt + kLead's stage, (kt - 2) % kStages: last read by step kt - 2 (its MMAs, which
          // every warp waited for before this step's barrier, or which the empty barrier counts;
          // its weights, read by this lane at step kt - 3).
          copy_next();
          ptx::wgmma_wait<L::kABufs - 1>();
#pragma unroll
          for (int i = 0; i < kAcc; ++i) ptx::fence_operand(acc[i]);
          // kMbar: this warp's MMAs of step kt - (kABufs - 1) are done: its stage may be refilled.
          if constexpr (kMbar)
            if (lane == 0 && kt >= L::kABufs - 1) ptx::mbar_arrive(empty_bar(kt - (L::kABufs - 1)));
        }
      }
    }
  }
  ptx::wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < kAcc; ++i) ptx::fence_operand(acc[i]);
  ptx::cp_async_wait<0>();
  if (!wg_live) return;

  wa_epilogue<BN>(a, acc, tile, lane, row0, row_end, n_g, n_g8, b_g, b_g8);
#else
  __trap();  // launched only where expert_gemm_v3_available() (sm_90a code on a 9.0 device)
#endif
}

}  // namespace

bool expert_gemm_v5_supports(const WeightMat& W, const void* A, int lda, int a_rows, const Epilogue& epi) {
  // Fragment layout only (the A registers come from it), whole warpgroups of tiles (N % 64), and
  // SwiGLU only over paired rows (gate and up in one thread).
  return W.fmt == WeightMat::kFragMXFP4 && W.N % (16 * kWaTilesWg) == 0 && expert_gemm_v3_supports(W, A, lda, a_rows, epi) &&
         (epi.mode != Epilogue::kSwiGLU || W.swiglu_rows);
}

namespace {
template <int BN, int WGS, bool kMbar>
void launch_v5(const ExpertGemmArgs& a, int pairs, int E, cudaStream_t s) {
  using L = WaTile<BN, WGS>;
  static std::atomic<uint64_t> attr_set{0};
  opt_in_smem_once_per_device(attr_set, L::kSmem, expert_gemm_wa_kernel<BN, WGS, kMbar>);
  // (a split tiling's remainder launch: at most one tile a group)
  const int max_tiles = a.tile_bulk > 0 ? std::min(pairs, E) : (pairs + BN - 1) / BN + std::min(pairs, E);
  if (max_tiles > 65535) throw Error("expert_gemm_v5: too many row tiles (" + std::to_string(max_tiles) + ")");
  const int T = a.N / 16;
  const dim3 grid((T + L::kTiles - 1) / L::kTiles, max_tiles);
  launch_pdl(expert_gemm_wa_kernel<BN, WGS, kMbar>, grid, dim3(L::kThreads), L::kSmem, s, a);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

// The block-barrier kernel at each width (the mbarrier one is launched directly: 128 pairs, four
// warpgroups, expert_gemm_v5_uses_mbarriers).
template <int WGS>
void launch_v5_width(int bn, const ExpertGemmArgs& a, int pairs, int E, cudaStream_t s) {
  switch (bn) {
    case 32: launch_v5<32, WGS, false>(a, pairs, E, s); break;
    case 48: launch_v5<48, WGS, false>(a, pairs, E, s); break;
    case 80: launch_v5<80, WGS, false>(a, pairs, E, s); break;
    case 96: launch_v5<96, WGS, false>(a, pairs, E, s); break;
    case 128: launch_v5<128, WGS, false>(a, pairs, E, s); break;
    default: launch_v5<64, WGS, false>(a, pairs, E, s); break;
  }
}
}  // namespace

void expert_gemm_v5(const WeightMat& W, const bf16_t* A, int lda, int pairs, int E, bool gather_a, bool a_k_permuted,
                    const MoeRouting& r, const Epilogue& epi, cudaStream_t s, int a_rows) {
  if (pairs <= 0) return;
  if (W.fmt != WeightMat::kFragMXFP4) throw Error("expert_gemm_v5: MXFP4 weights in the fragment layout only");
  if (E > kMoeMaxGroups) throw Error("expert_gemm_v5: at most " + std::to_string(kMoeMaxGroups) + " experts");
  if (!expert_gemm_v3_available()) throw Error("expert_gemm_v5: needs sm_90a code and a compute capability 9.0 GPU");
  if (epi.k_permuted && (epi.mode != Epilogue::kSwiGLU || (W.N / 2) % 64 != 0))
    throw Error("expert_gemm_v5: a k-permuted output needs SwiGLU into rows of whole 64-wide chunks");
  if (a_k_permuted && W.K % 64 != 0) throw Error("expert_gemm_v5: k-permuted activations need K % 64 == 0");
  ExpertGemmArgs a{static_cast<const uint8_t*>(W.w), W.scales, W.bias, W.N, W.K, A, lda, gather_a, r, epi, W.swiglu_rows,
                   a_k_permuted};
  auto launch = [&](int bn, const ExpertGemmArgs& la) {
    if (expert_gemm_v5_uses_mbarriers(bn, pairs, a_k_permuted)) {
      if (const int ws = expert_gemm_v5_warp_specialized())
        launch_expert_gemm_v5_ws(la, a_rows, pairs, E, ws == 1, s);
      else
        launch_v5<128, 4, true>(la, pairs, E, s);
    }
    else if (expert_gemm_v5_chosen_warpgroups(bn, pairs) == 4)
      launch_v5_width<4>(bn, la, pairs, E, s);
    else
      launch_v5_width<2>(bn, la, pairs, E, s);
  };
  const V5Tiling t = expert_gemm_v5_tiling(pairs, E);
  a.tile_rem_max = t.rem;
  launch(t.bulk, a);
  if (t.rem > 0) {  // the remainders the bulk launch left, one narrower tile a group
    ExpertGemmArgs rem = a;
    rem.tile_rem_max = 0;
    rem.tile_bulk = t.bulk;
    launch(t.rem, rem);
  }
}

namespace {
// One thread a 64-wide chunk of a row: eight 16-byte loads in natural order, each 64-byte half
// transposed as the kernel's permute_act does it (wa_transpose_half), eight 16-byte stores.
__global__ void permute_rows_frag_k_kernel(const uint4* __restrict__ src, int total, uint4* __restrict__ dst) {
  pdl_begin();  // src is the previous kernel's output
  const int i = int(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const uint4* in = src + size_t(i) * 8;
  uint4* out = dst + size_t(i) * 8;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint4 v[4], t[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) v[m] = in[4 * h + m];
    wa_transpose_half(v, t);
#pragma unroll
    for (int m = 0; m < 4; ++m) out[4 * h + m] = t[m];
  }
}
}  // namespace

void permute_rows_frag_k(const bf16_t* src, int rows, int K, bf16_t* dst, cudaStream_t s) {
  if (rows <= 0) return;
  if (K % 64 != 0) throw Error("permute_rows_frag_k: K must be a multiple of 64");
  if ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15)
    throw Error("permute_rows_frag_k: 16-byte aligned rows only");
  const int total = rows * (K / 64);
  launch_pdl(permute_rows_frag_k_kernel, dim3((total + 255) / 256), dim3(256), 0, s, reinterpret_cast<const uint4*>(src),
             total, reinterpret_cast<uint4*>(dst));
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
