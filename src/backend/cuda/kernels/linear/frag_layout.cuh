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
//   kFragMXFP4: uint4 [E][T][C][32 lanes]             (word j = k-step j: the 8 codes of its four
//               A registers, bits placed by mx_bit_pos() so that mx_word_to_f16x2() decodes them
//               in 11 integer ops), e8m0 scales uint32 [E][T][C][8 g]
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

// MXFP4 codes inside a fragment word. A register's fp16 pair (value x 2^-14) is the sign at bits
// 15/31 and the magnitude bits (m, e0, e1) at 9..11 / 25..27. Register r takes its sign bits from
// rotl(word, sign_rot(r)) and its magnitude bits from rotl(word, mag_rot(r)); the four patterns
// tile the 32 bits (found by exhaustive search: no tiling needs fewer than 11 ops), so decoding a
// word is 5 shifts and 6 LOP3s instead of 15 shift-and-mask ops.
__host__ __device__ constexpr int sign_rot(int r) { return r; }                    // 0, 1, 2, 3
__host__ __device__ constexpr int mag_rot(int r) { return r == 1 ? 6 : r == 2 ? 9 : r; }  // 0, 6, 9, 3

// Bit of the word that holds code bit `bit` (0 = m, 1 = e0, 2 = e1, 3 = sign) of register r's
// low (hi = 0) or high (hi = 1) value.
__host__ __device__ inline int mx_bit_pos(int r, int hi, int bit) {
  const int target = (bit == 3 ? 15 : 9 + bit) + 16 * hi;
  const int rot = bit == 3 ? sign_rot(r) : mag_rot(r);
  return (target - rot + 32) % 32;
}

#ifdef __CUDACC__
// One word -> the four f16x2 A registers of its k-step (exact: e2m1 x 2^-14; the subnormal code
// 0.5 lands on fp16's subnormal 2^-15). No masked bit of a rotation wraps around (sources: bits
// 14/30 and 3-5/19-21 for r = 1, 13/29 and 0-2/16-18 for r = 2, 12/28 and 6-8/22-24 for r = 3),
// so the rotations are plain left shifts, which ptxas may run on the FMA pipe (IMAD.SHL) beside
// the LOP3s on the integer pipe: at one token the decode's integer ops were the kernel's busiest
// pipe (Nsight Compute, H200).
__device__ __forceinline__ void mx_word_to_f16x2(uint32_t q, uint32_t* a) {
  constexpr uint32_t kS = 0x80008000u, kM = 0x0E000E00u;
#ifdef GPTOSS_DIAG_CHEAP_DECODE
  // Timing ceiling only (tools/gpu/diag_binary.sh; wrong values): 5 integer ops a word instead
  // of 11, what an e2m1 -> e4m3 decode for the fp8 MMA would cost.
  a[0] = q & (kS | kM);
  a[1] = (q << 3) & (kS | kM);
  a[2] = a[0] ^ a[1];
  a[3] = q ^ a[1];
  return;
#endif
  a[0] = q & (kS | kM);
  a[1] = ((q << 1) & kS) | ((q << 6) & kM);
  a[2] = ((q << 2) & kS) | ((q << 9) & kM);
  a[3] = (q << 3) & (kS | kM);
}
#endif

}  // namespace gptoss::cuda::frag
