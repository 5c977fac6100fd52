// Tensor-core linear layers for decode-sized batches (1-64 tokens; per expert for MoE): the
// weights, repacked at load into the fragment layout (frag_layout.cuh), are the M side of
// mma.sync m16n8k16 and the tokens the N side, 8 per n-tile. One 16-byte load per lane feeds four
// MMAs (MXFP4), so the kernel streams weights like a GEMV while the arithmetic rides the tensor
// cores, and 2-8 tokens cost what one does. Formats:
//   kFragBF16   bf16 weights x bf16 activations (bf16 MMA)
//   kFragFP8    e4m3 weights (cvt to f16x2) x fp16 activations, scale per output row in the epilogue
//   kFragMXFP4  e2m1 codes -> fp16 by bit moves (value x 2^-14, exact), x fp16 activations; each
//               32-K scale block's two MMAs accumulate apart and are scaled by 2^(s-127+14) in fp32
// A block is KS warps over one 16-row tile; warp w takes chunks w, w + KS, ... with PF chunks of
// weights (and activations) in flight, then the warps' partial sums meet in shared memory. Grouped
// (MoE) launches take blockIdx.y as the expert group and loop over its tokens 8 * NT at a time;
// one-n-tile grouped MXFP4 launches run the unit-walking kernel of skinny_units.cu instead.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/cluster.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/diag_clocks.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/tensor_core_ptx.cuh"
#include "backend/cuda/bulk_copy_ptx.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/frag_layout.cuh"
#include "backend/cuda/kernels/linear/skinny_chunk.cuh"
#include "backend/cuda/kernels/linear/norm_in_staging.cuh"
#include "backend/cuda/kernels/linear/skinny_units.h"
#include "backend/cuda/kernels/moe/router_fold.cuh"

namespace gptoss::cuda {

namespace skinny {

static int skinny_opt_bits() {  // GPTOSS_SKINNY_OPT, read once (skinny_units.h)
  static const int bits = env_int("GPTOSS_SKINNY_OPT", 7);
  return bits;
}
bool skinny_cc_enabled() { return (skinny_opt_bits() & 1) != 0; }
bool skinny_units_enabled() { return (skinny_opt_bits() & 3) == 3; }
bool skinny_tp_cc_enabled() { return (skinny_opt_bits() & 5) == 5; }

// GPTOSS_STAGE_ASYNC=0 (bench comparisons), read once: activation rows staged through registers
// (SkinnyArgs::stage_async).
static bool stage_async_enabled() {
  static const bool on = env_int("GPTOSS_STAGE_ASYNC", 1) != 0;
  return on;
}

// GPTOSS_DENSE_TWO_TILE (bench comparisons), read once: which o_proj launches (K = 4096) take the
// 16-warp, two-tile shape (launch_fmt). Bit 0: bf16 and fp8, bit 1: MXFP4 (`--mxfp4-layers all`:
// 120b tg64 494.18 -> 501.61, 20b 660.02 -> 659.55; H200, tenth session); both on by default.
// (o_proj's row slice at TP=2, K = 2048, measured within the noise: tg128 464.21 -> 467.75.)
static int dense_two_tile_bits() {
  static const int bits = env_int("GPTOSS_DENSE_TWO_TILE", 3);
  return bits;
}

}  // namespace skinny

namespace {

using namespace skinny;

#ifdef GPTOSS_DIAG_MMA_CLOCKS
// Diagnostic builds only (tools/gpu/diag_binary.sh): skinny_mma_kernel's thread 0 adds the cycles
// between its stages to [kind][stage] (kind 0: qkv staging its row as rmsnorm(x + moe), the one-token
// step's; 1: o_proj with the router folded in; 2: other staged dense launches; 3: the rest), a count
// in [kind][7]; printed at exit. Stages: start -> the wait returned -> the pass's rows staged -> the
// staged chunks' MMAs done (their bulk copies waited for) -> the chunks through registers done ->
// the block's end (reduction, epilogue; the fold's partial sums).
__device__ unsigned long long g_mma_clocks[4][8];
// The block's warps against warp 0 (same kinds), each warp's lane 0 stamping: [0] the last warp's
// wait returned after warp 0's, [1] the last warp at the first pass's barrier after warp 0,
// [2] warp 0 from its wait to that barrier, [3] the longest a warp took from its first early
// weight load to its wait's return.
__device__ unsigned long long g_mma_warp_clocks[4][8];
#define MMA_CLOCK(i) GPTOSS_STAGE_CLOCK(mclk, i)
#define WARP_CLOCK(j)                                       \
  do {                                                      \
    if ((threadIdx.x & 31) == 0) s_wclk[j][warp] = clock64(); \
  } while (0)
void print_mma_clocks() {
  static const char* const kinds[4] = {"qkv (norm-in)", "o_proj (fold)", "other staged", "other"};
  static const char* const names[5] = {"start->waited", "->rows staged", "->staged chunks", "->register chunks", "->end"};
  print_stage_table("skinny mma", g_mma_clocks, kinds, names, 5);
  static const char* const wnames[4] = {"last wait after warp 0's", "last at the barrier after warp 0",
                                        "warp 0 wait->barrier", "longest loads->wait"};
  print_stage_table("skinny mma warps", g_mma_warp_clocks, kinds, wnames, 4);
  static const char* const nkinds[3] = {"each block", "clusters", "multicast"};
  static const char* const nnames[3] = {"waited->loads in", "->sums met", "->row written"};
  print_stage_table("norm-in staging", g_norm_clocks, nkinds, nnames, 3);
}
#else
#define MMA_CLOCK(i) do {} while (0)
#define WARP_CLOCK(j) do {} while (0)
#endif

// A folded o_proj block, every thread, right after its wait: its rows of the residual (each of
// the pass's tokens) and of the previous layer's MoE output (moe_in, one token) into shared
// memory by cp.async, so the epilogue finds them there instead of asking L2 after the block's
// reduction, on the path to the expert kernels' routing. (Both were written launches back: the
// residual by the previous o_proj, moe_in by the previous down.) kRows rows from tile0's.
template <int RT>
__device__ __forceinline__ void fold_copy_residual(const SkinnyArgs& a, int tile0, float* x_s, long long* m_s) {
  constexpr int kRows = RT * 16, kX4 = kRows / 4, kM2 = kRows / 2;  // 16-byte pieces a token's rows / moe_in's
  const size_t row0 = size_t(tile0) * 16;
  const float* x = static_cast<const float*>(a.epi.out);
  const int nx = a.M * kX4, n = nx + (a.r.fold.moe_in ? kM2 : 0);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if (i < nx) {
      const int t = i / kX4, c = i - t * kX4;
      ptx::cp_async16(x_s + t * kRows + 4 * c, x + size_t(t) * a.epi.ldo + row0 + 4 * c, true);
    } else {
      const int c = i - nx;
      ptx::cp_async16(m_s + 2 * c, a.r.fold.moe_in + row0 + 2 * c, true);
    }
  }
  ptx::cp_async_commit();
}

// The router folded into o_proj (RouterFold, 1-8 tokens, staged launches): finish_tiles with the
// residual add written out, then each finished row's x * norm_w and x^2 (every token of the pass)
// to shared memory and xg, and the block's partial logits and sums of squares into the fold's sums.
// w_s / g_s: the block's rows' router and norm weights, staged before the wait.
// bias_v: block 0's thread t < E holds the router's bias of expert t, copied to the fold's bias_l2.
// CAP: the launch's fold capacity (kernels.h), a.M <= CAP.
// x_s / m_s: the block's rows of the residual ([t][kRows]) and of moe_in, copied by
// fold_copy_residual after the wait (waited for here).
template <int FMT, int KS, int RT, int CAP>
__device__ __forceinline__ void finish_tiles_fold(const SkinnyArgs& a, float* red, const float (&acc)[RT][1][4],
                                                  int tile0, const uint16_t* w_s, const float* g_s, float bias_v,
                                                  const float* x_s, const long long* m_s) {
  constexpr int kRows = RT * 16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const RouterFold& f = a.r.fold;
  const int ntok = a.M;
  __shared__ float xg_s[CAP * kRows], sq_s[CAP * kRows];
  ptx::cp_async_wait<0>();  // fold_copy_residual's rows (sum_tile_slices' first barrier publishes them)
  float fin[1][4];
  // Rows g, g + 8 of tile tile0 + warp; token 2 tq + c is column c of the lane's pair (fin[0][c],
  // fin[0][2 + c]).
  if (sum_tile_slices<1, KS, RT>(red, acc, RT, fin)) {
    const TileRows tr = tile_rows<FMT>(a, 0, tile0 + warp, g);
    const int l0 = warp * 16 + g, l1 = l0 + 8;  // the rows within the block (tr.lr - tile0 * 16)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int t = 2 * tq + c;
      if (t >= ntok) continue;
      float* x = static_cast<float*>(a.epi.out) + size_t(t) * a.epi.ldo;
      // What tile_store's kAddF32 stores, kept for the sums below; after a folded combine (one
      // token) the residual takes the previous layer's MoE output first (RouterFold::moe_in), as
      // the combine would have added it.
      float m0 = 0.f, m1 = 0.f;
      if (f.moe_in) {
        m0 = router_fold::from_fixed_logit(m_s[l0]);
        m1 = router_fold::from_fixed_logit(m_s[l1]);
      }
      const float n0 = (x_s[t * kRows + l0] + m0) + (fin[0][c] * tr.sc0 + tr.b0),
                  n1 = (x_s[t * kRows + l1] + m1) + (fin[0][2 + c] * tr.sc1 + tr.b1);
      x[tr.lr0] = n0;
      x[tr.lr1] = n1;
      const float xg0 = n0 * g_s[l0], xg1 = n1 * g_s[l1];
      xg_s[t * kRows + l0] = xg0;
      xg_s[t * kRows + l1] = xg1;
      sq_s[t * kRows + l0] = n0 * n0;
      sq_s[t * kRows + l1] = n1 * n1;
      f.xg[size_t(t) * f.H + tr.lr0] = xg0;
      f.xg[size_t(t) * f.H + tr.lr1] = xg1;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x < f.E) f.bias_l2[threadIdx.x] = bias_v;
  __syncthreads();
  router_fold::fold_add_partials<CAP>(f, kRows, ntok, xg_s, sq_s, w_s, red);
}

// CC: the chunks of a row (K / 64) at compile time, or 0 for any K. With CC, every weight and
// scale load is a lane pointer plus an immediate offset (the pointers advance once per PF
// chunks), and the host launches it only where the row tiles fill every block (no tail checks).
// SD (dense launches with CC, one n-tile): before griddepcontrol.wait the block asks the
// bulk-copy engine for the first SD * KS chunks of each of its row tiles, into shared memory past
// the activation rows (MXFP4: their scale words after them, a second copy a tile), so that while
// the kernel before it still runs, more of its weights are on their way than its registers could
// hold; warp w reads its first SD chunks from there.
// FOLD_CAP (staged o_proj launches at 1-8 tokens only, linear_router_fold; 0 elsewhere): the
// router's partial sums in the epilogue (finish_tiles_fold), its rows' router and norm weights
// staged beside the weights; its shared rows sized for FOLD_CAP tokens (4 or 8: kernels.h).
// NORM_IN (staged one-token qkv launches only, linear_norm_in): the row staged as
// rmsnorm(x + moe) by stage_row_norm_in, its norm weights loaded before the wait; NCL > 1: by
// clusters of NCL blocks, each reading a slice (stage_row_norm_in_cluster), or with NMC brought in
// by the bulk-copy engine's multicast (stage_row_norm_in_multicast; norm_w's slices before the wait).
template <int FMT, int NT, int KS, int RT, int PF, bool XF16, int CC, int SD = 0, int FOLD_CAP = 0,
          bool NORM_IN = false, int NCL = 1, bool NMC = false>
__global__ void __launch_bounds__(KS * 32, skinny_min_blocks(NT, KS, RT)) skinny_mma_kernel(SkinnyArgs a) {
  constexpr bool FOLD = FOLD_CAP > 0;
  static_assert(PF >= 1 && RT <= KS, "prefetch depth; one finishing warp per row tile");
  static_assert(SD == 0 || (CC > 0 && NT == 1 && SD * KS <= CC), "staged chunks");
  static_assert(!FOLD || (SD > 0 && NT == 1), "the router fold rides the staged one-n-tile kernel");
  static_assert(!NORM_IN || (SD > 0 && NT == 1 && !FOLD), "the norm-in staging rides the staged one-token kernel");
  static_assert(NCL == 1 || (NORM_IN && KS <= kNormClusterWarps), "clusters stage the norm-in row only");
  static_assert(!NMC || NCL > 1, "the multicast needs a cluster");
  constexpr int P = SD * KS;  // chunks of each row tile staged in shared memory
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int N = a.W.N, C = CC > 0 ? CC : a.W.K / 64, T = N / 16;
  const int tile0 = blockIdx.x * RT;
#ifdef GPTOSS_DIAG_MMA_CLOCKS
  long long mclk[6] = {0, 0, 0, 0, 0, 0};
  __shared__ long long s_wclk[3][KS];
#endif
  MMA_CLOCK(0);
  // The multicast staging's row, at the same offsets in every block of the cluster (static).
  __shared__ __align__(16) float4 mc_x_s[NMC ? kNormInRowMax : 1];
  __shared__ __align__(16) longlong2 mc_m_s[NMC ? 2 * kNormInRowMax : 1];
  __shared__ __align__(16) float4 mc_w_s[NMC ? kNormInRowMax : 1];
  __shared__ uint64_t mc_full;
  __shared__ uint64_t ws_full;  // the staged chunks (SD) landed
  const NormInRow mc_row{mc_x_s, mc_m_s, mc_w_s, &mc_full};
  if constexpr (NMC) {
    if (threadIdx.x == 0) {  // armed for the whole row before the cluster barrier publishes it
      const uint32_t bar = ptx::smem_u32(&mc_full);
      ptx::mbar_init(bar, 1);
      ptx::mbar_init_fence();
      ptx::mbar_arrive_expect_tx(bar, uint32_t(a.W.K) * 16);
    }
  }
  // (stage_row_norm_in_cluster waits on it; with NMC the wait before norm_w's multicast)
  if constexpr (NCL > 1) cluster_arrive_relaxed();
  const int nrt = CC > 0 ? RT : min(RT, T - tile0);  // row tiles of this block (the last block may have fewer)
  // Shared memory: the partial sums [KS][RT][NT][4][32] f32, then (one n-tile: XS) the block's
  // a.xs_rows (min(M, 8)) activation rows, K + 8 halves each (the pad spreads the rows over the
  // banks), so the B fragments are shared-memory reads and the registers hold only weights in flight.
  constexpr bool XS = NT == 1;
  // MXFP4 and fp8 weights multiply fp16 activations: bf16 ones are converted while staged.
  constexpr bool kStageF16 = XS && !XF16 && FMT != WeightMat::kFragBF16;
  constexpr bool kChunkF16 = XF16 || kStageF16;
  extern __shared__ __align__(128) float red[];  // (128: skinny_units.cu says why)
  uint16_t* xs = reinterpret_cast<uint16_t*>(red + KS * RT * NT * 4 * 32);
  const int xs_ld = a.W.K + 8;
  // The staged chunks: [RT][P] chunks in their global layout, 16-byte aligned (xs_ld * 2 is);
  // MXFP4: then their scale words, [RT][P][8].
  const uint4* ws = reinterpret_cast<const uint4*>(xs + size_t(a.xs_rows) * xs_ld);
  const uint32_t* ss = reinterpret_cast<const uint32_t*>(ws + size_t(RT) * P * (chunk_bytes<FMT>() / 16));
  // The router fold (RouterFold; staged one-token launches only): its rows' router weights and
  // norm weights after the staged scale words.
  const uint16_t* fold_w = reinterpret_cast<const uint16_t*>(ss + (FMT == WeightMat::kFragMXFP4 ? RT * P * 8 : 0));
  const float* fold_g = reinterpret_cast<const float*>(fold_w + RT * 16 * a.r.fold.E);

  int row_begin = 0, row_end = a.M, expert = 0;
  WChunk<FMT> wbuf[PF][RT];
  // Chunks of this warp through registers (past the SD staged ones).
  const int my_n = (C > warp ? (C - 1 - warp) / KS + 1 : 0) - SD;
  size_t tc0 = size_t(tile0) * C;
  // With CC: this lane's weight and scale pointers (wl, sl) at its next chunk group; chunk
  // (rel, r) of the group is at + (r CC + rel KS) chunks, an immediate offset, and the pointers
  // advance by PF KS chunks a group: no address arithmetic per load.
  const uint4* wl = nullptr;
  const uint32_t* sl = nullptr;
  auto set_lane_ptrs = [&]() {
    wl = static_cast<const uint4*>(a.W.w) + (tc0 + P + warp) * (chunk_bytes<FMT>() / 16) + lane;
    if constexpr (FMT == WeightMat::kFragMXFP4) sl = reinterpret_cast<const uint32_t*>(a.W.scales) + (tc0 + P + warp) * 8 + g;
  };
  auto load_rel = [&](int u, int rel) {
#pragma unroll
    for (int r = 0; r < RT; ++r) load_w_at<FMT>(wl, sl, r * CC + rel * KS, wbuf[u][r]);
  };
  auto load_chunk_w = [&](int u, int it) {
    if constexpr (CC > 0) {
      load_rel(u, it);  // it < PF: the first group (wl not advanced yet)
    } else {
      const int c = warp + it * KS;
#pragma unroll
      for (int r = 0; r < RT; ++r)
        if (r < nrt) load_w<FMT>(a, tc0 + size_t(r) * C + c, lane, wbuf[u][r]);
    }
  };
  // The first pass's first chunks load before the wait wherever nothing an earlier kernel
  // writes decides them: dense weights always, an expert's once its routing is settled.
  const bool early = !a.grouped || a.r.settled;
  if (!a.grouped) {
    if constexpr (CC > 0) set_lane_ptrs();
    if constexpr (SD > 0) {
      if (threadIdx.x == 0) {
        const uint32_t bar = ptx::smem_u32(&ws_full), dst = ptx::smem_u32(ws);
        constexpr uint32_t bytes = uint32_t(P * chunk_bytes<FMT>());
        constexpr uint32_t sbytes = FMT == WeightMat::kFragMXFP4 ? uint32_t(P * 32) : 0;  // scale words
        const uint32_t fw_bytes = FOLD ? uint32_t(RT * 16 * a.r.fold.E * 2) : 0, fg_bytes = FOLD ? RT * 16 * 4 : 0;
        ptx::mbar_init(bar, 1);
        ptx::mbar_init_fence();
        ptx::mbar_arrive_expect_tx(bar, RT * (bytes + sbytes) + fw_bytes + fg_bytes);
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          ptx::bulk_copy_g2s(dst + r * bytes, static_cast<const char*>(a.W.w) + (tc0 + size_t(r) * C) * chunk_bytes<FMT>(),
                             bytes, bar);
          if constexpr (sbytes > 0)
            ptx::bulk_copy_g2s(dst + RT * bytes + r * sbytes, a.W.scales + (tc0 + size_t(r) * C) * 32, sbytes, bar);
        }
        if constexpr (FOLD) {
          const size_t row0 = size_t(tile0) * 16;
          ptx::bulk_copy_g2s(ptx::smem_u32(fold_w), a.r.fold.w_t + row0 * a.r.fold.E, fw_bytes, bar);
          ptx::bulk_copy_g2s(ptx::smem_u32(fold_g), a.r.fold.norm_w + row0, fg_bytes, bar);
        }
      }
    }
  } else {
    if (!a.r.settled) pdl_wait();
    const int gi = blockIdx.y;
    // All four loads in flight at once (the group arrays have an entry for every grid row, so
    // reading past counts is in bounds): one L2 round trip before the first weight load, not two.
    const int ngroups = __ldcg(a.r.counts);
    row_begin = __ldcg(a.r.group_start + gi);
    row_end = __ldcg(a.r.group_end + gi);
    expert = __ldcg(a.r.group_expert + gi);
    if (gi >= ngroups) { pdl_trigger(); return; }  // uniform over the block
    tc0 = (size_t(expert) * T + tile0) * C;
    if constexpr (CC > 0) set_lane_ptrs();
  }
  if (warp < nrt) prefetch_tile_rows<FMT>(a, expert, tile0 + warp, g);
  // The norm weights: their lines into L2 (stage_row_norm_in reads them after the wait), or this
  // thread's piece of the block's slice into registers (clusters).
  float4 norm_w_piece[norm_pieces<NCL>()];
  if constexpr (NORM_IN && NCL == 1)
    for (int l = threadIdx.x; l < a.W.K * 4 / 128; l += blockDim.x)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<const char*>(a.norm_in.norm_w) + l * 128));
  if constexpr (NMC) {
    cluster_wait();  // every block's barrier is initialised and armed
    if (threadIdx.x == 0) multicast_norm_slice<NCL>(a.norm_in.norm_w, mc_w_s, a.W.K, 4, mc_row);
  } else if constexpr (NCL > 1) {
    const int slice = norm_slice<NCL>(a), rank = int(cooperative_groups::this_cluster().block_rank());
#pragma unroll
    for (int p = 0; p < norm_pieces<NCL>(); ++p) {
      const int e = int(threadIdx.x) + p * int(blockDim.x);
      norm_w_piece[p] = e < slice ? __ldg(reinterpret_cast<const float4*>(a.norm_in.norm_w) + rank * slice + e)
                                  : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  float fold_bias = 0.f;  // block 0: the router's bias for the fold's copy (finish_tiles_fold)
  if constexpr (FOLD)
    if (blockIdx.x == 0 && threadIdx.x < a.r.fold.E) fold_bias = __ldg(a.r.fold.bias + threadIdx.x);
  if (early) {
    WARP_CLOCK(0);
#pragma unroll
    for (int u = 0; u < PF; ++u)
      if (u < my_n) load_chunk_w(u, u);
    pdl_wait();
  }
  WARP_CLOCK(1);
  pdl_trigger();
  MMA_CLOCK(1);
  if constexpr (NMC) {
    if (threadIdx.x == 0) {
      multicast_norm_slice<NCL>(a.norm_in.x, mc_x_s, a.W.K, 4, mc_row);
      multicast_norm_slice<NCL>(a.norm_in.moe, mc_m_s, a.W.K, 8, mc_row);
    }
  }
  const char* A = static_cast<const char*>(a.A);
  __shared__ __align__(16) float fold_x_s[FOLD ? FOLD_CAP * RT * 16 : 1];
  __shared__ __align__(16) long long fold_m_s[FOLD ? RT * 16 : 1];
  if constexpr (FOLD) fold_copy_residual<RT>(a, tile0, fold_x_s, fold_m_s);

  for (int tok0 = row_begin; tok0 < row_end; tok0 += 8 * NT) {
    if (!early || tok0 != row_begin) {
#pragma unroll
      for (int u = 0; u < PF; ++u)
        if (u < my_n) load_chunk_w(u, u);
    }
    // This lane's B column (token g of each n-tile); its activations serve all RT row tiles.
    const char* xrow[NT];
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const int p = tok0 + 8 * i + g;
      xrow[i] = nullptr;
      if (p < row_end) {
        const int ar = a.gather_a ? a.r.pair_token[p] : p;
        xrow[i] = A + size_t(ar) * a.lda * 2;
      }
    }
    uint4 xbuf[XS ? 1 : PF][NT][2];
    const int ntok = min(8 * NT, row_end - tok0);
    if constexpr (XS) {
      if (tok0 == row_begin) WARP_CLOCK(2);
      __syncthreads();  // the previous pass's readers are done with xs
      if constexpr (NMC) {
        stage_row_norm_in_multicast<kChunkF16>(a, xs, red, mc_row);
      } else if constexpr (NCL > 1) {
        __shared__ __align__(16) float4 norm_row_s[NCL > 1 ? kNormInRowMax : 1];
        __shared__ float norm_ss_s[NCL > 1 ? NCL * kNormClusterWarps : 1];
        stage_row_norm_in_cluster<kChunkF16, NCL>(a, xs, norm_row_s, norm_ss_s, norm_w_piece);
      } else if constexpr (NORM_IN) {
        stage_row_norm_in<kChunkF16, FMT == WeightMat::kFragMXFP4>(a, xs, red);
      } else {
        stage_rows<kStageF16>(a, tok0, ntok, xs, xs_ld);
      }
      __syncthreads();
      MMA_CLOCK(2);
    } else {
#pragma unroll
      for (int u = 0; u < PF; ++u)
        if (u < my_n)
#pragma unroll
          for (int i = 0; i < NT; ++i) load_x<XF16>(a, xrow[i], warp + u * KS, tq, xbuf[u][i]);
    }
    const uint16_t* xs_lane = xs + size_t(g) * xs_ld + 8 * tq;
    auto x_from_smem = [&](int c, uint4 (&x)[NT][2]) {
      if (g < ntok) {
        const uint4* p = reinterpret_cast<const uint4*>(xs_lane + c * 64);
        x[0][0] = p[0];
        x[0][1] = p[4];
      } else {
        x[0][0] = x[0][1] = make_uint4(0, 0, 0, 0);
      }
    };

    float acc[RT][NT][4];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int i = 0; i < NT; ++i) acc[r][i][0] = acc[r][i][1] = acc[r][i][2] = acc[r][i][3] = 0.f;
    if constexpr (SD > 0) {
      // The staged chunks first (the same order of sums as without staging). The barrier's
      // init is visible: the staging above passed two __syncthreads.
      ptx::mbar_wait(ptx::smem_u32(&ws_full), 0);
#pragma unroll
      for (int sd = 0; sd < SD; ++sd) {
        const int c = warp + sd * KS;
        x_from_smem(c, xbuf[0]);
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          WChunk<FMT> w;
          load_w_at<FMT, WLoad::kStaged>(ws + lane, ss + g, size_t(r) * P + c, w);
          chunk_mma<FMT, NT, kChunkF16>(w, xbuf[0], acc[r]);
        }
      }
#ifdef GPTOSS_DIAG_MMA_CLOCKS
      asm volatile("" ::"f"(acc[0][0][0]) : "memory");
#endif
      MMA_CLOCK(3);
    }
    auto step = [&](int base, int u) {
      if (base + u < my_n) {
        const int xu = XS ? 0 : u;
        // (Reading the next chunk's activations a chunk ahead was measured: no faster.)
        if constexpr (XS) x_from_smem(P + warp + (base + u) * KS, xbuf[0]);
#pragma unroll
        for (int r = 0; r < RT; ++r)
          if (r < nrt) chunk_mma<FMT, NT, kChunkF16>(wbuf[u][r], xbuf[xu], acc[r]);
        const int nxt = base + u + PF;
        if (nxt < my_n) {
          if constexpr (CC > 0) {
            // At four row tiles a compiler barrier keeps these loads after this chunk's MMAs,
            // which free the registers they land in (without it ptxas spills at 80 registers).
            if constexpr (RT == 4) asm volatile("" ::: "memory");
            load_rel(u, u + PF);  // relative to this group's pointers
          } else {
            load_chunk_w(u, nxt);
          }
          if constexpr (!XS)
#pragma unroll
            for (int i = 0; i < NT; ++i) load_x<XF16>(a, xrow[i], warp + nxt * KS, tq, xbuf[xu][i]);
        }
      }
    };
    const uint4* wl0 = wl;
    const uint32_t* sl0 = sl;
    for (int base = 0; base < my_n; base += PF) {
#pragma unroll
      for (int u = 0; u < PF; ++u) step(base, u);
      if constexpr (CC > 0) {
        wl += PF * KS * (chunk_bytes<FMT>() / 16);
        if constexpr (FMT == WeightMat::kFragMXFP4) sl += PF * KS * 8;
      }
    }
    wl = wl0;  // the next token pass starts over
    sl = sl0;
#ifdef GPTOSS_DIAG_MMA_CLOCKS
    asm volatile("" ::"f"(acc[0][0][0]) : "memory");
#endif
    MMA_CLOCK(4);

    if constexpr (FOLD)  // at most 8 tokens: this is the only pass
      finish_tiles_fold<FMT, KS, RT, FOLD_CAP>(a, red, acc, tile0, fold_w, fold_g, fold_bias, fold_x_s, fold_m_s);
    else
      finish_tiles<FMT, NT, KS, RT>(a, red, acc, nrt, tile0, expert, tok0, row_end);
  }
#ifdef GPTOSS_DIAG_MMA_CLOCKS
  MMA_CLOCK(5);
  if (threadIdx.x == 0 && row_begin < row_end) {  // (one pass: the stages of more are the last one's)
    const int kind = NORM_IN ? 0 : FOLD ? 1 : SD > 0 ? 2 : 3;
    if (SD == 0) mclk[3] = mclk[2];  // (no staged chunks)
    if (!XS) mclk[2] = mclk[1];      // (no staged rows)
    for (int i = 0; i < 5; ++i) atomicAdd(&g_mma_clocks[kind][i], (unsigned long long)(mclk[i + 1] - mclk[i]));
    atomicAdd(&g_mma_clocks[kind][7], 1ull);
    if (early && XS) {
      long long w1 = s_wclk[1][0], w2 = s_wclk[2][0], lw = 0;
      for (int w = 0; w < KS; ++w) {
        w1 = max(w1, s_wclk[1][w]);
        w2 = max(w2, s_wclk[2][w]);
        lw = max(lw, s_wclk[1][w] - s_wclk[0][w]);
      }
      const long long v[4] = {w1 - s_wclk[1][0], w2 - s_wclk[2][0], s_wclk[2][0] - s_wclk[1][0], lw};
      for (int i = 0; i < 4; ++i) atomicAdd(&g_mma_warp_clocks[kind][i], (unsigned long long)v[i]);
      atomicAdd(&g_mma_warp_clocks[kind][7], 1ull);
    }
  }
#endif
}

// Kernel shapes (warps splitting K, row tiles whose blocks share the activation loads, chunks
// in flight), by the tokens an n-tile pass covers; `ks` picks among the measured ones. TRY_CC:
// use the compile-time chunk count for gpt-oss's K (2880, 4096) where the tiles fill every block.
// A block's dynamic shared memory (skinny_mma_kernel): the K slices' partial sums, the activation
// rows (one n-tile) and the SD staged chunk groups.
// (Staged launches with the router fold: its rows' router and norm weights after those.)
template <int FMT>
size_t skinny_smem_bytes(const SkinnyArgs& a, int NT, int KS, int RT, int SD) {
  const bool fold = SD > 0 && !a.grouped && a.r.fold.acc != nullptr;
  return size_t(KS) * RT * NT * 4 * 32 * sizeof(float) + (NT == 1 ? size_t(a.xs_rows) * (a.W.K + 8) * 2 : 0) +
         size_t(RT) * SD * KS * (chunk_bytes<FMT>() + (FMT == WeightMat::kFragMXFP4 ? 32 : 0)) +
         (fold ? router_fold::stage_bytes(RT * 16, a.r.fold.E) : 0);
}

// Where the last norm-in launch staged its row (last_norm_in_staging, for tests).
const char* g_norm_in_staging = "none";

// Whether an SM holds enough of kernel's blocks (at `smem` dynamic bytes) for the whole grid in one
// wave: the multicast staging's static row (46 KB) must not cost qkv's kernel its third block an
// SM (320 blocks over 132 SMs).
template <typename K>
bool one_wave(K kernel, int threads, size_t smem, int blocks) {
  int per_sm = 0;
  GPTOSS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  return size_t(per_sm) * sm_count() >= size_t(blocks);
}

template <int FMT, int NT, int KS, int RT, int PF, bool XF16, bool TRY_CC = false, int SD = 0, int FOLD_CAP = 0,
          bool NORM_IN = false, int NCL = 1, bool NMC = false>
void launch_shape(const SkinnyArgs& a, int tiles, int groups, cudaStream_t s) {
#ifdef GPTOSS_DIAG_MMA_CLOCKS
  static const bool registered = (std::atexit(print_mma_clocks), true);
  (void)registered;
#endif
  const size_t smem = skinny_smem_bytes<FMT>(a, NT, KS, RT, SD);
  if constexpr (FOLD_CAP > 0) {  // linear_router_fold: o_proj's K only
    if (a.W.K != 4096) throw Error("router fold: o_proj's staged kernel takes K = 4096 only");
    allow_dynamic_smem(skinny_mma_kernel<FMT, NT, KS, RT, PF, XF16, 64, SD, FOLD_CAP>, smem);
    launch_pdl(skinny_mma_kernel<FMT, NT, KS, RT, PF, XF16, 64, SD, FOLD_CAP>, dim3((tiles + RT - 1) / RT, groups),
               dim3(KS * 32), smem, s, a);
    return;
  }
  if constexpr (NORM_IN) {  // linear_norm_in: qkv's K only
    if constexpr (SD * KS <= 45) {
      if (a.W.K != 2880) throw Error("norm-in: qkv's staged kernel takes K = 2880 only");
      const auto k = skinny_mma_kernel<FMT, NT, KS, RT, PF, XF16, 45, SD, 0, true, NCL, NMC>;
      const dim3 grid((tiles + RT - 1) / RT, groups);
      if constexpr (NMC) {
        // (The static row leaves less than 48 KB for the dynamic part: always opted in.)
        static const bool fits = [&] {
          GPTOSS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
          return one_wave(k, KS * 32, smem, int(grid.x * grid.y));
        }();
        // Else fewer staged chunk groups (bf16's two take 32 KB), or clusters without the multicast.
        if (!fits) {
          if constexpr (SD > 1)
            return launch_shape<FMT, NT, KS, RT, PF, XF16, TRY_CC, SD - 1, FOLD_CAP, NORM_IN, NCL, NMC>(a, tiles, groups, s);
          else
            return launch_shape<FMT, NT, KS, RT, PF, XF16, TRY_CC, SD, FOLD_CAP, NORM_IN, NCL>(a, tiles, groups, s);
        }
      } else {
        allow_dynamic_smem(k, smem);
      }
      static_assert(NCL <= 8, "past 8, clusters need the non-portable size opt-in");
      g_norm_in_staging = NMC ? "multicast" : NCL > 1 ? "cluster" : "block";
      launch_pdl_cluster(k, grid, dim3(KS * 32), smem, dim3(NCL, 1, 1), s, a);
    } else {
      throw Error("norm-in: too many staged chunk groups for K = 2880");
    }
    return;
  }
  auto go = [&](auto k) {
    allow_dynamic_smem(k, smem);
    launch_pdl(k, dim3((tiles + RT - 1) / RT, groups), dim3(KS * 32), smem, s, a);
  };
  if constexpr (TRY_CC) {
    if (skinny_cc_enabled() && tiles % RT == 0) {
      if constexpr (SD > 0) {
        if constexpr (SD * KS <= 45)
          if (a.W.K == 2880) return go(skinny_mma_kernel<FMT, NT, KS, RT, PF, XF16, 45, SD>);
        if (a.W.K == 4096) return go(skinny_mma_kernel<FMT, NT, KS, RT, PF, XF16, 64, SD>);
      }
      if (a.W.K == 2880) return go(skinny_mma_kernel<FMT, NT, KS, RT, PF, XF16, 45>);
      if (a.W.K == 4096) return go(skinny_mma_kernel<FMT, NT, KS, RT, PF, XF16, 64>);
      // o_proj's row slice at TP=2 (K = 2048), in the default one-tile shape only.
      if constexpr (NT == 1 && KS == 8 && RT == 1)
        if (a.W.K == 2048 && skinny_tp_cc_enabled()) return go(skinny_mma_kernel<FMT, NT, KS, RT, PF, XF16, 32>);
    }
  }
  go(skinny_mma_kernel<FMT, NT, KS, RT, PF, XF16, 0>);
}

// Blocks a cluster of qkv's one-token kernel stages its row with (stage_row_norm_in_cluster):
// GPTOSS_NORM_IN_CLUSTER = 1 (each block reads the whole row), 2, 4 or 8, or set_norm_in_cluster
// (tests). 4 by default: H200, thirty-fifth session (s35r4), tg128 at one token against 1 (each
// block reading the row), twice each: 120b fp8 591.56, 590.43 against 575.13, 574.74 (2: 583.3,
// 582.6; 8: 586.4, 587.2; 16 was slower than 1 in s35r2 and is not built); bf16 508.50, 508.29
// against 499.27, 499.81 (2: 510.2, 510.0); MXFP4 dense 599.71, 599.46 against 588.22, 588.21;
// 20b fp8 859.04, 862.07 against 838.03, 839.12.
int checked_norm_in_cluster(int blocks, const char* who) {
  if (blocks != 1 && blocks != 2 && blocks != 4 && blocks != 8) throw Error(std::string(who) + ": 1, 2, 4 or 8 blocks");
  return blocks;
}
int g_norm_in_cluster = checked_norm_in_cluster(env_int("GPTOSS_NORM_IN_CLUSTER", 4), "GPTOSS_NORM_IN_CLUSTER");
// Clusters of 4 bring the row in by the bulk-copy engine's multicast (stage_row_norm_in_multicast)
// where the device runs sm_90a code (with fewer staged chunk groups where the static row would
// cost the kernel its one wave: bf16); otherwise clusters as above. GPTOSS_NORM_IN_MULTICAST=0 (or
// set_norm_in_multicast) turns it off. H200, thirty-sixth session (s36r1), tg128 at one token,
// multicast against clusters, twice each: 120b fp8 593.08, 594.46 against 590.01, 589.80; MXFP4
// dense 617.27, 617.47 against 601.73, 601.05; 20b fp8 863.22, 863.71 against 857.63, 858.43.
bool g_norm_in_multicast = env_int("GPTOSS_NORM_IN_MULTICAST", 1) != 0;

// bench-kernels: other MXFP4 one-n-tile shapes (set_skinny_variant); GPTOSS_SKINNY_VARIANT sets
// it for a whole run (a step's comparison: `gptoss bench`), 0 the default by grid.
int g_skinny_variant = env_int("GPTOSS_SKINNY_VARIANT", 0);

// Chunk groups each warp's block stages in shared memory before griddepcontrol.wait (the SD of
// skinny_mma_kernel) for the dense decode kernels (bf16 and fp8 decode copies, MXFP4 layers) at 1
// to kStageRows tokens: GPTOSS_DENSE_STAGE = o_proj digit (0-3) x 10 + qkv digit (0-4); 0 turns
// staging off. (H200, sixteenth session, tg64 off / 22 / 32: 120b 432.2, 431.3 / 433.3, 434.7 /
// 439.8, 440.3; at 2 tokens 672-675 / 693 / 697-699; 20b 613.4 / 616-620 / 626.2. At 8 tokens,
// where the activation rows fill shared memory, staging lost 1-3%, hence kStageRows. MXFP4,
// twenty-seventh session, --mxfp4-layers all: o_proj at 1 token 6.41 -> 5.53 us, qkv unchanged;
// 120b tg128 off / on, two pairs, 497.6 / 493.9 -> 500.5 / 506.2.)
constexpr int kStageRows = 4;
static int dense_stage_digits() {
  static const int v = env_int("GPTOSS_DENSE_STAGE", 32);
  return v;
}
template <int FMT, int NT, int KS, int RT, int PF, bool XF16, int FOLD_CAP = 0, bool NORM_IN = false, int NCL = 1,
          bool NMC = false>
bool launch_staged(const SkinnyArgs& a, int tiles, int groups, int sd, cudaStream_t s) {
  if constexpr (NT == 1) {
    // (The router fold stages at any of its 1-8 rows: its sums ride the staged kernel.)
    static const int max_rows = env_int("GPTOSS_DENSE_STAGE_ROWS", kStageRows);
    if (a.grouped || (FOLD_CAP == 0 && a.xs_rows > max_rows) || tiles % RT != 0 ||
        !skinny_cc_enabled() || (a.W.K != 2880 && a.W.K != 4096))
      return false;
    // Fewer staged groups where the block would not fit in shared memory (227 KB, less the
    // static barrier, the fold's row sums and the dynamic part's 128-byte alignment).
    constexpr size_t kStatic = 1024 + 2 * size_t(FOLD_CAP) * RT * 16 * sizeof(float) +
                               (NMC ? kNormInRowMax * 64 + 8 : NCL > 1 ? kNormInRowMax * 16 + NCL * kNormClusterWarps * 4 : 0);
    while (sd > 0 && skinny_smem_bytes<FMT>(a, NT, KS, RT, sd) > 227 * 1024 - kStatic) --sd;
    switch (sd) {
      case 1: launch_shape<FMT, NT, KS, RT, PF, XF16, true, 1, FOLD_CAP, NORM_IN, NCL, NMC>(a, tiles, groups, s); return true;
      case 2: launch_shape<FMT, NT, KS, RT, PF, XF16, true, 2, FOLD_CAP, NORM_IN, NCL, NMC>(a, tiles, groups, s); return true;
      case 3: launch_shape<FMT, NT, KS, RT, PF, XF16, true, 3, FOLD_CAP, NORM_IN, NCL, NMC>(a, tiles, groups, s); return true;
      case 4: if constexpr (KS == 8) { launch_shape<FMT, NT, KS, RT, PF, XF16, true, 4, FOLD_CAP, NORM_IN, NCL, NMC>(a, tiles, groups, s); return true; }
        return false;
      default: return false;
    }
  }
  return false;
}

template <int FMT, int NT, bool XF16>
void launch_fmt(const SkinnyArgs& a, int tiles, int groups, int ks, cudaStream_t s) {
  if (a.r.fold.acc) {
    // Expert launches after a folded router route in the unit-walking K-split kernel only.
    if constexpr (FMT == WeightMat::kFragMXFP4 && NT == 1)
      if (a.grouped && launch_skinny_units(a, tiles, groups, XF16, 0, true, s)) return;
    throw Error("router fold: this launch's kernel does not route from the fold (one-token MXFP4 experts only)");
  }
  if constexpr (FMT == WeightMat::kFragMXFP4 && NT == 1) {
    switch (g_skinny_variant) {  // KS warps x RT row tiles x PF chunks in flight
      case 1: return launch_shape<FMT, NT, 8, 4, 2, XF16, true>(a, tiles, groups, s);
      case 2: return launch_shape<FMT, NT, 16, 2, 3, XF16, true>(a, tiles, groups, s);
      case 3: return launch_shape<FMT, NT, 8, 1, 4, XF16, true>(a, tiles, groups, s);
      case 4: return launch_shape<FMT, NT, 16, 1, 4, XF16, true>(a, tiles, groups, s);
      case 5: return launch_shape<FMT, NT, 8, 2, 4, XF16, true>(a, tiles, groups, s);
      case 6: return launch_shape<FMT, NT, 4, 2, 4, XF16, true>(a, tiles, groups, s);
      case 7: return launch_shape<FMT, NT, 16, 4, 2, XF16, true>(a, tiles, groups, s);
      case 8: return launch_shape<FMT, NT, 8, 8, 1, XF16, true>(a, tiles, groups, s);
      case 9: return launch_shape<FMT, NT, 4, 4, 2, XF16, true>(a, tiles, groups, s);
      case 10: return launch_shape<FMT, NT, 8, 4, 1, XF16, true>(a, tiles, groups, s);
      case 20: return launch_shape<FMT, NT, 1, 1, 4, XF16, true>(a, tiles, groups, s);  // the warp walks' reference
      default: {
        // 11-19: the unit kernel's K-split shapes 1-9; 21-26: its warp-per-tile shapes 10-15
        // (launch_skinny_units), wherever the kernel takes the problem.
        const int v = g_skinny_variant, shape = v >= 11 && v <= 19 ? v - 10 : v >= 21 && v <= 26 ? v - 11 : 0;
        if (shape > 0 && launch_skinny_units(a, tiles, groups, XF16, shape, false, s)) return;
        break;
      }
    }
  }
  if constexpr (FMT == WeightMat::kFragFP8 && NT == 1) {
    switch (g_skinny_variant) {  // dense fp8 decode copies (q/k/v/o, lm_head)
      case 1: return launch_shape<FMT, NT, 8, 1, 4, XF16, true>(a, tiles, groups, s);
      case 2: return launch_shape<FMT, NT, 8, 1, 3, XF16, true>(a, tiles, groups, s);
      case 3: return launch_shape<FMT, NT, 16, 1, 2, XF16, true>(a, tiles, groups, s);
      case 4: return launch_shape<FMT, NT, 16, 2, 1, XF16, true>(a, tiles, groups, s);
      default: break;
    }
  }
  if constexpr (FMT == WeightMat::kFragBF16 && NT == 1) {
    switch (g_skinny_variant) {  // dense bf16 decode copies (q/k/v/o, lm_head)
      case 1: return launch_shape<FMT, NT, 16, 1, 1, XF16, true>(a, tiles, groups, s);
      case 2: return launch_shape<FMT, NT, 16, 1, 2, XF16, true>(a, tiles, groups, s);
      case 3: return launch_shape<FMT, NT, 8, 1, 2, XF16, true>(a, tiles, groups, s);
      case 4: return launch_shape<FMT, NT, 16, 2, 1, XF16, true>(a, tiles, groups, s);
      default: break;
    }
  }
  // Chunks in flight per warp: a bf16 chunk is 64 bytes a lane (16 registers), fp8 32, MXFP4 16;
  // with one n-tile the activations sit in shared memory, so the registers hold only weights.
  // (Chosen so that no variant spills: nvcc -Xptxas -v.)
  constexpr int kPF = FMT == WeightMat::kFragBF16 ? 1
                      : FMT == WeightMat::kFragFP8 ? (NT == 1 ? 2 : 1)
                                                    : (NT == 1 ? 3 : NT == 2 ? 2 : 1);
  // Two row tiles a block halve the activation reads; one keeps small grids (o_proj's 180 tiles,
  // qkv's 320) covering the SMs.
  const bool one_tile = size_t(tiles) * groups < size_t(8 * 132);
  // MXFP4 with one n-tile: grouped launches take the unit-walking kernel (skinny_units.cu)
  // wherever it takes the problem. The block-per-tile shapes below serve the rest (dense MXFP4
  // layers, and grouped launches with GPTOSS_SKINNY_OPT=1): over large grids (1,400 or more
  // (tile, expert) pairs) four row tiles a block, one chunk in flight (bench-kernels, H200,
  // seventh session, 120b: gate_up at 1 token 18.9 -> 16.8 us against two in flight; down at 32
  // tokens 124 -> 114 us against eight row tiles); grouped launches below that (down at 1 token:
  // 720 pairs) two row tiles, four chunks in flight (13.3 -> 11.6 us against one row tile, three).
  if constexpr (FMT == WeightMat::kFragMXFP4 && NT == 1) {
    if (ks != 4 && skinny_units_enabled() && launch_skinny_units(a, tiles, groups, XF16, 0, ks == 8, s)) return;
    if (ks != 4 && size_t(tiles) * groups >= 1400) return launch_shape<FMT, NT, 8, 4, 1, XF16, true>(a, tiles, groups, s);
    if (ks != 4 && a.grouped && size_t(tiles) * groups >= 512) return launch_shape<FMT, NT, 8, 2, 4, XF16, true>(a, tiles, groups, s);
  }
  if constexpr (FMT == WeightMat::kFragBF16 && NT == 1) {
    // bf16 at K = 2880 (qkv's decode copy): two chunks in flight (bench-kernels, H200, eighth
    // session: 120b qkv at 1 token 11.67 -> 10.66 us; o_proj's K = 4096 was slower so: 9.09 -> 9.51).
    if (ks != 4 && one_tile && a.W.K == 2880) {
      if (launch_staged<FMT, NT, 8, 1, 2, XF16>(a, tiles, groups, dense_stage_digits() % 10, s)) return;
      return launch_shape<FMT, NT, 8, 1, 2, XF16, true>(a, tiles, groups, s);
    }
  }
  if constexpr ((FMT == WeightMat::kFragFP8 || FMT == WeightMat::kFragMXFP4) && NT == 1) {
    // (MXFP4: qkv with --mxfp4-layers; its scales staged beside the codes.)
    if (ks != 4 && one_tile && a.W.K == 2880 &&
        launch_staged<FMT, NT, 8, 1, kPF, XF16>(a, tiles, groups, dense_stage_digits() % 10, s))
      return;
  }
  if constexpr (NT == 1) {
    // o_proj (K = 4096): 16 warps over K and two row tiles a block, so each block stages the
    // activation rows once for two tiles (bench-kernels, H200, tenth session, 120b, us: bf16 9.04
    // -> 8.71 at 1 token, 12.37 -> 10.40 at 8; fp8 7.13 -> 6.02, 10.94 -> 8.06). qkv (K = 2880)
    // and lm_head were slower so. Only where the shape is ours to choose (ks 0): the
    // batch-invariant mode asks for 8 warps over K at every batch size (the same sums for a row
    // whatever M).
    const int fmt_bit = FMT == WeightMat::kFragMXFP4 ? 2 : 1;
    if (ks == 0 && one_tile && !a.grouped && a.W.K == 4096 && (dense_two_tile_bits() & fmt_bit)) {
      if (launch_staged<FMT, NT, 16, 2, FMT == WeightMat::kFragMXFP4 ? 3 : 1, XF16>(a, tiles, groups,
                                                                                dense_stage_digits() / 10 % 10, s))
        return;
      return launch_shape<FMT, NT, 16, 2, FMT == WeightMat::kFragMXFP4 ? 3 : 1, XF16, true>(a, tiles, groups, s);
    }
  }
  if (ks == 4)
    launch_shape<FMT, NT, 4, 2, kPF, XF16>(a, tiles, groups, s);
  else if (one_tile)
    launch_shape<FMT, NT, 8, 1, kPF, XF16, NT == 1>(a, tiles, groups, s);
  else  // (skinny_dense_8x2 says when a dense bf16 launch lands here: the lm_head screen's recompute)
    launch_shape<FMT, NT, 8, 2, kPF, XF16, NT == 1>(a, tiles, groups, s);
}

template <int FMT, bool XF16>
void launch_nt(const SkinnyArgs& a, int max_tokens, int tiles, int groups, int ks, cudaStream_t s) {
  if (max_tokens <= 8)
    launch_fmt<FMT, 1, XF16>(a, tiles, groups, ks, s);
  else if (max_tokens <= 16)
    launch_fmt<FMT, 2, XF16>(a, tiles, groups, ks, s);
  else
    launch_fmt<FMT, 4, XF16>(a, tiles, groups, ks, s);
}


}  // namespace

void set_skinny_variant(int v) { g_skinny_variant = v; }
void set_norm_in_cluster(int blocks) { g_norm_in_cluster = checked_norm_in_cluster(blocks, "set_norm_in_cluster"); }
bool set_norm_in_multicast(bool on) {
  const bool was = g_norm_in_multicast;
  g_norm_in_multicast = on;
  return was;
}
const char* last_norm_in_staging() { return g_norm_in_staging; }

const char* skinny_variant_name(int v) {
  static const char* names[] = {"default (by grid)", "ks8 rt4 pf2", "ks16 rt2 pf3", "ks8 rt1 pf4",
                                "ks16 rt1 pf4", "ks8 rt2 pf4", "ks4 rt2 pf4", "ks16 rt4 pf2",
                                "ks8 rt8 pf1", "ks4 rt4 pf2", "ks8 rt4 pf1",
                                "units ks8 rt4 pf1", "units ks8 rt1 pf4", "units ks8 rt2 pf2",
                                "units ks8 rt2 pf4", "units ks8 rt6 pf1", "units ks8 rt8 pf1",
                                "units ks8 rt2 pf6 16w", "units ks8 rt4 pf3 16w", "units ks8 rt6 pf2 16w",
                                "ks1 rt1 pf4", "warp units rt1 pf4", "warp units rt1 pf8 16w",
                                "warp units rt2 pf4 16w", "warp units rt1 pf4 32w", "warp units rt1 pf8 16w 16-token passes",
                                "warp units rt1 pf6 16w 16-token passes"};
  return v >= 0 && v < kSkinnyVariants ? names[v] : "?";
}

bool skinny_router_fold(const WeightMat& W, const bf16_t* A, int lda, const Epilogue& epi, const RouterFold& fold,
                        cudaStream_t s) {
  // o_proj's shape at 1-8 tokens (launch_fmt: K = 4096, 16 warps over K, two row tiles a block,
  // staged), with the fold's bulk copies beside its staged weights.
  const int tiles = W.N / 16;
  const int fmt_bit = W.fmt == WeightMat::kFragMXFP4 ? 2 : 1;
  if (!frag_packable(W) || epi.mode != Epilogue::kAddF32 || W.K != 4096 || tiles % 2 != 0 ||
      size_t(tiles) >= size_t(8 * 132) || !(dense_two_tile_bits() & fmt_bit) || fold.E < 1 || fold.n < 1 ||
      fold.n > kRouterFoldMaxTokens || fold.n * fold.k > 32 ||
      fold.E > kRouterFoldMaxE || fold.k < 1 || fold.k > 8 || fold.H != W.N || !fold.w_t || !fold.xg || !fold.bias ||
      !fold.bias_l2)
    return false;
  SkinnyArgs a{W, A, lda, fold.n, false, false, MoeRouting{}, epi};
  a.r.fold = fold;
  a.xs_rows = fold.n;
  a.stage_async = stage_async_enabled();
  const int sd = dense_stage_digits() / 10 % 10;
  const bool ok = with_router_fold_capacity(fold.n, [&](auto cap) {
    constexpr int CAP = decltype(cap)::value;
    switch (W.fmt) {
      case WeightMat::kFragBF16: return launch_staged<WeightMat::kFragBF16, 1, 16, 2, 1, false, CAP>(a, tiles, 1, sd, s);
      case WeightMat::kFragFP8: return launch_staged<WeightMat::kFragFP8, 1, 16, 2, 1, false, CAP>(a, tiles, 1, sd, s);
      case WeightMat::kFragMXFP4: return launch_staged<WeightMat::kFragMXFP4, 1, 16, 2, 3, false, CAP>(a, tiles, 1, sd, s);
      default: return false;
    }
  });
  if (ok) GPTOSS_CUDA_LAUNCH_CHECK();
  return ok;
}

template <int FMT, int PF>
bool launch_norm_in(const SkinnyArgs& a, int tiles, int sd, cudaStream_t s) {
  // Clusters need the grid (one row tile a block) and the row's float4s to split evenly.
  const int cl = g_norm_in_cluster, n4 = a.W.K / 4;
  const bool fits = tiles % cl == 0 && n4 % cl == 0 && n4 <= kNormInRowMax && n4 / cl <= 2 * 8 * 32;
  if (fits && cl == 4 && g_norm_in_multicast && expert_gemm_v3_available())
    return launch_staged<FMT, 1, 8, 1, PF, false, 0, true, 4, true>(a, tiles, 1, sd, s);
  switch (fits ? cl : 1) {
    case 2: return launch_staged<FMT, 1, 8, 1, PF, false, 0, true, 2>(a, tiles, 1, sd, s);
    case 4: return launch_staged<FMT, 1, 8, 1, PF, false, 0, true, 4>(a, tiles, 1, sd, s);
    case 8: return launch_staged<FMT, 1, 8, 1, PF, false, 0, true, 8>(a, tiles, 1, sd, s);
    default: return launch_staged<FMT, 1, 8, 1, PF, false, 0, true>(a, tiles, 1, sd, s);
  }
}

bool skinny_norm_in(const WeightMat& W, const NormIn& in, const Epilogue& epi, cudaStream_t s) {
  // qkv's one-token shape (launch_fmt: K = 2880, 8 warps over K, one row tile a block, staged).
  const int tiles = W.N / 16;
  if (!frag_packable(W) || W.K != 2880 || W.K / 4 > kNormPer * 8 * 32 || size_t(tiles) >= size_t(8 * 132) ||
      !in.x || !in.moe || !in.norm_w || epi.mode == Epilogue::kScatterAdd || epi.mode == Epilogue::kSwiGLU)
    return false;
  SkinnyArgs a{W, nullptr, W.K, 1, false, false, MoeRouting{}, epi};
  a.norm_in = in;
  a.xs_rows = 1;
  const int sd = dense_stage_digits() % 10;
  bool ok = false;
  switch (W.fmt) {
    case WeightMat::kFragBF16: ok = launch_norm_in<WeightMat::kFragBF16, 2>(a, tiles, sd, s); break;
    case WeightMat::kFragFP8: ok = launch_norm_in<WeightMat::kFragFP8, 2>(a, tiles, sd, s); break;
    case WeightMat::kFragMXFP4: ok = launch_norm_in<WeightMat::kFragMXFP4, 3>(a, tiles, sd, s); break;
    default: break;
  }
  if (ok) GPTOSS_CUDA_LAUNCH_CHECK();
  return ok;
}

bool skinny_dense_8x2(const WeightMat& W, int M, int ks_override) {
  // launch_fmt<kFragBF16, 1> for a dense launch: no variant forced, a grid past one tile a block
  // (one_tile false, so neither the K = 2880 nor the K = 4096 shape), no 4-warp override: its
  // last line, launch_shape<kFragBF16, 1, 8, 2, 1, false, true>.
  const int tiles = W.N / 16;
  return W.fmt == WeightMat::kFragBF16 && frag_packable(W) && M >= 1 && M <= 8 && g_skinny_variant == 0 &&
         size_t(tiles) >= size_t(8 * 132) && ks_override != 4;
}

void skinny_linear(const WeightMat& W, const void* A, bool a_f16, int lda, int M, int pairs, int E, bool grouped,
                   bool gather_a, const MoeRouting& r, const Epilogue& epi, int ks_override, cudaStream_t s) {
  if (!frag_packable(W)) throw Error("skinny_linear: weights not in the fragment layout");
  if (epi.mode == Epilogue::kScatterAdd) throw Error("skinny_linear: scatter-add is done by moe_combine");
  if (epi.mode == Epilogue::kSwiGLU && !W.swiglu_rows) throw Error("skinny_linear: SwiGLU needs paired rows");
  const bool want_f16 = W.fmt != WeightMat::kFragBF16;
  if (a_f16 && !want_f16) throw Error("skinny_linear: bf16 weights need bf16 activations");
  SkinnyArgs a{W, A, lda, M, grouped, gather_a, r, epi};
  a.xs_rows = std::min(M, 8);  // a one-n-tile pass stages at most min(M, 8) rows (a group has <= M)
  a.stage_async = stage_async_enabled();
  const int tiles = W.N / 16;
  const int groups = grouped ? moe_max_groups(pairs, E) : 1;
  a.groups = groups;
  a.pairs = pairs;
  // Tokens an n-tile pass covers: dense, all M; grouped, sized by the mean group (pairs over the
  // experts they can touch), since a group with more tokens takes another pass (its weights then
  // come from L2) while padding every group to the largest possible one wastes MMAs and
  // activation loads on all of them (120b at 32 tokens: ~1.6 tokens per touched expert).
  const int max_tokens = grouped ? (pairs + groups - 1) / groups : M;
  // Warps splitting K (bench-kernels, 120b experts, H200, shared-memory activations): 8 was the
  // fastest or within 5% at 1 and 8 tokens (gate_up 23.7 vs 26.8 us at 4; 133.9 vs 140.2). 0
  // (no override): 8, or another shape where one measured faster (launch_fmt); 8 forces it.
  const int ks = ks_override;
  switch (W.fmt) {
    case WeightMat::kFragMXFP4:
      if (a_f16) launch_nt<WeightMat::kFragMXFP4, true>(a, max_tokens, tiles, groups, ks, s);
      else launch_nt<WeightMat::kFragMXFP4, false>(a, max_tokens, tiles, groups, ks, s);
      break;
    case WeightMat::kFragFP8:
      if (a_f16) launch_nt<WeightMat::kFragFP8, true>(a, max_tokens, tiles, groups, ks, s);
      else launch_nt<WeightMat::kFragFP8, false>(a, max_tokens, tiles, groups, ks, s);
      break;
    case WeightMat::kFragBF16: launch_nt<WeightMat::kFragBF16, false>(a, max_tokens, tiles, groups, ks, s); break;
    default: throw Error("skinny_linear: not a fragment format");
  }
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
