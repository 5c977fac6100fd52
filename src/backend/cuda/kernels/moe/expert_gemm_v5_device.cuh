#pragma once
// Device pieces of prefill expert GEMM version 5 that its kernels share (expert_gemm_wgmma_wa.cu,
// expert_gemm_v5_ws.cu): the fragment K order of its activations, the exact e2m1/e8m0 decode of a
// lane's weight chunk into wgmma's A registers, the one-factor test of a tile's scales, and the
// epilogue from the accumulators.
#include <cstdint>

#include "backend/cuda/kernels/moe/expert_gemm_common.cuh"
#include "backend/cuda/tensor_core_ptx.cuh"
#include "backend/cuda/wgmma_ptx.cuh"

namespace gptoss::cuda::moe_gemm {

inline constexpr int kWaTilesWg = 4;  // 16-row weight tiles a warpgroup (wgmma M = 64)

// Where natural K offset k (of a row of K, k % 64 = 32 h + 8 a + 4 b + 2 c + e) sits in the
// fragment K order version 5 stores activations in: position 32 h + 16 b + 8 c + 2 a + e of its
// 64-wide chunk (stored k16 slice j = 2 h + b, pair q = a + 4 c; the head's formula inverted).
__host__ __device__ constexpr int wa_frag_k_pos(int k) {
  const int n = k & 63;
  return (k & ~63) | (n & 32) | ((n & 4) << 2) | ((n & 2) << 2) | ((n & 24) >> 2) | (n & 1);
}
static_assert(wa_frag_k_pos(4) == 16 && wa_frag_k_pos(2) == 8 && wa_frag_k_pos(8) == 2 && wa_frag_k_pos(65) == 65,
              "the fragment K order's inverse");

// Launches the warp-specialized kernel (expert_gemm_v5_ws.cu) over 128-pair tiles: k-permuted
// activations of a_rows rows (the tensor copies' bound), four warpgroups and a producer warp.
// tma: the activation rows by tensor copies (else by the producer warp's cp.async).
void launch_expert_gemm_v5_ws(const ExpertGemmArgs& a, int a_rows, int pairs, int E, bool tma, cudaStream_t s);

#ifdef SM90A_WGMMA
__device__ __forceinline__ uint8_t* wa_align1024(uint8_t* p) {
  const uint32_t s = ptx::smem_addr(p);
  return p + ((1024u - (s & 1023u)) & 1023u);
}

// Every scale byte of the word <= 128 (gpt-oss's sit near 127): one bf16 factor a register
// gives the same bits as two.
__device__ __forceinline__ bool wa_one_factor(uint32_t fs) {
  const uint32_t big = (fs >> 7) & 0x01010101u;
  return (fs & (big * 0x7Fu)) == 0u;
}

// One lane's chunk (16 bytes: k-steps 0-3, rows g and g + 8) and its scale word (bytes: row g
// block 0, row g block 1, row g + 8 block 0, row g + 8 block 1) -> the bf16 A registers of the
// four k16 slices: A[4 j + r] (register r of slice j). Exact, as version 3's decode. kOne: every
// scale of the CTA passed wa_one_factor (chosen once a CTA, so no branch a step).
template <bool kOne>
__device__ __forceinline__ void wa_decode(const uint4& q, uint32_t fs, uint32_t (&A)[16]) {
  const uint32_t wq[4] = {q.x, q.y, q.z, q.w};
  const uint32_t hi = kOne ? fs + 0x7E7E7E7Eu : __vminu4(fs, 0x80808080u) + 0x7E7E7E7Eu;
  const uint32_t lo = kOne ? 0u : __vmaxu4(fs, 0x80808080u) - 0x01010101u;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t hg = frag_scale_pair(hi, h), hg8 = frag_scale_pair(hi, 2 + h);
    const uint32_t lg = kOne ? 0u : frag_scale_pair(lo, h), lg8 = kOne ? 0u : frag_scale_pair(lo, 2 + h);
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      const int j = 2 * h + jj;
      uint32_t r[4];
      frag_word_to_bf16x2(wq[j], r);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t v = bf16x2_mul(r[i], (i & 1) ? hg8 : hg);
        if constexpr (!kOne) v = bf16x2_mul(v, (i & 1) ? lg8 : lg);
        A[4 * j + i] = v;
      }
    }
  }
}

// Whether every scale of a tile (its C x 8 scale words, from tile-chunk tc0) passes wa_one_factor,
// this lane's share: the words as 16-byte loads, all issued before any is used (Nsight Compute: a
// serial scan of 4-byte loads held ~5% of the samples). The CTA then ANDs every lane's answer.
__device__ __forceinline__ bool wa_tile_takes_one_factor(const uint8_t* scales, size_t tc0, int C, int lane) {
  bool one = true;
  {
    const uint4* sc = reinterpret_cast<const uint4*>(scales + tc0 * 32);
    uint4 w[3];
  #pragma unroll
    for (int r = 0; r < 3; ++r) {
      const int i = lane + 32 * r;
      w[r] = i < 2 * C ? __ldg(sc + i) : make_uint4(0, 0, 0, 0);
    }
    for (int i = lane + 96; i < 2 * C; i += 32) {  // K > 3072
      const uint4 x = __ldg(sc + i);
      one &= wa_one_factor(x.x) && wa_one_factor(x.y) && wa_one_factor(x.z) && wa_one_factor(x.w);
    }
  #pragma unroll
    for (int r = 0; r < 3; ++r)
      one &= wa_one_factor(w[r].x) && wa_one_factor(w[r].y) && wa_one_factor(w[r].z) && wa_one_factor(w[r].w);
  }
  return one;
}

// The epilogue from the accumulators of a BN-pair tile: acc[i] is weight row g + 8 ((i >> 1) & 1) of
// this warp's tile `tile`, sorted pair row0 + 8 (i >> 2) + 2 tq + (i & 1); n_g / n_g8 and b_g / b_g8 are
// rows g and g + 8's output columns and biases.
template <int BN>
__device__ __forceinline__ void wa_epilogue(const ExpertGemmArgs& a, const float (&acc)[BN / 2], int tile, int lane,
                                            int row0, int row_end, int n_g, int n_g8, float b_g, float b_g8) {
  const int g = lane >> 2;
  const int tq = lane & 3;
  if (a.swiglu_rows && a.epi.mode == Epilogue::kSwiGLU) {
    // Gate (row g) and up (row g + 8) of output column 8 tile + g (k_permuted: stored where the
    // next version 5 GEMM reads that K, wa_frag_k_pos).
    const int j = a.epi.k_permuted ? wa_frag_k_pos(8 * tile + g) : 8 * tile + g;
#pragma unroll
    for (int t8 = 0; t8 < BN / 8; ++t8)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int row = row0 + 8 * t8 + 2 * tq + e;
        if (row >= row_end) continue;
        const float gate = acc[4 * t8 + e] + b_g, up = acc[4 * t8 + 2 + e] + b_g8;
        static_cast<uint16_t*>(a.epi.out)[size_t(row) * a.epi.ldo + j] =
            to_half_bits(swiglu_dev(gate, up, a.epi.swiglu_limit), a.epi.out_f16);
      }
    return;
  }
#pragma unroll
  for (int t8 = 0; t8 < BN / 8; ++t8)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int row = row0 + 8 * t8 + 2 * tq + e;
      if (row >= row_end) continue;
      store_pair(a.epi, a.r, row, n_g, acc[4 * t8 + e] + b_g, 0.f, false);
      store_pair(a.epi, a.r, row, n_g8, acc[4 * t8 + 2 + e] + b_g8, 0.f, false);
    }
}
#endif

}  // namespace gptoss::cuda::moe_gemm
