// Decode attention on tensor cores: one new token a sequence, gpt-oss attention (sinks, GQA,
// optional sliding window) over the paged KV cache, RoPE and the new token's K/V store folded in
// (the same job and the same splits as attention.cu's fused modes, which stay for other shapes).
//
// Why: attention.cu's decode kernel runs the 8 query heads of a kv head as CUDA-core dot
// products over keys staged as floats; at 32 sequences x 512 keys it reads its K/V at 0.7-0.9
// TB/s, issue-bound on shared-memory loads and FMAs. Here a block's query heads are the M side of
// mma.sync m16n8k16 (rows 0..G-1 of 16, the rest zero), keys the N side of S = Q K^T and the K side
// of O = P V, exactly as the prefill flash kernel lays out its rows: a 64-key tile costs a warp
// 24 MMAs (P in two bf16 parts) and 8 ldmatrix instead of thousands of FMAs.
//
// Work: block (token t, kv head, split) of 4 warps. The split's keys [lo, pos] go in 64-key
// tiles (split boundaries as in attention.cu, in these tiles) through a 3-stage cp.async ring
// (bf16 pages: K and V straight into swizzled tiles, kv_tile.cuh; fp8 pages: raw bytes, widened to
// one bf16 tile). Warp w takes keys 16 w .. 16 w + 15 of every tile with its own online softmax
// (log2 domain) over all G heads; after the last tile the 4 warps' (m, l, O) merge in shared
// memory into one partial row per head, which leaves as attention.cu's do: to `partial` for the
// merge launch, or merged across the cluster of splits (split_merge.cuh, the same code).
//
// Fused K/V store: the block whose split holds the last tile ropes k, stores k and v (bf16 or
// fp8, rounded as rope_kv_store does) and writes the stored values into its tile's row for `pos`
// (which the loads skip: no block reads a K/V row this launch writes). Everything read before
// the programmatic-launch wait (positions, page tables, pages of earlier positions) was written
// before the previous kernel started.
//
// Stored mode (STORED, for passes that bring several tokens of a sequence: speculative verify
// passes, Eagle3 drafts): rope_kv_store ran first, so q is rotated in qkv and every token's K/V,
// the pass's own included, is in the pages. A block then ropes and stores nothing and reads keys
// lo..pos from the pages (after the programmatic-launch wait: the previous kernel wrote some of
// them); the bytes are the ones the fused store would have written, so a one-token pass gives the
// fused mode's bits.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/diag_clocks.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/attention/attention_decode_mma.h"
#include "backend/cuda/kernels/attention/kv_tile.cuh"
#include "backend/cuda/kernels/attention/rope_math.cuh"
#include "backend/cuda/kernels/attention/split_merge.cuh"
#include "backend/cuda/tensor_core_ptx.cuh"
#include "backend/kv_layout.h"

namespace gptoss::cuda {

namespace cg = cooperative_groups;

namespace {

constexpr int kD = 64;          // head_dim
constexpr int kHalf = kD / 2;   // RoPE pairs
constexpr int kMaxG = 8;        // query heads a kv head (M rows used of 16)
constexpr int kKeys = 64;       // keys a tile
constexpr int kWarps = 4;       // 16 keys of a tile each
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 3;
constexpr int kTileBytes = kKeys * kD * 2;  // one bf16 K or V tile: 8 KiB
constexpr int kRawBytes = kKeys * kD;       // one fp8 K or V tile: 4 KiB
// bf16: stage s at s * 16 KiB (K, then V). fp8: raw stages at s * 8 KiB, the widened bf16 tile
// after them. After the loop the warps' outputs reuse the start.
constexpr int kSmemBf16 = kStages * 2 * kTileBytes;
constexpr int kSmemFp8 = kStages * 2 * kRawBytes + 2 * kTileBytes;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kOStride = kD + 8;  // floats a row of the warps' outputs: fewer bank conflicts on their stores

using ptx::cp_async16;

#ifdef GPTOSS_DIAG_ATTN_CLOCKS
// Diagnostic builds only (tools/gpu/diag_binary.sh): each block's thread 0 adds the cycles between
// its stages to [window > 0][split][stage], and a count in [.][.][8]; printed at exit.
__device__ unsigned long long g_attn_clocks[2][16][9];
#define ATTN_CLOCK(i) GPTOSS_STAGE_CLOCK(clk, i)
#else
#define ATTN_CLOCK(i) do {} while (0)
#endif

template <bool FP8, bool CLUSTER, bool STORED>
__global__ void __launch_bounds__(kThreads) attention_decode_mma_kernel(
    const uint16_t* __restrict__ qkv, int Hq, int Hkv, int window, TokenMeta tm, KvLayer kv, int nsplit,
    float* __restrict__ partial, const float* __restrict__ inv_freq, float rope_scaling,
    const float* __restrict__ sinks, uint16_t* __restrict__ out, int trigger_at, bool row_first) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(16) uint16_t q_s[kMaxG][kD];  // roped q, bf16 bits; rows >= G zero
  __shared__ __align__(16) uint16_t kv_new[2][kD];    // the token's own k and v as stored (bf16 bits)
  __shared__ __align__(16) uint16_t row_s[kMaxG + 2][kD];  // the group's q heads, k, v as qkv wrote them
  __shared__ float rope_c[kHalf], rope_s[kHalf];
  __shared__ float warp_m[kWarps][kMaxG], warp_l[kWarps][kMaxG];
  __shared__ float merge_rows[kMaxG][kD + 2];  // the block's partial row a head (m, l, O)
  // Cluster merge: the partial rows of the heads this block merges (g % nsplit == rank), every
  // split's, [g / nsplit][split], written into it by their blocks before the cluster barrier.
  // (Cluster kernels only: without its 6 KB a bf16 block's shared memory, 48 KB of stages and the
  // rest, fits four blocks an SM, not three.)
  __shared__ float recv_rows[CLUSTER ? kMaxG + kDecodeClusterMax - 1 : 1][kD + 2];

  const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
#ifdef GPTOSS_DIAG_ATTN_CLOCKS
  long long clk[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
#endif
  ATTN_CLOCK(0);
  // A block may write into another's shared memory only once that block has started: every
  // thread arrives here, at its start, and waits for the cluster just before the merge's stores
  // (by then all have long arrived; compute-sanitizer's racecheck flags the stores without it).
  if constexpr (CLUSTER)
    if (nsplit > 1) asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
  const int G = Hq / Hkv;
  const int pos = tm.pos[t];
  const int lo = window > 0 ? max(0, pos - window + 1) : 0;
  const int ntiles = (pos - lo + kKeys) / kKeys;
  const int per = (ntiles + nsplit - 1) / nsplit;
  const int tile0 = min(ntiles, split * per), tile1 = min(ntiles, tile0 + per);
  const int32_t* pt = tm.pt + tm.pt_off[t];
  const int ps = kv.page_size;
  const PagedKvLayout layout{ps, Hkv, kD};
  const uint32_t sbase = ptx::smem_addr(smem);
  const uint16_t* row = qkv + size_t(t) * (Hq + 2 * Hkv) * kD;

  // A thread's share of a tile: one 16-byte column (ch) of kKeys / kRowsPerPass keys, their K
  // and V rows. Address math is most of this kernel's instructions (Nsight Compute: IMAD, and
  // the signed division by the page size, outnumbered the MMAs 15 to 1 with a division a chunk),
  // so a key's page and slot are found once for K and V, by shift and mask when the page size is
  // a power of two (block-uniform), and the V row is the K row plus page_size rows.
  constexpr int kLanesPerKey = FP8 ? 4 : 8;              // 16-byte chunks a K or V row
  constexpr int kRowsPerPass = kThreads / kLanesPerKey;  // keys the block covers a pass
  const int my_key = tid / kLanesPerKey, my_ch = tid % kLanesPerKey;
  const size_t row_elems = size_t(Hkv) * kD;
  const size_t v_off = size_t(ps) * row_elems;  // K row -> V row of the same slot
  const size_t col = size_t(kvh) * kD + size_t(my_ch) * (FP8 ? 16 : 8);
  const bool ps_pow2 = (ps & (ps - 1)) == 0;
  const int ps_shift = __ffs(ps) - 1;
  // Tile `tile` into stage `stage`, one cp.async group (empty past the split: the ring's
  // accounting stays uniform). Keys past pos - 1 are zero-filled: pos is this launch's to write
  // (stored mode: keys past pos; pos is in the pages).
  auto load_tile = [&](int tile, int stage) {
    if (tile < tile1) {
      const int k0 = lo + tile * kKeys;
#pragma unroll
      for (int r = 0; r < kKeys / kRowsPerPass; ++r) {
        const int j = my_key + r * kRowsPerPass, p = k0 + j;
        const bool ok = STORED ? p <= pos : p < pos;
        size_t off = 0;  // element offset of the key's K row, this thread's column
        if (ok) {
          int page_idx, slot;
          if (ps_pow2) {
            page_idx = p >> ps_shift;
            slot = p & (ps - 1);
          } else {
            page_idx = int(unsigned(p) / unsigned(ps));
            slot = p - page_idx * ps;
          }
          off = (size_t(pt[page_idx]) * 2 * ps + slot) * row_elems + col;
        }
        if constexpr (!FP8) {
          const uint16_t* src = static_cast<const uint16_t*>(kv.base) + off;
          const uint32_t dst = sbase + stage * 2 * kTileBytes + kv_tile_swz(j, my_ch);
          cp_async16(dst, src, ok);
          cp_async16(dst + kTileBytes, ok ? src + v_off : src, ok);
        } else {  // raw layout [K/V][key][64 bytes]
          const uint8_t* src = static_cast<const uint8_t*>(kv.base) + off;
          const uint32_t dst = sbase + stage * 2 * kRawBytes + (j * kLanesPerKey + my_ch) * 16;
          cp_async16(dst, src, ok);
          cp_async16(dst + kRawBytes, ok ? src + v_off : src, ok);
        }
      }
    }
    ptx::cp_async_commit();
  };

  // Before the wait: nothing here depends on the previous kernel (the qkv projection); in stored
  // mode the pages do (rope_kv_store), so the loads wait. Every stage of the ring is filled here:
  // a split of up to kStages tiles (the sliding layers' window, the cluster splits at short
  // contexts) then reads nothing from memory after the wait but its q, k and v.
  if (STORED) pdl_begin();
  if (!STORED && tid < kHalf) rope_cos_sin(pos, inv_freq[tid], rope_scaling, &rope_c[tid], &rope_s[tid]);
  // The sinks of the heads this warp may merge (g = warp, warp + kWarps), read now rather than on
  // the merge's critical path.
  float sink_v[kMaxG / kWarps];
#pragma unroll
  for (int i = 0; i < kMaxG / kWarps; ++i) sink_v[i] = warp + i * kWarps < G ? sinks[kvh * G + warp + i * kWarps] : 0.f;
  // The split that holds the last tile holds the token's position: it stores k and v.
  const bool stores = !STORED && tile0 < tile1 && tile1 == ntiles;
  const int page = stores ? pt[pos / ps] : 0, slot = pos % ps;
  // The group's q heads (and, in the storing split, k and v) as qkv wrote them: one 16-byte load
  // a thread, all in flight together (one round trip to L2).
  const int nq = G * (kD / 8), n16 = nq + (stores ? 2 * (kD / 8) : 0);
  const uint16_t* row_src = tid < nq ? row + size_t(kvh * G) * kD + tid * 8
                                     : row + size_t(Hq + (tid - nq >= kD / 8 ? Hkv : 0) + kvh) * kD + (tid - nq) % (kD / 8) * 8;
  uint4 row_v = make_uint4(0u, 0u, 0u, 0u);
  // trigger_at: where the fused mode lets the next kernel (o_proj) launch: 0 right after its own
  // wait, as every kernel does, 1 after the tile loop, 2 at its end (GPTOSS_ATTN_TRIGGER, a
  // measurement knob).
  // row_first: the row is asked for before the ring's copies, not after them. Where qkv's kernel
  // lets no dependent launch start early (cuBLASLt, 17-64 tokens) the wait returns at once, and a
  // row asked for behind the ring's 48 KB a block came back thousands of cycles later (s46r1's
  // clocks at 64 sequences: 6,700 full / 9,900 sliding against the ring's 13,200 / 4,600).
  auto wait_for_qkv = [&] {  // (stored mode waited at its start)
    if (!STORED) {
      pdl_wait();
      if (trigger_at == 0) pdl_trigger();
    }
  };
  if (row_first) {
    wait_for_qkv();
    if (tid < n16) row_v = *reinterpret_cast<const uint4*>(row_src);
  }
#pragma unroll
  for (int s = 0; s < kStages; ++s) load_tile(tile0 + s, s);
  if (!row_first) wait_for_qkv();
  ATTN_CLOCK(1);
  if (tid < n16) {
    if (!row_first) row_v = *reinterpret_cast<const uint4*>(row_src);
    *reinterpret_cast<uint4*>(&row_s[0][0] + (tid < nq ? tid * 8 : kMaxG * kD + (tid - nq) * 8)) = row_v;
  }
  __syncthreads();  // rope_c / rope_s, row_s
  ATTN_CLOCK(2);
  // q of the group's heads: rotated, rounded to bf16 (the values rope_kv_store would store; in
  // stored mode, the values it stored).
  for (int i = tid; i < kMaxG * kHalf; i += kThreads) {
    const int g = i / kHalf, j = i % kHalf;
    uint16_t a = 0, b = 0;
    if (g < G) {
      const uint16_t* hp = row_s[g];
      if constexpr (STORED) {
        a = hp[j];
        b = hp[j + kHalf];
      } else {
        const float2 r = rope_rotate(bf16_bits_to_f32(hp[j]), bf16_bits_to_f32(hp[j + kHalf]), rope_c[j], rope_s[j]);
        a = f32_to_bf16_bits(r.x);
        b = f32_to_bf16_bits(r.y);
      }
    }
    q_s[g][j] = a;
    q_s[g][j + kHalf] = b;
  }
  if (stores) {
    if (tid < kHalf) {  // k: rotate, round to bf16 (and fp8), store
      const uint16_t* kp = row_s[kMaxG];
      const float2 r = rope_rotate(bf16_bits_to_f32(kp[tid]), bf16_bits_to_f32(kp[tid + kHalf]), rope_c[tid],
                                   rope_s[tid]);
      const size_t o = layout.offset(page, 0, slot, kvh, tid);
      kv_new[0][tid] = f32_to_bf16_bits(store_kv_value(kv, o, round_to_bf16(r.x)));
      kv_new[0][tid + kHalf] = f32_to_bf16_bits(store_kv_value(kv, o + kHalf, round_to_bf16(r.y)));
    } else if (tid >= 64) {  // v: stored as is (fp8: rounded)
      const int i = tid - 64;
      const float stored =
          store_kv_value(kv, layout.offset(page, 1, slot, kvh, i), bf16_bits_to_f32(row_s[kMaxG + 1][i]));
      kv_new[1][i] = f32_to_bf16_bits(stored);
    }
  }
  __syncthreads();  // q_s, kv_new
  ATTN_CLOCK(3);

  // Q as A fragments (m16n8k16, row = head): a0 row g cols 2q..2q+1, a2 the same 8 columns on;
  // a1 and a3 are rows 8..15, always zero.
  const int gr = lane >> 2, qc = 2 * (lane & 3);
  uint32_t qa[4][4];
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    qa[ks][0] = *reinterpret_cast<const uint32_t*>(&q_s[gr][16 * ks + qc]);
    qa[ks][2] = *reinterpret_cast<const uint32_t*>(&q_s[gr][16 * ks + 8 + qc]);
    qa[ks][1] = qa[ks][3] = 0u;
  }
  const float sc = rsqrtf(float(kD)) * kLog2e;
  float m = -INFINITY, l = 0.f;  // row gr's running max (log2 units) and this thread's part of the sum
  float o[8][2];                 // row gr, dims 8 nb + qc + {0, 1}
#pragma unroll
  for (int nb = 0; nb < 8; ++nb) o[nb][0] = o[nb][1] = 0.f;

  for (int tile = tile0; tile < tile1; ++tile) {
    const int it = tile - tile0, stage = it % kStages;
    // The ring started full: from the second tile on, the stage the last tile freed takes the
    // tile kStages - 1 ahead (an empty group past the split keeps the accounting uniform).
    if (it > 0) load_tile(tile + kStages - 1, (it + kStages - 1) % kStages);
    ptx::cp_async_wait<kStages - 1>();
    __syncthreads();
    const int k0 = lo + tile * kKeys;
    uint32_t kt;  // byte address of the bf16 K tile (V follows)
    if constexpr (FP8) {
      // Widen the raw stage to the bf16 tile (e4m3 values are exact in bf16); pos's row from kv_new.
      const uint8_t* raw = smem + stage * 2 * kRawBytes;
      uint8_t* dst = smem + kStages * 2 * kRawBytes;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = tid + i * kThreads;
        const int which = c >> 8, j = (c >> 2) & 63, ch = c & 3;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int chunk = 2 * ch + half;
          const uint4 v = !STORED && k0 + j == pos ? *reinterpret_cast<const uint4*>(&kv_new[which][chunk * 8])
                                        : widen_fp8x8_to_bf16(*reinterpret_cast<const uint2*>(raw + c * 16 + half * 8));
          *reinterpret_cast<uint4*>(dst + which * kTileBytes + kv_tile_swz(j, chunk)) = v;
        }
      }
      kt = sbase + kStages * 2 * kRawBytes;
      __syncthreads();
    } else {
      kt = sbase + stage * 2 * kTileBytes;
      if (!STORED && k0 + kKeys > pos) {  // the tile holding pos (block-uniform): its row from kv_new
        if (tid < 16) {
          const int which = tid >> 3, ch = tid & 7;
          *reinterpret_cast<uint4*>(smem + stage * 2 * kTileBytes + which * kTileBytes + kv_tile_swz(pos - k0, ch)) =
              *reinterpret_cast<const uint4*>(&kv_new[which][ch * 8]);
        }
        __syncthreads();
      }
    }
    const uint32_t vt = kt + kTileBytes;
    const int kw = k0 + 16 * warp;  // the warp's first key
    if (kw <= pos) {                // warp-uniform: a slice past pos is an exact no-op
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        uint32_t b[4];
        ptx::ldmatrix_x4(b, kt + kv_tile_swz(16 * warp + (lane & 7) + (lane >> 4) * 8, 2 * ks + ((lane >> 3) & 1)));
        ptx::mma_bf16_16816(s[0], qa[ks], b[0], b[1]);
        ptx::mma_bf16_16816(s[1], qa[ks], b[2], b[3]);
      }
      // Row gr's elements: (nb, e) is key kw + 8 nb + qc + e (e < 2; e >= 2 are the zero rows).
      float mx = -INFINITY;
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v = kw + 8 * nb + qc + e <= pos ? s[nb][e] * sc : -INFINITY;
          s[nb][e] = v;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mnew = fmaxf(m, mx);  // finite: the slice's first key is <= pos
      const float corr = fast_exp2(m - mnew);
      m = mnew;
      const float p00 = fast_exp2(s[0][0] - mnew), p01 = fast_exp2(s[0][1] - mnew);
      const float p10 = fast_exp2(s[1][0] - mnew), p11 = fast_exp2(s[1][1] - mnew);
      l = l * corr + (p00 + p01 + p10 + p11);
      // P as two bf16 A fragments, p = hi + lo (lo: the rounding residual, exact in fp32, itself
      // rounded to bf16): O = hi V + lo V keeps ~16 bits of each p, as the fp32 P of the CUDA-core
      // kernel does to within fp32 sums. bf16 P alone (the prefill flash kernel's) moved decode
      // logits enough to flip greedy steps against the CPU sooner on random weights.
      uint32_t pa[4] = {0u, 0u, 0u, 0u}, pl[4] = {0u, 0u, 0u, 0u};
      pa[0] = pack_bf16x2(p00, p01);
      pa[2] = pack_bf16x2(p10, p11);
      {
        const float2 h0 = bf16x2_to_f32x2(pa[0]), h1 = bf16x2_to_f32x2(pa[2]);
        pl[0] = pack_bf16x2(p00 - h0.x, p01 - h0.y);
        pl[2] = pack_bf16x2(p10 - h1.x, p11 - h1.y);
      }
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
        o[nb][0] *= corr;
        o[nb][1] *= corr;
      }
#pragma unroll
      for (int dp = 0; dp < 4; ++dp) {
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, vt + kv_tile_swz(16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * dp + (lane >> 4)));
        float c0[4] = {o[2 * dp][0], o[2 * dp][1], 0.f, 0.f};
        float c1[4] = {o[2 * dp + 1][0], o[2 * dp + 1][1], 0.f, 0.f};
        ptx::mma_bf16_16816(c0, pa, b[0], b[1]);
        ptx::mma_bf16_16816(c1, pa, b[2], b[3]);
        ptx::mma_bf16_16816(c0, pl, b[0], b[1]);
        ptx::mma_bf16_16816(c1, pl, b[2], b[3]);
        o[2 * dp][0] = c0[0];
        o[2 * dp][1] = c0[1];
        o[2 * dp + 1][0] = c1[0];
        o[2 * dp + 1][1] = c1[1];
      }
    }
    __syncthreads();  // the stage is free for the load kStages - 1 tiles ahead
  }
  ptx::cp_async_wait<0>();  // the ring's trailing (empty) groups
  __syncthreads();
  ATTN_CLOCK(4);
  if (trigger_at == 1) pdl_trigger();

  // The 4 warps' states -> one partial row a head. l: the quad's four parts.
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  float* warp_o = reinterpret_cast<float*>(smem);  // [warp][head][kOStride], over the dead stages
  if (gr < G) {
    if ((lane & 3) == 0) {
      warp_m[warp][gr] = m;
      warp_l[warp][gr] = l;
    }
#pragma unroll
    for (int nb = 0; nb < 8; ++nb)
      *reinterpret_cast<float2*>(&warp_o[(warp * kMaxG + gr) * kOStride + 8 * nb + qc]) = make_float2(o[nb][0], o[nb][1]);
  }
  __syncthreads();
  {
    const int g = tid / 16, d0 = (tid % 16) * 4;  // 16 threads a head, 4 dims each
    if (g < G) {
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) M = fmaxf(M, warp_m[w][g]);
      float L = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
      if (M != -INFINITY) {
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const float f = fast_exp2(warp_m[w][g] - M);  // a warp without keys: 2^-inf = 0
          L += warp_l[w][g] * f;
          const float4 v = *reinterpret_cast<const float4*>(&warp_o[(w * kMaxG + g) * kOStride + d0]);
          acc[0] += v.x * f;
          acc[1] += v.y * f;
          acc[2] += v.z * f;
          acc[3] += v.w * f;
        }
      }
      if (d0 == 0) {
        merge_rows[g][0] = M * kLn2;  // natural-log units, as split_merge.cuh expects
        merge_rows[g][1] = L;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) merge_rows[g][2 + d0 + i] = acc[i];
    }
  }
  ATTN_CLOCK(5);
  if (nsplit == 1) {
    // One split (either kernel): the block's rows are the heads' whole rows; merge them here.
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kMaxG / kWarps; ++i) {
      const int g = warp + i * kWarps;
      if (g < G)
        merge_splits<kD>([&](int) { return &merge_rows[g][0]; }, 1, sink_v[i],
                         out + (size_t(t) * Hq + kvh * G + g) * kD, lane);
    }
  } else if constexpr (!CLUSTER) {
    __syncthreads();
    for (int i = tid; i < G * (kD + 2); i += kThreads) {
      const int g = i / (kD + 2), e = i % (kD + 2);
      partial[((size_t(t) * Hq + kvh * G + g) * nsplit + split) * (kD + 2) + e] = merge_rows[g][e];
    }
  } else {
    // The nsplit (= gridDim.z = cluster size) blocks of this (token, kv head) merge through
    // distributed shared memory: block r merges the heads g with g % nsplit == r.
    // Each head's partial row goes to the block that merges it, by stores into that block's
    // shared memory (they need no reply, where reading the others' rows took round trips);
    // the barrier's release makes them visible there. After it every block reads only its own
    // shared memory, so none waits for another before exiting.
    cg::cluster_group cluster = cg::this_cluster();
    asm volatile("barrier.cluster.wait;\n" ::: "memory");  // every block has started
    __syncthreads();  // merge_rows
    for (int i = tid; i < G * (kD + 2); i += kThreads) {
      const int g = i / (kD + 2), e = i % (kD + 2);
      float* dst = &recv_rows[(g / nsplit) * nsplit + split][e];
      *static_cast<float*>(cluster.map_shared_rank(dst, g % nsplit)) = merge_rows[g][e];
    }
    cluster.sync();
    ATTN_CLOCK(6);
#pragma unroll
    for (int i = 0; i < kMaxG / kWarps; ++i) {
      const int g = warp + i * kWarps;
      if (g < G && g % nsplit == int(cluster.block_rank()))
        merge_splits<kD>([&](int s) { return &recv_rows[(g / nsplit) * nsplit + s][0]; }, nsplit, sink_v[i],
                         out + (size_t(t) * Hq + kvh * G + g) * kD, lane);
    }
    ATTN_CLOCK(7);
  }
#ifdef GPTOSS_DIAG_ATTN_CLOCKS
  ATTN_CLOCK(8);
  if (tid == 0) {
    const int w = window > 0 ? 1 : 0, z = split & 15;
    if (clk[6] == 0) clk[6] = clk[7] = clk[5];  // no cluster merge
    for (int i = 0; i < 8; ++i) atomicAdd(&g_attn_clocks[w][z][i], (unsigned long long)(clk[i + 1] - clk[i]));
    atomicAdd(&g_attn_clocks[w][z][8], 1ull);
  }
#endif
}

// Shared memory past the 48 KiB default is an opt-in per kernel and device; clusters past the
// portable 8 blocks too.
template <bool FP8, bool CLUSTER, bool STORED>
void opt_in(int nsplit) {
  static std::atomic<uint64_t> smem{0}, big_cluster{0};
  auto* k = attention_decode_mma_kernel<FP8, CLUSTER, STORED>;
  once_per_device(smem, [&] {
    GPTOSS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, FP8 ? kSmemFp8 : kSmemBf16));
  });
  if (CLUSTER && nsplit > 8)
    once_per_device(big_cluster, [&] {
      GPTOSS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    });
}

#ifdef GPTOSS_DIAG_ATTN_CLOCKS
void print_attn_clocks() {
  unsigned long long h[2][16][9];
  if (cudaMemcpyFromSymbol(h, g_attn_clocks, sizeof(h)) != cudaSuccess) return;
  const char* names[8] = {"entry->wait", "wait->row loaded", "->q roped, kv stored", "tile loop", "warp merge",
                          "cluster sync 1", "merge", "sync 2 / store"};
  for (int w = 0; w < 2; ++w)
    for (int z = 0; z < 16; ++z) {
      char kind[40];
      std::snprintf(kind, sizeof(kind), "%s layers, split %d", w ? "sliding" : "full", z);
      print_stage_clocks("attention", kind, names, 8, h[w][z], h[w][z][8]);
    }
}
#endif

template <bool FP8, bool CLUSTER, bool STORED>
void launch(const uint16_t* q, int n, int Hq, int Hkv, int window, const float* sinks, const float* inv_freq,
            float scaling, const TokenMeta& tm, const KvLayer& kv, int nsplit, float* partial, uint16_t* o,
            bool row_first, cudaStream_t s) {
  opt_in<FP8, CLUSTER, STORED>(nsplit);
  static const int trigger_at = env_int("GPTOSS_ATTN_TRIGGER", 0);
  // GPTOSS_ATTN_ROW_FIRST: 0 never, 1 always, else the caller's choice (a measurement knob).
  static const int row_first_env = env_int("GPTOSS_ATTN_ROW_FIRST", -1);
  if (row_first_env == 0 || row_first_env == 1) row_first = row_first_env == 1;
#ifdef GPTOSS_DIAG_ATTN_CLOCKS
  static bool registered = false;
  if (!registered) {
    registered = true;
    std::atexit(print_attn_clocks);
  }
#endif
  const dim3 cluster(1, 1, CLUSTER ? unsigned(nsplit) : 1u);
  launch_pdl_cluster(attention_decode_mma_kernel<FP8, CLUSTER, STORED>, dim3(n, Hkv, nsplit), dim3(kThreads),
                     FP8 ? kSmemFp8 : kSmemBf16, cluster, s, q, Hq, Hkv, window, tm, kv, nsplit, partial, inv_freq,
                     scaling, sinks, o, STORED ? 0 : trigger_at, row_first);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace

DecodeAttentionPlan decode_attention_mma_plan(int n, int Hkv, int max_keys, int split_nsplit, int max_cluster) {
  // Most blocks a cluster plan launches: three an SM. Past that a cluster grid ran in two waves:
  // at 32 sequences (512 blocks in pairs) a full layer's attention took 26.4 us against 15.4 at 24
  // (384 blocks), and split-and-merge (two splits, the merge a second launch) 16.9 (s33r3, s33r4).
  // GPTOSS_DECODE_WAVE: another budget, for measurements.
  static const int wave_env = env_int("GPTOSS_DECODE_WAVE", 0);
  const int wave = wave_env > 0 ? wave_env : 396;
  const int tiles = (std::max(max_keys, 1) + kKeys - 1) / kKeys;
  const int most = std::min(std::clamp(max_cluster, 1, kDecodeClusterMax), tiles <= 3 ? 1 : tiles);
  int c = 1;
  while (2 * c <= most && n * Hkv * 2 * c <= wave) c *= 2;
  const int per = (tiles + c - 1) / c;  // tiles a cluster split walks
  if (split_nsplit > c && per > 4) return DecodeAttentionPlan{std::min(split_nsplit, 32), false, true};
  // One split: the kernel without the cluster merge's receive rows (four bf16 blocks an SM, not
  // three: 64 sequences' 512 blocks in one wave), which stores its output rows itself.
  if (per > 8 || c == 1) return DecodeAttentionPlan{c, false, true};
  return DecodeAttentionPlan{c, true, true};
}

bool attention_decode_mma_supported(int Hq, int Hkv, int D) {
  return D == kD && Hkv > 0 && Hq % Hkv == 0 && Hq / Hkv <= kMaxG;
}

void attention_decode_mma(const uint16_t* q, int n, int Hq, int Hkv, int window, const float* sinks,
                          const float* inv_freq, float scaling, const TokenMeta& tm, const KvLayer& kv, int nsplit,
                          bool cluster, bool kv_stored, float* partial, uint16_t* out, cudaStream_t s,
                          bool row_first) {
  // Eight instantiations: (fp8 pages, cluster merge, stored mode) as template flags.
  auto go = [&](auto fp8, auto clu, auto stored) {
    launch<decltype(fp8)::value, decltype(clu)::value, decltype(stored)::value>(
        q, n, Hq, Hkv, window, sinks, inv_freq, scaling, tm, kv, nsplit, partial, out, row_first, s);
  };
  auto with_stored = [&](auto fp8, auto clu) {
    if (kv_stored)
      go(fp8, clu, std::true_type{});
    else
      go(fp8, clu, std::false_type{});
  };
  auto with_cluster = [&](auto fp8) {
    if (cluster)
      with_stored(fp8, std::true_type{});
    else
      with_stored(fp8, std::false_type{});
  };
  if (kv.fp8)
    with_cluster(std::true_type{});
  else
    with_cluster(std::false_type{});
}

}  // namespace gptoss::cuda
