// The int8 screen of lm_head: exact greedy ids at 1-8 rows from half of lm_head's bytes plus the
// candidates' tiles in bf16 (lm_head_screen.h says what, lm_head_screen_math.h proves the bound).
//
// Both GEMV kernels here have the block shape of the skinny kernel that runs lm_head in full at
// these sizes (skinny_mma.cu: 8 warps over K, two 16-row tiles a block, warp w taking chunks w,
// w + 8, ..., the slices summed in warp order by sum_tile_slices): the screen so that it streams
// like the fp8 decode copy does (the same bytes), the recompute so that each recomputed logit is
// the full kernel's, bit for bit (the same chunk_mma, the same order of sums, the same epilogue).
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <string>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels/linear/frag_layout.cuh"
#include "backend/cuda/kernels/linear/lm_head_screen.h"
#include "backend/cuda/kernels/linear/lm_head_screen_math.h"
#include "backend/cuda/kernels/linear/skinny_chunk.cuh"

namespace gptoss::cuda {

namespace {

using screen::RowConst;
using skinny::SkinnyArgs;
using skinny::WChunk;

constexpr int kKS = 8, kRT = 2, kThreads = kKS * 32;  // warps over K, row tiles a block
// The recompute's chunks in flight a warp and row tile: a warp's 5-6 chunks of K = 2880 in two
// rounds of loads (126 registers, two blocks an SM; the screen's: lm_head_screen_pf()).
constexpr int kPF = 3;
constexpr int kMaxRows = LmHeadScreen::kMaxRows;
constexpr int kMaxK = 8192;  // the staged rows: kMaxRows x (K + 8) halves of shared memory
constexpr size_t kRedBytes = size_t(kKS) * kRT * 4 * 32 * sizeof(float);

// The step's scratch (state_), zeroed at build and by each step's last block.
struct State {
  uint32_t lower_max[kMaxRows];       // order keys of each row's best lower bound (0: none yet)
  unsigned long long best[kMaxRows];  // argmax keys (screen::argmax_key; 0: none yet)
  int listed, blocks_done;            // tile pairs listed by the selection; recompute blocks finished
  long long pairs, steps;             // totals since build (stats)
};

size_t smem_bytes(int M, int K) { return kRedBytes + size_t(M) * (K + 8) * 2; }

// ---- Load time ----

// One block a row (kRowThreads): the scale (largest magnitude / 127), then the row's exact sums in
// double (err^2, w^2, q^2 over the codes quantize() gives), then its constants.
constexpr int kRowThreads = 256;
__global__ void __launch_bounds__(kRowThreads) row_constants_kernel(const uint16_t* __restrict__ w, int K,
                                                                    RowConst* __restrict__ out) {
  const uint16_t* row = w + size_t(blockIdx.x) * K;
  __shared__ float red[kRowThreads / 32];
  __shared__ double redd[kRowThreads / 32];
  float m = 0.f;  // (fmaxf drops NaN; an inf makes the scale 1: row_scale)
  for (int k = threadIdx.x; k < K; k += kRowThreads) m = fmaxf(m, fabsf(bf16_bits_to_f32(row[k])));
  const float scale = screen::row_scale(block_max<kRowThreads>(m, red));
  double e2 = 0, w2 = 0, q2 = 0;
  for (int k = threadIdx.x; k < K; k += kRowThreads) {
    const float wf = bf16_bits_to_f32(row[k]);
    const int q = screen::quantize(wf, scale);
    const double d = double(wf) - double(scale) * q;
    e2 += d * d;
    w2 += double(wf) * wf;
    q2 += double(q) * q;
  }
  e2 = block_sum_d<kRowThreads>(e2, redd);
  w2 = block_sum_d<kRowThreads>(w2, redd);
  q2 = block_sum_d<kRowThreads>(q2, redd);
  if (threadIdx.x == 0) out[blockIdx.x] = screen::row_constants(scale, e2, w2, q2, K);
}

// This warp's chunks n = 0 .. my_n - 1 (chunk warp + 8 n of each row tile) in order, PF in flight
// (their first PF already asked for by load(u, u)): mma(wbuf[u][r], x, r) for each row tile r, with
// the lane's activations of the chunk from the staged rows as skinny_mma_kernel's x_from_smem takes
// them (zeros for the lanes past the pass's rows: !live).
template <int PF, class WC, class Load, class Mma>
__device__ __forceinline__ void walk_chunks(int my_n, int warp, const uint16_t* xs_lane, bool live, WC (&wbuf)[PF][kRT],
                                            Load&& load, Mma&& mma) {
  for (int n0 = 0; n0 < my_n; n0 += PF) {
#pragma unroll
    for (int u = 0; u < PF; ++u) {
      const int n = n0 + u;
      if (n >= my_n) break;
      uint4 xb[1][2];
      if (live) {
        const uint4* p = reinterpret_cast<const uint4*>(xs_lane + (warp + n * kKS) * 64);
        xb[0][0] = p[0];
        xb[0][1] = p[4];
      } else {
        xb[0][0] = xb[0][1] = make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int r = 0; r < kRT; ++r) mma(wbuf[u][r], xb, r);
      if (n + PF < my_n) load(u, n + PF);
    }
  }
}

// ---- The screen ----

struct ScreenArgs {
  const uint4* q;
  const RowConst* rowc;
  const uint16_t* x;  // bf16 [M][lda]
  int lda, M, N, K;
  float* upper;  // [M][N]
  State* st;
};

// Two codes (bytes `sel` picks, each + 128) -> f16x2, exact: 0x64 above a byte is the half 1024 +
// byte, less 1152 (0x6480) is the code.
__device__ __forceinline__ uint32_t i8x2_to_f16x2(uint32_t word, uint32_t sel) {
  const uint32_t h = __byte_perm(word, 0x64646464u, sel);
  const __half2 v = __hsub2(*reinterpret_cast<const __half2*>(&h), __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480)));
  return *reinterpret_cast<const uint32_t*>(&v);
}

// One chunk of codes against fp16 activations: chunk_mma's kFragFP8 branch with the int8 decode
// (register r takes half r & 1 of word 2 jj + r / 2: bytes 0, 1 or 2, 3).
__device__ __forceinline__ void chunk_mma_i8(const WChunk<WeightMat::kFragFP8>& w, const uint4 (&x)[1][2],
                                             float (&acc)[1][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t* qw = reinterpret_cast<const uint32_t*>(&w.q[h]);
    const uint32_t* xb = reinterpret_cast<const uint32_t*>(&x[0][h]);
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      uint32_t af[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) af[r] = i8x2_to_f16x2(qw[2 * jj + (r >> 1)], (r & 1) ? 0x4342u : 0x4140u);
      ptx::mma_f16_16816(acc[0], af, xb[2 * jj], xb[2 * jj + 1]);
    }
  }
}

// One row's bounds: the upper one stored (+inf where anything is not finite: always a candidate),
// the lower one's order key returned (0 where not finite: it bounds nothing).
__device__ __forceinline__ uint32_t row_bounds(const RowConst& c, const screen::StepNorms& n, float acc, float* upper) {
  const float S = acc * c.scale, r = screen::radius(c, n, S);
  if (!isfinite(S) || !isfinite(r)) {
    *upper = INFINITY;
    return 0;
  }
  *upper = S + r;
  return screen::order_key(S - r);
}

// PF: chunks in flight a warp and row tile (fp8's decode copy takes 2 at three blocks an SM; 3 and
// 4 at two blocks an SM, where they do not spill, for the sweep: set_lm_head_screen_pf).
template <int PF>
__global__ void __launch_bounds__(kThreads, PF >= 3 ? 2 : 3) screen_kernel(ScreenArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int C = a.K / 64, tile0 = blockIdx.x * kRT;
  extern __shared__ __align__(128) float red[];  // [KS][RT][1][4][32] (sum_tile_slices), then the rows
  uint16_t* xs = reinterpret_cast<uint16_t*>(red + kKS * kRT * 4 * 32);
  const int xs_ld = a.K + 8;
  __shared__ float norm_parts[kKS][kMaxRows][3];
  __shared__ screen::StepNorms norms[kMaxRows];

  // The weights do not depend on the kernels before: the first chunks load before the wait.
  const int my_n = C > warp ? (C - 1 - warp) / kKS + 1 : 0;
  const uint4* wl = a.q + lane;
  WChunk<WeightMat::kFragFP8> wbuf[PF][kRT];
  auto load = [&](int u, int n) {
#pragma unroll
    for (int r = 0; r < kRT; ++r)
      skinny::load_w_at<WeightMat::kFragFP8>(wl, nullptr, size_t(tile0 + r) * C + warp + n * kKS, wbuf[u][r]);
  };
#pragma unroll
  for (int u = 0; u < PF; ++u)
    if (u < my_n) load(u, u);
  if (warp < kRT) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(a.rowc + (tile0 + warp) * 16 + g));
    asm volatile("prefetch.global.L1 [%0];" ::"l"(a.rowc + (tile0 + warp) * 16 + g + 8));
  }
  pdl_wait();
  pdl_trigger();

  // The rows as fp16 into shared memory, with their three norms (lm_head_screen_math.h).
  for (int t = 0; t < a.M; ++t) {
    float sx = 0.f, sd = 0.f, sh = 0.f;
    const uint4* src = reinterpret_cast<const uint4*>(a.x + size_t(t) * a.lda);
    for (int v = threadIdx.x; v < a.K / 8; v += kThreads) {
      const uint4 b = __ldg(src + v);
      const uint4 h = bf16x8_to_f16x8(b);
      *reinterpret_cast<uint4*>(xs + size_t(t) * xs_ld + v * 8) = h;
      const uint32_t* bw = reinterpret_cast<const uint32_t*>(&b);
      const uint32_t* hw = reinterpret_cast<const uint32_t*>(&h);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 xf = bf16x2_to_f32x2(bw[k]);
        const float2 hf = __half22float2(*reinterpret_cast<const __half2*>(&hw[k]));
        const float d0 = xf.x - hf.x, d1 = xf.y - hf.y;
        sx += xf.x * xf.x + xf.y * xf.y;
        sh += hf.x * hf.x + hf.y * hf.y;
        sd += d0 * d0 + d1 * d1;
      }
    }
    sx = warp_sum(sx);
    sd = warp_sum(sd);
    sh = warp_sum(sh);
    if (lane == 0) {
      norm_parts[warp][t][0] = sx;
      norm_parts[warp][t][1] = sd;
      norm_parts[warp][t][2] = sh;
    }
  }
  __syncthreads();
  if (threadIdx.x < a.M) {
    float x2 = 0.f, d2 = 0.f, h2 = 0.f;
    for (int w = 0; w < kKS; ++w) {
      x2 += norm_parts[w][threadIdx.x][0];
      d2 += norm_parts[w][threadIdx.x][1];
      h2 += norm_parts[w][threadIdx.x][2];
    }
    norms[threadIdx.x] = screen::inflate(x2, d2, h2);  // read after sum_tile_slices' barriers
  }

  float acc[kRT][1][4];
#pragma unroll
  for (int r = 0; r < kRT; ++r) acc[r][0][0] = acc[r][0][1] = acc[r][0][2] = acc[r][0][3] = 0.f;
  const uint16_t* xs_lane = xs + size_t(g) * xs_ld + 8 * tq;
  walk_chunks<PF>(my_n, warp, xs_lane, g < a.M, wbuf, load,
                  [&](const WChunk<WeightMat::kFragFP8>& w, const uint4(&xb)[1][2], int r) { chunk_mma_i8(w, xb, acc[r]); });
  float fin[1][4];
  if (!skinny::sum_tile_slices<1, kKS, kRT>(red, acc, kRT, fin)) return;
  // Warp r: rows g, g + 8 of tile tile0 + r; tokens 2 tq, 2 tq + 1 (fin[0][c], fin[0][2 + c]).
  const int r0 = (tile0 + warp) * 16 + g, r1 = r0 + 8;
  const RowConst c0 = a.rowc[r0], c1 = a.rowc[r1];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int t = 2 * tq + c;
    uint32_t key = 0;
    if (t < a.M) {
      float* up = a.upper + size_t(t) * a.N;
      key = max(row_bounds(c0, norms[t], fin[0][c], up + r0), row_bounds(c1, norms[t], fin[0][2 + c], up + r1));
    }
    key = max(key, __shfl_xor_sync(0xffffffffu, key, 4));  // over the lanes of this tq (g varies)
    key = max(key, __shfl_xor_sync(0xffffffffu, key, 8));
    key = max(key, __shfl_xor_sync(0xffffffffu, key, 16));
    if (g == 0 && t < a.M && key != 0) atomicMax(&a.st->lower_max[t], key);
  }
}

// ---- The selection: a warp a tile pair (32 rows, a lane each) ----

__global__ void select_kernel(const float* __restrict__ upper, int M, int N, int* __restrict__ list, State* st) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31, pair = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (pair >= N / 32) return;
  bool cand = false;
  for (int t = 0; t < M; ++t)
    cand |= screen::order_key(upper[size_t(t) * N + size_t(pair) * 32 + lane]) >= st->lower_max[t];
  if (__any_sync(0xffffffffu, cand) && lane == 0) list[atomicAdd(&st->listed, 1)] = pair;
}

// ---- The recompute: skinny_mma_kernel's arithmetic over the listed tile pairs ----

struct RecomputeArgs {
  SkinnyArgs a;  // the bf16 decode copy, the rows (bf16), M, the logits' epilogue
  const int* list;
  State* st;
  int32_t* ids;
  bool sampler_rule;  // a maximum of -inf gives id 0 (sample_rows' greedy rule)
};

__global__ void __launch_bounds__(kThreads, 2) recompute_kernel(RecomputeArgs ra) {
  const SkinnyArgs& a = ra.a;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int C = a.W.K / 64;
  extern __shared__ __align__(128) float red[];
  uint16_t* xs = reinterpret_cast<uint16_t*>(red + kKS * kRT * 4 * 32);
  const int xs_ld = a.W.K + 8;
  pdl_wait();
  pdl_trigger();
  const int listed = ra.st->listed;
  if (int(blockIdx.x) < listed) {  // (uniform over the block)
    skinny::stage_rows<false>(a, 0, a.M, xs, xs_ld);
    __syncthreads();
  }
  const int my_n = C > warp ? (C - 1 - warp) / kKS + 1 : 0;
  const uint16_t* xs_lane = xs + size_t(g) * xs_ld + 8 * tq;
  for (int i = blockIdx.x; i < listed; i += gridDim.x) {
    const int tile0 = ra.list[i] * kRT;
    WChunk<WeightMat::kFragBF16> wbuf[kPF][kRT];
    auto load = [&](int u, int n) {
#pragma unroll
      for (int r = 0; r < kRT; ++r) skinny::load_w<WeightMat::kFragBF16>(a, size_t(tile0 + r) * C + warp + n * kKS, lane, wbuf[u][r]);
    };
#pragma unroll
    for (int u = 0; u < kPF; ++u)
      if (u < my_n) load(u, u);
    // skinny_mma_kernel's sums: this warp's chunks in order, each chunk's four k-steps in order.
    float acc[kRT][1][4];
#pragma unroll
    for (int r = 0; r < kRT; ++r) acc[r][0][0] = acc[r][0][1] = acc[r][0][2] = acc[r][0][3] = 0.f;
    walk_chunks<kPF>(my_n, warp, xs_lane, g < a.M, wbuf, load,
                     [&](const WChunk<WeightMat::kFragBF16>& w, const uint4(&xb)[1][2], int r) {
                       skinny::chunk_mma<WeightMat::kFragBF16, 1, false>(w, xb, acc[r]);
                     });
    float fin[1][4];
    if (skinny::sum_tile_slices<1, kKS, kRT>(red, acc, kRT, fin)) {  // (finish_tiles)
      const int tile = tile0 + warp;
      const skinny::TileRows tr = skinny::tile_rows<WeightMat::kFragBF16>(a, 0, tile, g);
      skinny::tile_store(a, tr, tile, g, tq, 0, a.M, fin[0]);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int t = 2 * tq + c;
        unsigned long long key = 0;
        if (t < a.M)  // the values tile_store stored
          key = max(screen::argmax_key(fin[0][c] * tr.sc0 + tr.b0, tr.lr0),
                    screen::argmax_key(fin[0][2 + c] * tr.sc1 + tr.b1, tr.lr1));
        key = max(key, __shfl_xor_sync(0xffffffffu, key, 4));
        key = max(key, __shfl_xor_sync(0xffffffffu, key, 8));
        key = max(key, __shfl_xor_sync(0xffffffffu, key, 16));
        if (g == 0 && t < a.M && key != 0) atomicMax(&ra.st->best[t], key);
      }
    }
  }
  // The last block to finish: the ids, and the step's scratch back to zero for the next step.
  // (Every thread's atomics ordered before the block's count: the fence, then the barrier.)
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    if (atomicAdd(&ra.st->blocks_done, 1) == int(gridDim.x) - 1) {
      __threadfence();
      for (int t = 0; t < a.M; ++t) {
        const unsigned long long k = atomicExch(&ra.st->best[t], 0ull);
        const bool neg_inf = (k >> 32) == screen::order_key(-INFINITY);
        ra.ids[t] = ra.sampler_rule && neg_inf ? 0 : screen::argmax_key_id(k);
        ra.st->lower_max[t] = 0;
      }
      ra.st->pairs += listed;
      ra.st->steps += 1;
      ra.st->listed = 0;
      ra.st->blocks_done = 0;
    }
  }
}

}  // namespace

namespace {
int g_screen = -1;  // set_lm_head_screen: -1 GPTOSS_LM_HEAD_SCREEN's choice, 0 off, 1 on
int g_screen_pf = env_int("GPTOSS_LM_HEAD_SCREEN_PF", 2);  // the screen kernel's chunks in flight
std::atomic<long long> g_screen_passes{0};
}  // namespace

bool lm_head_screen_enabled() {
  static const bool env_on = env_int("GPTOSS_LM_HEAD_SCREEN", 1) != 0;
  return g_screen < 0 ? env_on : g_screen != 0;
}
void set_lm_head_screen(int v) { g_screen = v; }
void set_lm_head_screen_pf(int pf) { g_screen_pf = pf; }
int lm_head_screen_pf() { return g_screen_pf; }
void note_lm_head_screen_pass() { ++g_screen_passes; }
long long lm_head_screen_passes() { return g_screen_passes.load(); }

bool lm_head_screen_takes(const WeightMat& W, int M, bool invariant) {
  // (The screen and select walk rows in their natural order: no gate/up pairing inside tiles.)
  return W.fmt == WeightMat::kFragBF16 && !W.swiglu_rows && W.N % 32 == 0 && W.K % 64 == 0 && W.K <= kMaxK &&
         !W.bias && M >= 1 && M <= kMaxRows && linear_runs_dense_8x2(W, M, invariant);
}

size_t LmHeadScreen::bytes() const {
  return q_.bytes() + rowc_.bytes() + upper_.bytes() + list_.bytes() + state_.bytes();
}

void LmHeadScreen::build(const WeightMat& W, cudaStream_t s) {
  if (W.fmt != WeightMat::kBF16 || W.N <= 0 || W.N % 32 != 0 || W.K % 64 != 0 || W.K > kMaxK || W.bias)
    throw Error("lm_head screen: needs a row-major bf16 matrix without bias, rows % 32 == 0, K % 64 == 0, K <= " +
                std::to_string(kMaxK) + " (got " + std::to_string(W.N) + " x " + std::to_string(W.K) + ")");
  N_ = 0;  // built() stays false unless everything below succeeds
  q_.alloc(size_t(W.N) * W.K);
  rowc_.alloc(size_t(W.N) * sizeof(RowConst));
  upper_.alloc(size_t(kMaxRows) * W.N * sizeof(float));
  list_.alloc(size_t(W.N / 32) * sizeof(int));
  state_.alloc(sizeof(State));
  GPTOSS_CUDA_CHECK(cudaMemsetAsync(state_.get(), 0, sizeof(State), s));
  const uint16_t* w = static_cast<const uint16_t*>(W.w);
  row_constants_kernel<<<W.N, kRowThreads, 0, s>>>(w, W.K, rowc_.get<RowConst>());
  GPTOSS_CUDA_LAUNCH_CHECK();
  // (RowConst's first float is the scale: a stride of four floats.)
  static_assert(offsetof(RowConst, scale) == 0 && sizeof(RowConst) == 4 * sizeof(float));
  pack_frag_i8(W, reinterpret_cast<const float*>(rowc_.get<RowConst>()), 4, q_.get(), s);
  // The screen loads its first codes before griddepcontrol.wait, and a plain launch's writes are
  // only promised to a programmatic successor after that wait: the codes must be whole before any
  // argmax() is queued behind them.
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(s));
  N_ = W.N;
  K_ = W.K;
}

void LmHeadScreen::argmax(const WeightMat& W_dec, const bf16_t* x, int lda, int M, float* logits, int ldo,
                          int32_t* ids, bool invariant, cudaStream_t s, bool sampler_rule) const {
  if (!built() || W_dec.N != N_ || W_dec.K != K_ || !lm_head_screen_takes(W_dec, M, invariant))
    throw Error("lm_head screen: not built for this matrix, or " + std::to_string(M) + " rows it does not take");
  State* st = state_.get<State>();
  const size_t smem = smem_bytes(M, K_);
  ScreenArgs sa{q_.get<uint4>(), rowc_.get<RowConst>(), x, lda, M, N_, K_, upper_.get<float>(), st};
  auto screen = [&](auto kernel) {
    allow_dynamic_smem(kernel, smem);
    launch_pdl(kernel, dim3(N_ / 32), dim3(kThreads), smem, s, sa);
  };
  switch (lm_head_screen_pf()) {
    case 1: screen(screen_kernel<1>); break;
    case 3: screen(screen_kernel<3>); break;
    case 4: screen(screen_kernel<4>); break;
    default: screen(screen_kernel<2>); break;
  }
  GPTOSS_CUDA_LAUNCH_CHECK();
  const int pairs = N_ / 32;
  SkinnyArgs a{W_dec, x, lda, M, false, false, MoeRouting{}, Epilogue{Epilogue::kStoreF32, logits, ldo}};
  a.xs_rows = M;
  a.stage_async = true;
  RecomputeArgs ra{a, list_.get<int>(), st, ids, sampler_rule};
  try {
    launch_pdl(select_kernel, dim3((pairs + 7) / 8), dim3(256), 0, s, static_cast<const float*>(upper_.get<float>()),
               M, N_, list_.get<int>(), st);
    GPTOSS_CUDA_LAUNCH_CHECK();
    allow_dynamic_smem(recompute_kernel, smem);
    launch_pdl(recompute_kernel, dim3(std::min(pairs, 2 * sm_count())), dim3(kThreads), smem, s, ra);
    GPTOSS_CUDA_LAUNCH_CHECK();
  } catch (...) {
    // Only the recompute's last block resets the step's scratch: a step that stops after the
    // screen would leave its lower bounds behind to mislead the next one.
    cudaMemsetAsync(state_.get(), 0, sizeof(State), s);
    throw;
  }
}

LmHeadScreen::Stats LmHeadScreen::stats(cudaStream_t s) const {
  State h{};
  if (!built()) return {};
  GPTOSS_CUDA_CHECK(cudaMemcpyAsync(&h, state_.get(), sizeof(State), cudaMemcpyDeviceToHost, s));
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(s));
  return Stats{h.pairs, h.steps};
}

}  // namespace gptoss::cuda
