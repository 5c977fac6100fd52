// Linear layers: dense (bf16 weights) and grouped MoE (MXFP4 experts, dequantized on the fly,
// never stored as bf16). Small M: CUDA-core GEMV streaming 16-byte weight chunks, one warp per
// output row pair (so gate/up pairs meet for the SwiGLU epilogue). Larger M: mma.sync m16n8k16
// bf16 GEMM with fp32 accumulation, MXFP4 tiles dequantized into shared memory. Grouped launches
// size their grids from host-known upper bounds and read the real group/tile counts on the
// device, so they capture in CUDA graphs.
#include <algorithm>

#include "backend/cuda/cuda_common.h"
#include <cuda_fp16.h>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/tensor_core_ptx.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/kernels/linear/frag_layout.cuh"

namespace gptoss::cuda {

namespace {

int g_force_path = 0;
int g_gemv_variant = 0;  // 0 = best known, 1 = the first GEMV (row pairs), for A/B runs

struct LinArgs {
  WeightMat W;
  const uint16_t* A;
  int lda;
  int M;  // dense rows
  bool grouped, gather_a;
  MoeRouting r;
  Epilogue epi;
};

// e2m1 nibble -> float carrying a 2^-126 factor: the 3 magnitude bits land on the exponent's
// two low bits and the mantissa's top bit, which maps the subnormal code (0.5) right as well.
__device__ __forceinline__ float e2m1_bits(uint32_t nib) {
  return __uint_as_float(((nib & 7u) << 22) | ((nib & 8u) << 28));
}
// The scale 2^(s-127) times the 2^126 the nibble trick leaves out, as two factors (hi * lo) so
// that every e8m0 byte stays finite: hi = 2^(min(s,128)-1), lo = 2^(max(s,128)-128).
__device__ __forceinline__ float mx_scale_hi(uint32_t s) { return __uint_as_float((min(s, 128u) + 126u) << 23); }
__device__ __forceinline__ float mx_scale_lo(uint32_t s) { return __uint_as_float((max(s, 128u) - 1u) << 23); }

__device__ __forceinline__ float swiglu_dev(float gate, float up, float limit) {
  float g = fminf(gate, limit);
  float u = fmaxf(fminf(up, limit), -limit);
  return g / (1.f + __expf(-1.702f * g)) * (u + 1.f);
}

// Applies the epilogue to one value (not SwiGLU).
__device__ __forceinline__ void epi_store(const LinArgs& a, int row, int n, float v) {
  const Epilogue& e = a.epi;
  switch (e.mode) {
    case Epilogue::kStoreF32: static_cast<float*>(e.out)[size_t(row) * e.ldo + n] = v; break;
    case Epilogue::kStoreBF16: static_cast<uint16_t*>(e.out)[size_t(row) * e.ldo + n] = f32_to_bf16_bits(v); break;
    case Epilogue::kAddF32: static_cast<float*>(e.out)[size_t(row) * e.ldo + n] += v; break;
    case Epilogue::kScatterAdd:
      atomicAdd(static_cast<float*>(e.out) + size_t(a.r.pair_token[row]) * e.ldo + n, a.r.pair_weight[row] * v);
      break;
    default: break;
  }
}
__device__ __forceinline__ void epi_swiglu(const LinArgs& a, int row, int n_even, float gate, float up) {
  static_cast<uint16_t*>(a.epi.out)[size_t(row) * a.epi.ldo + n_even / 2] =
      f32_to_bf16_bits(swiglu_dev(gate, up, a.epi.swiglu_limit));
}

// ---------------------------------------------------------------------------------------------
// GEMV

constexpr int kGemvWarps = 8;
constexpr int kGemvRowsPerWarp = 2;
constexpr int kGemvRowsPerBlock = kGemvWarps * kGemvRowsPerWarp;
constexpr int kGemvMT = 4;  // tokens per pass over the weights

// A GEMV's finish for lane `lane`: token row rb + lane of the row pair (n0, n0 + 1) gets its
// sums plus bias through the epilogue (the loop keeps acc's indices compile-time).
__device__ __forceinline__ void lane_token_store(const LinArgs& a, int rb, int n0, int lane, bool has1, const float* acc0,
                                                 const float* acc1, float bias0, float bias1) {
#pragma unroll
  for (int m = 0; m < kGemvMT; ++m) {
    if (m != lane) continue;
    const int row = rb + m;
    const float v0 = acc0[m] + bias0, v1 = acc1[m] + bias1;
    if (a.epi.mode == Epilogue::kSwiGLU) {
      epi_swiglu(a, row, n0, v0, v1);
    } else {
      epi_store(a, row, n0, v0);
      if (has1) epi_store(a, row, n0 + 1, v1);
    }
  }
}

constexpr int kGemvMaxM = 8;  // the auto path uses GEMV up to this many rows (per group)

// RMSNorm fused into a bf16 GEMV (decode): A is the f32 residual stream, normalized on the fly,
// so the normalized rows never make a round trip through memory and the norm costs no launch.
struct FusedNorm {
  const float* x = nullptr;  // [M, K] f32; null: A is the (already normalized) bf16 input
  const float* w = nullptr;  // [K]
  float eps = 1e-5f;
  uint16_t* xn_out = nullptr;  // optional: block 0 also stores the normalized rows (bf16 [M, K])
  bool xn_f16 = false;         // ... as fp16 instead (the skinny MXFP4 kernels' activation type)
};

// Eight inputs of chunk c (8 columns) of token row `row` as four bf16 pairs: straight from A,
// or normalized from the f32 rows exactly as rmsnorm_kernel rounds them (x * inv * w -> bf16).
__device__ __forceinline__ uint4 gemv_x8(const LinArgs& a, const FusedNorm& fn, const uint16_t* xrow, int row,
                                         float inv, int c) {
  if (!fn.x) return *reinterpret_cast<const uint4*>(xrow + size_t(c) * 8);
  const float4* xr = reinterpret_cast<const float4*>(fn.x + size_t(row) * a.W.K + size_t(c) * 8);
  const float4* wr = reinterpret_cast<const float4*>(fn.w + size_t(c) * 8);
  float4 x0 = xr[0], x1 = xr[1], w0 = __ldg(wr), w1 = __ldg(wr + 1);
  uint4 r;
  r.x = uint32_t(f32_to_bf16_bits(x0.x * inv * w0.x)) | (uint32_t(f32_to_bf16_bits(x0.y * inv * w0.y)) << 16);
  r.y = uint32_t(f32_to_bf16_bits(x0.z * inv * w0.z)) | (uint32_t(f32_to_bf16_bits(x0.w * inv * w0.w)) << 16);
  r.z = uint32_t(f32_to_bf16_bits(x1.x * inv * w1.x)) | (uint32_t(f32_to_bf16_bits(x1.y * inv * w1.y)) << 16);
  r.w = uint32_t(f32_to_bf16_bits(x1.z * inv * w1.z)) | (uint32_t(f32_to_bf16_bits(x1.w * inv * w1.w)) << 16);
  return r;
}

// bf16 GEMV: each group of KS warps owns a row pair and splits K among its warps (KS = 1 for
// wide matrices; KS = 8 for narrow ones such as the router's 128 rows, which would otherwise
// occupy 8 of 132 SMs).
template <int KS>
__global__ void __launch_bounds__(256, 3) gemv_bf16_kernel(LinArgs a, FusedNorm fn) {
  constexpr int kPairs = kGemvWarps / KS;  // row pairs per block
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int ks = warp % KS;
  const int n0 = (blockIdx.x * kPairs + warp / KS) * kGemvRowsPerWarp;
  const int N = a.W.N, K = a.W.K;
  if (!a.grouped && n0 < N && ks == 0) {
    // Weights depend on no earlier kernel: pull this warp's rows toward L2 while the previous
    // kernel drains (programmatic dependent launch), then wait for its outputs.
    const char* base = static_cast<const char*>(a.W.w) + size_t(n0) * K * 2;
    const int lines = (min(2, N - n0) * K * 2 + 127) / 128;
    for (int l = lane; l < lines; l += 32) asm volatile("prefetch.global.L2 [%0];" ::"l"(base + size_t(l) * 128));
  }
  pdl_begin();
  int row_begin = 0, row_end = a.M, expert = 0;
  if (a.grouped) {
    int g = blockIdx.y;
    if (g >= a.r.counts[0]) return;  // uniform over the block
    row_begin = a.r.group_start[g];
    row_end = a.r.group_end[g];
    expert = a.r.group_expert[g];
  }
  __shared__ float inv_rms[kGemvMaxM];
  __shared__ float red[KS > 1 ? kGemvWarps : 1][2 * kGemvMT];
  if (fn.x) {
    // Dense only (M <= kGemvMaxM = warps): warp m finds token m's 1 / rms.
    if (warp < a.M) {
      const float4* xr = reinterpret_cast<const float4*>(fn.x + size_t(warp) * K);
      float ss = 0.f;
      for (int i = lane; i < K / 4; i += 32) {
        float4 v = xr[i];
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      }
      ss = warp_sum(ss);
      if (lane == 0) inv_rms[warp] = 1.0f / sqrtf(ss / float(K) + fn.eps);
    }
    __syncthreads();
    if (fn.xn_out && blockIdx.x == 0) {
      for (int i = threadIdx.x; i < a.M * (K / 8); i += blockDim.x) {
        int m = i / (K / 8), c = i % (K / 8);
        uint4 v = gemv_x8(a, fn, nullptr, m, inv_rms[m], c);
        *reinterpret_cast<uint4*>(fn.xn_out + size_t(m) * K + size_t(c) * 8) = fn.xn_f16 ? bf16x8_to_f16x8(v) : v;
      }
    }
  }
  const bool live = n0 < N;  // dead warps stay for the block's barriers (KS > 1)
  if (KS == 1 && !live) return;
  const bool has1 = n0 + 1 < N;
  const int n0c = live ? n0 : 0, n1 = has1 ? n0 + 1 : n0c;
  float bias0 = 0.f, bias1 = 0.f;
  if (a.W.bias && live) {
    bias0 = a.W.bias[size_t(expert) * N + n0c];
    bias1 = a.W.bias[size_t(expert) * N + n1];
  }
  const int chunks = K / 8;
  const int per = (chunks + KS - 1) / KS;
  const int cbeg = ks * per, cend = min(chunks, cbeg + per);
  for (int rb = row_begin; rb < row_end; rb += kGemvMT) {
    const int mt = min(kGemvMT, row_end - rb);
    const uint16_t* xrow[kGemvMT];
    int xr_row[kGemvMT];
    float inv[kGemvMT];
#pragma unroll
    for (int m = 0; m < kGemvMT; ++m) {
      int p = rb + min(m, mt - 1);
      int ar = a.gather_a ? a.r.pair_token[p] : p;
      xr_row[m] = ar;
      xrow[m] = fn.x ? nullptr : a.A + size_t(ar) * a.lda;
      inv[m] = fn.x ? inv_rms[ar] : 0.f;
    }
    float acc0[kGemvMT], acc1[kGemvMT];
#pragma unroll
    for (int m = 0; m < kGemvMT; ++m) acc0[m] = acc1[m] = 0.f;

    if (live) {
      const uint16_t* W = static_cast<const uint16_t*>(a.W.w) + size_t(expert) * N * K;
      const uint4* w0 = reinterpret_cast<const uint4*>(W + size_t(n0c) * K);
      const uint4* w1 = reinterpret_cast<const uint4*>(W + size_t(n1) * K);
      constexpr int U = 4;
      for (int c0 = cbeg + lane; c0 < cend; c0 += 32 * U) {
        uint4 wa[U], wb[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          int c = c0 + u * 32;
          if (c < cend) { wa[u] = __ldg(w0 + c); wb[u] = __ldg(w1 + c); }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          int c = c0 + u * 32;
          if (c >= cend) break;
          const uint32_t* pa = reinterpret_cast<const uint32_t*>(&wa[u]);
          const uint32_t* pb = reinterpret_cast<const uint32_t*>(&wb[u]);
#pragma unroll
          for (int m = 0; m < kGemvMT; ++m) {
            if (m >= mt) break;
            uint4 xv = gemv_x8(a, fn, xrow[m], xr_row[m], inv[m], c);
            const uint32_t* px = reinterpret_cast<const uint32_t*>(&xv);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              float2 x = bf16x2_to_f32x2(px[i]);
              float2 fa = bf16x2_to_f32x2(pa[i]);
              float2 fb = bf16x2_to_f32x2(pb[i]);
              acc0[m] = fmaf(fa.x, x.x, fmaf(fa.y, x.y, acc0[m]));
              acc1[m] = fmaf(fb.x, x.x, fmaf(fb.y, x.y, acc1[m]));
            }
          }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kGemvMT; ++m) {
      acc0[m] = warp_sum(acc0[m]);
      acc1[m] = warp_sum(acc1[m]);
    }
    if constexpr (KS > 1) {
      // The K slices of a row pair meet in shared memory; the pair's first warp finishes.
      if (lane == 0) {
#pragma unroll
        for (int m = 0; m < kGemvMT; ++m) {
          red[warp][m] = acc0[m];
          red[warp][kGemvMT + m] = acc1[m];
        }
      }
      __syncthreads();
      if (ks == 0) {
#pragma unroll
        for (int m = 0; m < kGemvMT; ++m) {
          float s0 = 0.f, s1 = 0.f;
#pragma unroll
          for (int j = 0; j < KS; ++j) {
            s0 += red[warp + j][m];
            s1 += red[warp + j][kGemvMT + m];
          }
          acc0[m] = s0;
          acc1[m] = s1;
        }
      }
      __syncthreads();  // red is reused by the next token chunk
    }
    if (live && ks == 0 && lane < mt) {
      // Each of the first mt lanes finishes one token (compile-time indices via the loop).
      lane_token_store(a, rb, n0, lane, has1, acc0, acc1, bias0, bias1);
    }
  }
}


// Wide dense GEMV for decode (bf16 weights, M <= kGemvMT tokens): one wave of blocks, each warp
// owns whole rows (row = global warp id + i * total warps). All of a row's 16-byte chunks are
// loaded at once (KC a lane) and the next row's loads go out before the current row's math; the
// first row is loaded before griddepcontrol.wait (weights depend on no earlier kernel), so its
// latency hides behind the previous kernel's tail, and later rows are prefetched toward L2. The
// inputs (normalized here if the norm is fused) are staged once per block in shared memory.
template <int KC, bool DB>
__global__ void __launch_bounds__(256, 2) gemv_bf16_rows_kernel(LinArgs a, FusedNorm fn) {
  extern __shared__ __align__(128) uint4 xs[];  // [M][K / 8] (128: skinny_units.cu says why)
  __shared__ float inv_rms[kGemvMT];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int N = a.W.N, K = a.W.K, chunks = K / 8, M = a.M;
  const int gw = blockIdx.x * kGemvWarps + warp, nw = gridDim.x * kGemvWarps;
  const uint4* W = static_cast<const uint4*>(a.W.w);
  uint4 wa[KC], wb[KC];
  auto load_row = [&](int n, uint4(&w)[KC]) {
    const uint4* r = W + size_t(n) * chunks;
#pragma unroll
    for (int u = 0; u < KC; ++u) {
      int c = lane + 32 * u;
      if (c < chunks) w[u] = __ldg(r + c);
    }
  };
  if (gw < N) load_row(gw, wa);
  for (int n = gw + nw; n < N; n += nw) {
    const char* base = reinterpret_cast<const char*>(W + size_t(n) * chunks);
    for (int l = lane; l < (K * 2 + 127) / 128; l += 32) asm volatile("prefetch.global.L2 [%0];" ::"l"(base + size_t(l) * 128));
  }
  pdl_begin();
  if (fn.x) {
    if (warp < M) {
      const float4* xr = reinterpret_cast<const float4*>(fn.x + size_t(warp) * K);
      float ss = 0.f;
      for (int i = lane; i < K / 4; i += 32) {
        float4 v = xr[i];
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      }
      ss = warp_sum(ss);
      if (lane == 0) inv_rms[warp] = 1.0f / sqrtf(ss / float(K) + fn.eps);
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < M * chunks; i += blockDim.x) {
    int m = i / chunks, c = i % chunks;
    uint4 v = gemv_x8(a, fn, a.A + size_t(m) * a.lda, m, fn.x ? inv_rms[m] : 0.f, c);
    xs[i] = v;
    if (fn.xn_out && blockIdx.x == 0) reinterpret_cast<uint4*>(fn.xn_out + size_t(m) * K)[c] = fn.xn_f16 ? bf16x8_to_f16x8(v) : v;
  }
  __syncthreads();
  for (int n = gw; n < N; n += nw) {
    const int nn = n + nw;
    if (DB && nn < N) load_row(nn, wb);
    float acc[kGemvMT];
#pragma unroll
    for (int m = 0; m < kGemvMT; ++m) acc[m] = 0.f;
#pragma unroll
    for (int u = 0; u < KC; ++u) {
      const int c = lane + 32 * u;
      if (c >= chunks) break;
      const uint32_t* pw = reinterpret_cast<const uint32_t*>(&wa[u]);
#pragma unroll
      for (int m = 0; m < kGemvMT; ++m) {
        if (m >= M) break;
        uint4 xv = xs[m * chunks + c];
        const uint32_t* px = reinterpret_cast<const uint32_t*>(&xv);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float2 x = bf16x2_to_f32x2(px[i]);
          float2 f = bf16x2_to_f32x2(pw[i]);
          acc[m] = fmaf(f.x, x.x, fmaf(f.y, x.y, acc[m]));
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kGemvMT; ++m) acc[m] = warp_sum(acc[m]);
    const float bias = a.W.bias ? a.W.bias[n] : 0.f;
#pragma unroll
    for (int m = 0; m < kGemvMT; ++m)
      if (m == lane && m < M) epi_store(a, m, n, acc[m] + bias);
    if (DB) {
#pragma unroll
      for (int u = 0; u < KC; ++u) wa[u] = wb[u];
    } else if (nn < N) {
      load_row(nn, wa);
    }
  }
}

// MXFP4 GEMV. Decoding is the cost here (3.6 B weights a token) and it runs on the integer pipe
// (half the rate of the float one on Hopper), so it is done with byte permutes: a 32-bit word of
// codes becomes eight fp16 high bytes through a 16-entry table (two 8-byte halves, positive and
// negative, picked per code by its sign bit), then four fp16 pairs with zero low bytes -- fifteen
// integer instructions for eight weights, against twenty shifts and masks plus four fp16 multiplies
// for the bit-field decode this replaced. HFMA2 multiplies the pairs with the activations (staged
// once per block in shared memory as fp16 pairs, pre-scaled by 1/16 for headroom); each half
// accumulates only 4 products in fp16 before the sum moves to fp32; the e8m0 scale is applied per
// 32-element block in fp32.
// 32-element chunks a lane holds per row: 3 cover the experts' K (2880); 4 cover o_proj's 4096
// when the dense layers are MXFP4 too (--mxfp4-layers).
constexpr int kMxMaxK = 4096;

template <int U>
__device__ __forceinline__ void mx_load_pair(const LinArgs& a, int expert, int n0, uint4* wa, uint4* wb, uint32_t* sa,
                                             uint32_t* sb, int lane) {
  const int N = a.W.N, kb = a.W.K / 32;
  const int n0c = n0 < N ? n0 : 0, n1 = n0 + 1 < N ? n0 + 1 : n0c;
  const uint8_t* B = static_cast<const uint8_t*>(a.W.w) + size_t(expert) * N * kb * 16;
  const uint8_t* S = a.W.scales + size_t(expert) * N * kb;
  const uint4* w0 = reinterpret_cast<const uint4*>(B + size_t(n0c) * kb * 16);
  const uint4* w1 = reinterpret_cast<const uint4*>(B + size_t(n1) * kb * 16);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    int c = lane + u * 32;
    if (n0 < N && c < kb) {
      wa[u] = __ldg(w0 + c);
      wb[u] = __ldg(w1 + c);
      sa[u] = __ldg(S + size_t(n0c) * kb + c);
      sb[u] = __ldg(S + size_t(n1) * kb + c);
    }
  }
}

// Stages tokens rb..rb+mt-1 of A into xh ([kGemvMT][xs] fp16 pairs of consecutive elements,
// pre-scaled by 1/16). One 16-byte load per (token, 8
// columns), all issued before any is used.
__device__ __forceinline__ void mx_stage_x(const LinArgs& a, int rb, int mt, __half2* xh, int xs) {
  const int K = a.W.K;
  for (int i = threadIdx.x; i < mt * (K / 8); i += blockDim.x) {
    int m = i / (K / 8), g8 = i % (K / 8);
    int p = rb + m;
    const uint16_t* xr = a.A + size_t(a.gather_a ? a.r.pair_token[p] : p) * a.lda;
    uint4 v = *reinterpret_cast<const uint4*>(xr + g8 * 8);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(&v);
    float f[8];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float2 t = bf16x2_to_f32x2(w[q]);
      f[2 * q] = t.x * 0.0625f;
      f[2 * q + 1] = t.y * 0.0625f;
    }
    __half2* dst = xh + m * xs + g8 * 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) dst[j] = __floats2half2_rn(f[2 * j], f[2 * j + 1]);
  }
}

// Dot products of a row pair (U 32-element chunks a lane: nibbles ca/cb, e8m0 scales csa/csb) with
// mt staged tokens, accumulated into acc0/acc1 (per lane; warp_sum follows).
// Eight e2m1 codes (element k in nibble k of q) -> four fp16 pairs (elements 2j, 2j+1 in h[j]).
__device__ __forceinline__ void e2m1x8_to_half2(uint32_t q, uint32_t* h) {
  // fp16 high bytes of 0, .5, 1, 1.5, 2, 3, 4, 6 and of their negatives (low bytes are zero).
  constexpr uint32_t kPos0 = 0x3E3C3800u, kPos1 = 0x46444240u, kNeg0 = 0xBEBCB880u, kNeg1 = 0xC6C4C2C0u;
  const uint32_t idx = q & 0x77777777u;                        // table index of each code
  const uint32_t sel = 0x32103210u | ((q & 0x88888888u) >> 1);  // sign bit: take the negative byte
  const uint32_t lo = __byte_perm(__byte_perm(kPos0, kPos1, idx), __byte_perm(kNeg0, kNeg1, idx), sel);
  const uint32_t hi =
      __byte_perm(__byte_perm(kPos0, kPos1, idx >> 16), __byte_perm(kNeg0, kNeg1, idx >> 16), sel >> 16);
  h[0] = __byte_perm(lo, 0u, 0x1404u);
  h[1] = __byte_perm(lo, 0u, 0x3424u);
  h[2] = __byte_perm(hi, 0u, 0x1404u);
  h[3] = __byte_perm(hi, 0u, 0x3424u);
}

// Dot products of a row pair (U 32-element chunks a lane: nibbles ca/cb, e8m0 scales csa/csb) with
// mt staged tokens, accumulated into acc0/acc1 (per lane; warp_sum follows).
template <int U>
__device__ __forceinline__ void mx_pair_dot(const uint4* ca, const uint4* cb, const uint32_t* csa, const uint32_t* csb,
                                            int kb, int lane, int mt, const __half2* xh, int xs, float* acc0,
                                            float* acc1) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int c = lane + u * 32;
    if (c >= kb) break;
    // 2^(s-127) times the 16 the activations were divided by.
    const float fa = __uint_as_float(max(min(csa[u], 254u), 1u) << 23) * 16.f;
    const float fb = __uint_as_float(max(min(csb[u], 254u), 1u) << 23) * 16.f;
    const uint32_t* pa = reinterpret_cast<const uint32_t*>(&ca[u]);
    const uint32_t* pb = reinterpret_cast<const uint32_t*>(&cb[u]);
    float ta[kGemvMT], tb[kGemvMT];
#pragma unroll
    for (int m = 0; m < kGemvMT; ++m) ta[m] = tb[m] = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t ua[4], ub[4];
      e2m1x8_to_half2(pa[i], ua);
      e2m1x8_to_half2(pb[i], ub);
      const __half2* da = reinterpret_cast<const __half2*>(ua);
      const __half2* db = reinterpret_cast<const __half2*>(ub);
#pragma unroll
      for (int m = 0; m < kGemvMT; ++m) {
        if (m >= mt) break;
        uint4 xv = *reinterpret_cast<const uint4*>(xh + m * xs + 16 * c + 4 * i);
        const __half2* x2 = reinterpret_cast<const __half2*>(&xv);
        __half2 ha = __hmul2(da[0], x2[0]), hb = __hmul2(db[0], x2[0]);
#pragma unroll
        for (int j = 1; j < 4; ++j) {
          ha = __hfma2(da[j], x2[j], ha);
          hb = __hfma2(db[j], x2[j], hb);
        }
        float2 fa2 = __half22float2(ha), fb2 = __half22float2(hb);
        ta[m] += fa2.x + fa2.y;
        tb[m] += fb2.x + fb2.y;
      }
    }
#pragma unroll
    for (int m = 0; m < kGemvMT; ++m) {
      acc0[m] = fmaf(ta[m], fa, acc0[m]);
      acc1[m] = fmaf(tb[m], fb, acc1[m]);
    }
  }
}

// Reduces a row pair's per-lane sums and applies bias + epilogue (lane m finishes token rb + m).
__device__ __forceinline__ void mx_pair_finish(const LinArgs& a, int expert, int n0, int rb, int mt, int lane,
                                               float* acc0, float* acc1) {
  const int N = a.W.N;
#pragma unroll
  for (int m = 0; m < kGemvMT; ++m) {
    acc0[m] = warp_sum(acc0[m]);
    acc1[m] = warp_sum(acc1[m]);
  }
  if (lane < mt) {
    const bool has1 = n0 + 1 < N;
    float bias0 = 0.f, bias1 = 0.f;
    if (a.W.bias) {
      bias0 = a.W.bias[size_t(expert) * N + n0];
      if (has1) bias1 = a.W.bias[size_t(expert) * N + n0 + 1];
    }
    lane_token_store(a, rb, n0, lane, has1, acc0, acc1, bias0, bias1);
  }
}

// Grid: (row blocks, groups), two blocks an SM; each warp walks row pairs n0 = (blockIdx.x + it *
// gridDim.x) * 16 + 2 * warp, loading the next pair's weights before computing the current one
// (the first pair's as soon as the group's expert is known, before the activations are staged).
// Variants measured on the H200 (bench-kernels, 120b gate_up at one token, ~25 us each) and in
// the model: three blocks an SM without the register double buffer, bulk-copy streaming through
// shared memory and int8 activations with dp4a were no faster (see docs/BENCHMARKS.md).
template <int U, bool DB>
__global__ void __launch_bounds__(256, 2) gemv_mxfp4_kernel(LinArgs a) {
  pdl_begin();
  constexpr int XS = U * 512;  // fp16 pairs per staged token
  __shared__ __align__(16) __half2 xh[kGemvMT][XS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int N = a.W.N, kb = a.W.K / 32;
  int row_begin = 0, row_end = a.M, expert = 0;
  if (a.grouped) {
    int g = blockIdx.y;
    if (g >= a.r.counts[0]) return;  // uniform over the block
    row_begin = a.r.group_start[g];
    row_end = a.r.group_end[g];
    expert = a.r.group_expert[g];
  }
  const int stride = gridDim.x * kGemvRowsPerBlock;
  const int first = blockIdx.x * kGemvRowsPerBlock + 2 * warp;
  // DB: the next pair loads into w* while the current one (c*) is computed. Without it (U = 4,
  // where two sets would not fit the register budget) each pair loads at its iteration's start.
  uint4 wa[U], wb[U], ca[U], cb[U];
  uint32_t sa[U], sb[U], csa[U], csb[U];
  if (DB)
    mx_load_pair<U>(a, expert, first, wa, wb, sa, sb, lane);
  else
    mx_load_pair<U>(a, expert, first, ca, cb, csa, csb, lane);
  for (int rb = row_begin; rb < row_end; rb += kGemvMT) {
    const int mt = min(kGemvMT, row_end - rb);
    __syncthreads();  // the previous chunk's readers are done with xh
    mx_stage_x(a, rb, mt, &xh[0][0], XS);
    __syncthreads();
    if (rb != row_begin) {
      if (DB)
        mx_load_pair<U>(a, expert, first, wa, wb, sa, sb, lane);
      else
        mx_load_pair<U>(a, expert, first, ca, cb, csa, csb, lane);
    }
    for (int n0 = first; n0 < N; n0 += stride) {
      if (DB) {
#pragma unroll
        for (int u = 0; u < U; ++u) { ca[u] = wa[u]; cb[u] = wb[u]; csa[u] = sa[u]; csb[u] = sb[u]; }
        if (n0 + stride < N) mx_load_pair<U>(a, expert, n0 + stride, wa, wb, sa, sb, lane);
      } else if (n0 != first) {
        mx_load_pair<U>(a, expert, n0, ca, cb, csa, csb, lane);
      }
      float acc0[kGemvMT], acc1[kGemvMT];
#pragma unroll
      for (int m = 0; m < kGemvMT; ++m) acc0[m] = acc1[m] = 0.f;
      mx_pair_dot<U>(ca, cb, csa, csb, kb, lane, mt, &xh[0][0], XS, acc0, acc1);
      mx_pair_finish(a, expert, n0, rb, mt, lane, acc0, acc1);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// GEMM (mma.sync m16n8k16 bf16, fp32 accumulate)

constexpr int BM = kGemmBM, BN = 128, BK = 32, SK = BK + 8;  // SK: padded row, conflict-free ldmatrix

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::ldmatrix_x4;
__device__ __forceinline__ void cp_async_wait1() { ptx::cp_async_wait<1>(); }
__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  ptx::mma_bf16_16816(c, a, b0, b1);
}

template <int FMT>
__global__ void __launch_bounds__(128) gemm_kernel(LinArgs a) {
  pdl_begin();
  __shared__ __align__(16) uint16_t As[2][BM][SK];
  __shared__ __align__(16) uint16_t Bs[2][BN][SK];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
  const int N = a.W.N, K = a.W.K;
  int row0, row_end, expert = 0;
  if (a.grouped) {
    int t = blockIdx.y;
    if (t >= a.r.counts[1]) return;
    int g = a.r.tile_group[t];
    row0 = a.r.tile_row[t];
    row_end = a.r.group_end[g];
    expert = a.r.group_expert[g];
  } else {
    row0 = blockIdx.y * BM;
    row_end = a.M;
  }
  const int n0 = blockIdx.x * BN;
  const int KT = K / BK;

  // A: each thread copies 16-byte chunk (tid % 4) of rows tid/4 and tid/4 + 32.
  const uint16_t* a_src[2];
  bool a_ok[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int p = row0 + tid / 4 + 32 * i;
    a_ok[i] = p < row_end;
    int ar = a_ok[i] ? (a.gather_a ? a.r.pair_token[p] : p) : 0;
    a_src[i] = a.A + size_t(ar) * a.lda + (tid % 4) * 8;
  }
  auto load_a = [&](int kt, int st) {
#pragma unroll
    for (int i = 0; i < 2; ++i) cp_async16(&As[st][tid / 4 + 32 * i][(tid % 4) * 8], a_src[i] + kt * BK, a_ok[i]);
  };

  // B, bf16: chunk (tid % 4) of rows tid/4 + 32 i. MXFP4: thread tid owns row tid.
  const uint16_t* b_src[4];
  bool b_ok[4];
  const uint4* mx_src = nullptr;
  const uint8_t* mx_scale_src = nullptr;
  bool mx_ok = false;
  if constexpr (FMT == WeightMat::kBF16) {
    const uint16_t* W = static_cast<const uint16_t*>(a.W.w) + size_t(expert) * N * K;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int n = n0 + tid / 4 + 32 * i;
      b_ok[i] = n < N;
      b_src[i] = W + size_t(b_ok[i] ? n : 0) * K + (tid % 4) * 8;
    }
  } else {
    const int kb = K / 32;
    int n = n0 + tid;
    mx_ok = n < N;
    size_t rowi = size_t(expert) * N + (mx_ok ? n : 0);
    mx_src = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(a.W.w) + rowi * kb * 16);
    mx_scale_src = a.W.scales + rowi * kb;
  }
  uint4 mx_w = make_uint4(0, 0, 0, 0);
  uint32_t mx_s = 127;
  // Fragment-layout MXFP4 (kFragMXFP4, the experts' load-time layout): thread tid decodes two
  // lane units u = 2 tid + q of the tile's 8 row tiles (tile u / 32, lane u % 32): the two words
  // of k-tile kt (chunk kt / 2, half kt % 2) hold rows g, g + 8 at K offsets 8 tq + [0, 8).
  uint2 fr_w[2] = {make_uint2(0, 0), make_uint2(0, 0)};
  uint32_t fr_s[2] = {0x7f7f7f7fu, 0x7f7f7f7fu};
  size_t fr_tc[2] = {0, 0};
  int fr_half = 0;  // K half (32 of the chunk's 64) of the k-tile in fr_w
  bool fr_ok[2] = {false, false};
  if constexpr (FMT == WeightMat::kFragMXFP4) {
    const int T = N / 16, C = K / 64;
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int u = 2 * tid + q, tt = n0 / 16 + u / 32;
      fr_ok[q] = tt < T;
      fr_tc[q] = (size_t(expert) * T + (fr_ok[q] ? tt : 0)) * C;
    }
  }
  auto load_b = [&](int kt, int st) {
    if constexpr (FMT == WeightMat::kFragMXFP4) {
      fr_half = kt & 1;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int lane_u = (2 * tid + q) % 32;
        if (fr_ok[q]) {
          const size_t tc = fr_tc[q] + kt / 2;
          fr_w[q] = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint4*>(a.W.w) + tc * 32 + lane_u) + (kt & 1));
          fr_s[q] = __ldg(reinterpret_cast<const uint32_t*>(a.W.scales) + tc * 8 + lane_u / 4);
        }
      }
    } else if constexpr (FMT == WeightMat::kBF16) {
#pragma unroll
      for (int i = 0; i < 4; ++i) cp_async16(&Bs[st][tid / 4 + 32 * i][(tid % 4) * 8], b_src[i] + kt * BK, b_ok[i]);
    } else {
      if (mx_ok) {
        mx_w = __ldg(mx_src + kt);
        mx_s = __ldg(mx_scale_src + kt);
      }
    }
  };
  auto store_b_mx = [&](int st) {
    if constexpr (FMT == WeightMat::kFragMXFP4) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int u = 2 * tid + q, tt = u / 32, lane_u = u % 32, g = lane_u / 4, tq = lane_u % 4;
        const int tile = n0 / 16 + tt;
        const int half = fr_half;
        const uint32_t s_g = (fr_s[q] >> (8 * half)) & 255u, s_g8 = (fr_s[q] >> (8 * (2 + half))) & 255u;
        // Codes decode to fp16 value x 2^-14; the scale 2^(s - 127 + 14) is one float (s <= 240).
        const float sc_g = __uint_as_float((s_g + 14u) << 23), sc_g8 = __uint_as_float((s_g8 + 14u) << 23);
        const int lr_g = frag::tile_row(tile, g, a.W.swiglu_rows) - n0;
        const int lr_g8 = frag::tile_row(tile, g + 8, a.W.swiglu_rows) - n0;
        const uint32_t words[2] = {fr_w[q].x, fr_w[q].y};
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          uint32_t hreg[4];
          frag::mx_word_to_f16x2(words[jj], hreg);
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const bool hi_row = r & 1;
            const float sc = fr_ok[q] ? (hi_row ? sc_g8 : sc_g) : 0.f;
            const int col = 8 * tq + 4 * jj + (r >> 1) * 2;
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hreg[r]));
            *reinterpret_cast<uint32_t*>(&Bs[st][hi_row ? lr_g8 : lr_g][col]) = pack_bf16x2(f.x * sc, f.y * sc);
          }
        }
      }
    } else if constexpr (FMT == WeightMat::kMXFP4) {
      const float sc = mx_scale_hi(mx_s), sl = mx_scale_lo(mx_s);
      const uint32_t* pw = reinterpret_cast<const uint32_t*>(&mx_w);
      uint32_t packed[16];
      if (mx_s <= 128) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j)
            packed[i * 4 + j] = pack_bf16x2(e2m1_bits(pw[i] >> (8 * j)) * sc, e2m1_bits(pw[i] >> (8 * j + 4)) * sc);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j)
            packed[i * 4 + j] = pack_bf16x2(e2m1_bits(pw[i] >> (8 * j)) * sc * sl,
                                            e2m1_bits(pw[i] >> (8 * j + 4)) * sc * sl);
      }
      uint4* dst = reinterpret_cast<uint4*>(&Bs[st][tid][0]);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        dst[q] = make_uint4(packed[4 * q], packed[4 * q + 1], packed[4 * q + 2], packed[4 * q + 3]);
    }
  };

  float acc[2][8][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.f;

  const int wm = warp / 2, wn = warp % 2;
  load_a(0, 0);
  load_b(0, 0);
  cp_async_commit();
  store_b_mx(0);
  for (int kt = 0; kt < KT; ++kt) {
    const int st = kt & 1;
    if (kt + 1 < KT) {
      load_a(kt + 1, st ^ 1);
      load_b(kt + 1, st ^ 1);
    }
    cp_async_commit();
    cp_async_wait1();
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      uint32_t af[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        ldmatrix_x4(af[mi], &As[st][wm * 32 + mi * 16 + (lane % 16)][ks * 16 + (lane / 16) * 8]);
#pragma unroll
      for (int nj = 0; nj < 4; ++nj) {
        uint32_t bf[4];
        ldmatrix_x4(bf, &Bs[st][wn * 64 + nj * 16 + (lane >> 4) * 8 + (lane & 7)][ks * 16 + ((lane >> 3) & 1) * 8]);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_bf16(acc[mi][2 * nj], af[mi], bf[0], bf[1]);
          mma_bf16(acc[mi][2 * nj + 1], af[mi], bf[2], bf[3]);
        }
      }
    }
    if (kt + 1 < KT) store_b_mx(st ^ 1);
    __syncthreads();
  }

  const int g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 8; ++ni)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        int row = row0 + wm * 32 + mi * 16 + g + hh * 8;
        int n = n0 + wn * 64 + ni * 8 + tq * 2;
        if (row >= row_end || n >= N) continue;
        float v0 = acc[mi][ni][hh * 2], v1 = acc[mi][ni][hh * 2 + 1];
        const bool has1 = n + 1 < N;
        if (a.W.bias) {
          v0 += a.W.bias[size_t(expert) * N + n];
          if (has1) v1 += a.W.bias[size_t(expert) * N + n + 1];
        }
        if (a.epi.mode == Epilogue::kSwiGLU) {
          epi_swiglu(a, row, n, v0, v1);
        } else {
          epi_store(a, row, n, v0);
          if (has1) epi_store(a, row, n + 1, v1);
        }
      }
}

void check_args(const WeightMat& W, const Epilogue& epi) {
  if (W.K % 32 != 0)
    throw Error("linear: K must be a multiple of 32 (got " + std::to_string(W.K) + ")");
  if (epi.mode == Epilogue::kSwiGLU && W.N % 2 != 0) throw Error("linear: SwiGLU needs an even N");
}

void launch(const LinArgs& a, int path, int grid_y, cudaStream_t s, const FusedNorm& fn = FusedNorm{}) {
  if (grid_y <= 0) return;
  if (path == 1) {
    dim3 grid((a.W.N + kGemvRowsPerBlock - 1) / kGemvRowsPerBlock, a.grouped ? grid_y : 1);
    if (a.W.fmt == WeightMat::kMXFP4) {
      // One wave: two blocks per SM over all groups; warps loop over the rows.
      int per_group = std::max(1, 2 * sm_count() / int(grid.y));
      grid.x = std::min<int>(grid.x, per_group);
      if (a.W.K <= 3 * 1024)
        launch_pdl(gemv_mxfp4_kernel<3, true>, dim3(grid), dim3(256), 0, s, a);
      else
        launch_pdl(gemv_mxfp4_kernel<4, false>, dim3(grid), dim3(256), 0, s, a);
    } else if (!a.grouped && a.M <= kGemvMT && a.epi.mode != Epilogue::kSwiGLU && a.W.K <= 16 * 256 &&
               int(grid.x) >= sm_count() && g_gemv_variant != 1) {
      const int kc = (a.W.K / 8 + 31) / 32;
      const int blocks = std::min((a.W.N + kGemvWarps - 1) / kGemvWarps, 2 * sm_count());
      const size_t smem = size_t(a.M) * (a.W.K / 8) * 16;
      if (kc <= 4)
        launch_pdl(gemv_bf16_rows_kernel<4, true>, dim3(blocks), dim3(256), smem, s, a, fn);
      else if (kc <= 8)
        launch_pdl(gemv_bf16_rows_kernel<8, true>, dim3(blocks), dim3(256), smem, s, a, fn);
      else if (kc <= 12)
        launch_pdl(gemv_bf16_rows_kernel<12, true>, dim3(blocks), dim3(256), smem, s, a, fn);
      else
        launch_pdl(gemv_bf16_rows_kernel<16, false>, dim3(blocks), dim3(256), smem, s, a, fn);
    } else if (int(grid.x * grid.y) < sm_count()) {
      // Narrow matrix: a row pair per block, K split over its warps.
      grid.x = (a.W.N + kGemvRowsPerWarp - 1) / kGemvRowsPerWarp;
      launch_pdl(gemv_bf16_kernel<kGemvWarps>, dim3(grid), dim3(256), 0, s, a, fn);
    } else {
      launch_pdl(gemv_bf16_kernel<1>, dim3(grid), dim3(256), 0, s, a, fn);
    }
  } else {
    dim3 grid((a.W.N + BN - 1) / BN, grid_y);
    if (a.W.fmt == WeightMat::kBF16)
      launch_pdl(gemm_kernel<WeightMat::kBF16>, dim3(grid), dim3(128), 0, s, a);
    else if (a.W.fmt == WeightMat::kFragMXFP4)
      launch_pdl(gemm_kernel<WeightMat::kFragMXFP4>, dim3(grid), dim3(128), 0, s, a);
    else
      launch_pdl(gemm_kernel<WeightMat::kMXFP4>, dim3(grid), dim3(128), 0, s, a);
  }
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace

int cublas_min_rows() {
  static const int rows = std::max(1, env_int("GPTOSS_CUBLAS_MIN_ROWS", 17));
  return rows;
}

LinearKernel choose_linear_kernel(const LinearProblem& p) {
  const bool frag = p.fmt == WeightMat::kFragBF16 || p.fmt == WeightMat::kFragFP8 || p.fmt == WeightMat::kFragMXFP4;
  if (p.invariant) {
    if (frag) return LinearKernel::kSkinnyMma;
    if (p.fmt == WeightMat::kBF16 && !p.grouped && p.N <= 512) return LinearKernel::kGemvBf16;
    return LinearKernel::kNone;
  }
  // Dense bf16 layers (qkv, o_proj, lm_head; the router past the GEMV's range) from
  // cublas_min_rows() rows on cuBLASLt when offered: ~3x our mma.sync GEMM at prefill sizes, and
  // ahead of the skinny kernels past 16 tokens (bench-kernels prints both).
  if (p.cublas && p.fmt == WeightMat::kBF16 && !p.grouped && p.force_path == 0 && p.rows >= cublas_min_rows())
    return LinearKernel::kCublasLt;
  if (frag) {
    // Decode batches (tokens per group <= 64) ride the tensor-core "skinny" kernels; prefill
    // tiles go to the mma GEMM (which reads the MXFP4 fragment layout directly).
    if (p.force_path != 2 && p.tokens <= kSkinnyMaxTokens) {
      // Tokens one weight matrix sees a pass: dense, all rows; grouped, the mean group (pairs over
      // the experts they can touch), as skinny_linear sizes its n-tiles. One 8-token n-tile: the
      // stream-K kernel (an even share of the chunks for every warp of the GPU).
      const int groups = p.grouped ? std::max(1, std::min(p.rows, p.experts > 0 ? p.experts : p.rows)) : 1;
      const int per_group = p.grouped ? (p.experts > 0 ? (p.rows + groups - 1) / groups : p.tokens) : p.rows;
      if (p.decode_kernel == 0 && per_group <= 8 &&
          streamk_takes(p.fmt, p.N, p.K, p.rows, p.experts > 0 ? p.experts : p.rows, p.grouped, p.rows))
        return LinearKernel::kStreamK;
      return LinearKernel::kSkinnyMma;
    }
    if (p.fmt != WeightMat::kFragMXFP4) return LinearKernel::kNone;
    return LinearKernel::kGemmMma;
  }
  if (p.fmt == WeightMat::kMXFP4 && p.K > kMxMaxK) return LinearKernel::kGemmMma;
  int path = p.force_path;
  if (!path) {
    path = (p.grouped ? p.rows <= 4 * kGemvMaxM : p.rows <= kGemvMaxM) ? 1 : 2;
    // Narrow bf16 matrices (the router) stay on the K-split GEMV for decode batches: the GEMM's
    // 128-column tiles would run them on one or two SMs (bench-kernels, 32 tokens: 30 vs 47 us).
    if (!p.grouped && p.fmt == WeightMat::kBF16 && p.N <= 512 && p.rows <= 64) path = 1;
  }
  if (path == 2) return LinearKernel::kGemmMma;
  return p.fmt == WeightMat::kMXFP4 ? LinearKernel::kGemvMxfp4 : LinearKernel::kGemvBf16;
}

const char* linear_kernel_name(LinearKernel k) {
  switch (k) {
    case LinearKernel::kGemvBf16: return "gemv_bf16";
    case LinearKernel::kGemvMxfp4: return "gemv_mxfp4";
    case LinearKernel::kSkinnyMma: return "skinny_mma";
    case LinearKernel::kStreamK: return "streamk_mma";
    case LinearKernel::kGemmMma: return "gemm_mma";
    case LinearKernel::kCublasLt: return "cublaslt";
    default: return "none";
  }
}

namespace {

LinearKernel pick(const WeightMat& W, int rows, int tokens, bool grouped, bool invariant = false,
                  bool cublas = false, int experts = 0) {
  LinearProblem p{W.fmt, rows, tokens, W.N, W.K, grouped, g_force_path, invariant, cublas, experts,
                  decode_kernel_choice()};
  LinearKernel k = choose_linear_kernel(p);
  if (k == LinearKernel::kNone)
    throw Error("linear: no kernel for this weight format at " + std::to_string(tokens) + " tokens");
  return k;
}

}  // namespace

void set_linear_path(int path) { g_force_path = path; }
void set_gemv_variant(int v) { g_gemv_variant = v; }

void linear(const WeightMat& W, const bf16_t* A, int lda, int M, const Epilogue& epi, cudaStream_t s,
            bool invariant, CublasLtGemm* blas) {
  if (M <= 0) return;
  check_args(W, epi);
  if (epi.mode == Epilogue::kScatterAdd) throw Error("linear: scatter-add needs routing");
  LinArgs a{W, A, lda, M, false, false, MoeRouting{}, epi};
  LinearKernel k = pick(W, M, M, false, invariant, blas && CublasLtGemm::supports(W, lda, epi));
  if (k == LinearKernel::kCublasLt) {
    if (blas->run(W, A, lda, M, epi, s)) return;
    k = pick(W, M, M, false, invariant);  // cuBLASLt has no algorithm for it: our own kernel
  }
  if (k == LinearKernel::kSkinnyMma) {
    // Batch-invariant: 8 warps over K at every M (the shapes chosen by speed differ by M).
    skinny_linear(W, A, false, lda, M, 0, 1, false, false, MoeRouting{}, epi, invariant ? 8 : 0, s);
    return;
  }
  if (k == LinearKernel::kStreamK) {
    streamk_linear(W, A, false, lda, M, 0, 1, false, false, MoeRouting{}, epi, s);
    return;
  }
  const int path = k == LinearKernel::kGemmMma ? 2 : 1;
  launch(a, path, path == 1 ? 1 : (M + BM - 1) / BM, s);
}

bool linear_router_fold(const WeightMat& W, const bf16_t* A, int lda, int M, const Epilogue& epi,
                        const RouterFold& fold, cudaStream_t s) {
  if (M < 1 || M > kRouterFoldMaxTokens || M != fold.n || !fold.acc || epi.mode != Epilogue::kAddF32) return false;
  check_args(W, epi);
  if (pick(W, M, M, false) != LinearKernel::kSkinnyMma) return false;
  return skinny_router_fold(W, A, lda, epi, fold, s);
}

bool linear_norm_in(const WeightMat& W, const NormIn& in, int M, const Epilogue& epi, cudaStream_t s) {
  if (M != 1) return false;
  check_args(W, epi);
  if (pick(W, M, M, false) != LinearKernel::kSkinnyMma) return false;
  return skinny_norm_in(W, in, epi, s);
}

void linear_rmsnorm(const WeightMat& W, const float* x, const float* norm_w, float eps, int M, bf16_t* xn,
                    bool need_xn, const Epilogue& epi, cudaStream_t s, bool xn_f16, CublasLtGemm* blas) {
  if (M <= 0) return;
  check_args(W, epi);
  if (epi.mode == Epilogue::kScatterAdd) throw Error("linear: scatter-add needs routing");
  if (W.K % 8 != 0) throw Error("linear_rmsnorm: K must be a multiple of 8");
  const LinearKernel k = pick(W, M, M, false);
  if (k == LinearKernel::kGemvBf16 && M <= kGemvMaxM) {
    LinArgs a{W, nullptr, W.K, M, false, false, MoeRouting{}, epi};
    launch(a, 1, 1, s, FusedNorm{x, norm_w, eps, need_xn ? xn : nullptr, xn_f16});
    return;
  }
  if (xn_f16) throw Error("linear_rmsnorm: fp16 normalized rows only from the fused decode GEMV");
  rmsnorm(x, norm_w, M, W.K, eps, nullptr, xn, s);
  linear(W, xn, W.K, M, epi, s, false, blas);
}

namespace {
// Whether a grouped launch that picked kernel k runs an expert GEMM over MXFP4 weights.
bool mx_gemm(LinearKernel k, const WeightMat& W) {
  return k == LinearKernel::kGemmMma && (W.fmt == WeightMat::kMXFP4 || W.fmt == WeightMat::kFragMXFP4);
}
// Whether a grouped launch that picked kernel k runs expert GEMM version 5: MXFP4 on the GEMM
// path, version 5 asked for (or automatic and preferred), and a problem it takes. The one rule
// linear_grouped follows and expert_gemm_v5_runs reports.
bool v5_takes(LinearKernel k, const WeightMat& W, const void* A, int lda, int pairs, int E, int a_rows,
              const Epilogue& epi) {
  if (!mx_gemm(k, W)) return false;
  const int version = expert_gemm_version();
  const bool v5 = version == 5 || (version == kExpertGemmAuto && expert_gemm_v5_preferred(pairs, E));
  return v5 && expert_gemm_v5_supports(W, A, lda, a_rows, epi);
}
}  // namespace

bool expert_gemm_v5_runs(const WeightMat& W, const void* A, int lda, int pairs, int E, bool gather_a,
                         const Epilogue& epi, int tokens, bool invariant) {
  if (pairs <= 0) return false;
  if (tokens <= 0) tokens = pairs;
  return v5_takes(pick(W, pairs, tokens, true, invariant, false, E), W, A, lda, pairs, E, gather_a ? tokens : pairs, epi);
}

void linear_grouped(const WeightMat& W, const void* A, int lda, int pairs, int E, bool gather_a,
                    const MoeRouting& r, const Epilogue& epi, cudaStream_t s, int tokens, bool a_f16,
                    bool invariant, bool a_k_permuted) {
  if (pairs <= 0) return;
  check_args(W, epi);
  if (tokens <= 0) tokens = pairs;
  // Decode batches spread over many experts (few rows each): GEMV or tensor-core skinny kernel
  // per group. Prefill: GEMM tiles.
  const LinearKernel k = pick(W, pairs, tokens, true, invariant, false, E);
  const int a_rows = gather_a ? tokens : pairs;
  const bool v5 = v5_takes(k, W, A, lda, pairs, E, a_rows, epi);
  if ((a_k_permuted || epi.k_permuted) && !v5)
    throw Error("linear_grouped: k-permuted activations or output need expert GEMM version 5 (expert_gemm_v5_runs)");
  if (k == LinearKernel::kSkinnyMma) {
    // Batch-invariant: the K-split order of sums (8 warps) at every size, whichever shape runs.
    skinny_linear(W, A, a_f16, lda, tokens, pairs, E, true, gather_a, r, epi, invariant ? 8 : 0, s);
    return;
  }
  if (k == LinearKernel::kStreamK) {
    streamk_linear(W, A, a_f16, lda, tokens, pairs, E, true, gather_a, r, epi, s);
    return;
  }
  if (a_f16) throw Error("linear_grouped: fp16 activations only on the skinny kernels");
  const bool mx = mx_gemm(k, W);
  // Version 5 (weights as wgmma's register A) where asked for and it takes the problem; version 3
  // (Hopper wgmma) where the GPU and the build have it; version 2 otherwise.
  const int version = expert_gemm_version();
  if (v5) {
    expert_gemm_v5(W, static_cast<const bf16_t*>(A), lda, pairs, E, gather_a, a_k_permuted, r, epi, s);
    return;
  }
  if (mx && version >= 3 && expert_gemm_v3_supports(W, A, lda, a_rows, epi)) {
    expert_gemm_v3(W, static_cast<const bf16_t*>(A), lda, pairs, E, gather_a, r, epi, s);
    return;
  }
  if (mx && version >= 2 && expert_gemm_v2_supports(W, A, lda, a_rows, epi)) {
    expert_gemm_v2(W, static_cast<const bf16_t*>(A), lda, pairs, E, gather_a, r, epi, s);
    return;
  }
  LinArgs a{W, static_cast<const uint16_t*>(A), lda, 0, true, gather_a, r, epi};
  const int path = k == LinearKernel::kGemmMma ? 2 : 1;
  launch(a, path, path == 1 ? moe_max_groups(pairs, E) : moe_max_tiles(pairs, E), s);
}

}  // namespace gptoss::cuda
