#pragma once
// The "fragment" weight layout of the tensor-core decode kernels (skinny_mma.cu), as one
// description shared by the packer (frag_pack.cu), the kernels and the tests.
//
// The weights are the M side of mma.sync m16n8k16 (16 output rows per tile), the tokens the N
// side (8 per n-tile), so 1-8 tokens cost one MMA per 16x16 weights and a decode step at batch 1
// streams the weights through the tensor cores like a GEMV. A tile-chunk is 16 rows x 64 K. In
// a chunk, lane (g = lane / 4, tq = lane % 4) owns rows g and g + 8 at the natural K offsets
// 32 h + 8 tq + [0, 8) for h = 0, 1: its A fragments of the four k-steps (j = 2 h + jj) are
//   a0 = W[g][b + 0, 1]   a1 = W[g + 8][b + 0, 1]   a2 = W[g][b + 2, 3]   a3 = W[g + 8][b + 2, 3]
// with b = 32 h + 8 tq + 4 jj. Every MMA k position is a permutation of the natural K order, and
// the activations are read in the same permutation, which makes each lane's B fragments two
// 16-byte loads of 8 consecutive activations (offsets 8 tq and 32 + 8 tq of the chunk) and keeps
// k-steps 0-1 inside the first 32-element MXFP4 scale block and 2-3 inside the second.
//
// Storage, for E experts of N x K (N % 16 == 0, K % 64 == 0), T = N / 16 tiles, C = K / 64:
//   kFragBF16:  uint4 [E][T][C][4 k-steps][32 lanes]  (a0..a3 of one k-step, bf16 pairs)
//   kFragFP8:   uint4 [E][T][C][2 halves][32 lanes]   (k-steps 2h, 2h+1: 8 e4m3 bytes each, a0 lo,
//               a0 hi, a1 lo, ...), plus f32 row_scale [E][N] (w = e4m3 * row_scale)
//   kFragMXFP4: uint4 [E][T][C][32 lanes]             (word j = k-step j: reg i's low value in
//               nibble i, its high value in nibble i + 4), e8m0 scales uint32 [E][T][C][8 g]
//               (bytes: row g block 0, row g block 1, row g+8 block 0, row g+8 block 1)
// Row order inside a tile: natural (row 16 t + i), or for SwiGLU pairs (the checkpoint's gate_up
// interleaves gate row 2j and up row 2j + 1): rows i < 8 are gates 2 (8 t + i), rows i >= 8 the
// matching ups, so a lane holds the gate and up of output 8 t + g and the epilogue fuses SwiGLU.
#include <cstdint>

namespace gptoss::cuda::frag {

constexpr int kTileRows = 16, kChunkK = 64;

// Logical (checkpoint) row of row i (0..15) of tile t.
__host__ __device__ inline int tile_row(int t, int i, bool swiglu_rows) {
  if (!swiglu_rows) return t * kTileRows + i;
  return i < 8 ? 2 * (8 * t + i) : 2 * (8 * t + i - 8) + 1;
}

// Natural K offset (within the chunk) of element e (0..7) of k-step j's a-registers for lane
// quad tq: a_r holds elements 2r, 2r+1 -> rows (r & 1 ? g + 8 : g), offsets b + (r >> 1) * 2 + (e & 1).
__host__ __device__ inline int chunk_k(int j, int tq, int r, int e) {
  return 32 * (j >> 1) + 8 * tq + 4 * (j & 1) + (r >> 1) * 2 + e;
}

}  // namespace gptoss::cuda::frag
