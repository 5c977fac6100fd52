#pragma once
// One chunk (16 weight rows x 64 K) of the tensor-core decode kernels, shared by the block-per-tile
// kernel (skinny_mma.cu), the unit-walking grouped kernel (skinny_units.cu) and the stream-K kernel
// (streamk_mma.cu): the kernels' arguments, a lane's weight loads per fragment format, the chunk's
// MMAs, the epilogue's stores, and the block-level steps the first two share (activation staging,
// the K slices' reduction).
// Fragment layout and formats: frag_layout.cuh and the head of skinny_mma.cu.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/frag_layout.cuh"
#include "backend/cuda/tensor_core_ptx.cuh"

namespace gptoss::cuda::skinny {

struct SkinnyArgs {
  WeightMat W;
  const void* A;  // bf16 or fp16 [rows][lda]
  int lda;
  int M;  // dense: tokens
  bool grouped, gather_a;
  MoeRouting r;
  Epilogue epi;
  int xs_rows = 8;  // one n-tile: activation rows a pass stages in shared memory (min(M, 8))
  int groups = 1;   // grouped: the grid rows (the host's bound on the routing's groups)
  int pairs = 0;    // grouped: the (token, expert) pairs (host-known; their mean a group picks the pass size)
  bool stage_async = true;  // stage_rows through cp.async (GPTOSS_STAGE_ASYNC=0: register copies)
  NormIn norm_in;           // one-token dense launches after a folded combine (skinny_norm_in)
};

// Four values of a staged row into shared memory as fp16 (F16) or bf16, one 8-byte store.
template <bool F16>
__device__ __forceinline__ void store_staged4(uint16_t* dst, float y0, float y1, float y2, float y3) {
  uint2 o;
  if constexpr (F16) {
    const __half2 lo = __floats2half2_rn(y0, y1), hi = __floats2half2_rn(y2, y3);
    o.x = *reinterpret_cast<const uint32_t*>(&lo);
    o.y = *reinterpret_cast<const uint32_t*>(&hi);
  } else {
    o.x = pack_bf16x2(y0, y1);
    o.y = pack_bf16x2(y2, y3);
  }
  *reinterpret_cast<uint2*>(dst) = o;
}

// Bytes of one tile-chunk (16 rows x 64 K) of a fragment format.
template <int FMT>
constexpr size_t chunk_bytes() {
  return FMT == WeightMat::kFragMXFP4 ? 512 : FMT == WeightMat::kFragFP8 ? 1024 : 2048;
}

using ptx::mma_f16_16816;

// e8m0 byte -> 2^(s - 127 + 14) as float bits: s * 2^23 + 14 * 2^23 (one IMAD; s <= 240 checked
// at packing).
__device__ __forceinline__ float mx_scale14(uint32_t w, int byte) {
  return __uint_as_float(__byte_perm(w, 0u, 0x4440u + byte) * 0x800000u + 0x7000000u);
}


template <int FMT>
struct WChunk;  // one chunk's weights for one lane
template <>
struct WChunk<WeightMat::kFragMXFP4> {
  uint4 q;
  uint32_t s;
};
template <>
struct WChunk<WeightMat::kFragFP8> {
  uint4 q[2];
};
template <>
struct WChunk<WeightMat::kFragBF16> {
  uint4 q[4];
};

// Measurement builds only (tools/gpu/diag_binary.sh ... GPTOSS_DIAG_L2_PREFETCH=256): the
// streaming loads below ask L2 to fetch 256 bytes around each request from DRAM (`.L2::256B`),
// and GPTOSS_DIAG_L2_PREFETCH_SCALES does so for the MXFP4 scale words (a chunk's 32 scale bytes,
// so L2 holds the next 7 chunks' scales when they are asked for). No change on the H100
// (fifty-first session).
#if defined(GPTOSS_DIAG_L2_PREFETCH) && GPTOSS_DIAG_L2_PREFETCH == 256
#define GPTOSS_LD_PREFETCH ".L2::256B"
#else
#define GPTOSS_LD_PREFETCH ""
#endif

// Weights are read once: 16-byte loads that skip L1 (the activations, read by every warp of the
// SM, keep it).
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate" GPTOSS_LD_PREFETCH ".v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The same load as ld_stream without `volatile`: the compiler may move it as it moves __ldg.
// (GPTOSS_DIAG_L2_EVICT_FIRST, measurement builds only: with an L2 evict-first policy, so the
// streamed weights leave L2 before the activations, scales and rows that are read again.)
__device__ __forceinline__ uint4 ld_no_l1(const uint4* p) {
  uint4 v;
#ifdef GPTOSS_DIAG_L2_EVICT_FIRST
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint" GPTOSS_LD_PREFETCH ".v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(pol));
#else
  asm("ld.global.nc.L1::no_allocate" GPTOSS_LD_PREFETCH ".v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
#endif
  return v;
}

// How a lane's weight words are read: __ldg, ld_stream (skipping L1), ld_no_l1, or plain loads
// (chunks staged in shared memory in their global layout).
enum class WLoad { kNc, kStream, kNoL1, kStaged };
// The dense decode kernels' default: __ldg (the expert kernels of skinny_units.cu read past L1:
// kExpertWeightLoad there). GPTOSS_WEIGHTS_SKIP_L1 (an experiment, built into a copy of gptoss by
// tools/gpu/diag_binary.sh; the values are the same, so whole steps mean something too): ld_no_l1,
// the L1::no_allocate loads the plain-read floors of bench-kernels make; s39r4 measured the dense
// kernels 1% slower so.
#ifdef GPTOSS_WEIGHTS_SKIP_L1
inline constexpr WLoad kWeightLoad = WLoad::kNoL1;
#else
inline constexpr WLoad kWeightLoad = WLoad::kNc;
#endif

// A lane's weights of the chunk `off` chunks past its pointers: wl at its 16-byte word of a chunk
// (W.w as uint4 + chunk * chunk_bytes / 16 + lane), sl (MXFP4) at its scale word (W.scales as
// uint32 + chunk * 8 + lane / 4).
template <int FMT, WLoad L = kWeightLoad>
__device__ __forceinline__ void load_w_at(const uint4* wl, const uint32_t* sl, size_t off, WChunk<FMT>& w) {
  auto ld = [](const uint4* p) {
    if constexpr (L == WLoad::kStream)
      return ld_stream(p);
    else if constexpr (L == WLoad::kNoL1)
      return ld_no_l1(p);
    else if constexpr (L == WLoad::kStaged)
      return *p;
    else
      return __ldg(p);
  };
  if constexpr (FMT == WeightMat::kFragMXFP4) {
    w.q = ld(wl + off * 32);
#ifdef GPTOSS_DIAG_SCALE_NO_LOAD  // timing ceiling only (tools/gpu/diag_binary.sh): no scale request,
    w.s = (w.q.x & 0x0f0f0f0fu) | 0x70707070u;  // the scale math on a word already in registers
#else
    if constexpr (L == WLoad::kStaged)
      w.s = sl[off * 8];  // staged MXFP4 chunks: sl points at their scale words in shared memory too
    else {
#ifdef GPTOSS_DIAG_L2_PREFETCH_SCALES
      asm("ld.global.nc.L2::256B.u32 %0, [%1];" : "=r"(w.s) : "l"(sl + off * 8));
#else
      w.s = __ldg(sl + off * 8);
#endif
    }
#endif
  } else if constexpr (FMT == WeightMat::kFragFP8) {
#pragma unroll
    for (int h = 0; h < 2; ++h) w.q[h] = ld(wl + (off * 2 + h) * 32);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) w.q[j] = ld(wl + (off * 4 + j) * 32);
  }
}

// Tile-chunk tc of the weights (chunks counted from the start of W).
template <int FMT, bool STREAM = false>
__device__ __forceinline__ void load_w(const SkinnyArgs& a, size_t tc, int lane, WChunk<FMT>& w) {
  const uint32_t* sl = nullptr;
  if constexpr (FMT == WeightMat::kFragMXFP4) sl = reinterpret_cast<const uint32_t*>(a.W.scales) + lane / 4;
  load_w_at<FMT, STREAM ? WLoad::kStream : kWeightLoad>(static_cast<const uint4*>(a.W.w) + lane, sl, tc, w);
}

// The lane's activations of one chunk for n-tile i: 8 consecutive elements at 8 tq and 32 + 8 tq.
template <bool F16>
__device__ __forceinline__ void load_x(const SkinnyArgs& a, const char* row, int c, int tq, uint4* x) {
  if (!row) {
    x[0] = x[1] = make_uint4(0, 0, 0, 0);
    return;
  }
  const uint4* p = reinterpret_cast<const uint4*>(row + (size_t(c) * 64 + 8 * tq) * 2);
  x[0] = __ldg(p);
  x[1] = __ldg(p + 4);  // + 32 elements
}

// Applies one chunk: acc[i] (rows g, g+8 x tokens 2tq, 2tq+1 of n-tile i) += W_chunk . x_chunk.
template <int FMT, int NT, bool XF16>
__device__ __forceinline__ void chunk_mma(const WChunk<FMT>& w, const uint4 (&x)[NT][2], float (&acc)[NT][4]) {
  if constexpr (FMT == WeightMat::kFragMXFP4) {
    const uint32_t* qw = reinterpret_cast<const uint32_t*>(&w.q);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#ifdef GPTOSS_DIAG_SCALE_NO_MATH  // timing ceiling only (tools/gpu/diag_binary.sh): scales 1.0
      asm volatile("" ::"r"(w.s));
      const float s_lo = 1.0f, s_hi = 1.0f;
#else
      const float s_lo = mx_scale14(w.s, h), s_hi = mx_scale14(w.s, 2 + h);
#endif
      float tmp[NT][4];
#pragma unroll
      for (int i = 0; i < NT; ++i) tmp[i][0] = tmp[i][1] = tmp[i][2] = tmp[i][3] = 0.f;
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        uint32_t af[4];
        frag::mx_word_to_f16x2(qw[2 * h + jj], af);
#pragma unroll
        for (int i = 0; i < NT; ++i) {
          const uint32_t* xb = reinterpret_cast<const uint32_t*>(&x[i][h]);
          uint32_t b0 = xb[2 * jj], b1 = xb[2 * jj + 1];
          if constexpr (!XF16) { b0 = bf16x2_to_f16x2(b0); b1 = bf16x2_to_f16x2(b1); }
          mma_f16_16816(tmp[i], af, b0, b1);
        }
      }
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        acc[i][0] = fmaf(tmp[i][0], s_lo, acc[i][0]);
        acc[i][1] = fmaf(tmp[i][1], s_lo, acc[i][1]);
        acc[i][2] = fmaf(tmp[i][2], s_hi, acc[i][2]);
        acc[i][3] = fmaf(tmp[i][3], s_hi, acc[i][3]);
      }
    }
  } else if constexpr (FMT == WeightMat::kFragFP8) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t* qw = reinterpret_cast<const uint32_t*>(&w.q[h]);
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        uint32_t af[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const uint32_t word = qw[2 * jj + (r >> 1)];
          __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(word >> (16 * (r & 1))), __NV_E4M3);
          af[r] = uint32_t(hr.x) | (uint32_t(hr.y) << 16);
        }
#pragma unroll
        for (int i = 0; i < NT; ++i) {
          const uint32_t* xb = reinterpret_cast<const uint32_t*>(&x[i][h]);
          uint32_t b0 = xb[2 * jj], b1 = xb[2 * jj + 1];
          if constexpr (!XF16) { b0 = bf16x2_to_f16x2(b0); b1 = bf16x2_to_f16x2(b1); }
          mma_f16_16816(acc[i], af, b0, b1);
        }
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t* af = reinterpret_cast<const uint32_t*>(&w.q[j]);
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        const uint32_t* xb = reinterpret_cast<const uint32_t*>(&x[i][j >> 1]);
        ptx::mma_bf16_16816(acc[i], af, xb[2 * (j & 1)], xb[2 * (j & 1) + 1]);
      }
    }
  }
}

__device__ __forceinline__ float swiglu_f(float gate, float up, float limit) {
  float g = fminf(gate, limit);
  float u = fmaxf(fminf(up, limit), -limit);
  return g / (1.f + __expf(-1.702f * g)) * (u + 1.f);
}

__device__ __forceinline__ void store_val(const Epilogue& e, int row, int n, float v) {
  switch (e.mode) {
    case Epilogue::kStoreF32: static_cast<float*>(e.out)[size_t(row) * e.ldo + n] = v; break;
    case Epilogue::kStoreBF16:
      if (e.out_f16)
        static_cast<__half*>(e.out)[size_t(row) * e.ldo + n] = __float2half_rn(v);
      else
        static_cast<uint16_t*>(e.out)[size_t(row) * e.ldo + n] = f32_to_bf16_bits(v);
      break;
    case Epilogue::kAddF32: static_cast<float*>(e.out)[size_t(row) * e.ldo + n] += v; break;
    default: break;
  }
}

// A lane's two output rows of a finished 16-row tile (rows g, g + 8, in the checkpoint's order)
// with their fp8 row scales and biases, for tile_store.
struct TileRows {
  int lr0, lr1;
  float sc0 = 1.f, sc1 = 1.f, b0 = 0.f, b1 = 0.f;
};
template <int FMT>
__device__ __forceinline__ TileRows tile_rows(const SkinnyArgs& a, int expert, int tile, int g) {
  const int N = a.W.N;
  const bool sw = a.W.swiglu_rows;
  TileRows t;
  t.lr0 = frag::tile_row(tile, g, sw);
  t.lr1 = frag::tile_row(tile, g + 8, sw);
  if (FMT == WeightMat::kFragFP8) {
    t.sc0 = a.W.row_scale[size_t(expert) * N + t.lr0];
    t.sc1 = a.W.row_scale[size_t(expert) * N + t.lr1];
  }
  if (a.W.bias) {
    t.b0 = a.W.bias[size_t(expert) * N + t.lr0];
    t.b1 = a.W.bias[size_t(expert) * N + t.lr1];
  }
  return t;
}

// Asks for a lane's tile_rows values early (prefetch into this SM's L1: no registers held over
// the K loop, where the kernels sit at their register limit), so the epilogue does not wait on
// DRAM for them.
template <int FMT>
__device__ __forceinline__ void prefetch_tile_rows(const SkinnyArgs& a, int expert, int tile, int g) {
  const int N = a.W.N;
  const bool sw = a.W.swiglu_rows;
  const size_t r0 = size_t(expert) * N + frag::tile_row(tile, g, sw), r1 = size_t(expert) * N + frag::tile_row(tile, g + 8, sw);
  auto pf = [](const float* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); };
  if (FMT == WeightMat::kFragFP8) { pf(a.W.row_scale + r0); pf(a.W.row_scale + r1); }
  if (a.W.bias) { pf(a.W.bias + r0); pf(a.W.bias + r1); }
}

// The epilogue of one n-tile of a finished tile: fin holds rows g, g + 8 x tokens p0 + 2 tq,
// p0 + 2 tq + 1 (tokens at or past row_end are not stored).
__device__ __forceinline__ void tile_store(const SkinnyArgs& a, const TileRows& t, int tile, int g, int tq, int p0,
                                           int row_end, const float (&fin)[4]) {
#pragma unroll
  for (int cc = 0; cc < 2; ++cc) {
    const int p = p0 + 2 * tq + cc;
    if (p >= row_end) continue;
    const float v0 = fin[cc] * t.sc0 + t.b0, v1 = fin[2 + cc] * t.sc1 + t.b1;
    if (a.epi.mode == Epilogue::kSwiGLU) {
      const float y = swiglu_f(v0, v1, a.epi.swiglu_limit);
      const size_t o = size_t(p) * a.epi.ldo + tile * 8 + g;
      if (a.epi.out_f16)
        static_cast<__half*>(a.epi.out)[o] = __float2half_rn(y);
      else
        static_cast<uint16_t*>(a.epi.out)[o] = f32_to_bf16_bits(y);
    } else {
      store_val(a.epi, p, t.lr0, v0);
      store_val(a.epi, p, t.lr1, v1);
    }
  }
}

// The kernels' occupancy target: 24 warps an SM with one n-tile (activations in shared memory)
// and at most four row tiles, else 16 (more n-tiles: their activations sit in registers; more
// row tiles: their weights do). Four row tiles at 24 warps spill 8 bytes and were still faster
// than at 16 warps (bench-kernels, H200).
// (PF: chunks in flight a row tile; the unit-walking kernel's whole-unit shape, RT x PF = 12,
// takes 16 warps.)
constexpr int skinny_min_blocks(int NT, int KS, int RT, int PF = 1) {
  const int warps = NT == 1 && RT <= 4 && RT * PF <= 8 ? 24 : 16;
  return warps / KS > 0 ? warps / KS : 1;
}
// Stages the activation rows of pairs tok0 .. tok0 + ntok - 1 (gathered through pair_token when
// a.gather_a) into xs, K + 8 halves a row; bf16 rows become fp16 here when F16 (once per block
// rather than per chunk and row tile in chunk_mma: the same rounding, so the same numbers).
// Every thread of the block takes part; the caller brackets it with __syncthreads.
// With a.stage_async every 16-byte piece goes out as a cp.async before any is waited for (one
// L2 round trip a staging); the register copy waits on each load before its store, and its loop
// is not pipelined: ~11 round trips for 8 rows at K = 2880 and 256 threads, each time a unit
// walk crosses into a new pass.
template <bool F16>
__device__ __forceinline__ void stage_rows(const SkinnyArgs& a, int tok0, int ntok, uint16_t* xs, int xs_ld) {
  const char* A = static_cast<const char*>(a.A);
  const int vecs = a.W.K / 8;
  if (a.stage_async) {
    for (int i = threadIdx.x; i < ntok * vecs; i += blockDim.x) {
      const int t = i / vecs, v = i - t * vecs;
      const int p = tok0 + t;
      const int ar = a.gather_a ? __ldg(a.r.pair_token + p) : p;
      ptx::cp_async16_ca(xs + size_t(t) * xs_ld + v * 8, A + size_t(ar) * a.lda * 2 + size_t(v) * 16);
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();
    if constexpr (F16) {
      // Each thread converts the pieces it copied (its own cp.async writes, visible to it now).
      for (int i = threadIdx.x; i < ntok * vecs; i += blockDim.x) {
        const int t = i / vecs, v = i - t * vecs;
        uint4* q = reinterpret_cast<uint4*>(xs + size_t(t) * xs_ld + v * 8);
        *q = bf16x8_to_f16x8(*q);
      }
    }
    return;
  }
  for (int i = threadIdx.x; i < ntok * vecs; i += blockDim.x) {
    const int t = i / vecs, v = i % vecs;
    const int p = tok0 + t;
    const int ar = a.gather_a ? a.r.pair_token[p] : p;
    uint4 x = __ldg(reinterpret_cast<const uint4*>(A + size_t(ar) * a.lda * 2) + v);
    if constexpr (F16) x = bf16x8_to_f16x8(x);
    *reinterpret_cast<uint4*>(xs + size_t(t) * xs_ld + v * 8) = x;
  }
}

// The K slices of a block's row tiles meet in shared memory (red: [KS][RT][NT][4][32] f32) and
// warp r < nrt sums row tile tile0 + r's slices in warp order (fixed: the result does not depend
// on the grid) into fin. Every thread of the block calls it; false for the warps that finish no
// tile.
template <int NT, int KS, int RT>
__device__ __forceinline__ bool sum_tile_slices(float* red, const float (&acc)[RT][NT][4], int nrt,
                                                float (&fin)[NT][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  __syncthreads();  // red is free (the previous pass's finishing warps are done)
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int v = 0; v < 4; ++v) red[(((warp * RT + r) * NT + i) * 4 + v) * 32 + lane] = acc[r][i][v];
  __syncthreads();
  if (warp >= nrt) return false;
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < KS; ++w) sum += red[(((w * RT + warp) * NT + i) * 4 + v) * 32 + lane];
      fin[i][v] = sum;
    }
  return true;
}

// sum_tile_slices, then warp r < nrt stores row tile tile0 + r.
template <int FMT, int NT, int KS, int RT>
__device__ __forceinline__ void finish_tiles(const SkinnyArgs& a, float* red, const float (&acc)[RT][NT][4], int nrt,
                                             int tile0, int expert, int tok0, int row_end) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  float fin[NT][4];
  if (!sum_tile_slices<NT, KS, RT>(red, acc, nrt, fin)) return;
  // Rows g, g + 8 of the tile; tokens 2 tq, 2 tq + 1 of each n-tile.
  const TileRows tr = tile_rows<FMT>(a, expert, tile0 + warp, g);
#pragma unroll
  for (int i = 0; i < NT; ++i) tile_store(a, tr, tile0 + warp, g, tq, tok0 + 8 * i, row_end, fin[i]);
}

}  // namespace gptoss::cuda::skinny
