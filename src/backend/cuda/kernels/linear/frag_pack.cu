// Load-time repacking of weights into the fragment layout of frag_layout.cuh (bf16 and MXFP4
// copied bit for bit; bf16 -> e4m3 with a scale per output row for --dense-dtype fp8). Runs once
// per matrix on the device, one thread per (expert, tile, chunk, lane).
#include <cuda_fp8.h>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/frag_layout.cuh"
#include "backend/cuda/kernels/linear/lm_head_screen_math.h"

namespace gptoss::cuda {

namespace {

using frag::chunk_k;
using frag::tile_row;

struct PackGeom {
  int E, N, K, T, C;
  bool swiglu;
  __host__ __device__ size_t items() const { return size_t(E) * T * C * 32; }
};

__device__ inline void unpack_item(const PackGeom& p, size_t i, int& e, int& t, int& c, int& lane) {
  lane = int(i % 32);
  size_t r = i / 32;
  c = int(r % p.C);
  r /= p.C;
  t = int(r % p.T);
  e = int(r / p.T);
}

__global__ void pack_bf16_kernel(const uint16_t* __restrict__ src, PackGeom p, uint4* __restrict__ dst) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < p.items(); i += size_t(gridDim.x) * blockDim.x) {
    int e, t, c, lane;
    unpack_item(p, i, e, t, c, lane);
    const int g = lane / 4, tq = lane % 4;
    const uint16_t* rows[2] = {src + (size_t(e) * p.N + tile_row(t, g, p.swiglu)) * p.K + size_t(c) * 64,
                               src + (size_t(e) * p.N + tile_row(t, g + 8, p.swiglu)) * p.K + size_t(c) * 64};
    for (int j = 0; j < 4; ++j) {
      uint32_t reg[4];
      for (int r = 0; r < 4; ++r) {
        const uint16_t* row = rows[r & 1];
        reg[r] = uint32_t(row[chunk_k(j, tq, r, 0)]) | (uint32_t(row[chunk_k(j, tq, r, 1)]) << 16);
      }
      dst[((size_t(e) * p.T + t) * p.C + c) * 128 + j * 32 + lane] = make_uint4(reg[0], reg[1], reg[2], reg[3]);
    }
  }
}

__device__ inline uint32_t nibble_at(const uint8_t* blocks_row, int k) {
  uint8_t b = blocks_row[k / 2];
  return (k & 1) ? (b >> 4) : (b & 15u);
}

__global__ void pack_mxfp4_kernel(const uint8_t* __restrict__ blocks, const uint8_t* __restrict__ scales, PackGeom p,
                                  uint4* __restrict__ dst, uint32_t* __restrict__ dst_scales,
                                  int* __restrict__ bad_scale) {
  const int kb = p.K / 32;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < p.items(); i += size_t(gridDim.x) * blockDim.x) {
    int e, t, c, lane;
    unpack_item(p, i, e, t, c, lane);
    const int g = lane / 4, tq = lane % 4;
    const size_t r0 = size_t(e) * p.N + tile_row(t, g, p.swiglu), r1 = size_t(e) * p.N + tile_row(t, g + 8, p.swiglu);
    const uint8_t* rows[2] = {blocks + r0 * kb * 16 + size_t(c) * 32, blocks + r1 * kb * 16 + size_t(c) * 32};
    uint32_t words[4];
    for (int j = 0; j < 4; ++j) {
      uint32_t w = 0;
      for (int r = 0; r < 4; ++r)
        for (int hi = 0; hi < 2; ++hi) {
          const uint32_t code = nibble_at(rows[r & 1], chunk_k(j, tq, r, hi));
          for (int bit = 0; bit < 4; ++bit) w |= ((code >> bit) & 1u) << frag::mx_bit_pos(r, hi, bit);
        }
      words[j] = w;
    }
    const size_t tc = (size_t(e) * p.T + t) * p.C + c;
    dst[tc * 32 + lane] = make_uint4(words[0], words[1], words[2], words[3]);
    if (tq == 0) {
      uint32_t s00 = scales[r0 * kb + 2 * c], s01 = scales[r0 * kb + 2 * c + 1];
      uint32_t s10 = scales[r1 * kb + 2 * c], s11 = scales[r1 * kb + 2 * c + 1];
      // The kernels build 2^(s - 127 + 14) by one integer multiply-add (exact up to s = 240).
      if (max(max(s00, s01), max(s10, s11)) > 240u) atomicOr(bad_scale, 1);
      dst_scales[tc * 8 + g] = s00 | (s01 << 8) | (s10 << 16) | (s11 << 24);
    }
  }
}

// One block per row (256 threads): the row's largest magnitude -> scale = amax / 448 (e4m3's
// largest finite).
__global__ void __launch_bounds__(256) fp8_row_scale_kernel(const uint16_t* __restrict__ src, int K,
                                                            float* __restrict__ row_scale) {
  const uint16_t* row = src + size_t(blockIdx.x) * K;
  __shared__ float red[256 / 32];
  float m = 0.f;
  for (int k = threadIdx.x; k < K; k += 256) m = fmaxf(m, fabsf(bf16_bits_to_f32(row[k])));
  const float v = block_max<256>(m, red);
  if (threadIdx.x == 0) row_scale[blockIdx.x] = v > 0.f ? v / 448.f : 1.f;
}

// Byte codes in kFragFP8's layout: Code::row(r) gives row r's parameter, code(w, that) a weight's
// byte (e4m3 at the row's scale for --dense-dtype fp8; the int8 screen of lm_head's codes + 128).
struct Fp8Code {
  const float* row_scale;
  __device__ float row(size_t r) const { return 1.f / row_scale[r]; }
  __device__ uint32_t operator()(float w, float inv) const { return f32_to_fp8_bits(w * inv); }
};
struct I8Code {
  const float* scale;  // row r's at scale[r * stride]
  int stride;
  __device__ float row(size_t r) const { return scale[r * stride]; }
  __device__ uint32_t operator()(float w, float sc) const { return uint32_t(screen::quantize(w, sc) + 128); }
};

template <class Code>
__global__ void pack_bytes_kernel(const uint16_t* __restrict__ src, Code code, PackGeom p, uint4* __restrict__ dst) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < p.items(); i += size_t(gridDim.x) * blockDim.x) {
    int e, t, c, lane;
    unpack_item(p, i, e, t, c, lane);
    const int g = lane / 4, tq = lane % 4;
    const size_t r0 = size_t(e) * p.N + tile_row(t, g, p.swiglu), r1 = size_t(e) * p.N + tile_row(t, g + 8, p.swiglu);
    const uint16_t* rows[2] = {src + r0 * p.K + size_t(c) * 64, src + r1 * p.K + size_t(c) * 64};
    const float rp[2] = {code.row(r0), code.row(r1)};
    for (int h = 0; h < 2; ++h) {
      uint32_t words[4];
      for (int jj = 0; jj < 2; ++jj) {
        const int j = 2 * h + jj;
        uint32_t b[8];
        for (int r = 0; r < 4; ++r)
          for (int el = 0; el < 2; ++el) b[2 * r + el] = code(bf16_bits_to_f32(rows[r & 1][chunk_k(j, tq, r, el)]), rp[r & 1]);
        words[2 * jj] = b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24);
        words[2 * jj + 1] = b[4] | (b[5] << 8) | (b[6] << 16) | (b[7] << 24);
      }
      dst[(((size_t(e) * p.T + t) * p.C + c) * 2 + h) * 32 + lane] = make_uint4(words[0], words[1], words[2], words[3]);
    }
  }
}

PackGeom geom(const WeightMat& W, int E, bool swiglu) {
  if (W.N % 16 || W.K % 64)
    throw Error("fragment layout: N must be a multiple of 16 and K of 64 (got " + std::to_string(W.N) + " x " +
                std::to_string(W.K) + ")");
  return PackGeom{E, W.N, W.K, W.N / 16, W.K / 64, swiglu};
}

int grid_for(size_t items) { return int(std::min<size_t>((items + 255) / 256, 4096)); }

}  // namespace

bool frag_packable(const WeightMat& W) { return W.N % 16 == 0 && W.K % 64 == 0; }

size_t frag_weight_bytes(WeightMat::Format fmt, int E, int N, int K) {
  size_t el = size_t(E) * N * K;
  switch (fmt) {
    case WeightMat::kFragBF16: return el * 2;
    case WeightMat::kFragFP8: return el;
    case WeightMat::kFragMXFP4: return el / 2;
    default: return 0;
  }
}

WeightMat pack_frag(const WeightMat& W, int E, bool swiglu_rows, WeightMat::Format to, void* w_out, void* aux_out,
                    int* d_flag, cudaStream_t s) {
  const PackGeom p = geom(W, E, swiglu_rows);
  WeightMat o = W;
  o.fmt = to;
  o.w = w_out;
  o.swiglu_rows = swiglu_rows;
  const int grid = grid_for(p.items());
  if (W.fmt == WeightMat::kBF16 && to == WeightMat::kFragBF16) {
    pack_bf16_kernel<<<grid, 256, 0, s>>>(static_cast<const uint16_t*>(W.w), p, static_cast<uint4*>(w_out));
  } else if (W.fmt == WeightMat::kMXFP4 && to == WeightMat::kFragMXFP4) {
    pack_mxfp4_kernel<<<grid, 256, 0, s>>>(static_cast<const uint8_t*>(W.w), W.scales, p, static_cast<uint4*>(w_out),
                                           static_cast<uint32_t*>(aux_out), d_flag);
    o.scales = static_cast<const uint8_t*>(aux_out);
  } else if (W.fmt == WeightMat::kBF16 && to == WeightMat::kFragFP8) {
    float* rs = static_cast<float*>(aux_out);
    fp8_row_scale_kernel<<<E * W.N, 256, 0, s>>>(static_cast<const uint16_t*>(W.w), W.K, rs);
    pack_bytes_kernel<<<grid, 256, 0, s>>>(static_cast<const uint16_t*>(W.w), Fp8Code{rs}, p, static_cast<uint4*>(w_out));
    o.row_scale = rs;
  } else {
    throw Error("pack_frag: unsupported conversion");
  }
  GPTOSS_CUDA_LAUNCH_CHECK();
  return o;
}

void pack_frag_i8(const WeightMat& W, const float* scale, int scale_stride, void* w_out, cudaStream_t s) {
  if (W.fmt != WeightMat::kBF16) throw Error("pack_frag_i8: needs bf16 weights");
  const PackGeom p = geom(W, 1, false);
  pack_bytes_kernel<<<grid_for(p.items()), 256, 0, s>>>(static_cast<const uint16_t*>(W.w), I8Code{scale, scale_stride}, p,
                                                        static_cast<uint4*>(w_out));
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
