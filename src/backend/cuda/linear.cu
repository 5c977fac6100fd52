// Linear layers: dense (bf16 weights) and grouped MoE (MXFP4 experts, dequantized on the fly,
// never stored as bf16). Small M: CUDA-core GEMV streaming 16-byte weight chunks, one warp per
// output row pair (so gate/up pairs meet for the SwiGLU epilogue). Larger M: mma.sync m16n8k16
// bf16 GEMM with fp32 accumulation, MXFP4 tiles dequantized into shared memory. Grouped launches
// size their grids from host-known upper bounds and read the real group/tile counts on the
// device, so they capture in CUDA graphs.
#include <algorithm>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace gptoss::cuda {

namespace {

int g_force_path = 0;

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
constexpr int kGemvMaxM = 8;  // the auto path uses GEMV up to this many rows (per group)

template <int FMT>
__global__ void __launch_bounds__(256) gemv_kernel(LinArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int n0 = (blockIdx.x * kGemvWarps + warp) * kGemvRowsPerWarp;
  const int N = a.W.N, K = a.W.K;
  int row_begin = 0, row_end = a.M, expert = 0;
  if (a.grouped) {
    int g = blockIdx.y;
    if (g >= a.r.counts[0]) return;
    row_begin = a.r.group_start[g];
    row_end = a.r.group_end[g];
    expert = a.r.group_expert[g];
  }
  if (n0 >= N) return;
  const bool has1 = n0 + 1 < N;
  const int n1 = has1 ? n0 + 1 : n0;
  float bias0 = 0.f, bias1 = 0.f;
  if (a.W.bias) {
    bias0 = a.W.bias[size_t(expert) * N + n0];
    bias1 = a.W.bias[size_t(expert) * N + n1];
  }
  for (int rb = row_begin; rb < row_end; rb += kGemvMT) {
    const int mt = min(kGemvMT, row_end - rb);
    const uint16_t* xrow[kGemvMT];
#pragma unroll
    for (int m = 0; m < kGemvMT; ++m) {
      int p = rb + min(m, mt - 1);
      int ar = a.gather_a ? a.r.pair_token[p] : p;
      xrow[m] = a.A + size_t(ar) * a.lda;
    }
    float acc0[kGemvMT], acc1[kGemvMT];
#pragma unroll
    for (int m = 0; m < kGemvMT; ++m) acc0[m] = acc1[m] = 0.f;

    if constexpr (FMT == WeightMat::kBF16) {
      const uint16_t* W = static_cast<const uint16_t*>(a.W.w) + size_t(expert) * N * K;
      const uint4* w0 = reinterpret_cast<const uint4*>(W + size_t(n0) * K);
      const uint4* w1 = reinterpret_cast<const uint4*>(W + size_t(n1) * K);
      const int chunks = K / 8;
      constexpr int U = 4;
      for (int c0 = lane; c0 < chunks; c0 += 32 * U) {
        uint4 wa[U], wb[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          int c = c0 + u * 32;
          if (c < chunks) { wa[u] = __ldg(w0 + c); wb[u] = __ldg(w1 + c); }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          int c = c0 + u * 32;
          if (c >= chunks) break;
          const uint32_t* pa = reinterpret_cast<const uint32_t*>(&wa[u]);
          const uint32_t* pb = reinterpret_cast<const uint32_t*>(&wb[u]);
#pragma unroll
          for (int m = 0; m < kGemvMT; ++m) {
            if (m >= mt) break;
            uint4 xv = *reinterpret_cast<const uint4*>(xrow[m] + size_t(c) * 8);
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
    } else {
      const int kb = K / 32;
      const uint8_t* B = static_cast<const uint8_t*>(a.W.w) + size_t(expert) * N * kb * 16;
      const uint8_t* S = a.W.scales + size_t(expert) * N * kb;
      const uint4* w0 = reinterpret_cast<const uint4*>(B + size_t(n0) * kb * 16);
      const uint4* w1 = reinterpret_cast<const uint4*>(B + size_t(n1) * kb * 16);
      const uint8_t* s0 = S + size_t(n0) * kb;
      const uint8_t* s1 = S + size_t(n1) * kb;
      constexpr int U = 2;
      for (int c0 = lane; c0 < kb; c0 += 32 * U) {
        uint4 wa[U], wb[U];
        uint32_t sa[U], sb[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          int c = c0 + u * 32;
          if (c < kb) { wa[u] = __ldg(w0 + c); wb[u] = __ldg(w1 + c); sa[u] = __ldg(s0 + c); sb[u] = __ldg(s1 + c); }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          int c = c0 + u * 32;
          if (c >= kb) break;
          const float fsa = mx_scale_hi(sa[u]), fsb = mx_scale_hi(sb[u]);
          const float lsa = mx_scale_lo(sa[u]), lsb = mx_scale_lo(sb[u]);
          float da[32], db[32];
          const uint32_t* pa = reinterpret_cast<const uint32_t*>(&wa[u]);
          const uint32_t* pb = reinterpret_cast<const uint32_t*>(&wb[u]);
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              da[i * 8 + j] = e2m1_bits(pa[i] >> (4 * j)) * fsa;
              db[i * 8 + j] = e2m1_bits(pb[i] >> (4 * j)) * fsb;
            }
#pragma unroll
          for (int m = 0; m < kGemvMT; ++m) {
            if (m >= mt) break;
            const uint4* xp = reinterpret_cast<const uint4*>(xrow[m] + size_t(c) * 32);
            float t0 = 0.f, t1 = 0.f;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              uint4 xv = xp[q];
              const uint32_t* px = reinterpret_cast<const uint32_t*>(&xv);
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                float2 x = bf16x2_to_f32x2(px[i]);
                int e = q * 8 + i * 2;
                t0 = fmaf(da[e], x.x, fmaf(da[e + 1], x.y, t0));
                t1 = fmaf(db[e], x.x, fmaf(db[e + 1], x.y, t1));
              }
            }
            acc0[m] = fmaf(t0, lsa, acc0[m]);
            acc1[m] = fmaf(t1, lsb, acc1[m]);
          }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kGemvMT; ++m) {
      acc0[m] = warp_sum(acc0[m]);
      acc1[m] = warp_sum(acc1[m]);
    }
    if (lane < mt) {
      // Each of the first mt lanes finishes one token (compile-time indices via the loop).
#pragma unroll
      for (int m = 0; m < kGemvMT; ++m) {
        if (m != lane) continue;
        int row = rb + m;
        float v0 = acc0[m] + bias0, v1 = acc1[m] + bias1;
        if (a.epi.mode == Epilogue::kSwiGLU) {
          epi_swiglu(a, row, n0, v0, v1);
        } else {
          epi_store(a, row, n0, v0);
          if (has1) epi_store(a, row, n0 + 1, v1);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// GEMM (mma.sync m16n8k16 bf16, fp32 accumulate)

constexpr int BM = kGemmBM, BN = 128, BK = 32, SK = BK + 8;  // SK: padded row, conflict-free ldmatrix

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  int sz = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(sz));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <int FMT>
__global__ void __launch_bounds__(128) gemm_kernel(LinArgs a) {
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
  auto load_b = [&](int kt, int st) {
    if constexpr (FMT == WeightMat::kBF16) {
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
    if constexpr (FMT == WeightMat::kMXFP4) {
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

void launch(const LinArgs& a, int path, int grid_y, cudaStream_t s) {
  if (grid_y <= 0) return;
  if (path == 1) {
    dim3 grid((a.W.N + kGemvRowsPerBlock - 1) / kGemvRowsPerBlock, a.grouped ? grid_y : 1);
    if (a.W.fmt == WeightMat::kBF16)
      gemv_kernel<WeightMat::kBF16><<<grid, 256, 0, s>>>(a);
    else
      gemv_kernel<WeightMat::kMXFP4><<<grid, 256, 0, s>>>(a);
  } else {
    dim3 grid((a.W.N + BN - 1) / BN, grid_y);
    if (a.W.fmt == WeightMat::kBF16)
      gemm_kernel<WeightMat::kBF16><<<grid, 128, 0, s>>>(a);
    else
      gemm_kernel<WeightMat::kMXFP4><<<grid, 128, 0, s>>>(a);
  }
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace

void set_linear_path(int path) { g_force_path = path; }

void linear(const WeightMat& W, const bf16_t* A, int lda, int M, const Epilogue& epi, cudaStream_t s) {
  if (M <= 0) return;
  check_args(W, epi);
  if (epi.mode == Epilogue::kScatterAdd) throw Error("linear: scatter-add needs routing");
  LinArgs a{W, A, lda, M, false, false, MoeRouting{}, epi};
  int path = g_force_path ? g_force_path : (M <= kGemvMaxM ? 1 : 2);
  launch(a, path, path == 1 ? 1 : (M + BM - 1) / BM, s);
}

void linear_grouped(const WeightMat& W, const bf16_t* A, int lda, int pairs, int E, bool gather_a,
                    const MoeRouting& r, const Epilogue& epi, cudaStream_t s) {
  if (pairs <= 0) return;
  check_args(W, epi);
  LinArgs a{W, A, lda, 0, true, gather_a, r, epi};
  // Decode batches spread over many experts (few rows each): GEMV per group. Prefill: GEMM tiles.
  int path = g_force_path ? g_force_path : (pairs <= 4 * kGemvMaxM ? 1 : 2);
  launch(a, path, path == 1 ? moe_max_groups(pairs, E) : moe_max_tiles(pairs, E), s);
}

}  // namespace gptoss::cuda
