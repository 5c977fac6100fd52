// Grouped MoE expert GEMM for prefill, version 4: MXFP4 weights x bf16 activations on Hopper's
// warpgroup MMA with the weights in registers (wgmma "RS", sm_90a only; elsewhere linear_grouped
// keeps version 2). Chosen by GPTOSS_EXPERT_GEMM=v4.
//
// Why not version 3's shape (64 token rows x 128 weight rows, the weights decoded into a bf16
// shared-memory tile by the warps that also issue the MMAs): at ~64 pairs per expert (2048 tokens,
// top-4 of 128) its 64-row tiles ran ~2/3 full and decoded each expert's weights ~1.5 times, and
// every step stored 16 KB of decoded weights and read them back through the tensor cores, which
// with the activation tile put shared memory near its bandwidth.
//
// Here the operands are swapped: the weights are the wgmma M side (A, 64 rows a warpgroup, decoded
// from e2m1 straight into the A registers: no bf16 copy in shared memory) and the tokens the N side
// (B, in shared memory), so a tile's token count only has to round up to 16 (wgmma N = 16..128,
// one instantiation of the main loop per size) instead of 64.
//
// One CTA: one expert's row tile of up to 128 sorted pairs x 128 weight rows, K in steps of 64.
// Three warpgroups, specialized:
// - warpgroup 0 (producer) copies, per step, the 128 weight rows' codes (4 KB, cp.async 16 B, as
//   versions 2 and 3) and the tile's activation rows (gathered by pair_token, cp.async 4 B into
//   the K permutation below) into a ring of kStages stages, and the tile's scales once; each
//   stage's "full" mbarrier fires when the producer threads' copies have landed
//   (cp.async.mbarrier.arrive.noinc);
// - warpgroups 1 and 2 (consumers) own weight rows 0-63 and 64-127: per step each waits for the
//   stage, decodes its 64 x 64 weights into the A registers of four k16 slices, issues four
//   wgmma m64nNk16 over the tile's N tokens, and once the previous step's MMAs are done (wait_group
//   1) frees that step's stage ("empty" mbarrier, one arrive a warp). The decode of step kt + 1
//   overlaps the MMAs of step kt, and the two consumers' MMAs share one activation tile.
//
// K permutation. The decode produces A registers in the order of the fragment layout
// (kernels/linear/frag_layout.cuh; version 2's order for the checkpoint layout): inside each
// 32-element scale block h, lane quad tq holds natural elements 8 tq .. 8 tq + 7, so k16 slice
// j = 2 h + jj of the 64-step pairs MMA k positions 2 tq + {0, 1} with natural 32 h + 8 tq + 4 jj +
// {0, 1} and 8 + 2 tq + {0, 1} with + {2, 3}. The activations are stored in the same permutation:
// in the 128-byte swizzled row of a token (wgmma_ptx.cuh), 16-byte chunk 4 h + u (u = 2 jj + c)
// word tq holds the natural word u of natural chunk 4 h + tq, a 4 x 4 transpose of words inside
// each 32-element block, which the producer's 4-byte copies perform in flight (one token row a
// warp instruction: 128 contiguous bytes read, 32 distinct banks written).
//
// Epilogue straight from the accumulators (thread: weight rows g and g + 8 of its warp's 16, token
// columns 8 i + 2 tq + {0, 1}): in the fragment layout with paired gate/up rows a thread holds
// gate and up of one output column; in natural row order the up of gate row n sits four lanes on.
#include <algorithm>
#include <atomic>
#include <string>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/frag_layout.cuh"
#include "backend/cuda/kernels/moe/expert_gemm_common.cuh"
#include "backend/cuda/tensor_core_ptx.cuh"
#include "backend/cuda/wgmma_pipeline_ptx.cuh"
#include "backend/cuda/wgmma_ptx.cuh"

namespace gptoss::cuda {

namespace {

using namespace moe_gemm;
using ptx::sw128_offset;

constexpr int kBT = 128;  // sorted pairs (tokens) a CTA tile at most: the wgmma N side
constexpr int kBW = 128;  // weight rows a CTA tile: 64 per consumer warpgroup (the wgmma M side)
constexpr int kBK = 64;   // K a step
constexpr int kStages = 6;
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (1 + kConsumers);
static_assert(kBW == kTileWeightRows && kBK == kTileKStep, "copy_tile_scales, code_copies (128 producer threads)");
constexpr int kActStageBytes = kBT * kBK * 2;  // 16 KB
constexpr int kRawStageBytes = kBW * kBK / 2;  // 4 KB
constexpr int kMaxK = 4096;
constexpr int kActOff = 0;
constexpr int kRawOff = kActOff + kStages * kActStageBytes;
constexpr int kScaleOff = kRawOff + kStages * kRawStageBytes;
// Then the scales (kBW * K / 32 bytes, a multiple of 256) and 2 kStages mbarriers.

// + 1 KB: the dynamic shared memory is aligned up to 1024 bytes in the kernel.
size_t smem_bytes(int K) { return size_t(kScaleOff) + size_t(kBW) * (K / 32) + 2 * kStages * 8 + 1024; }

struct V4Args {
  const uint8_t* w;
  const uint8_t* scales;
  const float* bias;
  int N, K;
  const uint16_t* A;
  int lda;
  bool gather_a;
  MoeRouting r;
  Epilogue epi;
  bool swiglu_rows;
};

#ifdef SM90A_WGMMA
__device__ __forceinline__ uint8_t* align1024(uint8_t* p) {
  const uint32_t s = ptx::smem_addr(p);
  return p + ((1024u - (s & 1023u)) & 1023u);
}

// What every role of the CTA knows about its tile.
struct Tile {
  int expert, row0, row_end, nb;  // nb: token rows the MMAs cover (count rounded up to 16)
  int n0, N, K, KT;
  uint8_t* smem;
  uint32_t s_base, bar_full, bar_empty;
};

// Warpgroup 0: the copies of every step into the ring.
template <bool FRAG>
__device__ __forceinline__ void produce(const V4Args& a, const Tile& t, int pt) {
  const int lane = pt & 31, pw = pt >> 5;
  copy_tile_scales<FRAG>(a.scales, t.expert, t.N, t.K, t.n0, t.s_base + kScaleOff, pt);
  const CodeCopies codes = code_copies<FRAG>(a.w, t.expert, t.N, t.K, t.n0, pt);
  // This lane's token row 32 pw + lane: its A row offset (0 and !ok past the group's end).
  const int p = t.row0 + 32 * pw + lane;
  const bool my_ok = p < t.row_end;
  const uint32_t my_off = my_ok ? uint32_t(a.gather_a ? a.r.pair_token[p] : p) * uint32_t(a.lda) : 0u;
  const int rows = min(32, t.nb - 32 * pw);  // this warp's rows the MMAs read (<= 0: none)
  // Word `lane` of a row's step (natural chunk 4 h + tq, word u) -> chunk 4 h + u, word tq.
  const int h = lane >> 4, tq = (lane >> 2) & 3, u = lane & 3;
  const int dst_k = 8 * (4 * h + u);
  const uint32_t dst_word = uint32_t(4 * tq);
  for (int kt = 0; kt < t.KT; ++kt) {
    const int s = kt % kStages;
    if (kt >= kStages) ptx::mbar_wait(t.bar_empty + 8 * s, uint32_t((kt / kStages - 1) & 1));
    const uint32_t raw = t.s_base + kRawOff + s * kRawStageBytes;
#pragma unroll
    for (int c = 0; c < 2; ++c) ptx::cp_async16(raw + codes.dst[c], codes.src[c] + size_t(kt) * codes.step, codes.ok[c]);
    const uint32_t act = t.s_base + kActOff + s * kActStageBytes;
    const uint16_t* src = a.A + kt * kBK + 2 * lane;
    for (int j = 0; j < rows; ++j) {  // warp-uniform
      const uint32_t off = __shfl_sync(0xffffffffu, my_off, j);
      const bool ok = __shfl_sync(0xffffffffu, my_ok, j);
      const int r = 32 * pw + j;
      ptx::cp_async4(act + sw128_offset(r, dst_k) + dst_word, src + off, ok);
    }
    ptx::cp_async_mbar_arrive_noinc(t.bar_full + 8 * s);
  }
  ptx::cp_async_wait_all();
}

// This thread's A registers of step kt (four k16 slices) from stage s: weight rows g and g + 8 of
// warp `warp` of consumer cw (tile 4 cw + warp of the CTA's eight 16-row tiles).
template <bool FRAG>
__device__ __forceinline__ void decode_a(const Tile& t, int cw, int warp, int lane, int kt, int s, uint32_t (&af)[4][4]) {
  const uint8_t* raw = t.smem + kRawOff + s * kRawStageBytes;
  const uint8_t* sc = t.smem + kScaleOff;
  const int g = lane >> 2, tq = lane & 3;
  if constexpr (FRAG) {
    const int tl = 4 * cw + warp, C = t.K / 64;
    const uint4 q = *reinterpret_cast<const uint4*>(raw + tl * 512 + lane * 16);
    const uint32_t fs = *reinterpret_cast<const uint32_t*>(sc + (tl * C + kt) * 32 + 4 * g);
    const uint32_t fs_hi = __vminu4(fs, 0x80808080u) + 0x7E7E7E7Eu;
    const uint32_t fs_lo = __vmaxu4(fs, 0x80808080u) - 0x01010101u;
    const uint32_t wq[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t hi_g = frag_scale_pair(fs_hi, h), lo_g = frag_scale_pair(fs_lo, h);
      const uint32_t hi_g8 = frag_scale_pair(fs_hi, 2 + h), lo_g8 = frag_scale_pair(fs_lo, 2 + h);
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        uint32_t r[4];
        frag_word_to_bf16x2(wq[2 * h + jj], r);
        af[2 * h + jj][0] = bf16x2_mul(bf16x2_mul(r[0], hi_g), lo_g);
        af[2 * h + jj][1] = bf16x2_mul(bf16x2_mul(r[1], hi_g8), lo_g8);
        af[2 * h + jj][2] = bf16x2_mul(bf16x2_mul(r[2], hi_g), lo_g);
        af[2 * h + jj][3] = bf16x2_mul(bf16x2_mul(r[3], hi_g8), lo_g8);
      }
    }
  } else {
    const int kb = t.K / 32;
    const int R0 = 64 * cw + 16 * warp + g, R1 = R0 + 8;
    const int swz = (g >> 2) & 1;  // code_copies' chunk swizzle ((row >> 2) & 1, the same for R1)
    const uint32_t cs0 = *reinterpret_cast<const uint16_t*>(sc + R0 * kb + 2 * kt);
    const uint32_t cs1 = *reinterpret_cast<const uint16_t*>(sc + R1 * kb + 2 * kt);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t q0 = *reinterpret_cast<const uint32_t*>(raw + R0 * 32 + ((h ^ swz) << 4) + 4 * tq);
      const uint32_t q1 = *reinterpret_cast<const uint32_t*>(raw + R1 * 32 + ((h ^ swz) << 4) + 4 * tq);
      uint32_t o0[4], o1[4];  // o[b]: natural elements 32 h + 8 tq + 2 b, + 1
      mx_word_to_bf16x2(q0, e8m0_bf16x2((cs0 >> (8 * h)) & 255u), o0);
      mx_word_to_bf16x2(q1, e8m0_bf16x2((cs1 >> (8 * h)) & 255u), o1);
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        af[2 * h + jj][0] = o0[2 * jj];
        af[2 * h + jj][1] = o1[2 * jj];
        af[2 * h + jj][2] = o0[2 * jj + 1];
        af[2 * h + jj][3] = o1[2 * jj + 1];
      }
    }
  }
}

// Consumer cw (warpgroup 1 + cw): the main loop over K and the epilogue, NB token rows.
template <bool FRAG, int NB>
__device__ __forceinline__ void consume(const V4Args& a, const Tile& t, int cw, int ct) {
  const int warp = ct >> 5, lane = ct & 31, g = lane >> 2, tq = lane & 3;
  const int T = t.N / 16, tile0 = t.n0 / 16;  // FRAG geometry
  const bool live = FRAG ? tile0 + 4 * cw < T : t.n0 + 64 * cw < t.N;  // any of its 64 rows real
  float acc[NB / 2];
#pragma unroll
  for (int i = 0; i < NB / 2; ++i) acc[i] = 0.f;
  for (int kt = 0; kt < t.KT; ++kt) {
    const int s = kt % kStages;
    ptx::mbar_wait(t.bar_full + 8 * s, uint32_t((kt / kStages) & 1));
    if (live) {
      ptx::fence_proxy_async();  // the activation rows (cp.async) -> the tensor cores' reads
      uint32_t af[4][4];
      decode_a<FRAG>(t, cw, warp, lane, kt, s, af);
      const uint32_t act = t.s_base + kActOff + s * kActStageBytes;
#pragma unroll
      for (int i = 0; i < NB / 2; ++i) ptx::fence_operand(acc[i]);
      ptx::wgmma_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j) ptx::wgmma_m64nNk16_rs_bf16<NB>(acc, af[j], ptx::sw128_desc(act + 32 * j));
      ptx::wgmma_commit();
      ptx::wgmma_wait<1>();  // step kt - 1 done: its stage is free
#pragma unroll
      for (int i = 0; i < NB / 2; ++i) ptx::fence_operand(acc[i]);
    }
    __syncwarp();
    if (kt > 0 && lane == 0) ptx::mbar_arrive(t.bar_empty + 8 * ((kt - 1) % kStages));
  }
  if (!live) return;
  ptx::wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < NB / 2; ++i) ptx::fence_operand(acc[i]);

  // Logical weight row (output column) of this thread's accumulator rows g (hf 0) and g + 8 (hf 1),
  // -1 past N.
  const int tile = tile0 + 4 * cw + warp;
  int n[2];
  float bias[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    if constexpr (FRAG) {
      n[hf] = tile < T ? frag::tile_row(tile, g + 8 * hf, a.swiglu_rows) : -1;
    } else {
      const int nn = t.n0 + 64 * cw + 16 * warp + g + 8 * hf;
      n[hf] = nn < t.N ? nn : -1;
    }
    bias[hf] = a.bias && n[hf] >= 0 ? a.bias[size_t(t.expert) * t.N + n[hf]] : 0.f;
  }
  const Epilogue& e = a.epi;
  if (FRAG && a.swiglu_rows && e.mode == Epilogue::kSwiGLU) {
    // Paired rows: gate of output column 8 tile + g in row g, its up in row g + 8.
    if (tile >= T) return;
    const int j = 8 * tile + g;
#pragma unroll
    for (int i = 0; i < NB / 8; ++i)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int row = t.row0 + 8 * i + 2 * tq + c;
        if (row >= t.row_end) continue;
        const float gate = acc[4 * i + c] + bias[0], up = acc[4 * i + 2 + c] + bias[1];
        static_cast<uint16_t*>(e.out)[size_t(row) * e.ldo + j] = to_half_bits(swiglu_dev(gate, up, e.swiglu_limit), e.out_f16);
      }
    return;
  }
#pragma unroll
  for (int i = 0; i < NB / 2; ++i) {
    const int hf = (i >> 1) & 1;
    const int row = t.row0 + 8 * (i >> 2) + 2 * tq + (i & 1);
    const float v = acc[i] + bias[hf];
    if (e.mode == Epilogue::kSwiGLU) {
      // Natural row order: gate row n (even g) and up row n + 1 (g + 1: four lanes on).
      const float up = __shfl_down_sync(0xffffffffu, v, 4);
      if ((g & 1) == 0 && n[hf] >= 0 && row < t.row_end) store_pair(e, a.r, row, n[hf], v, up, true);
    } else if (n[hf] >= 0 && row < t.row_end) {
      store_pair(e, a.r, row, n[hf], v, 0.f, false);
    }
  }
}
#endif

template <bool FRAG>
__global__ void __launch_bounds__(kThreads, 1) expert_gemm_v4_kernel(V4Args a) {
#ifdef SM90A_WGMMA
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  pdl_begin();
  // Role and tile values broadcast from lane 0: provably warp-uniform for ptxas, which otherwise
  // treats the wgmma path as divergent and serializes the MMAs.
  const int tid = threadIdx.x, lane = tid & 31, wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  int grp, within;
  find_row_tile<kBT>(a.r, int(blockIdx.y), lane, grp, within);
  if (grp < 0) return;  // the same for every warp of the CTA
  Tile t;
  t.expert = a.r.group_expert[grp];
  t.row0 = a.r.group_start[grp] + within * kBT;
  t.row_end = min(a.r.group_end[grp], t.row0 + kBT);
  t.nb = __shfl_sync(0xffffffffu, (t.row_end - t.row0 + 15) & ~15, 0);
  t.N = a.N, t.K = a.K, t.KT = a.K / kBK;
  t.n0 = int(blockIdx.x) * kBW;
  t.smem = align1024(smem_raw);
  t.s_base = ptx::smem_addr(t.smem);
  t.bar_full = t.s_base + kScaleOff + kBW * (a.K / 32);
  t.bar_empty = t.bar_full + 8 * kStages;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(t.bar_full + 8 * s, 128);            // the producer threads' cp.async arrivals
      ptx::mbar_init(t.bar_empty + 8 * s, 4 * kConsumers);  // one arrive a consumer warp
    }
    ptx::mbar_init_fence();
  }
  __syncthreads();
  if (wg == 0) {
    produce<FRAG>(a, t, tid);
    return;
  }
  const int cw = wg - 1, ct = tid & 127;
  switch (t.nb >> 4) {
    case 1: consume<FRAG, 16>(a, t, cw, ct); break;
    case 2: consume<FRAG, 32>(a, t, cw, ct); break;
    case 3: consume<FRAG, 48>(a, t, cw, ct); break;
    case 4: consume<FRAG, 64>(a, t, cw, ct); break;
    case 5: consume<FRAG, 80>(a, t, cw, ct); break;
    case 6: consume<FRAG, 96>(a, t, cw, ct); break;
    case 7: consume<FRAG, 112>(a, t, cw, ct); break;
    default: consume<FRAG, 128>(a, t, cw, ct); break;
  }
#else
  __trap();  // launched only where expert_gemm_v3_available() (sm_90a code on a 9.0 device)
#endif
}

}  // namespace

bool expert_gemm_v4_supports(const WeightMat& W, const void* A, int lda, int a_rows, const Epilogue& epi) {
  return expert_gemm_v3_available() && W.K <= kMaxK && expert_gemm_v2_supports(W, A, lda, a_rows, epi);
}

void expert_gemm_v4(const WeightMat& W, const bf16_t* A, int lda, int pairs, int E, bool gather_a, const MoeRouting& r,
                    const Epilogue& epi, cudaStream_t s) {
  if (pairs <= 0) return;
  if (W.fmt != WeightMat::kMXFP4 && W.fmt != WeightMat::kFragMXFP4)
    throw Error("expert_gemm_v4: MXFP4 weights only (checkpoint or fragment layout)");
  if (E > kMoeMaxGroups) throw Error("expert_gemm_v4: at most " + std::to_string(kMoeMaxGroups) + " experts");
  if (!expert_gemm_v3_available()) throw Error("expert_gemm_v4: needs sm_90a code and a compute capability 9.0 GPU");
  const bool frag = W.fmt == WeightMat::kFragMXFP4;
  auto kernel = frag ? expert_gemm_v4_kernel<true> : expert_gemm_v4_kernel<false>;
  static std::atomic<uint64_t> attr_set{0};
  opt_in_smem_once_per_device(attr_set, smem_bytes(kMaxK), expert_gemm_v4_kernel<true>, expert_gemm_v4_kernel<false>);
  V4Args a{static_cast<const uint8_t*>(W.w), W.scales, W.bias, W.N, W.K, A, lda, gather_a, r, epi, W.swiglu_rows};
  const int max_tiles = (pairs + kBT - 1) / kBT + std::min(pairs, E);
  if (max_tiles > 65535) throw Error("expert_gemm_v4: too many row tiles (" + std::to_string(max_tiles) + ")");
  const dim3 grid((W.N + kBW - 1) / kBW, max_tiles);
  launch_pdl(kernel, grid, dim3(kThreads), smem_bytes(W.K), s, a);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
