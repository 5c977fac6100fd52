#pragma once
// Device pieces shared by the grouped MXFP4 expert GEMMs (expert_gemm_mxfp4_bf16.cu = v2 on
// mma.sync, expert_gemm_wgmma.cu = v3 on Hopper wgmma): the exact e2m1/e8m0 -> bf16 decodes of
// both weight layouts, the epilogue stores, the search for a CTA's (expert, row tile), and the
// copies of its weight tile (scales once, codes a K step at a time) into shared memory.
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tensor_core_ptx.cuh"

namespace gptoss::cuda::moe_gemm {

constexpr int kMoeMaxGroups = 256;  // experts with pairs (moe_route takes E <= 256)

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) { return __byte_perm(a, b, sel); }

// One word of codes (byte b: element 2b in the low nibble, 2b + 1 in the high one) -> four bf16
// pairs out[b] = (element 2b, element 2b + 1) x the block scale (scale2: the scale as a bf16 pair).
__device__ __forceinline__ void mx_word_to_bf16x2(uint32_t q, uint32_t scale2, uint32_t* out) {
  // bf16 of the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6: 0000 3F00 3F80 3FC0 4000 4040 4080 40C0.
  constexpr uint32_t kLo0 = 0xC0800000u, kLo1 = 0xC0804000u;  // low bytes, codes 0-3 / 4-7
  constexpr uint32_t kHi0 = 0x3F3F3F00u, kHi1 = 0x40404040u;  // high bytes, positive
  constexpr uint32_t kNg0 = 0xBFBFBF80u, kNg1 = 0xC0C0C0C0u;  // high bytes, negative
  const uint32_t idx = q & 0x77777777u;                        // nibble k: magnitude of element k
  const uint32_t sel = 0x32103210u | ((q >> 1) & 0x44444444u);  // sign: take the negative byte
  const uint32_t idx_b = idx >> 16, sel_b = sel >> 16;
  const uint32_t lo_a = prmt(kLo0, kLo1, idx), lo_b = prmt(kLo0, kLo1, idx_b);
  const uint32_t hi_a = prmt(prmt(kHi0, kHi1, idx), prmt(kNg0, kNg1, idx), sel);
  const uint32_t hi_b = prmt(prmt(kHi0, kHi1, idx_b), prmt(kNg0, kNg1, idx_b), sel_b);
  uint32_t v[4];
  v[0] = prmt(lo_a, hi_a, 0x5140u);  // (low, high byte) of elements 0 and 1
  v[1] = prmt(lo_a, hi_a, 0x7362u);  // elements 2, 3
  v[2] = prmt(lo_b, hi_b, 0x5140u);
  v[3] = prmt(lo_b, hi_b, 0x7362u);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(out[i]) : "r"(v[i]), "r"(scale2), "r"(0x80008000u));
}

// e8m0 byte -> 2^(s - 127) as a bf16 pair: 0 is the subnormal 2^-127, 255 NaN (as the CPU decode).
__device__ __forceinline__ uint32_t e8m0_bf16x2(uint32_t s) {
  uint32_t h = s << 7;
  h = s == 0 ? 0x0040u : h;
  h = s == 255 ? 0x7FC0u : h;
  return h * 0x00010001u;
}

// Fragment layout (kFragMXFP4, frag_layout.cuh): the lane that reads a 16-row tile's chunk holds,
// for k-step j = 2 h + jj, rows g and g + 8 at natural K 32 h + 8 tq + 4 jj + [0, 4): exactly the
// B registers of this kernel's K permutation, for the tile's two n8 halves (rows 0-7 and 8-15).
// The word's bits sit where mx_word_to_f16x2 wants them for fp16; rotated 3 bits less, the
// magnitude lands on bf16's exponent low bits and mantissa top bit: e2m1 x 2^-126 (the 0.5 code
// as the subnormal 2^-127). a[r]: register r of the decode kernels' A fragment (rows r & 1 ? g + 8
// : g, elements (r >> 1) * 2 + {0, 1}).
__device__ __forceinline__ uint32_t rotl(uint32_t x, int n) { return __funnelshift_l(x, x, n); }
__device__ __forceinline__ void frag_word_to_bf16x2(uint32_t q, uint32_t* a) {
  constexpr uint32_t kS = 0x80008000u, kM = 0x01C001C0u;
  const uint32_t r3 = rotl(q, 3);
  a[0] = (q & kS) | (rotl(q, 29) & kM);
  a[1] = (rotl(q, 1) & kS) | (r3 & kM);
  a[2] = (rotl(q, 2) & kS) | (rotl(q, 6) & kM);
  a[3] = (r3 & kS) | (q & kM);
}
// 2^(s - 127) over the 2^-126 above, as two bf16 factors (each a normal power of two for every
// s <= 254): 2^(min(s, 128) - 1) and 2^(max(s, 128) - 128). fp16 scales of the frag decode stop at
// s = 240 (the packer flags more); these do not.
// exps: four biased bf16 exponents (min(s, 128) + 126 or max(s, 128) - 1, one a byte, no carries);
// byte b of them as a bf16 pair of that power of two.
__device__ __forceinline__ uint32_t frag_scale_pair(uint32_t exps, int b) {
  return __byte_perm(exps, 0u, 0x4040u | (b << 8) | b) << 7;
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}

__device__ __forceinline__ float swiglu_dev(float gate, float up, float limit) {
  float g = fminf(gate, limit);
  float u = fmaxf(fminf(up, limit), -limit);
  return g / (1.f + __expf(-1.702f * g)) * (u + 1.f);
}
__device__ __forceinline__ uint16_t to_half_bits(float v, bool f16) {
  return f16 ? __half_as_ushort(__float2half_rn(v)) : f32_to_bf16_bits(v);
}

// Output columns n, n + 1 (has1) of sorted pair `row`, bias added.
__device__ __forceinline__ void store_pair(const Epilogue& e, const MoeRouting& r, int row, int n, float v0, float v1,
                                           bool has1) {
  const size_t o = size_t(row) * e.ldo + n;
  switch (e.mode) {
    case Epilogue::kSwiGLU:
      static_cast<uint16_t*>(e.out)[size_t(row) * e.ldo + n / 2] = to_half_bits(swiglu_dev(v0, v1, e.swiglu_limit), e.out_f16);
      break;
    case Epilogue::kStoreF32: {
      float* p = static_cast<float*>(e.out) + o;
      if (has1 && (o & 1) == 0) {
        *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
      } else {
        p[0] = v0;
        if (has1) p[1] = v1;
      }
      break;
    }
    case Epilogue::kStoreBF16: {
      uint16_t* p = static_cast<uint16_t*>(e.out) + o;
      p[0] = to_half_bits(v0, e.out_f16);
      if (has1) p[1] = to_half_bits(v1, e.out_f16);
      break;
    }
    case Epilogue::kAddF32: {
      float* p = static_cast<float*>(e.out) + o;
      p[0] += v0;
      if (has1) p[1] += v1;
      break;
    }
    case Epilogue::kScatterAdd: {
      float* p = static_cast<float*>(e.out) + size_t(r.pair_token[row]) * e.ldo + n;
      const float w = r.pair_weight[row];
      atomicAdd(p, w * v0);
      if (has1) atomicAdd(p + 1, w * v1);
      break;
    }
    default: break;
  }
}

// The row tile `tile` of the routing's groups, each cut into ceil(pairs / BM) tiles, in group
// order: grp (-1 past the last tile) and the tile's index inside its group. Called by whole
// warps (shuffles); every lane loads its groups' bounds at once (one memory round trip).
//
// A group's pairs may instead be cut in two launches (version 5's split tiling): rem_max > 0 (the
// bulk launch): n / BM whole tiles, plus one for the remainder n % BM only where it holds more than
// rem_max pairs; bulk > 0 (the remainder launch, BM <= rem_max of the bulk launch): one tile for
// the remainder n % bulk where it is in [1, BM] (the pairs the bulk launch left), none otherwise.
template <int BM>
__device__ __forceinline__ int group_row_tiles(int n, int rem_max, int bulk) {
  if (bulk > 0) {
    const int rem = n % bulk;
    return rem > 0 && rem <= BM ? 1 : 0;
  }
  if (rem_max > 0) return n / BM + (n % BM > rem_max ? 1 : 0);
  return (n + BM - 1) / BM;
}

template <int BM>
__device__ __forceinline__ void find_row_tile(const MoeRouting& r, int tile, int lane, int& grp, int& within,
                                              int rem_max = 0, int bulk = 0) {
  grp = -1, within = 0;
  const int ng = r.counts[0];
  int nts[kMoeMaxGroups / 32];
#pragma unroll
  for (int i = 0; i < kMoeMaxGroups / 32; ++i) {
    const int gi = 32 * i + lane;
    nts[i] = gi < ng ? group_row_tiles<BM>(r.group_end[gi] - r.group_start[gi], rem_max, bulk) : 0;
  }
  int base = 0;
#pragma unroll
  for (int i = 0; i < kMoeMaxGroups / 32; ++i) {
    const int nt = nts[i];
    int incl = nt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    const int t = tile - base;
    if (t < total) {  // uniform over the warp (and the CTA when every warp calls it)
      const int L = __ffs(__ballot_sync(0xffffffffu, t < incl)) - 1;
      const int before = __shfl_sync(0xffffffffu, incl - nt, L);
      grp = 32 * i + L;
      within = t - before;
      break;
    }
    base += total;
  }
}

// Version 2's and version 3's arguments (one layout: the launchers fill them alike).
struct ExpertGemmArgs {
  const uint8_t* w;       // [E][N][K / 2] codes (checkpoint layout), or kFragMXFP4 tile-chunks
  const uint8_t* scales;  // [E][N][K / 32] e8m0, or kFragMXFP4 scale words
  const float* bias;      // [E][N] or null
  int N, K;
  const uint16_t* A;  // bf16 rows (token rows if gather_a, else sorted-pair rows)
  int lda;
  bool gather_a;
  MoeRouting r;
  Epilogue epi;
  bool swiglu_rows;  // kFragMXFP4: gate/up rows paired inside each 16-row tile
  bool a_k_permuted = false;  // version 5: A's rows already in the fragment K order (no transpose)
  // Version 5's split tiling (find_row_tile): tile_rem_max > 0 in the bulk launch, tile_bulk > 0
  // (the bulk launch's width) in the remainder launch; both 0: one launch, ceil(n / BN) tiles.
  int tile_rem_max = 0, tile_bulk = 0;
};

// The rows of a row tile find_row_tile found (group grp >= 0, tile `within` of it): the group's
// expert and its sorted rows [row0, row_end). bulk > 0: the remainder launch's one tile, the
// group's pairs past its n / bulk whole tiles of the bulk launch.
struct RowTile {
  int expert, row0, row_end;
};
template <int BM>
__device__ __forceinline__ RowTile row_tile_rows(const MoeRouting& r, int grp, int within, int bulk = 0) {
  RowTile t;
  t.expert = r.group_expert[grp];
  const int start = r.group_start[grp], end = r.group_end[grp];
  t.row0 = bulk > 0 ? start + (end - start) / bulk * bulk : start + within * BM;
  t.row_end = min(end, t.row0 + BM);
  return t;
}

// Both GEMMs' CTAs: 128 threads over 128 weight rows (from n0), 64 K a step.
constexpr int kTileWeightRows = 128, kTileThreads = 128, kTileKStep = 64;

// The CTA's scales, once, into shared memory at dst (cp.async, left for the caller's commit):
// checkpoint rows n0 .. n0 + 127 (K / 32 bytes each; the launchers check N * K / 32 % 16 == 0, so
// the span is whole 16-byte chunks), or the fragment layout's [8 tiles][K / 64 chunks][8 g] words
// (32 bytes a tile-chunk). Both are 128 * K / 32 bytes. THREADS: the CTA's threads that share the
// copy (version 3's 128-row tiles have 256).
template <bool FRAG, int THREADS = kTileThreads>
__device__ __forceinline__ void copy_tile_scales(const uint8_t* scales, int expert, int N, int K, int n0, uint32_t dst,
                                                 int tid) {
  int span;
  const uint8_t* src;
  if constexpr (FRAG) {
    const int T = N / 16, C = K / 64, tile0 = n0 / 16;
    span = min(8, T - tile0) * C * 32;
    src = scales + (size_t(expert) * T + tile0) * C * 32;
  } else {
    const int kb = K / 32;
    span = min(kTileWeightRows, N - n0) * kb;
    src = scales + (size_t(expert) * N + n0) * kb;
  }
  for (int i = tid * 16; i < span; i += THREADS * 16) ptx::cp_async16(dst + i, src + i, true);
}

// This thread's two 16-byte copies of the CTA's codes a K step. Checkpoint: the two chunks (scale
// blocks) of weight row n0 + tid; chunk c lands at c ^ ((row >> 2) & 1), so reads of eight
// consecutive rows spread over all banks. Fragments: 16-byte pieces tid and tid + 128 of the
// step's 8 tile-chunks (512 B each), in place. Step kt copies src[c] + kt * step to dst[c].
struct CodeCopies {
  bool ok[2];
  const uint8_t* src[2];
  uint32_t dst[2];
  int step;  // bytes between consecutive K steps of one source
};
template <bool FRAG>
__device__ __forceinline__ CodeCopies code_copies(const uint8_t* w, int expert, int N, int K, int n0, int tid) {
  CodeCopies b;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    if constexpr (FRAG) {
      const int T = N / 16, C = K / 64, tile0 = n0 / 16;
      const int piece = tid + 128 * c, tl = piece >> 5;
      b.ok[c] = tile0 + tl < T;
      b.src[c] = w + ((size_t(expert) * T + (b.ok[c] ? tile0 + tl : 0)) * C * 32 + (piece & 31)) * 16;
      b.dst[c] = uint32_t(piece * 16);
      b.step = 512;
    } else {
      b.ok[c] = n0 + tid < N;
      b.src[c] = w + (size_t(expert) * N + (b.ok[c] ? n0 + tid : 0)) * (K / 2) + 16 * c;
      b.dst[c] = uint32_t(tid * 32 + ((c ^ ((tid >> 2) & 1)) << 4));
      b.step = kTileKStep / 2;
    }
  }
  return b;
}

// Host side: opts the expert GEMM kernels into `bytes` of dynamic shared memory, once per device
// (the opt-in is per device, and tensor-parallel ranks each drive their own); `done` holds a bit
// per device.
template <class... Kernels>
inline void opt_in_smem_once_per_device(std::atomic<uint64_t>& done, size_t bytes, Kernels... kernels) {
  once_per_device(done, [&] {
    for (const void* k : {reinterpret_cast<const void*>(kernels)...})
      GPTOSS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  });
}

}  // namespace gptoss::cuda::moe_gemm
