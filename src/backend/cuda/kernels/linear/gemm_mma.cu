// The mma.sync m16n8k16 bf16 GEMM with fp32 accumulation for larger M: dense bf16 weights, and
// grouped MXFP4 experts (checkpoint or fragment layout) dequantized tile by tile into shared
// memory, never stored as bf16. Grouped launches read the real tile counts on the device.
#include "backend/cuda/kernels/linear/frag_layout.cuh"
#include "backend/cuda/kernels/linear/linear_common.cuh"
#include "backend/cuda/tensor_core_ptx.cuh"

namespace gptoss::cuda::linear_impl {

namespace {


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

}  // namespace

void launch_gemm_mma(const LinArgs& a, int grid_y, cudaStream_t s) {
  if (grid_y <= 0) return;
    dim3 grid((a.W.N + BN - 1) / BN, grid_y);
    if (a.W.fmt == WeightMat::kBF16)
      launch_pdl(gemm_kernel<WeightMat::kBF16>, dim3(grid), dim3(128), 0, s, a);
    else if (a.W.fmt == WeightMat::kFragMXFP4)
      launch_pdl(gemm_kernel<WeightMat::kFragMXFP4>, dim3(grid), dim3(128), 0, s, a);
    else
      launch_pdl(gemm_kernel<WeightMat::kMXFP4>, dim3(grid), dim3(128), 0, s, a);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda::linear_impl
