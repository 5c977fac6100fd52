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
// (MoE) launches take blockIdx.y as the expert group and loop over its tokens 8 * NT at a time.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/tensor_core_ptx.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/frag_layout.cuh"
#include "backend/cuda/kernels/linear/skinny_chunk.cuh"

namespace gptoss::cuda {

namespace {

using namespace skinny;

// Occupancy target: 24 warps an SM with one n-tile (activations in shared memory), 16 with more
// (their activations sit in registers). Four row tiles at 24 warps spill 12 bytes and were still
// faster than at 16 warps (bench-kernels, H200).
constexpr int skinny_min_blocks(int NT, int KS, int RT) {
  const int warps = NT == 1 && RT <= 4 ? 24 : 16;
  return warps / KS > 0 ? warps / KS : 1;
}
// Stages the activation rows of pairs tok0 .. tok0 + ntok - 1 (gathered through pair_token when
// a.gather_a) into xs, K + 8 halves a row; bf16 rows become fp16 here when F16 (once per block
// rather than per chunk and row tile in chunk_mma: the same rounding, so the same numbers).
// Every thread of the block takes part; the caller brackets it with __syncthreads.
template <bool F16>
__device__ __forceinline__ void stage_rows(const SkinnyArgs& a, int tok0, int ntok, uint16_t* xs, int xs_ld) {
  const char* A = static_cast<const char*>(a.A);
  const int vecs = a.W.K / 8;
  for (int i = threadIdx.x; i < ntok * vecs; i += blockDim.x) {
    const int t = i / vecs, v = i % vecs;
    const int p = tok0 + t;
    const int ar = a.gather_a ? a.r.pair_token[p] : p;
    uint4 x = __ldg(reinterpret_cast<const uint4*>(A + size_t(ar) * a.lda * 2) + v);
    if constexpr (F16) {
      x.x = bf16x2_to_f16x2(x.x);
      x.y = bf16x2_to_f16x2(x.y);
      x.z = bf16x2_to_f16x2(x.z);
      x.w = bf16x2_to_f16x2(x.w);
    }
    *reinterpret_cast<uint4*>(xs + size_t(t) * xs_ld + v * 8) = x;
  }
}

// The K slices of a block's row tiles meet in shared memory (red: [KS][RT][NT][4][32] f32) and
// warp r < nrt finishes row tile tile0 + r, adding the slices in warp order (fixed: the result
// does not depend on the grid), then stores it.
template <int FMT, int NT, int KS, int RT>
__device__ __forceinline__ void finish_tiles(const SkinnyArgs& a, float* red, const float (&acc)[RT][NT][4], int nrt,
                                             int tile0, int expert, int tok0, int row_end) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  __syncthreads();  // red is free (the previous pass's finishing warps are done)
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int v = 0; v < 4; ++v) red[(((warp * RT + r) * NT + i) * 4 + v) * 32 + lane] = acc[r][i][v];
  __syncthreads();
  if (warp >= nrt) return;
  float fin[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < KS; ++w) sum += red[(((w * RT + warp) * NT + i) * 4 + v) * 32 + lane];
      fin[i][v] = sum;
    }
  // Rows g, g + 8 of the tile; tokens 2 tq, 2 tq + 1 of each n-tile.
  const TileRows tr = tile_rows<FMT>(a, expert, tile0 + warp, g);
#pragma unroll
  for (int i = 0; i < NT; ++i) tile_store(a, tr, tile0 + warp, g, tq, tok0 + 8 * i, row_end, fin[i]);
}

// CC: the chunks of a row (K / 64) at compile time, or 0 for any K. With CC, every weight and
// scale load is a lane pointer plus an immediate offset (the pointers advance once per PF
// chunks), and the host launches it only where the row tiles fill every block (no tail checks).
template <int FMT, int NT, int KS, int RT, int PF, bool XF16, int CC>
__global__ void __launch_bounds__(KS * 32, skinny_min_blocks(NT, KS, RT)) skinny_mma_kernel(SkinnyArgs a) {
  static_assert(PF >= 1 && RT <= KS, "prefetch depth; one finishing warp per row tile");
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int N = a.W.N, C = CC > 0 ? CC : a.W.K / 64, T = N / 16;
  const int tile0 = blockIdx.x * RT;
  const int nrt = CC > 0 ? RT : min(RT, T - tile0);  // row tiles of this block (the last block may have fewer)
  // Shared memory: the partial sums [KS][RT][NT][4][32] f32, then (one n-tile: XS) the block's
  // a.xs_rows (min(M, 8)) activation rows, K + 8 halves each (the pad spreads the rows over the
  // banks), so the B fragments are shared-memory reads and the registers hold only weights in flight.
  constexpr bool XS = NT == 1;
  // MXFP4 and fp8 weights multiply fp16 activations: bf16 ones are converted while staged.
  constexpr bool kStageF16 = XS && !XF16 && FMT != WeightMat::kFragBF16;
  constexpr bool kChunkF16 = XF16 || kStageF16;
  extern __shared__ __align__(16) float red[];
  uint16_t* xs = reinterpret_cast<uint16_t*>(red + KS * RT * NT * 4 * 32);
  const int xs_ld = a.W.K + 8;

  int row_begin = 0, row_end = a.M, expert = 0;
  WChunk<FMT> wbuf[PF][RT];
  const int my_n = C > warp ? (C - 1 - warp) / KS + 1 : 0;  // chunks of this warp
  size_t tc0 = size_t(tile0) * C;
  // With CC: this lane's weight and scale pointers (wl, sl) at its next chunk group; chunk
  // (rel, r) of the group is at + (r CC + rel KS) chunks, an immediate offset, and the pointers
  // advance by PF KS chunks a group: no address arithmetic per load.
  const uint4* wl = nullptr;
  const uint32_t* sl = nullptr;
  auto set_lane_ptrs = [&]() {
    wl = static_cast<const uint4*>(a.W.w) + (tc0 + warp) * (chunk_bytes<FMT>() / 16) + lane;
    if constexpr (FMT == WeightMat::kFragMXFP4) sl = reinterpret_cast<const uint32_t*>(a.W.scales) + (tc0 + warp) * 8 + g;
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
  if (early) {
#pragma unroll
    for (int u = 0; u < PF; ++u)
      if (u < my_n) load_chunk_w(u, u);
    pdl_wait();
  }
  pdl_trigger();
  const char* A = static_cast<const char*>(a.A);

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
      __syncthreads();  // the previous pass's readers are done with xs
      stage_rows<kStageF16>(a, tok0, ntok, xs, xs_ld);
      __syncthreads();
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
    auto step = [&](int base, int u) {
      if (base + u < my_n) {
        const int xu = XS ? 0 : u;
        // (Reading the next chunk's activations a chunk ahead was measured: no faster.)
        if constexpr (XS) x_from_smem(warp + (base + u) * KS, xbuf[0]);
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

    finish_tiles<FMT, NT, KS, RT>(a, red, acc, nrt, tile0, expert, tok0, row_end);
  }
}

// Grouped MXFP4 launches past one wave of blocks (2-64 tokens touch 8-111 experts: 720-10,000
// (group, row-tile block) pairs at 120b's gate_up). The work is cut into units of one pass (<= 8
// of a group's tokens) over one block of RT row tiles, in (group, pass, row-tile block) order,
// and a grid of as many blocks as the GPU holds at once takes a contiguous, equal run each (a
// group of 17 tokens is three passes, so three times the units: blocks stay balanced whatever
// the groups' sizes). Against one block a (group, row-tile block), as skinny_mma_kernel runs it:
//  - the routing is read once a block, all groups at once, not once a (group, row-tile block);
//  - the next unit's first weight loads go out before the current unit's reduction and stores,
//    so a block never starts a unit on an empty pipe;
//  - a pass's activation rows are staged once for all the block's units of that pass.
// Each row's sums run in the same order as in skinny_mma_kernel with the same KS (chunks per
// warp, warps added in order): the two agree bit for bit. K = 64 CC, T % RT == 0, at most
// KS * 32 - 1 groups (a thread each in the scan).
template <int KS, int RT, int PF, bool XF16, int CC>
__global__ void __launch_bounds__(KS * 32, skinny_min_blocks(1, KS, RT)) skinny_units_kernel(SkinnyArgs a) {
  constexpr int FMT = WeightMat::kFragMXFP4, C = CC, kMaxGroups = KS * 32;
  static_assert(PF >= 1 && RT <= KS && CC > 0, "prefetch depth; one finishing warp per row tile; fixed K");
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2;
  const int T = a.W.N / 16, TB = T / RT;  // row-tile blocks an expert
  extern __shared__ __align__(16) float red[];
  uint16_t* xs = reinterpret_cast<uint16_t*>(red + KS * RT * 4 * 32);
  const int xs_ld = C * 64 + 8;
  const int my_n = C > warp ? (C - 1 - warp) / KS + 1 : 0;
  // Per group: its first unit (then the total at [ngroups]), expert and sorted rows.
  __shared__ int s_unit0[kMaxGroups], s_expert[kMaxGroups], s_start[kMaxGroups], s_end[kMaxGroups];
  __shared__ int s_warp_passes[KS];

  // The routing, every group in one L2 round trip (the group arrays have an entry for each of
  // the a.groups grid rows, so reading past ngroups is in bounds), and the units by a scan of
  // the groups' passes.
  if (!a.r.settled) pdl_wait();
  const int t = threadIdx.x;
  const int ngroups = __ldcg(a.r.counts);
  int gs = 0, ge = 0, gx = 0;
  if (t < a.groups) {
    gs = __ldcg(a.r.group_start + t);
    ge = __ldcg(a.r.group_end + t);
    gx = __ldcg(a.r.group_expert + t);
  }
  const int passes = t < ngroups ? (ge - gs + 7) / 8 : 0;
  int incl = passes;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += y;
  }
  if (lane == 31) s_warp_passes[warp] = incl;
  __syncthreads();
  int total = 0;
#pragma unroll
  for (int w = 0; w < KS; ++w) {
    const int c = s_warp_passes[w];
    if (w < warp) incl += c;
    total += c;
  }
  if (t < ngroups) {
    s_unit0[t] = (incl - passes) * TB;
    s_expert[t] = gx;
    s_start[t] = gs;
    s_end[t] = ge;
  }
  if (t == ngroups) s_unit0[t] = total * TB;
  __syncthreads();
  const int units = total * TB;
  const int u0 = int(int64_t(blockIdx.x) * units / gridDim.x);
  const int u1 = int(int64_t(blockIdx.x + 1) * units / gridDim.x);
  if (u0 >= u1) { pdl_trigger(); return; }  // uniform over the block

  struct Unit {
    int group, tile0, expert, tok0, tok_end;
  };
  int cursor = 0;  // the group of the last unit decoded (units only grow within a block)
  auto unit_at = [&](int u) {
    while (s_unit0[cursor + 1] <= u) ++cursor;
    Unit x;
    x.group = cursor;
    const int rel = u - s_unit0[cursor], pass = rel / TB;
    x.tile0 = (rel - pass * TB) * RT;
    x.expert = s_expert[cursor];
    x.tok0 = s_start[cursor] + 8 * pass;
    x.tok_end = min(x.tok0 + 8, s_end[cursor]);
    return x;
  };
  WChunk<FMT> wbuf[PF][RT];
  const uint4* wl = nullptr;
  const uint32_t* sl = nullptr;
  // This lane's weight and scale pointers at its first chunk of a unit, and the unit's first PF chunks.
  auto load_first = [&](const Unit& x) {
    const size_t tc0 = (size_t(x.expert) * T + x.tile0) * C + warp;
    wl = static_cast<const uint4*>(a.W.w) + tc0 * (chunk_bytes<FMT>() / 16) + lane;
    sl = reinterpret_cast<const uint32_t*>(a.W.scales) + tc0 * 8 + g;
#pragma unroll
    for (int u = 0; u < PF; ++u)
      if (u < my_n)
#pragma unroll
        for (int r = 0; r < RT; ++r) load_w_at<FMT>(wl, sl, r * CC + u * KS, wbuf[u][r]);
  };
  Unit cur = unit_at(u0);
  load_first(cur);
  if (a.r.settled) pdl_wait();
  pdl_trigger();

  int staged_tok0 = -1;  // the pass whose rows xs holds (its first sorted pair)
  for (int u = u0; u < u1; ++u) {
    if (warp < RT) prefetch_tile_rows<FMT>(a, cur.expert, cur.tile0 + warp, g);
    const int ntok = cur.tok_end - cur.tok0;
    if (cur.tok0 != staged_tok0) {
      __syncthreads();  // every warp is done reading xs
      stage_rows<!XF16>(a, cur.tok0, ntok, xs, xs_ld);
      __syncthreads();
      staged_tok0 = cur.tok0;
    }
    const uint16_t* xs_lane = xs + size_t(g) * xs_ld + 8 * (lane & 3);
    float acc[RT][1][4];
#pragma unroll
    for (int r = 0; r < RT; ++r) acc[r][0][0] = acc[r][0][1] = acc[r][0][2] = acc[r][0][3] = 0.f;
    for (int base = 0; base < my_n; base += PF) {
#pragma unroll
      for (int v = 0; v < PF; ++v) {
        if (base + v < my_n) {
          uint4 x[1][2];
          if (g < ntok) {
            const uint4* p = reinterpret_cast<const uint4*>(xs_lane + (warp + (base + v) * KS) * 64);
            x[0][0] = p[0];
            x[0][1] = p[4];
          } else {
            x[0][0] = x[0][1] = make_uint4(0, 0, 0, 0);
          }
#pragma unroll
          for (int r = 0; r < RT; ++r) chunk_mma<FMT, 1, true>(wbuf[v][r], x, acc[r]);
          if (base + v + PF < my_n) {
            // As in skinny_mma_kernel: the loads after this chunk's MMAs, which free their registers.
            if constexpr (RT == 4) asm volatile("" ::: "memory");
#pragma unroll
            for (int r = 0; r < RT; ++r) load_w_at<FMT>(wl, sl, r * CC + (v + PF) * KS, wbuf[v][r]);
          }
        }
      }
      wl += PF * KS * (chunk_bytes<FMT>() / 16);
      sl += PF * KS * 8;
    }
    const Unit done = cur;
    if (u + 1 < u1) {
      // The next unit's first weights go out now; this unit's reduction and stores run under them.
      cur = unit_at(u + 1);
      load_first(cur);
    }
    finish_tiles<FMT, 1, KS, RT>(a, red, acc, RT, done.tile0, done.expert, done.tok0, done.tok_end);
  }
}

// GPTOSS_SKINNY_OPT (bench comparisons; unset = all on): bit 0 the compile-time chunk counts
// (CC), bit 1 the unit-walking grouped kernel (which needs CC). 0 turns both off, 1 keeps CC only.
int skinny_opt_bits() {
  static const int bits = [] {
    const char* e = std::getenv("GPTOSS_SKINNY_OPT");
    return e && *e ? std::atoi(e) : 3;
  }();
  return bits;
}
bool skinny_cc_enabled() { return (skinny_opt_bits() & 1) != 0; }
bool skinny_units_enabled() { return (skinny_opt_bits() & 3) == 3; }

// The unit-walking grouped kernel (skinny_units_kernel) for this launch, if it takes it (K of
// 2880 or 4096, whole row-tile blocks, fewer groups than threads) and its units (at least one a
// (group, row-tile block)) fill at least `min_fill` of the blocks the GPU holds at once. The
// grid: every block the GPU holds at once, or one per unit of the host's bound if fewer.
template <int KS, int RT, int PF, bool XF16>
bool launch_units(const SkinnyArgs& a, int tiles, int groups, double min_fill, cudaStream_t s) {
  if (!a.grouped || !skinny_cc_enabled() || tiles % RT != 0 || (a.W.K != 2880 && a.W.K != 4096) ||
      groups >= KS * 32)
    return false;
  const size_t smem = size_t(KS) * RT * 4 * 32 * sizeof(float) + size_t(a.xs_rows) * (a.W.K + 8) * 2;
  auto go = [&](auto k) {
    // Blocks an SM holds at this shared-memory size (cached per thread: TP ranks may share a process).
    thread_local size_t cached_smem = 0;
    thread_local int cached_blocks = 0;
    if (cached_smem != smem) {
      if (smem > 48 * 1024) GPTOSS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      int b = 0;
      GPTOSS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, k, KS * 32, smem));
      cached_smem = smem;
      cached_blocks = std::max(b, 1);
    }
    const size_t resident = size_t(sm_count()) * cached_blocks, units = size_t(tiles / RT) * groups;
    if (double(units) < min_fill * double(resident)) return false;
    launch_pdl(k, dim3(unsigned(std::min(resident, units))), dim3(KS * 32), smem, s, a);
    return true;
  };
  return a.W.K == 2880 ? go(skinny_units_kernel<KS, RT, PF, XF16, 45>) : go(skinny_units_kernel<KS, RT, PF, XF16, 64>);
}

// The unit-walking kernel's shape by the grid (see launch_fmt); false if it takes no shape.
template <bool XF16>
bool launch_units_auto(const SkinnyArgs& a, int tiles, int groups, cudaStream_t s) {
  return launch_units<8, 4, 1, XF16>(a, tiles, groups, 0.5, s) || launch_units<8, 2, 2, XF16>(a, tiles, groups, 0, s);
}

template <int FMT, int NT, int KS, int RT, int PF, bool XF16, bool TRY_CC = false>
void launch_shape(const SkinnyArgs& a, int tiles, int groups, cudaStream_t s) {
  const size_t smem = size_t(KS) * RT * NT * 4 * 32 * sizeof(float) +
                      (NT == 1 ? size_t(a.xs_rows) * (a.W.K + 8) * 2 : 0);
  auto go = [&](auto k) {
    if (smem > 48 * 1024) GPTOSS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    launch_pdl(k, dim3((tiles + RT - 1) / RT, groups), dim3(KS * 32), smem, s, a);
  };
  if constexpr (TRY_CC) {
    if (skinny_cc_enabled() && tiles % RT == 0) {
      if (a.W.K == 2880) return go(skinny_mma_kernel<FMT, NT, KS, RT, PF, XF16, 45>);
      if (a.W.K == 4096) return go(skinny_mma_kernel<FMT, NT, KS, RT, PF, XF16, 64>);
    }
  }
  go(skinny_mma_kernel<FMT, NT, KS, RT, PF, XF16, 0>);
}

int g_skinny_variant = 0;  // bench-kernels: other MXFP4 one-n-tile shapes (set_skinny_variant)

template <int FMT, int NT, bool XF16>
void launch_fmt(const SkinnyArgs& a, int tiles, int groups, int ks, cudaStream_t s) {
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
      case 11: if (launch_units<8, 4, 1, XF16>(a, tiles, groups, 0, s)) return; break;
      case 12: if (launch_units<8, 1, 4, XF16>(a, tiles, groups, 0, s)) return; break;
      case 13: if (launch_units<8, 2, 2, XF16>(a, tiles, groups, 0, s)) return; break;
      case 14: if (launch_units<8, 2, 4, XF16>(a, tiles, groups, 0, s)) return; break;
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
  // MXFP4 with one n-tile over large grids (1,400 or more (tile, expert) pairs): four row tiles
  // a block, one chunk in flight (bench-kernels, H200, seventh session, 120b: gate_up at 1 token
  // 18.9 -> 16.8 us against two in flight; down at 32 tokens 124 -> 114 us against eight row
  // tiles). Grouped launches below that (down at 1 token: 720 pairs): two row tiles, four chunks
  // in flight (13.3 -> 11.6 us against one row tile, three in flight).
  if constexpr (FMT == WeightMat::kFragMXFP4 && NT == 1) {
    // Grouped: the unit-walking kernel, four row tiles with one chunk in flight where that fills
    // half the GPU's blocks or more, else two with two (down at one token: 180 against 360 units;
    // bench-kernels, H200, eighth session: 10.5 -> 8.6 us against skinny_mma_kernel).
    if (ks == 8 && skinny_units_enabled() && launch_units_auto<XF16>(a, tiles, groups, s)) return;
    if (ks == 8 && size_t(tiles) * groups >= 1400) return launch_shape<FMT, NT, 8, 4, 1, XF16, true>(a, tiles, groups, s);
    if (ks == 8 && a.grouped && size_t(tiles) * groups >= 512) return launch_shape<FMT, NT, 8, 2, 4, XF16, true>(a, tiles, groups, s);
  }
  if constexpr (FMT == WeightMat::kFragBF16 && NT == 1) {
    // bf16 at K = 2880 (qkv's decode copy): two chunks in flight (bench-kernels, H200, eighth
    // session: 120b qkv at 1 token 11.67 -> 10.66 us; o_proj's K = 4096 was slower so: 9.09 -> 9.51).
    if (ks != 4 && one_tile && a.W.K == 2880) return launch_shape<FMT, NT, 8, 1, 2, XF16, true>(a, tiles, groups, s);
  }
  if (ks == 4)
    launch_shape<FMT, NT, 4, 2, kPF, XF16>(a, tiles, groups, s);
  else if (one_tile)
    launch_shape<FMT, NT, 8, 1, kPF, XF16, NT == 1>(a, tiles, groups, s);
  else
    launch_shape<FMT, NT, 8, 2, kPF, XF16, NT == 1>(a, tiles, groups, s);
}

// Diagnostic (bench-kernels): the same grid reading the same bytes of the routed experts with
// plain 16-byte loads and no math: the memory floor of a grouped MXFP4 launch.
__global__ void stream_experts_kernel(const uint4* __restrict__ w, int T, int C, MoeRouting r, uint32_t* sink) {
  pdl_wait();
  const int gi = blockIdx.y;
  if (gi >= r.counts[0]) { pdl_trigger(); return; }
  pdl_trigger();
  const uint4* base = w + ((size_t(r.group_expert[gi]) * T + blockIdx.x) * C) * 32;
  uint32_t acc = 0;
  const int n = C * 32;
#pragma unroll 4
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    uint4 v = __ldg(base + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads
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
const char* skinny_variant_name(int v) {
  static const char* names[] = {"default (by grid)", "ks8 rt4 pf2", "ks16 rt2 pf3", "ks8 rt1 pf4",
                                "ks16 rt1 pf4", "ks8 rt2 pf4", "ks4 rt2 pf4", "ks16 rt4 pf2",
                                "ks8 rt8 pf1", "ks4 rt4 pf2", "ks8 rt4 pf1",
                                "units ks8 rt4 pf1", "units ks8 rt1 pf4", "units ks8 rt2 pf2",
                                "units ks8 rt2 pf4"};
  return v >= 0 && v < kSkinnyVariants ? names[v] : "?";
}

void stream_experts(const WeightMat& W, int pairs, int E, const MoeRouting& r, uint32_t* sink, cudaStream_t s) {
  dim3 grid(W.N / 16, moe_max_groups(pairs, E));
  launch_pdl(stream_experts_kernel, grid, dim3(128), 0, s, static_cast<const uint4*>(W.w), W.N / 16, W.K / 64, r, sink);
  GPTOSS_CUDA_LAUNCH_CHECK();
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
  const int tiles = W.N / 16;
  const int groups = grouped ? moe_max_groups(pairs, E) : 1;
  a.groups = groups;
  // Tokens an n-tile pass covers: dense, all M; grouped, sized by the mean group (pairs over the
  // experts they can touch), since a group with more tokens takes another pass (its weights then
  // come from L2) while padding every group to the largest possible one wastes MMAs and
  // activation loads on all of them (120b at 32 tokens: ~1.6 tokens per touched expert).
  const int max_tokens = grouped ? (pairs + groups - 1) / groups : M;
  // Warps splitting K (bench-kernels, 120b experts, H200, shared-memory activations): 8 was the
  // fastest or within 5% at 1 and 8 tokens (gate_up 23.7 vs 26.8 us at 4; 133.9 vs 140.2).
  const int ks = ks_override ? ks_override : 8;
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
