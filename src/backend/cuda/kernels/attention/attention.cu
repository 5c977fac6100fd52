// Attention with sinks and sliding window over the paged KV cache, for prefill and decode alike:
// one block per (token, kv head, KV split) stages 32-key tiles of K/V in shared memory and its
// warps (one per query head of the group) run an online softmax; a second kernel merges the
// splits (flash-decoding) and adds the sink to the denominator. Every token reads its own causal
// range from the pages, so prefill chunks and decode tokens of different sequences mix freely.
// The launcher hands the prefill tokens of a pass to flash_attention.cu (tensor cores); see
// flash_blocks.cuh for how a pass mixing prefill and decode splits between the two.
#include <algorithm>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/attention/flash_blocks.cuh"
#include "backend/kv_layout.h"

namespace gptoss::cuda {

namespace {
constexpr int kTile = 32;
constexpr int kWarps = 8;  // query heads per kv head handled by one block (gpt-oss: 64 / 8)
}  // namespace

size_t attention_partial_floats(int n, int Hq, int D, int nsplit) { return size_t(n) * Hq * nsplit * (D + 2); }

__device__ __forceinline__ void load8(const void* base, size_t off, bool fp8, float* dst) {
  if (fp8) {
    uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(base) + off);
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) dst[i] = fp8_bits_to_f32(b[i]);
  } else {
    uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + off);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f = bf16x2_to_f32x2(w[i]);
      dst[2 * i] = f.x;
      dst[2 * i + 1] = f.y;
    }
  }
}

template <int D>
__global__ void __launch_bounds__(256) attention_kernel(const uint16_t* __restrict__ qkv, int Hq, int Hkv, int window,
                                                        TokenMeta tm, KvLayer kv, int nsplit,
                                                        float* __restrict__ partial, int n, int flash_tq) {
  pdl_begin();
  // Tokens the flash kernel takes in this pass (flash_tq > 0) are not ours.
  if (flash_tq > 0 && flash_takes_block(tm.pt_off, n, blockIdx.x / flash_tq * flash_tq, flash_tq)) return;
  constexpr int PAD = D + 4;  // keeps float4 row reads across lanes free of bank conflicts
  constexpr int DPL = D / 32;  // output dims per lane
  __shared__ __align__(16) float Ks[kTile][PAD];
  __shared__ __align__(16) float Vs[kTile][PAD];
  __shared__ float Ps[kWarps][kTile];
  const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int G = Hq / Hkv;
  const int pos = tm.pos[t];
  const int lo = window > 0 ? max(0, pos - window + 1) : 0;
  const int ntiles = (pos - lo + kTile) / kTile;
  const int per = (ntiles + nsplit - 1) / nsplit;
  const int tile0 = split * per, tile1 = min(ntiles, tile0 + per);
  const int32_t* pt = tm.pt + tm.pt_off[t];
  const int ps = kv.page_size;
  const bool active = warp < G;
  const int h = kvh * G + warp;
  const int row_len = (Hq + 2 * Hkv) * D;

  float q[D];
  const float scale = rsqrtf(float(D));
  if (active) {
    const uint4* qp = reinterpret_cast<const uint4*>(qkv + size_t(t) * row_len + size_t(h) * D);
#pragma unroll
    for (int c = 0; c < D / 8; ++c) {
      uint4 v = qp[c];
      const uint32_t* w = reinterpret_cast<const uint32_t*>(&v);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float2 f = bf16x2_to_f32x2(w[i]);
        q[c * 8 + 2 * i] = f.x * scale;
        q[c * 8 + 2 * i + 1] = f.y * scale;
      }
    }
  }
  float m = -INFINITY, l = 0.f, o[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) o[i] = 0.f;

  for (int tile = tile0; tile < tile1; ++tile) {
    const int k0 = lo + tile * kTile;
    constexpr int CPK = D / 8;  // 8-element chunks per key
    for (int c = threadIdx.x; c < 2 * kTile * CPK; c += blockDim.x) {
      int which = c / (kTile * CPK);  // 0 = K, 1 = V
      int cc = c % (kTile * CPK);
      int j = cc / CPK, d0 = (cc % CPK) * 8;
      int p = k0 + j;
      float vals[8];
      if (p <= pos) {
        int page = pt[p / ps];
        size_t off = PagedKvLayout{ps, Hkv, D}.offset(page, which, p % ps, kvh, d0);
        load8(kv.base, off, kv.fp8, vals);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) vals[i] = 0.f;
      }
      float* dst = which ? &Vs[j][d0] : &Ks[j][d0];
      *reinterpret_cast<float4*>(dst) = make_float4(vals[0], vals[1], vals[2], vals[3]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(vals[4], vals[5], vals[6], vals[7]);
    }
    __syncthreads();
    if (active) {
      const bool valid = k0 + lane <= pos;
      float s = 0.f;
#pragma unroll
      for (int d = 0; d < D; d += 4) {
        float4 kk = *reinterpret_cast<const float4*>(&Ks[lane][d]);
        s += q[d] * kk.x + q[d + 1] * kk.y + q[d + 2] * kk.z + q[d + 3] * kk.w;
      }
      s = valid ? s : -INFINITY;
      float mnew = fmaxf(m, warp_max(s));
      float pj = valid ? __expf(s - mnew) : 0.f;
      float corr = __expf(m - mnew);
      l = l * corr + warp_sum(pj);
#pragma unroll
      for (int i = 0; i < DPL; ++i) o[i] *= corr;
      m = mnew;
      Ps[warp][lane] = pj;
      __syncwarp();
#pragma unroll 8
      for (int j = 0; j < kTile; ++j) {
        float pv = Ps[warp][j];
#pragma unroll
        for (int i = 0; i < DPL; ++i) o[i] += pv * Vs[j][lane * DPL + i];
      }
      __syncwarp();
    }
    __syncthreads();
  }
  if (active) {
    float* out = partial + ((size_t(t) * Hq + h) * nsplit + split) * (D + 2);
#pragma unroll
    for (int i = 0; i < DPL; ++i) out[2 + lane * DPL + i] = o[i];
    if (lane == 0) {
      out[0] = m;
      out[1] = l;
    }
  }
}

// One warp per (token, query head). Lane s reads split s's running max and sum, so the merge
// weights come from two warp reductions instead of a serial walk; the splits' output rows are
// then summed with every load independent, skipping splits that saw no keys (weight 0).
template <int D>
__global__ void attention_combine_kernel(const float* __restrict__ partial, int Hq, int nsplit,
                                         const float* __restrict__ sinks, uint16_t* __restrict__ out,
                                         const int32_t* __restrict__ pt_off, int n, int flash_tq) {
  pdl_begin();
  if (flash_tq > 0 && flash_takes_block(pt_off, n, blockIdx.x / flash_tq * flash_tq, flash_tq)) return;
  constexpr int DPL = D / 32;
  const int t = blockIdx.x;
  const int h = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (h >= Hq) return;
  const float* p = partial + (size_t(t) * Hq + h) * nsplit * (D + 2);
  const float sink = sinks[h];
  float ms = -INFINITY, ls = 0.f;
  if (lane < nsplit) {
    ms = p[lane * (D + 2)];
    ls = p[lane * (D + 2) + 1];
  }
  const float M = fmaxf(warp_max(ms), sink);
  const float w = lane < nsplit ? __expf(ms - M) : 0.f;  // empty split: m = -inf, w = 0
  const float denom = __expf(sink - M) + warp_sum(ls * w);
  float acc[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) acc[i] = 0.f;
#pragma unroll 4
  for (int s = 0; s < nsplit; ++s) {
    const float ws = __shfl_sync(0xffffffffu, w, s);
    if (ws == 0.f) continue;  // uniform over the warp
    const float* ps = p + s * (D + 2) + 2 + lane * DPL;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] += ps[i] * ws;
  }
  const float inv = 1.f / denom;
#pragma unroll
  for (int i = 0; i < DPL; ++i) out[(size_t(t) * Hq + h) * D + lane * DPL + i] = f32_to_bf16_bits(acc[i] * inv);
}

void attention(const bf16_t* qkv, int n, int Hq, int Hkv, int D, int window, const float* sinks,
               const TokenMeta& tm, const KvLayer& kv, int nsplit, float* partial, bf16_t* out, cudaStream_t s,
               AttentionPath path, const AttentionPassInfo& info) {
  if (n <= 0) return;
  int flash_tq = 0;  // > 0: the flash kernel takes the blocks of this many tokens it suits
  if (flash_attention_supported(Hq, Hkv, D)) {
    const int tq = flash_attention_block_tokens(Hq, Hkv);
    // Runs of one sequence a block can hold: at most one a sequence, one a token.
    const int max_runs = std::min(tq, info.num_seqs > 0 ? info.num_seqs : n);
    if (path == AttentionPath::kFlash) {
      flash_attention(qkv, n, Hq, Hkv, D, window, sinks, tm, kv, out, s, true, max_runs);
      return;
    }
    if (path == AttentionPath::kAuto && info.max_seq_tokens >= kFlashMinSeqTokens) {
      flash_tq = tq;
      flash_attention(qkv, n, Hq, Hkv, D, window, sinks, tm, kv, out, s, false, std::min(max_runs, kFlashMaxRuns));
      // Every sequence at least a block long: no block holds three, the flash kernel took all.
      if (info.min_seq_tokens >= tq) return;
    }
  }
  if (Hq % Hkv != 0 || Hq / Hkv > kWarps) throw Error("attention: needs 1..8 query heads per kv head");
  if (nsplit < 1) nsplit = 1;
  if (nsplit > 32) throw Error("attention: at most 32 KV splits");
  dim3 grid(n, Hkv, nsplit);
  dim3 cgrid(n, (Hq + 1) / 2);  // two heads (warps) a block: many small blocks for decode
  if (D == 64) {
    launch_pdl(attention_kernel<64>, dim3(grid), dim3(256), 0, s, qkv, Hq, Hkv, window, tm, kv, nsplit, partial, n,
               flash_tq);
    GPTOSS_CUDA_LAUNCH_CHECK();
    launch_pdl(attention_combine_kernel<64>, dim3(cgrid), dim3(64), 0, s, partial, Hq, nsplit, sinks, out, tm.pt_off,
               n, flash_tq);
  } else if (D == 32) {
    launch_pdl(attention_kernel<32>, dim3(grid), dim3(256), 0, s, qkv, Hq, Hkv, window, tm, kv, nsplit, partial, n,
               flash_tq);
    GPTOSS_CUDA_LAUNCH_CHECK();
    launch_pdl(attention_combine_kernel<32>, dim3(cgrid), dim3(64), 0, s, partial, Hq, nsplit, sinks, out, tm.pt_off,
               n, flash_tq);
  } else {
    throw Error("attention: head_dim must be 32 or 64");
  }
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
