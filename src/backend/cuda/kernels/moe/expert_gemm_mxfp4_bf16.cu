// Grouped MoE expert GEMM for prefill, version 2: MXFP4 weights (the checkpoint layout, as
// loaded) x bf16 activations -> fp32 accumulators on mma.sync m16n8k16, one CTA per
// (expert row tile of up to 128 sorted pairs, 128 weight rows). Version 1 is gemm_kernel in
// kernels/linear/gemm_mma.cu; linear_grouped picks between them (GPTOSS_EXPERT_GEMM=v1|v2).
//
// Why it is shaped this way (v1 ran at ~150 TFLOP/s on an H200):
// - Weights are decoded once per CTA, straight from shared memory into the MMA's B registers
//   (no bf16 copy of the tile in shared memory, no second barrier): the four warps split the
//   128 weight rows (32 each) and every warp covers all of the tile's token rows, so no element
//   is decoded twice in a CTA. Decoding costs ~2.6 integer ops a weight, amortized over every
//   token row of the tile, hence the tall tile (128 rows; 16-row slices past the expert's last
//   pair are skipped, so an expert with 70 pairs costs 80 rows of MMA and one decode).
// - K is permuted inside each 32-element scale block, the same way on both operands (a dot
//   product does not care about the order of its terms): lane quad tq takes natural elements
//   8 tq .. 8 tq + 7 of the block, i.e. one 32-bit word of codes (bytes 4 tq .. 4 tq + 3) and one
//   16-byte activation load per row. MMA k-step j of the block maps k positions 2 tq + {0,1} to
//   natural 8 tq + 4 j + {0,1} and 8 + 2 tq + {0,1} to 8 tq + 4 j + 2 + {0,1}, so the B registers
//   are code bytes 2 j and 2 j + 1 (each byte = two consecutive elements = one bf16 pair) and
//   the A registers are words 2 j and 2 j + 1 of the 16-byte load.
// - e2m1 -> bf16 by byte permutes (a table of the eight magnitudes' bf16 bytes), then one bf16x2
//   multiply by the e8m0 scale as a bf16 power of two: exact (the product is a power-of-two
//   multiple of a 2-bit mantissa; bf16 has fp32's exponent range, and subnormals are kept).
// - A 4-stage cp.async pipeline (one barrier a 64-wide k-step) with the token gather in the
//   activation loads, the tile's e8m0 scales copied once (K / 32 bytes a row, contiguous for the
//   tile's rows), XOR-swizzled tiles so neither the copies nor the reads conflict on banks.
// - The (expert, row tile) of a CTA is found on the device by a warp scan over the routing's
//   groups: the grid is sized by a host-known bound, tiles past the real count exit at once, and
//   experts without pairs cost nothing. The launch captures in CUDA graphs.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/tensor_core_ptx.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/frag_layout.cuh"
#include "backend/cuda/kernels/moe/expert_gemm_common.cuh"

namespace gptoss::cuda {

namespace {

using namespace moe_gemm;

constexpr int kBM = 128;  // sorted pairs (token rows) a CTA tile
constexpr int kBN = 128;  // weight rows a CTA tile (32 a warp)
constexpr int kBK = 64;   // K a pipeline stage (two scale blocks)
constexpr int kStages = 4;
constexpr int kThreads = 128;
static_assert(kBN == kTileWeightRows && kThreads == kTileThreads && kBK == kTileKStep, "copy_tile_scales, code_copies");
constexpr int kAStageBytes = kBM * kBK * 2;  // bf16 [128 rows][64]: 128 B a row, 8 chunks
constexpr int kBStageBytes = kBN * kBK / 2;  // e2m1 [128 rows][64]: 32 B a row, 2 chunks
constexpr int kMaxK = 4096;                  // scales of the tile: kBN * K / 32 bytes <= 16 KB
constexpr int kMaxGroups = kMoeMaxGroups;

size_t smem_bytes(int K) { return size_t(kStages) * (kAStageBytes + kBStageBytes) + size_t(kBN) * (K / 32); }

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
__device__ __forceinline__ void mma_bf16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Grid: (weight row tiles, bound on pair row tiles). 128 threads; warp w owns weight rows
// n0 + 32 w .. + 31 (four n8 tiles) for all of the tile's pair rows (eight m16 slices).
// FRAG: the weights are in the fragment layout (16-row tiles 2 w, 2 w + 1 of the CTA's eight; n8
// tile t = 2 tt + half is rows 8 half .. + 7 of tile tt, in the tile's row order).
template <bool FRAG>
__global__ void __launch_bounds__(kThreads, 2) expert_gemm_mxfp4_bf16_kernel(ExpertGemmArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  pdl_begin();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  // This CTA's row tile: the blockIdx.y-th of the groups' ceil(pairs / kBM) tiles, in group order.
  int grp, within;
  find_row_tile<kBM>(a.r, int(blockIdx.y), lane, grp, within);
  if (grp < 0) return;
  const auto [expert, row0, row_end] = row_tile_rows<kBM>(a.r, grp, within);
  const int m_slices = (row_end - row0 + 15) >> 4;  // live m16 slices (1..8)
  const int N = a.N, K = a.K, kb = K / 32, KT = K / kBK;
  const int n0 = blockIdx.x * kBN;
  const int T = N / 16, C = K / 64, tile0 = n0 / 16;  // FRAG geometry

  const uint32_t s_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t a_base = s_base;                           // [stage][128 rows][128 B]
  const uint32_t b_base = s_base + kStages * kAStageBytes;  // [stage][4 KB]
  const uint32_t sc_base = b_base + kStages * kBStageBytes;
  const uint8_t* sc_smem = smem + kStages * (kAStageBytes + kBStageBytes);

  // The tile's scales, copied once (part of cp.async group 0).
  copy_tile_scales<FRAG>(a.scales, expert, N, K, n0, sc_base, tid);

  // A: this thread copies 16-byte chunk (tid % 8) of rows tid / 8 + 16 i, i = 0..7 (rows of dead
  // m16 slices are skipped, rows past the group's end zero-filled). Chunk c of row r lands at
  // chunk c ^ 4 (r & 1): the fragment reads (rows r, r + 1 in one phase) hit all 32 banks.
  const int a_chunk = tid & 7;
  uint32_t a_off[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int p = row0 + (tid >> 3) + 16 * i;
    const int ar = p < row_end ? (a.gather_a ? a.r.pair_token[p] : p) : 0;
    a_off[i] = uint32_t(ar) * uint32_t(a.lda) + uint32_t(a_chunk * 8);
  }
  const uint32_t a_dst = uint32_t((tid >> 3) * 128 + ((a_chunk ^ (((tid >> 3) & 1) << 2)) << 4));
  const CodeCopies codes = code_copies<FRAG>(a.w, expert, N, K, n0, tid);

  auto load_stage = [&](int kt, int st) {
    const uint32_t ad = a_base + st * kAStageBytes + a_dst;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = (tid >> 3) + 16 * i;
      if ((r >> 4) < m_slices)
        cp_async16(ad + i * 16 * 128, a.A + a_off[i] + kt * kBK, row0 + r < row_end);
    }
    const uint32_t bd = b_base + st * kBStageBytes;
#pragma unroll
    for (int c = 0; c < 2; ++c) cp_async16(bd + codes.dst[c], codes.src[c] + size_t(kt) * codes.step, codes.ok[c]);
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();
  }

  float acc[8][4][4];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.f;

  const int g = lane >> 2, tq = lane & 3;
  const bool warp_live = n0 + 32 * warp < N;
  // Checkpoint: this lane's weight rows (local) are 32 warp + 8 t + g; its code word in a B row
  // is bytes 4 tq. Fragments: its 16 bytes of tile 2 warp + tt are at (2 warp + tt) * 512 + 16 lane.
  const uint32_t b_rd = FRAG ? uint32_t(2 * warp * 512 + 16 * lane) : uint32_t((32 * warp + g) * 32 + 4 * tq);
  const int b_rd_swz = g >> 2;
  // Its activation rows: 16 mi + g and + 8 (same parity), chunk 4 h + tq, swizzled by the parity.
  const uint32_t a_rd = uint32_t(g * 128);
  const int a_rd_swz = (g & 1) << 2;

  // The k loop, compiled once per count of live m16 slices (MS): straight-line code the
  // scheduler can interleave, no per-slice branches in the hot loop.
  auto main_loop = [&](auto ms_tag) {
    constexpr int MS = decltype(ms_tag)::value;
    for (int kt = 0; kt < KT; ++kt) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // stage kt landed for all; stage kt - 1 is free for the next copy
      if (kt + kStages - 1 < KT) load_stage(kt + kStages - 1, (kt + kStages - 1) % kStages);
      cp_async_commit();
      if (!warp_live) continue;
      const int st = kt % kStages;
      // Plain C++ shared loads (not asm), so the compiler orders them against the barrier.
      const uint8_t* as = smem + st * kAStageBytes + a_rd;
      const uint8_t* bs = smem + kStages * kAStageBytes + st * kBStageBytes + b_rd;
      [[maybe_unused]] uint4 fw[2];  // (FRAG only)
      [[maybe_unused]] uint32_t fs_hi[2], fs_lo[2];
      if constexpr (FRAG) {
#pragma unroll
        for (int tt = 0; tt < 2; ++tt) {
          fw[tt] = *reinterpret_cast<const uint4*>(bs + tt * 512);
          const uint32_t fs = *reinterpret_cast<const uint32_t*>(sc_smem + ((2 * warp + tt) * C + kt) * 32 + 4 * g);
          fs_hi[tt] = __vminu4(fs, 0x80808080u) + 0x7E7E7E7Eu;  // min(s, 128) + 126, four bytes at once
          fs_lo[tt] = __vmaxu4(fs, 0x80808080u) - 0x01010101u;  // max(s, 128) - 1
        }
      }
      [[maybe_unused]] uint32_t cs[4];  // checkpoint: the scale bytes of blocks 2 kt, 2 kt + 1 (kb is even)
      if constexpr (!FRAG) {
#pragma unroll
        for (int t = 0; t < 4; ++t)
          cs[t] = *reinterpret_cast<const uint16_t*>(sc_smem + (32 * warp + 8 * t + g) * kb + 2 * kt);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t bfr[4][4];  // [n8 tile][k-step 0: b0, b1; k-step 1: b0, b1]
        if constexpr (FRAG) {
#pragma unroll
          for (int tt = 0; tt < 2; ++tt) {
            // Scale bytes: row g block 0, row g block 1, row g + 8 block 0, row g + 8 block 1.
            const uint32_t hi_g = frag_scale_pair(fs_hi[tt], h), lo_g = frag_scale_pair(fs_lo[tt], h);
            const uint32_t hi_g8 = frag_scale_pair(fs_hi[tt], 2 + h), lo_g8 = frag_scale_pair(fs_lo[tt], 2 + h);
            const uint32_t words[2] = {h ? fw[tt].z : fw[tt].x, h ? fw[tt].w : fw[tt].y};
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
              uint32_t r[4];
              frag_word_to_bf16x2(words[jj], r);
              bfr[2 * tt][2 * jj] = bf16x2_mul(bf16x2_mul(r[0], hi_g), lo_g);
              bfr[2 * tt][2 * jj + 1] = bf16x2_mul(bf16x2_mul(r[2], hi_g), lo_g);
              bfr[2 * tt + 1][2 * jj] = bf16x2_mul(bf16x2_mul(r[1], hi_g8), lo_g8);
              bfr[2 * tt + 1][2 * jj + 1] = bf16x2_mul(bf16x2_mul(r[3], hi_g8), lo_g8);
            }
          }
        } else {
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            const uint32_t q = *reinterpret_cast<const uint32_t*>(bs + t * 8 * 32 + ((h ^ b_rd_swz) << 4));
            mx_word_to_bf16x2(q, e8m0_bf16x2((cs[t] >> (8 * h)) & 255u), bfr[t]);
          }
        }
        const uint32_t a_chunk_off = uint32_t(((4 * h + tq) ^ a_rd_swz) << 4);
#pragma unroll
        for (int mi = 0; mi < MS; ++mi) {
          const uint4 x0 = *reinterpret_cast<const uint4*>(as + mi * 16 * 128 + a_chunk_off);
          const uint4 x1 = *reinterpret_cast<const uint4*>(as + (mi * 16 + 8) * 128 + a_chunk_off);
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            mma_bf16(acc[mi][t], x0.x, x1.x, x0.y, x1.y, bfr[t][0], bfr[t][1]);  // k-step j = 0
            mma_bf16(acc[mi][t], x0.z, x1.z, x0.w, x1.w, bfr[t][2], bfr[t][3]);  // j = 1
          }
        }
      }
    }
  };
  switch (m_slices) {
    case 1: main_loop(std::integral_constant<int, 1>{}); break;
    case 2: main_loop(std::integral_constant<int, 2>{}); break;
    case 3: main_loop(std::integral_constant<int, 3>{}); break;
    case 4: main_loop(std::integral_constant<int, 4>{}); break;
    case 5: main_loop(std::integral_constant<int, 5>{}); break;
    case 6: main_loop(std::integral_constant<int, 6>{}); break;
    case 7: main_loop(std::integral_constant<int, 7>{}); break;
    default: main_loop(std::integral_constant<int, 8>{}); break;
  }
  cp_async_wait<0>();

  if (!warp_live) return;
  // Logical (checkpoint) weight row of accumulator column 2 tq + e of n8 tile t.
  auto col_row = [&](int t, int e) {
    if constexpr (FRAG) {
      return frag::tile_row(tile0 + 2 * warp + (t >> 1), 8 * (t & 1) + 2 * tq + e, a.swiglu_rows);
    } else {
      return n0 + 32 * warp + 8 * t + 2 * tq + e;
    }
  };
  auto bias_at = [&](int n) { return a.bias && n < N ? a.bias[size_t(expert) * N + n] : 0.f; };
  // Fragment tiles with paired rows hold gate j in n8 tile 2 tt and up j in 2 tt + 1 (same lane,
  // same register): SwiGLU meets them there. Everywhere else gate/up are columns 2 tq, 2 tq + 1.
  const bool paired = FRAG && a.swiglu_rows && a.epi.mode == Epilogue::kSwiGLU;
  float bias[4][2];
#pragma unroll
  for (int t = 0; t < 4; ++t)
#pragma unroll
    for (int e = 0; e < 2; ++e) bias[t][e] = bias_at(col_row(t, e));
#pragma unroll
  for (int mi = 0; mi < 8; ++mi) {
    if (mi >= m_slices) continue;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = row0 + 16 * mi + g + 8 * hh;
      if (row >= row_end) continue;
      if (paired) {
#pragma unroll
        for (int tt = 0; tt < 2; ++tt) {
          if (tile0 + 2 * warp + tt >= T) continue;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float gate = acc[mi][2 * tt][2 * hh + e] + bias[2 * tt][e];
            const float up = acc[mi][2 * tt + 1][2 * hh + e] + bias[2 * tt + 1][e];
            const int j = 8 * (tile0 + 2 * warp + tt) + 2 * tq + e;  // output column
            static_cast<uint16_t*>(a.epi.out)[size_t(row) * a.epi.ldo + j] =
                to_half_bits(swiglu_dev(gate, up, a.epi.swiglu_limit), a.epi.out_f16);
          }
        }
        continue;
      }
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int n = col_row(t, 0), n1 = col_row(t, 1);
        if (FRAG ? tile0 + 2 * warp + (t >> 1) >= T : n >= N) continue;
        const float v0 = acc[mi][t][2 * hh] + bias[t][0], v1 = acc[mi][t][2 * hh + 1] + bias[t][1];
        if (n1 == n + 1) {
          store_pair(a.epi, a.r, row, n, v0, v1, n1 < N);
        } else {  // paired fragment rows under another epilogue: two gates (or ups) apart
          store_pair(a.epi, a.r, row, n, v0, 0.f, false);
          store_pair(a.epi, a.r, row, n1, v1, 0.f, false);
        }
      }
    }
  }
}

int g_version = -1;  // -1: not read yet

}  // namespace

int expert_gemm_version() {
  if (g_version < 0) {
    const char* v = std::getenv("GPTOSS_EXPERT_GEMM");
    const std::string s = v ? v : "";
    // auto by default: v5 or v3 by the pairs per expert (expert_gemm_v5_preferred), v2 where
    // neither is available. v3 against v2: H200, 120b pp2048 19.8k tok/s vs 19.1k, 20b 35.0k vs
    // 31.4k (v2 itself: 16.0k vs v1's 10.6k; docs/BENCHMARKS.md).
    if (s == "v1" || s == "1")
      g_version = 1;
    else if (s == "v2" || s == "2")
      g_version = 2;
    else if (s == "v3" || s == "3")
      g_version = 3;
    else if (s == "v5" || s == "5")
      g_version = 5;
    else if (s.empty() || s == "auto")
      g_version = kExpertGemmAuto;
    else
      throw Error("GPTOSS_EXPERT_GEMM=" + s + ": expected v1, v2, v3, v5 or auto");
  }
  return g_version;
}

void set_expert_gemm_version(int v) {
  if (v != kExpertGemmAuto && (v < 0 || v > 5 || v == 4))
    throw Error("set_expert_gemm_version: expected 0 (environment), 1, 2, 3, 5 or kExpertGemmAuto");
  g_version = v == 0 ? -1 : v;
}

bool expert_gemm_v2_supports(const WeightMat& W, const void* A, int lda, int a_rows, const Epilogue& epi) {
  auto aligned16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  const int kb = W.K / 32;
  const bool layout = W.fmt == WeightMat::kMXFP4 ? (size_t(W.N) * kb) % 16 == 0
                      : W.fmt == WeightMat::kFragMXFP4 ? W.N % 16 == 0
                                                       : false;
  return layout && W.K % kBK == 0 && W.K <= kMaxK && W.N > 0 && lda % 8 == 0 && aligned16(A) && aligned16(W.w) &&
         aligned16(W.scales) && size_t(a_rows) * size_t(lda) < (size_t(1) << 31) &&
         (epi.mode != Epilogue::kSwiGLU || W.N % 2 == 0);
}

void expert_gemm_v2(const WeightMat& W, const bf16_t* A, int lda, int pairs, int E, bool gather_a, const MoeRouting& r,
                    const Epilogue& epi, cudaStream_t s) {
  if (pairs <= 0) return;
  if (W.fmt != WeightMat::kMXFP4 && W.fmt != WeightMat::kFragMXFP4)
    throw Error("expert_gemm_v2: MXFP4 weights only (checkpoint or fragment layout)");
  if (E > kMaxGroups) throw Error("expert_gemm_v2: at most " + std::to_string(kMaxGroups) + " experts");
  const bool frag = W.fmt == WeightMat::kFragMXFP4;
  auto kernel = frag ? expert_gemm_mxfp4_bf16_kernel<true> : expert_gemm_mxfp4_bf16_kernel<false>;
  static std::atomic<uint64_t> attr_set{0};
  opt_in_smem_once_per_device(attr_set, smem_bytes(kMaxK), expert_gemm_mxfp4_bf16_kernel<true>, expert_gemm_mxfp4_bf16_kernel<false>);
  ExpertGemmArgs a{static_cast<const uint8_t*>(W.w), W.scales, W.bias, W.N, W.K, A, lda, gather_a, r, epi, W.swiglu_rows};
  const int max_tiles = (pairs + kBM - 1) / kBM + std::min(pairs, E);
  if (max_tiles > 65535) throw Error("expert_gemm_v2: too many row tiles (" + std::to_string(max_tiles) + ")");
  const dim3 grid((W.N + kBN - 1) / kBN, max_tiles);
  launch_pdl(kernel, grid, dim3(kThreads), smem_bytes(W.K), s, a);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
