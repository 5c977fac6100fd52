// GEMV for decode sizes: dense bf16 (row pairs, or whole rows a warp for wide matrices, with the
// RMSNorm optionally fused in) and grouped MXFP4 experts (codes decoded by byte permutes). One warp
// per output row pair, so gate/up pairs meet for the SwiGLU epilogue. Grouped launches size their
// grids from host-known upper bounds and read the real group counts on the device (graph capture).
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/kernels/linear/linear_common.cuh"

namespace gptoss::cuda::linear_impl {

namespace {

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

// 1 / rms of the fused norm's f32 row `row` (K values) as rmsnorm_kernel computes it, a warp's
// lanes summing strided float4s; every lane gets the result.
__device__ __forceinline__ float fused_norm_inv_rms(const FusedNorm& fn, int row, int K, int lane) {
  const float4* xr = reinterpret_cast<const float4*>(fn.x + size_t(row) * K);
  float ss = 0.f;
  for (int i = lane; i < K / 4; i += 32) {
    float4 v = xr[i];
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  ss = warp_sum(ss);
  return 1.0f / sqrtf(ss / float(K) + fn.eps);
}

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
  int row_begin, row_end, expert;
  if (!gemv_block_rows(a, row_begin, row_end, expert)) return;  // uniform over the block
  __shared__ float inv_rms[kGemvMaxM];
  __shared__ float red[KS > 1 ? kGemvWarps : 1][2 * kGemvMT];
  if (fn.x) {
    // Dense only (M <= kGemvMaxM = warps): warp m finds token m's 1 / rms.
    if (warp < a.M) {
      const float inv = fused_norm_inv_rms(fn, warp, K, lane);
      if (lane == 0) inv_rms[warp] = inv;
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
      const float inv = fused_norm_inv_rms(fn, warp, K, lane);
      if (lane == 0) inv_rms[warp] = inv;
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
  int row_begin, row_end, expert;
  if (!gemv_block_rows(a, row_begin, row_end, expert)) return;  // uniform over the block
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

}  // namespace

void launch_gemv(const LinArgs& a, int grid_y, cudaStream_t s, const FusedNorm& fn, int variant) {
  if (grid_y <= 0) return;
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
               int(grid.x) >= sm_count() && variant != 1) {
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
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda::linear_impl
