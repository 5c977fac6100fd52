// Decode-size MoE kernels, version 2 (1-64 tokens): the router (the residual's RMSNorm, the
// router GEMV on tensor cores, top-k, softmax and the sort by expert) as one thread-block
// cluster, and the combine (the experts' weighted rows + residual + the next layer's RMSNorm)
// with 16-byte loads and one cluster barrier. Both are latency-bound: what counts is the chain of
// dependent memory round trips and barriers after griddepcontrol.wait, so weights (router rows,
// norm weights, bias) are loaded before it and the blocks meet through distributed shared memory
// (a cluster barrier) instead of global atomics and fences. The old kernels (route.cu) stay
// selectable: GPTOSS_ROUTER_KERNEL=old, GPTOSS_COMBINE_KERNEL=old (kernels.h).
#include "backend/cuda/kernels/moe/route_decode.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/cluster.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/diag_clocks.h"
#include "backend/cuda/kernels/moe/route_sort.cuh"
#include "backend/cuda/tensor_core_ptx.cuh"
#include "common/error.h"

namespace gptoss::cuda {

namespace {

namespace cg = cooperative_groups;

// ---- variants ----
const char* const kRouterNames[kRouterVariants] = {"auto", "old", "c8", "c16", "c8x", "c8s", "c16s"};
const char* const kCombineNames[kCombineVariants] = {"auto", "old", "c1", "c2", "c4", "c8"};
// Defaults from the H200 (sixth session, docs/BENCHMARKS.md): router c16s (120b tg64 365.8 against c8 355.9
// in the step), combine c8 (3.09 us at 1 token against c4 3.65).
constexpr int kRouterDefault = 6, kCombineDefault = 5;
int g_router_set = 0, g_combine_set = 0;  // set_*_variant; 0: the environment's choice
int g_router_env = -1, g_combine_env = -1;

int env_variant(const char* var, const char* const* names, int count, int dflt) {
  const char* v = std::getenv(var);
  const std::string s = v ? v : "";
  if (s.empty() || s == "new" || s == "auto") return dflt;
  for (int i = 1; i < count; ++i)
    if (s == names[i]) return i;
  std::string all = "new";
  for (int i = 1; i < count; ++i) all += std::string(", ") + names[i];
  throw Error(std::string(var) + "=" + s + ": expected one of " + all);
}

#ifdef GPTOSS_DIAG_ROUTER_CLOCKS
// Diagnostic builds only (tools/gpu/diag_binary.sh): router_v2_kernel's thread 0 adds the cycles
// between its stages to [kind][stage] (kind: 0 block 0, 1 the other blocks, of passes of 1-16
// tokens; 2 and 3 the same at 17-64), a count in [kind][7]; printed at exit. Stages: start ->
// after the wait -> the rows' inverse RMS known (step 1) -> normalized rows (2) -> partial logits
// met (3, the cluster barrier) -> top-k done (4) -> the end (block 0: the sort).
__device__ unsigned long long g_router_clocks[4][8];
#define ROUTER_CLOCK(i) GPTOSS_STAGE_CLOCK(rclk, i)
void print_router_clocks() {
  static const char* const kinds[4] = {"1-16 tokens, block 0", "1-16 tokens, others", "17-64 tokens, block 0",
                                       "17-64 tokens, others"};
  static const char* const stages[6] = {"->waited", "->inv rms", "->normalized", "->logits met", "->top-k", "->end"};
  print_stage_table("router", g_router_clocks, kinds, stages, 6);
}
#else
#define ROUTER_CLOCK(i) \
  do { } while (0)
#endif

// ---- router ----
// One cluster of C blocks x NW warps. Block c owns a slice of K (32-column chunks
// [c * nc / C, (c + 1) * nc / C)): it loads its rows' slice of every expert's router row into
// registers before griddepcontrol.wait, reads the tokens' residual slice (f32) once, normalizes
// it into shared memory (and into xn for the experts) and runs the GEMV on mma.sync m16n8k16
// (experts as M, tokens as N: 1-8 tokens cost one MMA column tile). The sums of squares meet
// through distributed shared memory (few tokens: every block sums the whole rows itself, no
// barrier), so do the blocks' partial logits: block c routes tokens c * NW .. c * NW + NW - 1
// (the partial logits of the C blocks added in block order, then the bias, a thread per logit;
// logits stored; top-k by warp max reductions, a warp per token; softmax) and block 0 sorts the
// pairs. Three cluster barriers in all (two up to 4 tokens), no global atomics or fences, no ticket.
//
// A-fragment order: the MMA sums over its 16 k positions, so any fixed assignment of 16 of K's
// columns to them gives the same dot product. Lane (g = lane / 4, q = lane % 4) takes columns
// 8q..8q+3 of a 32-column chunk for the first k16 step and 8q+4..8q+7 for the second, for both
// the router rows (A) and the normalized activations (B): one 16-byte load per row and chunk.
constexpr int kRouterV2MaxTokens = 64;
constexpr int kRouterMaxChunks = 6;  // 32-column chunks per warp (registers: 2 uint4 each)
constexpr int kRedundantSsTokens = 4;
constexpr int kXLoads = 4;           // float4 loads per lane and token row of a slice (<= 128 columns / lane)

struct RouterV2Args : RouterIo {
  // Shape, planned on the host (router_v2_plan).
  int nc;             // K / 32 chunks
  int sw;             // columns of the widest block slice
  int mt, kp;         // m tiles (16 experts each); warps per m tile (each a part of the slice)
  int astr;           // bf16 elements between rows of the normalized slice (bytes = 64 mod 128)
  bool redundant_ss;  // every block sums the whole rows (few tokens)
  int wch;  // most chunks a warp holds (SMW: its shared memory stride, 1 KB a chunk)
  int o_w, o_g, o_bias, o_inv, o_ss, o_red, o_lg, o_sel_i, o_sel_w, o_sort, o_act, o_big;  // shared memory offsets (bytes)
};

// SMW: the router rows wait in shared memory (cp.async) instead of registers: fewer registers held,
// so the blocks fit beside more of the kernel before (whose end they wait for).
template <int C, int NW, int NT, bool SMW>  // NT: most MMA column tiles (8 tokens each)
__global__ void __launch_bounds__(NW * 32, 16 / NW) router_v2_kernel(const RouterV2Args a) {
#ifdef GPTOSS_DIAG_ROUTER_CLOCKS
  long long rclk[7] = {0, 0, 0, 0, 0, 0, 0};
#endif
  ROUTER_CLOCK(0);
  extern __shared__ __align__(128) unsigned char smem[];  // (128: skinny_units.cu says why)
  float* gs = reinterpret_cast<float*>(smem + a.o_g);          // [sw] norm weights of the slice
  float* bias_s = reinterpret_cast<float*>(smem + a.o_bias);   // [E]
  float* lg = reinterpret_cast<float*>(smem + a.o_lg);         // [NW][E] logits of the tokens routed here
  float* inv_rms = reinterpret_cast<float*>(smem + a.o_inv);   // [n]
  float* ss_part = reinterpret_cast<float*>(smem + a.o_ss);    // [n] this block's sums of squares
  float* red = reinterpret_cast<float*>(smem + a.o_red);       // [kRedundantSsTokens][NW]
  int32_t* sel_i = reinterpret_cast<int32_t*>(smem + a.o_sel_i);  // block 0: [n * k] top-k experts
  float* sel_w = reinterpret_cast<float*>(smem + a.o_sel_w);      // block 0: [n * k] their weights
  int32_t* sort_sm = reinterpret_cast<int32_t*>(smem + a.o_sort);  // block 0: moe_sort_block's scratch
  uint16_t* act = reinterpret_cast<uint16_t*>(smem + a.o_act);     // [round8(n)][astr] bf16
  float* big = reinterpret_cast<float*>(smem + a.o_big);  // x slice [n][sw] f32, then partial logits [kp][mt*16][n]

  const int rank = int(cg::this_cluster().block_rank());
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int n = a.n, K = a.K, E = a.E;
  const int cb = rank * a.nc / C, ce = (rank + 1) * a.nc / C, nb = ce - cb;  // this block's chunks
  const int sw4 = nb * 8;                                                    // float4s per slice row
  const int xs_ld4 = a.sw / 4;

  // Weights first: they depend on no earlier kernel. Warp (mt, kp) holds rows mt*16 + g and +8
  // over its part of the block's chunks.
  const int mt = warp % a.mt, kp = warp / a.mt;
  const bool mma_warp = kp < a.kp;
  const int wcb = mma_warp ? cb + kp * nb / a.kp : 0, wce = mma_warp ? cb + (kp + 1) * nb / a.kp : 0;
  const int r0 = mt * 16 + g, r1 = r0 + 8;
  uint4 wlo[SMW ? 1 : kRouterMaxChunks], whi[SMW ? 1 : kRouterMaxChunks];
  uint4* wsm = reinterpret_cast<uint4*>(smem + a.o_w) + size_t(warp) * a.wch * 64;  // SMW: [chunk][row g, g+8][lane]
#pragma unroll
  for (int j = 0; j < kRouterMaxChunks; ++j) {
    const int ch = wcb + j;
    const size_t col = size_t(ch) * 32 + 8 * q;
    if constexpr (SMW) {
      if (ch < wce) {  // rows past E: zeros (source size 0)
        ptx::cp_async16(wsm + j * 64 + lane, r0 < E ? a.w + size_t(r0) * K + col : a.w, r0 < E);
        ptx::cp_async16(wsm + j * 64 + 32 + lane, r1 < E ? a.w + size_t(r1) * K + col : a.w, r1 < E);
      }
    } else {
      wlo[j] = whi[j] = make_uint4(0u, 0u, 0u, 0u);
      if (ch < wce) {
        if (r0 < E) wlo[j] = __ldg(reinterpret_cast<const uint4*>(a.w + size_t(r0) * K + col));
        if (r1 < E) whi[j] = __ldg(reinterpret_cast<const uint4*>(a.w + size_t(r1) * K + col));
      }
    }
  }
  if constexpr (SMW) ptx::cp_async_commit();
  for (int i = tid; i < nb * 32; i += blockDim.x) gs[i] = __ldg(a.norm_w + size_t(cb) * 32 + i);
  for (int e = tid; e < E; e += blockDim.x) bias_s[e] = a.bias ? __ldg(a.bias + e) : 0.f;
  const int np8 = (n + 7) & ~7;
  {
    uint4* pad = reinterpret_cast<uint4*>(act + size_t(n) * a.astr);  // MMA columns past the tokens: zeros
    for (int i = tid; i < (np8 - n) * a.astr / 8; i += blockDim.x) pad[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  pdl_wait();
  ROUTER_CLOCK(1);
  pdl_trigger();

  // 1. The residual slice into shared memory (f32) and the rows' inverse RMS.
  const float4* x4 = reinterpret_cast<const float4*>(a.x);
  float4* xs4 = reinterpret_cast<float4*>(big);
  if (a.redundant_ss) {
    // Few tokens: every block reads the whole rows (the same sums in the same order everywhere).
    const int K4 = K / 4, total = n * K4, bd = blockDim.x;
    float ss[kRedundantSsTokens] = {};
    for (int base = tid; base < total; base += kXLoads * bd) {
      float4 v[kXLoads];
#pragma unroll
      for (int u = 0; u < kXLoads; ++u)
        if (base + u * bd < total) v[u] = x4[base + u * bd];
#pragma unroll
      for (int u = 0; u < kXLoads; ++u) {
        const int idx = base + u * bd;
        if (idx < total) {
          const int t = idx / K4, i = idx - t * K4;
          const float s = v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
#pragma unroll
          for (int tt = 0; tt < kRedundantSsTokens; ++tt)
            if (t == tt) ss[tt] += s;
          const int li = i - cb * 8;
          if (li >= 0 && li < sw4) xs4[t * xs_ld4 + li] = v[u];
        }
      }
    }
#pragma unroll
    for (int tt = 0; tt < kRedundantSsTokens; ++tt) {
      if (tt < n) {
        const float s = warp_sum(ss[tt]);
        if (lane == 0) red[tt * NW + warp] = s;
      }
    }
    __syncthreads();
    if (tid < n) {
      float tot = 0.f;
      for (int w2 = 0; w2 < NW; ++w2) tot += red[tid * NW + w2];
      inv_rms[tid] = 1.0f / sqrtf(tot / float(K) + a.eps);
    }
  } else {
    // A warp per token row of the slice; the blocks' partial sums meet in block order.
    for (int t = warp; t < n; t += NW) {
      const float4* xr = x4 + (size_t(t) * K + size_t(cb) * 32) / 4;
      float4 v[kXLoads];
#pragma unroll
      for (int u = 0; u < kXLoads; ++u)
        if (lane + 32 * u < sw4) v[u] = xr[lane + 32 * u];
      float ss = 0.f;
#pragma unroll
      for (int u = 0; u < kXLoads; ++u)
        if (lane + 32 * u < sw4) {
          xs4[t * xs_ld4 + lane + 32 * u] = v[u];
          ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
        }
      ss = warp_sum(ss);
      if (lane == 0) ss_part[t] = ss;
    }
    cluster_sync_all();  // every block's partial sums are in its ss_part
    if (tid < n) {
      float tot = 0.f;
#pragma unroll
      for (int c = 0; c < C; ++c) tot += in_block(ss_part, c)[tid];
      inv_rms[tid] = 1.0f / sqrtf(tot / float(K) + a.eps);
    }
  }
  __syncthreads();

  ROUTER_CLOCK(2);
  // 2. Normalized bf16 rows (rounded as rmsnorm_kernel rounds them) for the MMA and the experts.
  for (int idx = tid; idx < n * sw4; idx += blockDim.x) {
    const int t = idx / sw4, i = idx - t * sw4;
    const float4 v = xs4[t * xs_ld4 + i], w = reinterpret_cast<const float4*>(gs)[i];
    const float inv = inv_rms[t];
    uint2 o;
    o.x = pack_bf16x2(v.x * inv * w.x, v.y * inv * w.y);
    o.y = pack_bf16x2(v.z * inv * w.z, v.w * inv * w.w);
    *reinterpret_cast<uint2*>(act + size_t(t) * a.astr + 4 * i) = o;
    if (a.xn) {
      if (a.xn_f16) o = make_uint2(bf16x2_to_f16x2(o.x), bf16x2_to_f16x2(o.y));
      *reinterpret_cast<uint2*>(static_cast<uint16_t*>(a.xn) + size_t(t) * K + size_t(cb) * 32 + 4 * i) = o;
    }
  }
  __syncthreads();

  ROUTER_CLOCK(3);
  // 3. The GEMV over this block's slice: acc[nt] holds experts mt*16 + g (+8) x tokens nt*8 + 2q (+1).
  const int nts = np8 / 8, ep = a.mt * 16;
  if constexpr (SMW) ptx::cp_async_wait<0>();  // each lane reads back only what it copied
  if (mma_warp) {
    // One column tile: a second accumulator for the second k16 step halves the chain of
    // dependent MMAs (more tiles are independent chains already).
    float acc[NT][4], acc2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
    for (int j = 0; j < kRouterMaxChunks; ++j) {
      if (wcb + j < wce) {
        const uint16_t* brow = act + size_t(g) * a.astr + (wcb + j - cb) * 32 + 8 * q;
        const uint4 lo = SMW ? wsm[j * 64 + lane] : wlo[SMW ? 0 : j], hi = SMW ? wsm[j * 64 + 32 + lane] : whi[SMW ? 0 : j];
        const uint32_t alo[4] = {lo.x, hi.x, lo.y, hi.y};
        const uint32_t ahi[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (nt < nts) {
            const uint4 b = *reinterpret_cast<const uint4*>(brow + size_t(nt) * 8 * a.astr);
            ptx::mma_bf16_16816(acc[nt], alo, b.x, b.y);
            ptx::mma_bf16_16816(NT == 1 ? acc2 : acc[nt], ahi, b.z, b.w);
          }
        }
      }
    }
    if (NT == 1)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[0][i] += acc2[i];
    // The x slice is dead (step 2 read it before the barrier above): partial logits take its place,
    // token-major ([t][ep]): step 4's threads read them with consecutive experts, so the 16 remote
    // reads of each logit hit 32 banks. (Expert-major, [e][n], put a warp's reads n floats apart:
    // at 32 tokens all in one bank, a 32-way conflict on every read, and the 120b router took
    // 25 us at 32 tokens against 6 at one; Nsight Compute, eighth session.)
    float* kb = big + size_t(kp) * ep * n;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt < nts) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int c2 = 0; c2 < 2; ++c2) {
            const int t = nt * 8 + 2 * q + c2, e = mt * 16 + g + 8 * h;
            if (t < n) kb[t * ep + e] = acc[nt][2 * h + c2];
          }
      }
    }
  }
  __syncthreads();
  if (a.kp > 1)  // the warps' parts of the slice, in part order, into part 0
    for (int i = tid; i < ep * n; i += blockDim.x) {
      float s = big[i];
      for (int p = 1; p < a.kp; ++p) s += big[size_t(p) * ep * n + i];
      big[i] = s;
    }
  cluster_sync_all();  // every block's partial logits (its K slice) are in its big[0, n * ep)
  ROUTER_CLOCK(4);

  // 4. Up to NW tokens block 0 routes them all (no barrier before the sort); past that, the tokens
  // are spread evenly over the blocks (at 32 tokens 2 a block, not 8 in each of 4 blocks: the
  // block's reads of C partial logits a (token, expert) were the longest stage at 17-64 tokens,
  // GPTOSS_DIAG_ROUTER_CLOCKS). Their logits (the blocks' partial sums in block order, then the
  // bias) by a thread per (token, expert), then a warp per token for the top-k.
  const int per_block = n <= NW ? NW : (n + C - 1) / C;  // <= NW: n <= C * NW (router_v2_plan)
  const int t0 = rank * per_block, here = max(0, min(per_block, n - t0));
  for (int i = tid; i < here * E; i += blockDim.x) {
    const int tl = i / E, e = i - tl * E, t = t0 + tl;
    float v = 0.f;
#pragma unroll
    for (int c = 0; c < C; ++c) v += in_block(big, c)[t * ep + e];
    v += bias_s[e];
    lg[tl * E + e] = v;
    a.logits[size_t(t) * E + e] = v;
  }
  __syncthreads();
  if (warp < here) {
    const int t = t0 + warp;
    uint32_t key[kMaxExpertsPerLane];
#pragma unroll
    for (int i = 0; i < kMaxExpertsPerLane; ++i) {
      const int e = lane + 32 * i;
      key[i] = e < E ? order_key(lg[warp * E + e]) : 0u;
    }
    // Top-k: the largest value, ties to the lower expert index (as moe_route and the CPU).
    float sel_v[kMaxTopK];
    int sel_e[kMaxTopK];
    warp_top_k<kMaxExpertsPerLane>(key, a.k, sel_v, sel_e);
    if (lane == 0) {
      float w[kMaxTopK];
      topk_softmax(sel_v, a.k, w);
      int32_t* di = rank == 0 ? sel_i : in_block(sel_i, 0);
      float* dw = rank == 0 ? sel_w : in_block(sel_w, 0);
      for (int j = 0; j < a.k; ++j) {
        a.r.topk_idx[t * a.k + j] = sel_e[j];
        a.r.topk_w[t * a.k + j] = w[j];
        di[t * a.k + j] = sel_e[j];
        dw[t * a.k + j] = w[j];
      }
    }
  }

  ROUTER_CLOCK(5);
  // 5. Block 0 sorts the pairs. Up to NW tokens it routed them all itself and sorts at once; the
  // others wait for its arrival (their shared memory must outlive its reads).
  cluster_arrive();
  const int P = routed_pairs(a.r, n, a.k);  // padding tokens take no pair
  if (rank == 0) {
    const bool local = n <= NW;
    if (local)
      __syncthreads();
    else
      cluster_wait();
    if (P <= 32) {
      if (warp == 0) moe_sort_warp(P, a.k, a.r, a.eb, a.ee, sel_i, sel_w);
    } else {
      moe_sort_block_warp_scan(P, E, a.k, a.r, a.eb, a.ee, sel_i, sel_w, sort_sm);
    }
    clear_padding_slots(a.r, P, n * a.k, tid, blockDim.x);
    if (local) cluster_wait();
  } else {
    cluster_wait();
  }
  ROUTER_CLOCK(6);
#ifdef GPTOSS_DIAG_ROUTER_CLOCKS
  if (threadIdx.x == 0) {
    const int kind = (n > 16 ? 2 : 0) + (rank == 0 ? 0 : 1);
    for (int i = 0; i < 6; ++i) atomicAdd(&g_router_clocks[kind][i], (unsigned long long)(rclk[i + 1] - rclk[i]));
    atomicAdd(&g_router_clocks[kind][7], 1ull);
  }
#endif
}

struct RouterV2Plan {
  RouterV2Args a;
  size_t smem = 0;
  int C = 0, NW = 0;
  bool smw = false;
};

int align16(int b) { return (b + 15) & ~15; }
constexpr int kRouterMaxSmem = 200 * 1024;

// router_v2_plan's shared memory past the router rows (an upper bound: each part rounded up to 16 bytes).
int router_v2_smem_rest(int n, int k, int E, int NW, const RouterV2Args& a, int np8) {
  return align16(a.sw * 4) + align16(E * 4) + 2 * align16(kRouterV2MaxTokens * 4) +
         align16(kRedundantSsTokens * NW * 4) + align16(NW * E * 4) + 2 * align16(n * k * 4) + align16(5 * E * 4) +
         align16(np8 * a.astr * 2) + align16(std::max(n * a.sw, a.kp * a.mt * 16 * n) * 4);
}

bool router_v2_plan(int variant, int n, int K, int E, int k, RouterV2Plan* p) {
  int C = 0, NW = 0;
  switch (variant) {
    case 2: case 4: case 5: C = 8, NW = 16; break;
    case 3: case 6: C = 16, NW = 8; break;
    default: return false;
  }
  if (n < 1 || n > kRouterV2MaxTokens || n > C * NW || K % 32 != 0 || K <= 0) return false;
  if (E < 1 || E > 32 * kMaxExpertsPerLane || E > 32 * NW || k < 1 || k > kMaxTopK || k > E) return false;
  RouterV2Args& a = p->a;
  a.nc = K / 32;
  const int swc = (a.nc + C - 1) / C;
  if (swc * 8 > 32 * kXLoads) return false;
  a.mt = (E + 15) / 16;
  if (a.mt > NW) return false;
  a.kp = NW / a.mt;
  a.wch = (swc + a.kp - 1) / a.kp;
  if (a.wch > kRouterMaxChunks) return false;
  a.sw = swc * 32;
  a.astr = (((a.sw * 2 + 127) / 128) * 128 + 64) / 2;
  a.redundant_ss = variant != 4 && n <= kRedundantSsTokens;
  const int np8 = (n + 7) & ~7;
  // Rows in shared memory ("s" variants) while they fit beside the rest; else in registers.
  const int wbytes = NW * a.wch * 1024;
  const bool smw = variant >= 5 && router_v2_smem_rest(n, k, E, NW, a, np8) + wbytes <= kRouterMaxSmem;
  int o = 0;
  a.o_w = o, o += smw ? wbytes : 0;
  a.o_g = o, o = align16(o + a.sw * 4);
  a.o_bias = o, o = align16(o + E * 4);
  a.o_inv = o, o = align16(o + kRouterV2MaxTokens * 4);
  a.o_ss = o, o = align16(o + kRouterV2MaxTokens * 4);
  a.o_red = o, o = align16(o + kRedundantSsTokens * NW * 4);
  a.o_lg = o, o = align16(o + NW * E * 4);
  a.o_sel_i = o, o = align16(o + n * k * 4);
  a.o_sel_w = o, o = align16(o + n * k * 4);
  a.o_sort = o, o = align16(o + 5 * E * 4);
  a.o_act = o, o = align16(o + np8 * a.astr * 2);
  a.o_big = o, o = align16(o + std::max(n * a.sw, a.kp * a.mt * 16 * n) * 4);
  if (o > kRouterMaxSmem) return false;
  p->smem = size_t(o);
  p->C = C;
  p->NW = NW;
  p->smw = smw;
  return true;
}

template <int C, int NW, int NT, bool SMW>
void launch_router_v2(const RouterV2Plan& p, cudaStream_t s) {
  auto kernel = router_v2_kernel<C, NW, NT, SMW>;
  if (C > 8) GPTOSS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  allow_dynamic_smem(kernel, p.smem);
  launch_pdl_cluster(kernel, dim3(C), dim3(NW * 32), p.smem, dim3(C), s, p.a);
}

// ---- combine ----
// C blocks per token (a cluster; C = 1: one block), each over a slice of the row, a float4 of
// it per thread: x += sum_j w_j y[slot_j] with the experts added in order j = 0..k-1 (the old
// kernels' per-element sum, bit for bit), then the next layer's RMSNorm. The norm weights are
// loaded before griddepcontrol.wait, the residual with the routing; each block pushes its part
// of the sum of squares into every block's shared memory (after a relaxed arrival that only
// proves all blocks have started), so one barrier later each adds the parts in block order
// locally and no block waits for the others to finish reading before it exits.
template <int C>
__global__ void __launch_bounds__(C == 1 ? 768 : 512) combine_v2_kernel(const float* __restrict__ y, MoeRouting r, int k, int H,
                                                          float* __restrict__ x, const float* __restrict__ norm_w,
                                                          float eps, uint16_t* __restrict__ xn) {
  __shared__ float red[32];
  __shared__ float part[C];
  const int t = blockIdx.x / C;
  int rank = 0;
  if constexpr (C > 1) rank = int(cg::this_cluster().block_rank());
  const int H4 = H / 4, per = (H4 + C - 1) / C, f = rank * per + threadIdx.x;
  const bool active = int(threadIdx.x) < per && f < H4;
  const bool norm = norm_w != nullptr;  // uniform over the cluster
  if constexpr (C > 1)
    if (norm) cluster_arrive_relaxed();
  float4 gw = make_float4(0.f, 0.f, 0.f, 0.f);
  if (norm && active) gw = __ldg(reinterpret_cast<const float4*>(norm_w) + f);
  pdl_wait();
  pdl_trigger();
  float4* xr = reinterpret_cast<float4*>(x + size_t(t) * H);
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (active) v = xr[f];
  int slot[kMaxTopK];
  float w[kMaxTopK];
#pragma unroll
  for (int j = 0; j < kMaxTopK; ++j)
    if (j < k) {
      slot[j] = r.slot_pair[t * k + j];
      w[j] = r.topk_w[t * k + j];
    }
  if (active) {
    float4 yv[kMaxTopK];
#pragma unroll
    for (int j = 0; j < kMaxTopK; ++j)
      if (j < k) yv[j] = __ldcg(reinterpret_cast<const float4*>(y + size_t(slot[j]) * H) + f);
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma unroll
    for (int j = 0; j < kMaxTopK; ++j)
      if (j < k) {
        s0 = fmaf(w[j], yv[j].x, s0);
        s1 = fmaf(w[j], yv[j].y, s1);
        s2 = fmaf(w[j], yv[j].z, s2);
        s3 = fmaf(w[j], yv[j].w, s3);
      }
    v.x += s0;
    v.y += s1;
    v.z += s2;
    v.w += s3;
    xr[f] = v;
  }
  if (!norm) return;
  float ss = active ? v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w : 0.f;
  ss = warp_sum(ss);
  const int nw = (blockDim.x + 31) / 32;
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.f;
  if constexpr (C == 1) {
    for (int i = 0; i < nw; ++i) total += red[i];
  } else {
    cluster_wait();  // all blocks have started: their shared memory takes stores
    if (threadIdx.x == 0) {
      float b = 0.f;
      for (int i = 0; i < nw; ++i) b += red[i];
#pragma unroll
      for (int c = 0; c < C; ++c) *in_block(&part[rank], c) = b;
    }
    cluster_sync_all();
#pragma unroll
    for (int c = 0; c < C; ++c) total += part[c];
  }
  const float inv = 1.0f / sqrtf(total / float(H) + eps);
  if (active)
    reinterpret_cast<uint2*>(xn + size_t(t) * H)[f] =
        make_uint2(pack_bf16x2(v.x * inv * gw.x, v.y * inv * gw.y), pack_bf16x2(v.z * inv * gw.z, v.w * inv * gw.w));
}

template <int C>
void launch_combine_v2(const float* y, const MoeRouting& r, int n, int k, int H, float* x, const float* norm_w,
                       float eps, bf16_t* xn, cudaStream_t s) {
  const int per = (H / 4 + C - 1) / C;
  launch_pdl_cluster(combine_v2_kernel<C>, dim3(n * C), dim3((per + 31) / 32 * 32), 0, dim3(C), s, y, r, k, H, x,
                     norm_w, eps, reinterpret_cast<uint16_t*>(xn));
}

}  // namespace

int router_variant() {
  if (g_router_set > 0) return g_router_set;
  if (g_router_env < 0) g_router_env = env_variant("GPTOSS_ROUTER_KERNEL", kRouterNames, kRouterVariants, kRouterDefault);
  return g_router_env;
}
void set_router_variant(int v) {
  if (v < 0 || v >= kRouterVariants) throw Error("set_router_variant: no variant " + std::to_string(v));
  g_router_set = v;
}
const char* router_variant_name(int v) { return v >= 0 && v < kRouterVariants ? kRouterNames[v] : "?"; }

int combine_variant() {
  if (g_combine_set > 0) return g_combine_set;
  if (g_combine_env < 0)
    g_combine_env = env_variant("GPTOSS_COMBINE_KERNEL", kCombineNames, kCombineVariants, kCombineDefault);
  return g_combine_env;
}
void set_combine_variant(int v) {
  if (v < 0 || v >= kCombineVariants) throw Error("set_combine_variant: no variant " + std::to_string(v));
  g_combine_set = v;
}
const char* combine_variant_name(int v) { return v >= 0 && v < kCombineVariants ? kCombineNames[v] : "?"; }

bool router_v2_fuses(int n, int K, int E, int k) {
  RouterV2Plan p;
  return router_v2_plan(router_variant(), n, K, E, k, &p);
}

bool router_v2_route(const RouterIo& io, cudaStream_t s) {
  const int n = io.n;
  RouterV2Plan p;
  if (!router_v2_plan(router_variant(), n, io.K, io.E, io.k, &p)) return false;
#ifdef GPTOSS_DIAG_ROUTER_CLOCKS
  static const bool registered = (std::atexit(print_router_clocks), true);
  (void)registered;
#endif
  static_cast<RouterIo&>(p.a) = io;
  // One MMA column tile up to 8 tokens: fewer registers held, more room beside the kernel before.
  const bool one = n <= 8, smw = p.smw;
  constexpr int NT = kRouterV2MaxTokens / 8;
  if (p.C == 8 && !smw)
    one ? launch_router_v2<8, 16, 1, false>(p, s) : launch_router_v2<8, 16, NT, false>(p, s);
  else if (p.C == 8)
    one ? launch_router_v2<8, 16, 1, true>(p, s) : launch_router_v2<8, 16, NT, true>(p, s);
  else if (!smw)
    one ? launch_router_v2<16, 8, 1, false>(p, s) : launch_router_v2<16, 8, NT, false>(p, s);
  else
    one ? launch_router_v2<16, 8, 1, true>(p, s) : launch_router_v2<16, 8, NT, true>(p, s);
  GPTOSS_CUDA_LAUNCH_CHECK();
  return true;
}

bool combine_v2(const float* y, const MoeRouting& r, int n, int k, int H, float* x, const float* norm_w, float eps,
                bf16_t* xn, cudaStream_t s, bool invariant) {
  int v = combine_variant();
  if (v == 1 || H % 4 != 0 || k > kMaxTopK) return false;
  if (invariant) v = kCombineDefault;  // one shape at every size, whichever version 2 shape was asked for
  if (!invariant && n > kSkinnyMaxTokens) return false;
  const int C = v == 2 ? 1 : v == 3 ? 2 : v == 4 ? 4 : 8;
  if ((H / 4 + C - 1) / C > (C == 1 ? 768 : 512)) return false;  // a float4 per thread (launch bounds)
  switch (C) {
    case 1: launch_combine_v2<1>(y, r, n, k, H, x, norm_w, eps, xn, s); break;
    case 2: launch_combine_v2<2>(y, r, n, k, H, x, norm_w, eps, xn, s); break;
    case 4: launch_combine_v2<4>(y, r, n, k, H, x, norm_w, eps, xn, s); break;
    default: launch_combine_v2<8>(y, r, n, k, H, x, norm_w, eps, xn, s); break;
  }
  GPTOSS_CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace gptoss::cuda
