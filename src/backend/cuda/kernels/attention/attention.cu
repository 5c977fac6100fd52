// Attention with sinks and sliding window over the paged KV cache, for prefill and decode alike:
// one block per (token, kv head, KV split) stages 32-key tiles of K/V in shared memory and its
// warps (one per query head of the group) run an online softmax; a second kernel merges the
// splits (flash-decoding) and adds the sink to the denominator. Every token reads its own causal
// range from the pages, so prefill chunks and decode tokens of different sequences mix freely.
// The launcher hands the prefill tokens of a pass to flash_attention.cu (tensor cores); see
// flash_blocks.cuh for how a pass mixing prefill and decode splits between the two.
//
// Decode passes (every sequence brings one new token) take attention_decode() instead of
// rope_kv_store() + attention(): the same kernel with RoPE and the K/V store of the new token
// folded in, its splits merged inside a thread-block cluster (no second launch) unless the
// context is long enough to want more splits than a cluster holds.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/attention/attention_decode_mma.h"
#include "backend/cuda/kernels/attention/flash_blocks.cuh"
#include "backend/cuda/kernels/attention/rope_math.cuh"
#include "backend/cuda/kernels/attention/split_merge.cuh"
#include "backend/kv_layout.h"

namespace gptoss::cuda {

namespace cg = cooperative_groups;

namespace {
constexpr int kTile = 32;
constexpr int kWarps = 8;  // query heads per kv head handled by one block (gpt-oss: 64 / 8)
// Decode plan: blocks a launch may hold before more splits stop paying (one wave on an H200: 132
// SMs x 4 blocks of this kernel at 64 registers a thread; a cluster's blocks are scheduled
// together, so a second wave would wait on whole clusters), and the tiles a cluster split may
// walk before the split-and-merge launches win.
constexpr int kDecodeBlockBudget = 528;
constexpr int kClusterMaxTiles = 8;
}  // namespace

size_t attention_partial_floats(int n, int Hq, int D, int nsplit) { return size_t(n) * Hq * nsplit * (D + 2); }

// Eight K or V elements as loaded from a page row (16 bytes of bf16 or 8 of fp8 in raw.x/.y)
// -> floats. Exact either way.
__device__ __forceinline__ void widen8(const uint4& raw, bool fp8, float* dst) {
  if (fp8) {
    const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
    for (int i = 0; i < 8; ++i) dst[i] = fp8_bits_to_f32(uint8_t(w[i >> 2] >> (8 * (i & 3))));
  } else {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f = bf16x2_to_f32x2(w[i]);
      dst[2 * i] = f.x;
      dst[2 * i + 1] = f.y;
    }
  }
}

// Where a block's keys come from and where its result goes.
enum class AttnMode {
  kStored,        // every key in the pages (rope_kv_store ran first); partials to global memory
  kFusedPartial,  // decode: RoPE + K/V store of the token's own position folded in; partials out
  kFusedCluster,  // decode as kFusedPartial; the gridDim.z splits (a cluster) merge among themselves
};

// One block per (token, kv head, split): its warps are the group's query heads (their scaled q
// in shared memory, read as broadcasts). The split's 32-key tiles go through shared memory as
// floats; the loads of the next two tiles are in flight (in registers, two sets used in turn)
// while the current one is computed.
//
// Fused modes (decode passes: every token is the one new token of its sequence): the block ropes
// its query heads itself (rope_math.cuh, the same bits as rope_kv_store), and the block whose
// split holds the token's position ropes k, stores k and v into the pages and uses the stored
// values for that key from shared memory: no block of the launch reads a K/V row the launch
// writes. Everything read before the programmatic-launch wait (positions, page tables, pages of
// earlier positions) was written before this pass's previous kernel started.
template <int D, AttnMode MODE>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(const uint16_t* __restrict__ qkv, int Hq, int Hkv,
                                                                int window, TokenMeta tm, KvLayer kv, int nsplit,
                                                                float* __restrict__ partial, int n, int flash_tq,
                                                                int t_begin, const float* __restrict__ inv_freq,
                                                                float rope_scaling, const float* __restrict__ sinks,
                                                                uint16_t* __restrict__ out) {
  constexpr bool kFused = MODE != AttnMode::kStored;
  constexpr int kThreads = kWarps * 32;
  constexpr int PAD = D + 4;  // keeps float4 row reads across lanes free of bank conflicts
  constexpr int DPL = D / 32;  // output dims per lane
  constexpr int HALF = D / 2;
  constexpr int CPK = D / 8;  // 8-element chunks per key
  constexpr int kChunks = 2 * kTile * CPK;  // K and V chunks of a tile
  constexpr int kPerThread = (kChunks + kThreads - 1) / kThreads;
  __shared__ __align__(16) float Ks[kTile][PAD];
  __shared__ __align__(16) float Vs[kTile][PAD];
  __shared__ float Ps[kWarps][kTile];
  __shared__ __align__(16) float q_s[kWarps][D];  // each head's q (roped, bf16 values) x 1/sqrt(D)
  __shared__ __align__(16) float k_new[kFused ? D : 1];  // the token's own k and v as stored
  __shared__ __align__(16) float v_new[kFused ? D : 1];
  __shared__ float rope_c[kFused ? HALF : 1], rope_s[kFused ? HALF : 1];
  __shared__ float merge_rows[MODE == AttnMode::kFusedCluster ? kWarps : 1][D + 2];
  if constexpr (!kFused) {
    pdl_begin();
    // Tokens the flash kernel takes in this pass (flash_tq > 0) are not ours.
    const int tb = t_begin + int(blockIdx.x);
    if (flash_tq > 0 && flash_takes_block(tm.pt_off, n, tb / flash_tq * flash_tq, flash_tq)) return;
  }
  const int t = t_begin + int(blockIdx.x), kvh = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int G = Hq / Hkv;
  const int pos = tm.pos[t];
  const int lo = window > 0 ? max(0, pos - window + 1) : 0;
  const int ntiles = (pos - lo + kTile) / kTile;
  const int per = (ntiles + nsplit - 1) / nsplit;
  const int tile0 = split * per, tile1 = min(ntiles, tile0 + per);
  const int32_t* pt = tm.pt + tm.pt_off[t];
  const int ps = kv.page_size;
  const PagedKvLayout layout{ps, Hkv, D};
  const bool active = warp < G;
  const int h = kvh * G + warp;
  const int row_len = (Hq + 2 * Hkv) * D;
  const uint16_t* row = qkv + size_t(t) * row_len;

  // Tile loads into registers (16 bytes of bf16 / 8 of fp8 a chunk); keys past the token's
  // position, and in fused modes the position itself, are not read.
  uint4 ra[kPerThread], rb[kPerThread];
  auto load_tile = [&](uint4(&raw)[kPerThread], int tile) {
    const int k0 = lo + tile * kTile;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int c = threadIdx.x + i * kThreads;
      raw[i] = make_uint4(0u, 0u, 0u, 0u);
      const int which = c / (kTile * CPK), cc = c % (kTile * CPK);
      const int j = cc / CPK, d0 = (cc % CPK) * 8;
      const int p = k0 + j;
      if (c < kChunks && (kFused ? p < pos : p <= pos)) {
        const size_t off = layout.offset(pt[p / ps], which, p % ps, kvh, d0);
        if (kv.fp8) {
          const uint2 r = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(kv.base) + off);
          raw[i].x = r.x;
          raw[i].y = r.y;
        } else {
          raw[i] = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(kv.base) + off);
        }
      }
    }
  };
  // Registers -> the float tile (zeros past the position; the fused token's own k/v from k_new/v_new).
  auto stage_tile = [&](const uint4(&raw)[kPerThread], int tile) {
    const int k0 = lo + tile * kTile;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int c = threadIdx.x + i * kThreads;
      if (c >= kChunks) break;
      const int which = c / (kTile * CPK), cc = c % (kTile * CPK);
      const int j = cc / CPK, d0 = (cc % CPK) * 8;
      const int p = k0 + j;
      float vals[8];
      if (kFused && p == pos) {
        const float* src = (which ? v_new : k_new) + d0;
#pragma unroll
        for (int e = 0; e < 8; ++e) vals[e] = src[e];
      } else if (p <= pos) {
        widen8(raw[i], kv.fp8, vals);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) vals[e] = 0.f;
      }
      float* dst = which ? &Vs[j][d0] : &Ks[j][d0];
      *reinterpret_cast<float4*>(dst) = make_float4(vals[0], vals[1], vals[2], vals[3]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(vals[4], vals[5], vals[6], vals[7]);
    }
  };

  const float scale = rsqrtf(float(D));
  if constexpr (kFused) {
    // Before the wait: nothing here depends on the previous kernel (the qkv projection).
    if (threadIdx.x < HALF) rope_cos_sin(pos, inv_freq[threadIdx.x], rope_scaling, &rope_c[threadIdx.x], &rope_s[threadIdx.x]);
    if (tile0 < tile1) load_tile(ra, tile0);
    if (tile0 + 1 < tile1) load_tile(rb, tile0 + 1);
    pdl_begin();
    __syncthreads();  // rope_c / rope_s
    if (active && lane < HALF) {
      const uint16_t* hp = row + size_t(h) * D;
      const float2 r = rope_rotate(bf16_bits_to_f32(hp[lane]), bf16_bits_to_f32(hp[lane + HALF]), rope_c[lane],
                                   rope_s[lane]);
      q_s[warp][lane] = round_to_bf16(r.x) * scale;
      q_s[warp][lane + HALF] = round_to_bf16(r.y) * scale;
    }
    // The split that holds the last tile holds the token's position: it stores k and v.
    if (tile0 < tile1 && tile1 == ntiles && warp >= kWarps - 2) {
      const int page = pt[pos / ps], slot = pos % ps;
      if (warp == kWarps - 2 && lane < HALF) {  // k: rotate, round to bf16 (and fp8), store
        const uint16_t* kp = row + size_t(Hq + kvh) * D;
        const float2 r = rope_rotate(bf16_bits_to_f32(kp[lane]), bf16_bits_to_f32(kp[lane + HALF]), rope_c[lane],
                                     rope_s[lane]);
        const size_t o = layout.offset(page, 0, slot, kvh, lane);
        k_new[lane] = store_kv_value(kv, o, round_to_bf16(r.x));
        k_new[lane + HALF] = store_kv_value(kv, o + HALF, round_to_bf16(r.y));
      } else if (warp == kWarps - 1) {  // v: stored as is (fp8: rounded)
        const uint16_t* vp = row + size_t(Hq + Hkv + kvh) * D;
        for (int i = lane; i < D; i += 32)
          v_new[i] = store_kv_value(kv, layout.offset(page, 1, slot, kvh, i), bf16_bits_to_f32(vp[i]));
      }
    }
    __syncthreads();  // q_s, k_new, v_new
  } else {
    if (tile0 < tile1) load_tile(ra, tile0);
    if (tile0 + 1 < tile1) load_tile(rb, tile0 + 1);
    if (active) {  // lane i: dims 8 i .. 8 i + 7
      for (int c = lane; c < D / 8; c += 32) {
        const uint4 v = reinterpret_cast<const uint4*>(row + size_t(h) * D)[c];
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = bf16x2_to_f32x2(w[i]);
          q_s[warp][c * 8 + 2 * i] = f.x * scale;
          q_s[warp][c * 8 + 2 * i + 1] = f.y * scale;
        }
      }
    }
    __syncwarp();  // a warp reads only its own head's q
  }
  float m = -INFINITY, l = 0.f, o[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) o[i] = 0.f;

  auto compute_tile = [&](int tile) {
    const int k0 = lo + tile * kTile;
    if (active) {
      const bool valid = k0 + lane <= pos;
      float s = 0.f;
#pragma unroll
      for (int d = 0; d < D; d += 4) {
        const float4 kk = *reinterpret_cast<const float4*>(&Ks[lane][d]);
        const float4 qq = *reinterpret_cast<const float4*>(&q_s[warp][d]);
        s += qq.x * kk.x + qq.y * kk.y + qq.z * kk.z + qq.w * kk.w;
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
  };
  // Tiles in order, two at a time: ra holds tile, rb tile + 1; each refills with the tile two on.
  for (int tile = tile0; tile < tile1; tile += 2) {
    stage_tile(ra, tile);
    if (tile + 2 < tile1) load_tile(ra, tile + 2);
    __syncthreads();
    compute_tile(tile);
    __syncthreads();
    if (tile + 1 >= tile1) break;
    stage_tile(rb, tile + 1);
    if (tile + 3 < tile1) load_tile(rb, tile + 3);
    __syncthreads();
    compute_tile(tile + 1);
    __syncthreads();
  }
  if constexpr (MODE != AttnMode::kFusedCluster) {
    if (active) {
      float* dst = partial + ((size_t(t) * Hq + h) * nsplit + split) * (D + 2);
#pragma unroll
      for (int i = 0; i < DPL; ++i) dst[2 + lane * DPL + i] = o[i];
      if (lane == 0) {
        dst[0] = m;
        dst[1] = l;
      }
    }
  } else {
    // The nsplit (= gridDim.z = cluster size) blocks of this (token, kv head) merge their
    // partials through distributed shared memory: block r merges the heads g with g % nsplit == r.
    if (active) {
#pragma unroll
      for (int i = 0; i < DPL; ++i) merge_rows[warp][2 + lane * DPL + i] = o[i];
      if (lane == 0) {
        merge_rows[warp][0] = m;
        merge_rows[warp][1] = l;
      }
    }
    uint16_t* dst = out + (size_t(t) * Hq + h) * D;
    if (nsplit == 1) {  // no cluster: the block's own rows
      __syncwarp();
      if (active) merge_splits<D>([&](int) { return &merge_rows[warp][0]; }, 1, sinks[h], dst, lane);
    } else {
      cg::cluster_group cluster = cg::this_cluster();
      cluster.sync();  // every split's rows are in its shared memory
      if (active && warp % nsplit == int(cluster.block_rank())) {
        float* mine = &merge_rows[warp][0];
        merge_splits<D>([&](int s) { return static_cast<const float*>(cluster.map_shared_rank(mine, s)); }, nsplit,
                        sinks[h], dst, lane);
      }
      cluster.sync();  // the others' shared memory stays alive until every block has read it
    }
  }
}

// Merges the splits of attention_kernel's partials: one warp per (token, query head).
template <int D>
__global__ void attention_combine_kernel(const float* __restrict__ partial, int Hq, int nsplit,
                                         const float* __restrict__ sinks, uint16_t* __restrict__ out,
                                         const int32_t* __restrict__ pt_off, int n, int flash_tq, int t_begin) {
  pdl_begin();
  const int t = t_begin + int(blockIdx.x);
  if (flash_tq > 0 && flash_takes_block(pt_off, n, t / flash_tq * flash_tq, flash_tq)) return;
  const int h = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (h >= Hq) return;
  const float* p = partial + (size_t(t) * Hq + h) * nsplit * (D + 2);
  merge_splits<D>([&](int s) { return p + s * (D + 2); }, nsplit, sinks[h], out + (size_t(t) * Hq + h) * D, lane);
}

TokenRange attention_per_token_range(const std::vector<int>& seq_tokens, int n, int tq) {
  long total = 0;
  for (int c : seq_tokens) total += c;
  if (seq_tokens.empty() || tq <= 0 || total != n) return {0, n};
  // flash_takes_block on the host: a block's runs are the sequences it meets (each sequence has
  // its own page-table offset, so a change of sequence is a change of pt_off). An empty sequence
  // counts as a run here and not there: the range can only grow, and its blocks still check.
  TokenRange r{n, 0};
  const int last = int(seq_tokens.size()) - 1;
  int s0 = 0, s0_end = seq_tokens[0];  // the sequence holding the block's first token, its end
  for (int t0 = 0; t0 < n; t0 += tq) {
    const int end = std::min(n, t0 + tq);
    while (s0_end <= t0 && s0 < last) s0_end += seq_tokens[++s0];
    int s1 = s0, s1_end = s0_end;  // the sequence holding the block's last token
    while (s1_end < end && s1 < last) s1_end += seq_tokens[++s1];
    if (s1 - s0 + 1 > kFlashMaxRuns) {
      r.begin = std::min(r.begin, t0);
      r.end = end;
    }
  }
  return r.begin < r.end ? r : TokenRange{0, 0};
}

void attention(const bf16_t* qkv, int n, int Hq, int Hkv, int D, int window, const float* sinks,
               const TokenMeta& tm, const KvLayer& kv, int nsplit, float* partial, bf16_t* out, cudaStream_t s,
               AttentionPath path, const AttentionPassInfo& info) {
  if (n <= 0) return;
  int flash_tq = 0;  // > 0: the flash kernel takes the blocks of this many tokens it suits
  TokenRange mine{0, n};  // the per-token kernel's tokens (blocks in it that flash takes return)
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
      mine = attention_per_token_range(info.seq_tokens, n, tq);
      if (mine.end <= mine.begin) return;
    }
  }
  if (Hq % Hkv != 0 || Hq / Hkv > kWarps) throw Error("attention: needs 1..8 query heads per kv head");
  if (nsplit < 1) nsplit = 1;
  if (nsplit > 32) throw Error("attention: at most 32 KV splits");
  const int nt = mine.end - mine.begin;
  dim3 grid(nt, Hkv, nsplit);
  dim3 cgrid(nt, (Hq + 1) / 2);  // two heads (warps) a block: many small blocks for decode
  auto* q = reinterpret_cast<const uint16_t*>(qkv);
  auto* o = reinterpret_cast<uint16_t*>(out);
  if (D == 64) {
    launch_pdl(attention_kernel<64, AttnMode::kStored>, grid, dim3(kWarps * 32), 0, s, q, Hq, Hkv, window, tm, kv,
               nsplit, partial, n, flash_tq, mine.begin, nullptr, 0.f, nullptr, nullptr);
    GPTOSS_CUDA_LAUNCH_CHECK();
    launch_pdl(attention_combine_kernel<64>, cgrid, dim3(64), 0, s, partial, Hq, nsplit, sinks, o, tm.pt_off, n,
               flash_tq, mine.begin);
  } else if (D == 32) {
    launch_pdl(attention_kernel<32, AttnMode::kStored>, grid, dim3(kWarps * 32), 0, s, q, Hq, Hkv, window, tm, kv,
               nsplit, partial, n, flash_tq, mine.begin, nullptr, 0.f, nullptr, nullptr);
    GPTOSS_CUDA_LAUNCH_CHECK();
    launch_pdl(attention_combine_kernel<32>, cgrid, dim3(64), 0, s, partial, Hq, nsplit, sinks, o, tm.pt_off, n,
               flash_tq, mine.begin);
  } else {
    throw Error("attention: head_dim must be 32 or 64");
  }
  GPTOSS_CUDA_LAUNCH_CHECK();
}

DecodeAttentionPlan decode_attention_plan(int n, int Hkv, int max_keys, int split_nsplit, int max_cluster, bool mma) {
  if (mma) return decode_attention_mma_plan(n, Hkv, max_keys, split_nsplit, max_cluster);
  // The CUDA-core kernel: as many cluster splits as the block budget allows (empty splits cost a block that only
  // syncs: the plan does not follow the context, so a captured graph serves every step).
  int c = 1;
  max_cluster = std::clamp(max_cluster, 1, kDecodeClusterMax);
  while (2 * c <= max_cluster && n * Hkv * c * 2 <= kDecodeBlockBudget) c *= 2;
  const int tiles = (std::max(max_keys, 1) + kTile - 1) / kTile;
  if ((tiles + c - 1) / c > kClusterMaxTiles && split_nsplit > c) return DecodeAttentionPlan{split_nsplit, false};
  return DecodeAttentionPlan{c, true};
}

namespace {

// Launches attention_kernel in a fused mode: cluster (1, 1, nsplit) when the splits merge in it.
template <int D, AttnMode MODE>
void launch_decode(const uint16_t* q, int n, int Hq, int Hkv, int window, const float* sinks, const float* inv_freq,
                   float scaling, const TokenMeta& tm, const KvLayer& kv, int nsplit, float* partial, uint16_t* o,
                   cudaStream_t s) {
  if (MODE == AttnMode::kFusedCluster && nsplit > 8) {
    // Clusters past the portable 8 blocks are an opt-in per kernel and device.
    static std::atomic<uint64_t> allowed{0};
    once_per_device(allowed, [] {
      GPTOSS_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<D, MODE>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    });
  }
  const dim3 cluster(1, 1, MODE == AttnMode::kFusedCluster ? unsigned(nsplit) : 1u);
  launch_pdl_cluster(attention_kernel<D, MODE>, dim3(n, Hkv, nsplit), dim3(kWarps * 32), 0, cluster, s, q, Hq, Hkv,
                     window, tm, kv, nsplit, partial, n, 0, 0, inv_freq, scaling, sinks, o);
  GPTOSS_CUDA_LAUNCH_CHECK();
  if (MODE == AttnMode::kFusedPartial)
    launch_pdl(attention_combine_kernel<D>, dim3(n, (Hq + 1) / 2), dim3(64), 0, s, static_cast<const float*>(partial),
               Hq, nsplit, sinks, o, tm.pt_off, n, 0, 0);
}

}  // namespace

void attention_decode(const bf16_t* qkv, int n, int Hq, int Hkv, int D, int window, const float* sinks,
                      const float* inv_freq, float attn_scaling, const TokenMeta& tm, const KvLayer& kv,
                      const DecodeAttentionPlan& plan, float* partial, bf16_t* out, cudaStream_t s,
                      bool kv_stored, bool qkv_overlaps) {
  if (n <= 0) return;
  if (kv_stored && !(plan.mma && attention_decode_mma_supported(Hq, Hkv, D))) {
    attention(qkv, n, Hq, Hkv, D, window, sinks, tm, kv, plan.nsplit, partial, out, s, AttentionPath::kPerToken);
    return;
  }
  if (Hkv <= 0 || Hq % Hkv != 0 || Hq / Hkv > kWarps)
    throw Error("attention_decode: needs 1..8 query heads per kv head");
  if (plan.cluster ? plan.nsplit < 1 || plan.nsplit > kDecodeClusterMax || (plan.nsplit & (plan.nsplit - 1))
                   : plan.nsplit < 1 || plan.nsplit > 32)
    throw Error("attention_decode: " + std::to_string(plan.nsplit) + " splits: at most 32, and a power of two up to " +
                std::to_string(kDecodeClusterMax) + " merged in a cluster");
  auto* q = reinterpret_cast<const uint16_t*>(qkv);
  auto* o = reinterpret_cast<uint16_t*>(out);
  if (plan.mma && attention_decode_mma_supported(Hq, Hkv, D)) {
    attention_decode_mma(q, n, Hq, Hkv, window, sinks, inv_freq, attn_scaling, tm, kv, plan.nsplit, plan.cluster,
                         kv_stored, partial, o, s, !qkv_overlaps);
    if (!plan.cluster && plan.nsplit > 1)  // (one split: the kernel stores the output rows)
      launch_pdl(attention_combine_kernel<64>, dim3(n, (Hq + 1) / 2), dim3(64), 0, s,
                 static_cast<const float*>(partial), Hq, plan.nsplit, sinks, o, tm.pt_off, n, 0, 0);
  } else if (D == 64) {
    if (plan.cluster)
      launch_decode<64, AttnMode::kFusedCluster>(q, n, Hq, Hkv, window, sinks, inv_freq, attn_scaling, tm, kv,
                                                 plan.nsplit, partial, o, s);
    else
      launch_decode<64, AttnMode::kFusedPartial>(q, n, Hq, Hkv, window, sinks, inv_freq, attn_scaling, tm, kv,
                                                 plan.nsplit, partial, o, s);
  } else if (D == 32) {
    if (plan.cluster)
      launch_decode<32, AttnMode::kFusedCluster>(q, n, Hq, Hkv, window, sinks, inv_freq, attn_scaling, tm, kv,
                                                 plan.nsplit, partial, o, s);
    else
      launch_decode<32, AttnMode::kFusedPartial>(q, n, Hq, Hkv, window, sinks, inv_freq, attn_scaling, tm, kv,
                                                 plan.nsplit, partial, o, s);
  } else {
    throw Error("attention_decode: head_dim must be 32 or 64");
  }
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
