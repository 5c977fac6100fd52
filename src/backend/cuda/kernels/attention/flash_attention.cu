// Flash attention on tensor cores for prefill and chunked prefill (many new tokens a sequence):
// gpt-oss attention (sinks, GQA, causal, optional sliding window) over the paged KV cache.
//
// Tiling. A CTA takes TQ = 128 / G consecutive tokens of the pass and one kv head; its 128 query
// rows are (group head g, token) pairs, so one K/V tile from the pages feeds all G query heads
// that share it (gpt-oss: G = 8, TQ = 16 tokens, warp w = query head w of the group over the 16
// tokens). 8 warps, 16 rows each. K/V tiles of 64 keys x 64 dims (bf16, 8 KiB each) arrive by
// cp.async into two stages (fp8 pages: raw bytes double-buffered, widened to one bf16 tile);
// S = Q K^T and O += P V run on mma.sync m16n8k16 (bf16 in, fp32 accumulate) with fragments from
// ldmatrix (.trans for V); the softmax is online in fp32 in the log2 domain (scale * log2e folded
// into S, ex2.approx); the sink joins the denominator at the end.
//
// Rows of a CTA may belong to different sequences (tokens are staged sequence after sequence):
// the block's maximal runs of tokens with one page table (segments) go to gridDim.z CTAs in
// turn (run r to CTA z = r mod gridDim.z, each walking its runs one after another); within a
// segment a CTA walks the 64-aligned absolute key tiles between the smallest window start and
// the largest position of the segment, masking each row to its own [pos - window + 1, pos] and to its own
// segment. A tile fully masked for a row is an exact no-op for that row (its max and sums are
// unchanged, P = 0 adds 0), so a row's result depends on its own data only: the tiles it sees
// are the fixed absolute tiles covering its range, in ascending order, whatever its neighbours.
// That makes the kernel batch-invariant.
#include <algorithm>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/tensor_core_ptx.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/attention/flash_blocks.cuh"
#include "backend/cuda/kernels/attention/kv_tile.cuh"
#include "backend/kv_layout.h"

namespace gptoss::cuda {

namespace {

constexpr int kD = 64;        // head_dim
constexpr int kRows = 128;    // query rows a CTA (tokens x group heads)
constexpr int kKeys = 64;     // keys a KV tile
constexpr int kThreads = 256; // 8 warps x 16 rows
constexpr int kTileBytes = kKeys * kD * 2;      // one bf16 K or V tile: 8 KiB
constexpr int kStageBytes = 2 * kTileBytes;     // K + V
constexpr int kSmemBytes = 2 * kStageBytes;     // 32 KiB (both dtypes)

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::smem_addr;

template <bool FP8>
__global__ void __launch_bounds__(kThreads, 2)
    flash_attention_kernel(const uint16_t* __restrict__ qkv, int n, int Hq, int Hkv, int window,
                           const float* __restrict__ sinks, TokenMeta tm, KvLayer kv, uint16_t* __restrict__ out,
                           bool all_blocks) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int s_pos[kRows], s_off[kRows];
  pdl_begin();
  const int G = Hq / Hkv, TQ = kRows / G;
  const int blk = gridDim.x - 1 - blockIdx.x;  // the latest tokens (most keys) first
  const int kvh = blockIdx.y;
  const int t0 = blk * TQ;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
  const int ntok = min(TQ, n - t0);
  const int row_len = (Hq + 2 * Hkv) * kD;
  // Blocks of many sequences' decode tokens are the per-token kernel's (flash_blocks.cuh).
  if (!all_blocks && !flash_takes_block(tm.pt_off, n, t0, TQ)) return;
  const uint32_t sbase = smem_addr(smem);
  // bf16: stage s at s * kStageBytes (K then V); Q is staged once in stage 1 before the loop.
  // fp8: raw stages of 8 KiB at s * 8 KiB (Q staged there first), the bf16 K/V tile at stage 1.
  const uint32_t q_base = FP8 ? sbase : sbase + kStageBytes;

  if (tid < TQ) {
    s_pos[tid] = tid < ntok ? tm.pos[t0 + tid] : -1;
    s_off[tid] = tid < ntok ? tm.pt_off[t0 + tid] : -1;
  }
  __syncthreads();
  // CTA z takes runs z, z + gridDim.z, ... of its block: blocks of many decode tokens spread
  // over gridDim.z CTAs instead of walking every sequence's keys one after another.
  {
    int runs = 1;
    for (int i = 1; i < ntok; ++i) runs += s_off[i] != s_off[i - 1];
    if (int(blockIdx.z) >= runs) return;
  }
  // Q: row r = (group head r / TQ, token r % TQ), 8 chunks of 16 bytes a row.
  for (int c = tid; c < kRows * 8; c += kThreads) {
    const int r = c / 8, ch = c % 8, g = r / TQ, tok = r % TQ;
    const bool ok = tok < ntok;
    const uint16_t* src = ok ? qkv + size_t(t0 + tok) * row_len + size_t(kvh * G + g) * kD + ch * 8 : qkv;
    cp_async16(q_base + kv_tile_swz(r, ch), src, ok);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  // A fragments of the warp's 16 rows over the 4 k-steps of 16 dims.
  uint32_t qf[4][4];
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
    ptx::ldmatrix_x4(qf[ks], q_base + kv_tile_swz(r, 2 * ks + (lane >> 4)));
  }
  __syncthreads();  // the Q staging area is a K/V stage from here on

  const int g = (warp * 16) / TQ, tokb = (warp * 16) % TQ;
  const int h = kvh * G + g;
  const int tokA = tokb + (lane >> 2), tokB = tokA + 8;  // this thread's two rows
  const float sc = rsqrtf(float(kD)) * kLog2e;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[8][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

  const PagedKvLayout lay{kv.page_size, Hkv, kD};
  const int ps = kv.page_size;
  for (int seg = 0, run = 0; seg < ntok; ++run) {
    // The segment: the run of tokens from `seg` sharing its page table; its key range.
    const int off = s_off[seg];
    int seg_end = seg, kmin = INT_MAX, kmax = -1;
    while (seg_end < ntok && s_off[seg_end] == off) {
      const int p = s_pos[seg_end];
      kmin = min(kmin, window > 0 ? max(0, p - window + 1) : 0);
      kmax = max(kmax, p);
      ++seg_end;
    }
    if (run % int(gridDim.z) != int(blockIdx.z)) {  // another CTA's run
      seg = seg_end;
      continue;
    }
    const int32_t* pt = tm.pt + off;
    // This thread's rows' key ranges inside the segment (empty outside it).
    int lo[2], hi[2];
    {
      const int toks[2] = {tokA, tokB};
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const bool in = toks[i] >= seg && toks[i] < seg_end;
        const int p = in ? s_pos[toks[i]] : -1;
        lo[i] = in ? (window > 0 ? max(0, p - window + 1) : 0) : INT_MAX;
        hi[i] = p;
      }
    }
    const int kbeg = (kmin / kKeys) * kKeys;
    const int ntiles = (kmax - kbeg) / kKeys + 1;

    auto load_tile = [&](int tile, int stage) {
      const int k0 = kbeg + tile * kKeys;
      if constexpr (!FP8) {
        const uint32_t dst0 = sbase + stage * kStageBytes;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = tid + i * kThreads;  // 1024 chunks: (K/V, key, 16-byte chunk)
          const int which = c >> 9, j = (c >> 3) & 63, ch = c & 7;
          const int p = k0 + j;
          bool ok = p >= kmin && p <= kmax;
          const int page = ok ? pt[p / ps] : 0;
          ok = ok && page >= 0;
          const uint16_t* src = static_cast<const uint16_t*>(kv.base);
          if (ok) src += lay.offset(page, which, p % ps, kvh, ch * 8);
          cp_async16(dst0 + which * kTileBytes + kv_tile_swz(j, ch), src, ok);
        }
      } else {
        const uint32_t dst0 = sbase + stage * (kStageBytes / 2);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int c = tid + i * kThreads;  // 512 chunks: (K/V, key, 16 fp8 values)
          const int which = c >> 8, j = (c >> 2) & 63, ch = c & 3;
          const int p = k0 + j;
          bool ok = p >= kmin && p <= kmax;
          const int page = ok ? pt[p / ps] : 0;
          ok = ok && page >= 0;
          const uint8_t* src = static_cast<const uint8_t*>(kv.base);
          if (ok) src += lay.offset(page, which, p % ps, kvh, ch * 16);
          cp_async16(dst0 + c * 16, src, ok);  // raw layout [K/V][key][64 bytes]
        }
      }
      cp_async_commit();
    };

    load_tile(0, 0);
    for (int tile = 0; tile < ntiles; ++tile) {
      if (tile + 1 < ntiles) {
        load_tile(tile + 1, (tile + 1) & 1);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
      uint32_t kt;  // byte address of the bf16 K tile (V follows)
      if constexpr (FP8) {
        // Widen the raw stage to the bf16 tile (e4m3 values are exact in bf16).
        const uint8_t* raw = smem + (tile & 1) * (kStageBytes / 2);
        uint8_t* dstt = smem + kStageBytes;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int c = tid + i * kThreads;
          const int which = c >> 8, j = (c >> 2) & 63, ch = c & 3;
          uint8_t* base = dstt + which * kTileBytes;
#pragma unroll
          for (int half = 0; half < 2; ++half) {  // 8 fp8 values -> one 16-byte bf16 chunk
            const uint2 v = *reinterpret_cast<const uint2*>(raw + c * 16 + half * 8);
            *reinterpret_cast<uint4*>(base + kv_tile_swz(j, 2 * ch + half)) = widen_fp8x8_to_bf16(v);
          }
        }
        __syncthreads();
        kt = sbase + kStageBytes;
      } else {
        kt = sbase + (tile & 1) * kStageBytes;
      }
      const uint32_t vt = kt + kTileBytes;
      const int k0 = kbeg + tile * kKeys;
      // Warp-uniform: does any of the warp's rows see a key of this tile? (If not, the tile is
      // an exact no-op for them: skip it.) Is the tile inside every row's range (no mask)?
      const bool any_row = (lo[0] <= k0 + kKeys - 1 && hi[0] >= k0) || (lo[1] <= k0 + kKeys - 1 && hi[1] >= k0);
      const bool full_row = lo[0] <= k0 && hi[0] >= k0 + kKeys - 1 && lo[1] <= k0 && hi[1] >= k0 + kKeys - 1;
      if (__any_sync(0xffffffffu, any_row)) {
        const bool need_mask = !__all_sync(0xffffffffu, full_row);
        float s[8][4];
#pragma unroll
        for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
          for (int np = 0; np < 4; ++np) {
            uint32_t b[4];
            ptx::ldmatrix_x4(b, kt + kv_tile_swz(16 * np + (lane & 7) + (lane >> 4) * 8, 2 * ks + ((lane >> 3) & 1)));
            ptx::mma_bf16_16816(s[2 * np], qf[ks], b[0], b[1]);
            ptx::mma_bf16_16816(s[2 * np + 1], qf[ks], b[2], b[3]);
          }
        }
        // Online softmax, log2 domain. Element (nb, e): row e < 2 ? A : B, key k0 + 8 nb + 2 (lane % 4) + e % 2.
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nb = 0; nb < 8; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float v = s[nb][e] * sc;
            if (need_mask) {
              const int key = k0 + 8 * nb + 2 * (lane & 3) + (e & 1), r = e >> 1;
              if (key < lo[r] || key > hi[r]) v = -INFINITY;
            }
            s[nb][e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
          }
        float mu[2], corr[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          const float mnew = fmaxf(m[r], mx[r]);
          mu[r] = mnew == -INFINITY ? 0.f : mnew;  // a row with no key yet: keep exp2 away from NaN
          corr[r] = mnew == m[r] ? 1.f : fast_exp2(m[r] - mu[r]);
          m[r] = mnew;
        }
        float rs[2] = {0.f, 0.f};
        uint32_t pa[4][4];  // P as A fragments, k-step kk = keys 16 kk .. 16 kk + 15
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {
          const float p0 = fast_exp2(s[nb][0] - mu[0]), p1 = fast_exp2(s[nb][1] - mu[0]);
          const float p2 = fast_exp2(s[nb][2] - mu[1]), p3 = fast_exp2(s[nb][3] - mu[1]);
          rs[0] += p0 + p1;
          rs[1] += p2 + p3;
          pa[nb >> 1][(nb & 1) * 2 + 0] = pack_bf16x2(p0, p1);
          pa[nb >> 1][(nb & 1) * 2 + 1] = pack_bf16x2(p2, p3);
        }
        // l stays a per-thread partial (its own columns); the quad sums it at the end.
        l[0] = l[0] * corr[0] + rs[0];
        l[1] = l[1] * corr[1] + rs[1];
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {
          o[nb][0] *= corr[0];
          o[nb][1] *= corr[0];
          o[nb][2] *= corr[1];
          o[nb][3] *= corr[1];
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
          for (int dp = 0; dp < 4; ++dp) {
            uint32_t b[4];
            ptx::ldmatrix_x4_trans(b,
                                   vt + kv_tile_swz(16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * dp + (lane >> 4)));
            ptx::mma_bf16_16816(o[2 * dp], pa[kk], b[0], b[1]);
            ptx::mma_bf16_16816(o[2 * dp + 1], pa[kk], b[2], b[3]);
          }
        }
      }
      __syncthreads();  // the stage is free for the load two tiles ahead
    }
    seg = seg_end;
  }

  // Sink joins the denominator: out = O / (l + 2^(sink2 - m)), rescaled to max(m, sink2).
  const float sink2 = sinks[h] * kLog2e;
  const int toks[2] = {tokA, tokB};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lr = l[r];
    lr += __shfl_xor_sync(0xffffffffu, lr, 1);
    lr += __shfl_xor_sync(0xffffffffu, lr, 2);
    if (toks[r] >= ntok) continue;
    int run = 0;  // the row's run in the block: stored by the CTA that took it
    for (int i = 1; i <= toks[r]; ++i) run += s_off[i] != s_off[i - 1];
    if (run % int(gridDim.z) != int(blockIdx.z)) continue;
    const float M = fmaxf(m[r], sink2);
    const float f = fast_exp2(m[r] - M);
    const float inv = f / (lr * f + fast_exp2(sink2 - M));
    uint16_t* dst = out + (size_t(t0 + toks[r]) * Hq + h) * kD + 2 * (lane & 3);
#pragma unroll
    for (int nb = 0; nb < 8; ++nb)
      *reinterpret_cast<uint32_t*>(dst + 8 * nb) = pack_bf16x2(o[nb][2 * r] * inv, o[nb][2 * r + 1] * inv);
  }
}

}  // namespace

int flash_attention_block_tokens(int Hq, int Hkv) { return kRows / (Hq / Hkv); }

bool flash_attention_supported(int Hq, int Hkv, int D) {
  if (D != kD || Hkv <= 0 || Hq % Hkv != 0) return false;
  const int G = Hq / Hkv;
  return G == 1 || G == 2 || G == 4 || G == 8;
}

void flash_attention(const bf16_t* qkv, int n, int Hq, int Hkv, int D, int window, const float* sinks,
                     const TokenMeta& tm, const KvLayer& kv, bf16_t* out, cudaStream_t s, bool all_blocks,
                     int max_runs) {
  if (n <= 0) return;
  if (!flash_attention_supported(Hq, Hkv, D))
    throw Error("flash_attention: needs head_dim 64 and 1, 2, 4 or 8 query heads per kv head");
  const int TQ = kRows / (Hq / Hkv);
  dim3 grid((n + TQ - 1) / TQ, Hkv, std::clamp(max_runs, 1, TQ));
  auto* q = reinterpret_cast<const uint16_t*>(qkv);
  auto* o = reinterpret_cast<uint16_t*>(out);
  if (kv.fp8)
    launch_pdl(flash_attention_kernel<true>, grid, dim3(kThreads), kSmemBytes, s, q, n, Hq, Hkv, window, sinks, tm, kv,
               o, all_blocks);
  else
    launch_pdl(flash_attention_kernel<false>, grid, dim3(kThreads), kSmemBytes, s, q, n, Hq, Hkv, window, sinks, tm,
               kv, o, all_blocks);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
