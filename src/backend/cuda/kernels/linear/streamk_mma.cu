// Stream-K decode kernel over fragment-layout weights (opt-in, GPTOSS_DECODE_KERNEL=streamk: it
// measured slower than skinny_mma.cu's block-per-tile kernel on the H200, see docs/BENCHMARKS.md): the same chunk math as skinny_mma.cu (one
// chunk = 16 weight rows x 64 K through mma.sync, tokens as the N side, 8 per pass), but the work
// is cut so that every warp of a full-GPU grid streams the same number of chunks.
//
// Why: at 1-8 tokens a decode linear layer is a weight stream (gate_up of 4 experts: 35 MB, one
// H200 streams it in ~8 us). Cutting work by tiles leaves SMs with unequal shares (qkv: 320 tiles
// over 132 SMs; down: 720 one-tile blocks, two waves) and each warp with a few chunks, so the
// kernels sat at ~2x the read floor, bound by latency. Here the launch's work is one list of
// chunk items, job-major (job = one 16-row tile of one expert for one pass of up to 8 tokens;
// C = K / 64 chunks a job), and warp w of nw takes items [w W / nw, (w + 1) W / nw) in order with
// PF items of weights and activations in flight. A job whose chunks one warp covers is finished
// by that warp; a job split between warps is finished by the last of them to arrive: each writes
// its partial tile (4 f32 a lane) to a per-warp slot, fences, and takes a ticket from the job's
// counter; the last sums all partials in warp order (a fixed order: the same bits every run) and
// applies the epilogue, then zeroes the counter for the next launch. No warp waits on another.
//
// Job order: groups (experts) in routing order, then tiles, then passes, so a group's second pass
// of 8 tokens re-reads the tile it just streamed (from L2). Dense layers are one group.
#include <cstdlib>
#include <mutex>
#include <string>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/frag_layout.cuh"
#include "backend/cuda/kernels/linear/skinny_chunk.cuh"

namespace gptoss::cuda {

namespace {

using namespace skinny;

constexpr int kSkWarps = 4;           // warps a block (independent workers; only the job table is shared)
constexpr int kSkMaxGroups = 256;     // routing groups (experts) a launch may have
constexpr int kSkMaxJobs = 1 << 17;   // job counters in the workspace
constexpr int kSkMaxWarpsPerSm = 64;  // partial slots: two a warp of a full grid
constexpr int kSkSlotFloats = 128;    // one partial: 4 f32 x 32 lanes

struct StreamKArgs {
  SkinnyArgs a;
  float* partial;  // [warps][2][kSkSlotFloats]
  int* counters;   // [kSkMaxJobs], zero between launches
};

// The launch's groups, in shared memory: group gi holds jobs [first_job[gi], first_job[gi + 1]),
// passes[gi] passes of up to 8 tokens over its T tiles.
struct JobTable {
  int ngroups;
  int first_job[kSkMaxGroups + 1];
  int passes[kSkMaxGroups];
  int start[kSkMaxGroups], end[kSkMaxGroups], expert[kSkMaxGroups];
};

struct Job {
  int tile, tok0, tok_end, expert;  // tokens [tok0, tok_end), at most 8
};

__device__ __forceinline__ Job decode_job(const JobTable& jt, int j, int T) {
  int lo = 0, hi = jt.ngroups - 1;  // the last group whose first job is <= j
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (jt.first_job[mid] <= j) lo = mid;
    else hi = mid - 1;
  }
  const int r = j - jt.first_job[lo], p = jt.passes[lo];
  const int t = r / p, pass = r - t * p;
  const int tok0 = jt.start[lo] + 8 * pass;
  return Job{t, tok0, min(jt.end[lo], tok0 + 8), jt.expert[lo]};
}

// Warp 0 fills the table: dense launches are one group of M tokens (no device reads, so this may
// run before pdl_wait); grouped ones read the routing.
__device__ void fill_job_table(const SkinnyArgs& a, int T, JobTable& jt) {
  const int lane = threadIdx.x & 31;
  const int ng = a.grouped ? a.r.counts[0] : 1;
  int carry = 0;
  for (int base = 0; base < ng; base += 32) {
    const int gi = base + lane;
    int s = 0, e = 0, x = 0;
    if (gi < ng) {
      if (a.grouped) {
        s = a.r.group_start[gi];
        e = a.r.group_end[gi];
        x = a.r.group_expert[gi];
      } else {
        e = a.M;
      }
    }
    const int p = (e - s + 7) / 8, jobs = p * T;
    int incl = jobs;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (gi < ng) {
      jt.first_job[gi] = carry + incl - jobs;
      jt.passes[gi] = p;
      jt.start[gi] = s;
      jt.end[gi] = e;
      jt.expert[gi] = x;
    }
    carry += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) {
    jt.first_job[ng] = carry;
    jt.ngroups = ng;
  }
}


// Warp w of nw covers items [lo(w), lo(w + 1)), lo(w) = floor(W w / nw); with nw <= W every warp
// has one at least, so the warps sharing a job are consecutive: the warp of item i is the largest
// w with lo(w) <= i.
__device__ __forceinline__ int warp_of_item(long long i, int nw, long long W) { return int(((i + 1) * nw - 1) / W); }

// The epilogue of job jb from its summed tile fin (rows g, g + 8; tokens 2 tq, 2 tq + 1).
template <int FMT>
__device__ __forceinline__ void job_epilogue(const SkinnyArgs& a, const Job& jb, const float (&fin)[4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  tile_store(a, tile_rows<FMT>(a, jb.expert, jb.tile, g), jb.tile, g, tq, jb.tok0, jb.tok_end, fin);
}

// A split job's last warp to arrive (its ticket says so) sums every warp's partial in warp order
// (four loads in flight at a time) and applies the epilogue.
template <int FMT>
__device__ __forceinline__ void finish_split_job(const StreamKArgs& s, const JobTable& jt, int j, int ticket, int nw,
                                                 long long W) {
  const SkinnyArgs& a = s.a;
  const int lane = threadIdx.x & 31, tq = lane & 3;
  const int C = a.W.K / 64, T = a.W.N / 16;
  const long long first = (long long)j * C;
  const int wf = warp_of_item(first, nw, W), wl = warp_of_item(first + C - 1, nw, W);
  if (ticket != wl - wf) return;
  const Job jb = decode_job(jt, j, T);
  float fin[4] = {0.f, 0.f, 0.f, 0.f};
  if (2 * tq < jb.tok_end - jb.tok0) {
    for (int w0 = wf; w0 <= wl; w0 += 4) {
      float part[4][4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int ww = w0 + q;
        if (ww <= wl) {
          const float* p = s.partial + (size_t(ww) * 2 + (ww == wf ? 1 : 0)) * kSkSlotFloats;
#pragma unroll
          for (int v = 0; v < 4; ++v) part[q][v] = __ldcg(p + v * 32 + lane);
        }
      }
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (w0 + q <= wl)
#pragma unroll
          for (int v = 0; v < 4; ++v) fin[v] += part[q][v];
    }
  }
  if (lane == 0) s.counters[j] = 0;
  job_epilogue<FMT>(a, jb, fin);
}

// PF: chunks of weights in flight per warp (a register ring); the activations of the next chunk
// are loaded one step ahead (two buffers; they mostly hit L1). MINI: fewest items a warp (fewer
// warps, and fewer partials a job, on small launches).
template <int FMT, int PF, bool XF16, int MINB, int MINI>
__global__ void __launch_bounds__(kSkWarps * 32, MINB) streamk_mma_kernel(const __grid_constant__ StreamKArgs s) {
  static_assert(PF % 2 == 0, "the activation buffers alternate with the ring's steps");
  const SkinnyArgs& a = s.a;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int C = a.W.K / 64, T = a.W.N / 16;
  __shared__ JobTable jt;

  if (a.grouped) {
    pdl_wait();
    if (warp == 0) fill_job_table(a, T, jt);
  } else if (warp == 0) {
    fill_job_table(a, T, jt);
  }
  __syncthreads();

  const int total_jobs = jt.first_job[jt.ngroups];
  const long long W = (long long)total_jobs * C;
  const int nw = int(min((long long)gridDim.x * kSkWarps, max(W / MINI, 1LL))), w = blockIdx.x * kSkWarps + warp;
  if (w >= nw || W == 0) {
    if (!a.grouped) pdl_wait();
    pdl_trigger();
    return;
  }
  const int lo = int(W * w / nw), hi = int(W * (w + 1) / nw);
  const char* A = static_cast<const char*>(a.A);

  // Loader: the next item to load (job lj, chunk lc), its weight base and this lane's activation
  // row offset in bytes (~0u: no token for this lane).
  int lj = lo / C, lc = lo - lj * C;
  size_t lw = 0;
  uint32_t lrow = ~0u;
  auto enter = [&](bool rows) {
    const Job jb = decode_job(jt, lj, T);
    lw = (size_t(jb.expert) * T + jb.tile) * C;
    lrow = ~0u;
    const int p = jb.tok0 + g;
    if (rows && p < jb.tok_end) lrow = uint32_t(size_t(a.gather_a ? a.r.pair_token[p] : p) * a.lda * 2 + 16 * tq);
  };
  auto advance = [&](bool rows) {
    if (++lc == C) {
      lc = 0;
      ++lj;
      if (lj < total_jobs) enter(rows);
    }
  };
  WChunk<FMT> wb[PF];
  uint32_t xoff[PF];  // the item's activation offset (row + chunk), ~0u: none
  uint4 xb[2][1][2];
  // (nvcc sees xoff[u] read before every entry is set; a live warp always has item 0, lo < hi,
  // and reads entry u only for an item it loaded.)
#pragma nv_diag_suppress 549
  auto load_x = [&](int u, int b) {
    if (xoff[u] != ~0u) {
      const uint4* p = reinterpret_cast<const uint4*>(A + xoff[u]);
      xb[b][0][0] = __ldg(p);
      xb[b][0][1] = __ldg(p + 4);
    } else {
      xb[b][0][0] = xb[b][0][1] = make_uint4(0, 0, 0, 0);
    }
  };
#pragma nv_diag_default 549
  auto x_of = [&]() { return lrow == ~0u ? ~0u : lrow + uint32_t(lc) * 128u; };

  if (!a.grouped) {
    enter(false);
    // Dense: the weights depend on no earlier kernel, so the first PF chunks load before the wait;
    // the activation offsets follow once the rows may be read (after it, for gathers).
#pragma unroll
    for (int u = 0; u < PF; ++u)
      if (lo + u < hi) {
        load_w<FMT, true>(a, lw + lc, lane, wb[u]);
        advance(false);
      }
    pdl_wait();
    pdl_trigger();
    lj = lo / C;
    lc = lo - lj * C;
    enter(true);
#pragma unroll
    for (int u = 0; u < PF; ++u)
      if (lo + u < hi) {
        xoff[u] = x_of();
        advance(true);
      }
  } else {
    pdl_trigger();
    enter(true);
#pragma unroll
    for (int u = 0; u < PF; ++u)
      if (lo + u < hi) {
        load_w<FMT, true>(a, lw + lc, lane, wb[u]);
        xoff[u] = x_of();
        advance(true);
      }
  }
  load_x(0, 0);

  // Consumer: job cj, its next chunk cc, the first chunk c0 of this warp's segment of it. A
  // segment that is a whole job ends with its epilogue at once; the (at most two) split segments,
  // the warp's first and last, are published together after the loop, so the fence their partials
  // need waits on no weights in flight.
  int cj = lo / C, cc = lo - cj * C, c0 = cc;
  float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  float head[4] = {0.f, 0.f, 0.f, 0.f}, tail[4] = {0.f, 0.f, 0.f, 0.f};  // slot 0 and slot 1 partials
  int head_j = -1, tail_j = -1;
  for (int base = lo; base < hi; base += PF) {
#pragma unroll
    for (int u = 0; u < PF; ++u) {
      const int i = base + u;
      if (i < hi) {
        if (i + 1 < hi) load_x((u + 1) % PF, (u + 1) & 1);
        chunk_mma<FMT, 1, XF16>(wb[u], xb[u & 1], acc);
        if (i + PF < hi) {
          load_w<FMT, true>(a, lw + lc, lane, wb[u]);
          xoff[u] = x_of();
          advance(true);
        }
        if (++cc == C || i + 1 == hi) {
          if (c0 == 0 && cc == C) {
            const float fin[4] = {acc[0][0], acc[0][1], acc[0][2], acc[0][3]};
            job_epilogue<FMT>(a, decode_job(jt, cj, T), fin);
          } else if (c0 > 0) {
            head_j = cj;
#pragma unroll
            for (int v = 0; v < 4; ++v) head[v] = acc[0][v];
          } else {
            tail_j = cj;
#pragma unroll
            for (int v = 0; v < 4; ++v) tail[v] = acc[0][v];
          }
          acc[0][0] = acc[0][1] = acc[0][2] = acc[0][3] = 0.f;
          ++cj;
          cc = c0 = 0;
        }
      }
    }
  }
  if (head_j < 0 && tail_j < 0) return;
  // Publish: partials out (only the lanes that hold token columns), one fence, the tickets.
  auto live = [&](int j) { const Job jb = decode_job(jt, j, T); return 2 * tq < jb.tok_end - jb.tok0; };
  if (head_j >= 0 && live(head_j)) {
    float* p = s.partial + (size_t(w) * 2 + 0) * kSkSlotFloats;
#pragma unroll
    for (int v = 0; v < 4; ++v) __stcg(p + v * 32 + lane, head[v]);
  }
  if (tail_j >= 0 && live(tail_j)) {
    float* p = s.partial + (size_t(w) * 2 + 1) * kSkSlotFloats;
#pragma unroll
    for (int v = 0; v < 4; ++v) __stcg(p + v * 32 + lane, tail[v]);
  }
  __threadfence();
  __syncwarp();
  int th = 0, tt = 0;
  if (lane == 0) {
    if (head_j >= 0) th = atomicAdd(s.counters + head_j, 1);
    if (tail_j >= 0) tt = atomicAdd(s.counters + tail_j, 1);
  }
  th = __shfl_sync(0xffffffffu, th, 0);
  tt = __shfl_sync(0xffffffffu, tt, 0);
  __threadfence();
  if (head_j >= 0) finish_split_job<FMT>(s, jt, head_j, th, nw, W);
  if (tail_j >= 0) finish_split_job<FMT>(s, jt, tail_j, tt, nw, W);
}

// The workspace of one device: partial slots for a full grid's warps and the job counters (zeroed
// once; every finisher re-zeroes its counter). Allocated on first use outside a graph capture
// (streamk_prepare, called by the backend at start-up).
struct Workspace {
  float* partial = nullptr;
  int* counters = nullptr;
  int max_warps = 0;
};
constexpr int kMaxDevices = 64;
Workspace g_ws[kMaxDevices];
std::mutex g_ws_mutex;
int g_decode_kernel = -1;  // -1: not read yet; 0 stream-K, 1 block-per-tile skinny (the default)

const Workspace& workspace(cudaStream_t s) {
  int dev = 0;
  GPTOSS_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) throw Error("stream-K: device index out of range");
  std::lock_guard<std::mutex> lock(g_ws_mutex);
  Workspace& ws = g_ws[dev];
  if (!ws.partial) {
    if (s) {
      cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
      GPTOSS_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
      if (st != cudaStreamCaptureStatusNone)
        throw Error("stream-K: workspace not prepared before a graph capture (call streamk_prepare)");
    }
    ws.max_warps = sm_count() * kSkMaxWarpsPerSm;
    GPTOSS_CUDA_CHECK(cudaMalloc(&ws.partial, size_t(ws.max_warps) * 2 * kSkSlotFloats * sizeof(float)));
    GPTOSS_CUDA_CHECK(cudaMalloc(&ws.counters, size_t(kSkMaxJobs) * sizeof(int)));
    GPTOSS_CUDA_CHECK(cudaMemset(ws.counters, 0, size_t(kSkMaxJobs) * sizeof(int)));
    GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
  }
  return ws;
}

template <int FMT, int PF, bool XF16, int MINB, int MINI = 2>
void launch_streamk(const StreamKArgs& sa, int max_warps, cudaStream_t s) {
  auto k = streamk_mma_kernel<FMT, PF, XF16, MINB, MINI>;
  static int per_sm = [&] {
    int b = 0;
    GPTOSS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, k, kSkWarps * 32, 0));
    return b > 0 ? b : 1;
  }();
  const int blocks = std::min(sm_count() * per_sm, max_warps / kSkWarps);
  launch_pdl(k, dim3(blocks), dim3(kSkWarps * 32), 0, s, sa);
}

int g_streamk_variant = 0;  // bench-kernels: other (chunks in flight, blocks an SM) shapes

// Chunks in flight per warp (a ring slot holds a chunk's weights and its activation offset: MXFP4
// 5 + 1 registers, fp8 8 + 1, bf16 16 + 1) and the blocks an SM the registers are sized for.
template <int FMT, bool XF16>
void launch_fmt(const StreamKArgs& sa, int max_warps, cudaStream_t s) {
  const int v = g_streamk_variant;
  if constexpr (FMT == WeightMat::kFragMXFP4) {
    if (v == 1) return launch_streamk<FMT, 12, XF16, 4>(sa, max_warps, s);
    if (v == 2) return launch_streamk<FMT, 16, XF16, 3>(sa, max_warps, s);
    if (v == 3) return launch_streamk<FMT, 6, XF16, 6>(sa, max_warps, s);
    return launch_streamk<FMT, 10, XF16, 4>(sa, max_warps, s);
  } else if constexpr (FMT == WeightMat::kFragFP8) {
    if (v == 1) return launch_streamk<FMT, 8, XF16, 4>(sa, max_warps, s);
    if (v == 2) return launch_streamk<FMT, 10, XF16, 3>(sa, max_warps, s);
    if (v == 3) return launch_streamk<FMT, 4, XF16, 6>(sa, max_warps, s);
    return launch_streamk<FMT, 6, XF16, 4>(sa, max_warps, s);
  } else {
    if (v == 1) return launch_streamk<FMT, 6, XF16, 3>(sa, max_warps, s);
    if (v == 2) return launch_streamk<FMT, 2, XF16, 6>(sa, max_warps, s);
    if (v == 3) return launch_streamk<FMT, 4, XF16, 4, 8>(sa, max_warps, s);
    return launch_streamk<FMT, 4, XF16, 4>(sa, max_warps, s);
  }
}

}  // namespace

int decode_kernel_choice() {
  if (g_decode_kernel < 0) {
    const char* e = std::getenv("GPTOSS_DECODE_KERNEL");
    // Stream-K is opt-in: on the H200 it measured slower than the skinny kernel (docs/BENCHMARKS.md,
    // sixth session), e.g. 120b gate_up at 1 token 30.6 against 21.3 us.
    g_decode_kernel = e && std::string(e) == "streamk" ? 0 : 1;
  }
  return g_decode_kernel;
}
void set_decode_kernel_choice(int v) { g_decode_kernel = v; }
void set_streamk_variant(int v) { g_streamk_variant = v; }
const char* streamk_variant_name(WeightMat::Format fmt, int v) {
  static const char* mx[] = {"pf10 4 blocks/SM (default)", "pf12 4 blocks/SM", "pf16 3 blocks/SM", "pf6 6 blocks/SM"};
  static const char* f8[] = {"pf6 4 blocks/SM (default)", "pf8 4 blocks/SM", "pf10 3 blocks/SM", "pf4 6 blocks/SM"};
  static const char* bf[] = {"pf4 4 blocks/SM (default)", "pf6 3 blocks/SM", "pf2 6 blocks/SM", "pf4 4 blocks/SM >=8 items a warp"};
  if (v < 0 || v >= kStreamKVariants) return "?";
  return fmt == WeightMat::kFragMXFP4 ? mx[v] : fmt == WeightMat::kFragFP8 ? f8[v] : bf[v];
}

void streamk_prepare() { workspace(nullptr); }

bool streamk_takes(WeightMat::Format fmt, int N, int K, int pairs, int E, bool grouped, int M) {
  if (fmt != WeightMat::kFragBF16 && fmt != WeightMat::kFragFP8 && fmt != WeightMat::kFragMXFP4) return false;
  if (N % 16 != 0 || K % 64 != 0 || K <= 0) return false;
  const int T = N / 16;
  long long jobs;
  if (grouped) {
    const int groups = moe_max_groups(pairs, E);
    if (groups > kSkMaxGroups) return false;
    jobs = (long long)(groups + (pairs + 7) / 8) * T;
  } else {
    jobs = (long long)((M + 7) / 8) * T;
  }
  return jobs <= kSkMaxJobs && jobs * (K / 64) < (1LL << 31) / 4;
}

void streamk_linear(const WeightMat& W, const void* A, bool a_f16, int lda, int M, int pairs, int E, bool grouped,
                    bool gather_a, const MoeRouting& r, const Epilogue& epi, cudaStream_t s) {
  if (!streamk_takes(W.fmt, W.N, W.K, pairs, E, grouped, M)) throw Error("streamk_linear: problem not supported (streamk_takes)");
  if (epi.mode == Epilogue::kScatterAdd) throw Error("streamk_linear: scatter-add is done by moe_combine");
  if (epi.mode == Epilogue::kSwiGLU && !W.swiglu_rows) throw Error("streamk_linear: SwiGLU needs paired rows");
  if (a_f16 && W.fmt == WeightMat::kFragBF16) throw Error("streamk_linear: bf16 weights need bf16 activations");
  const Workspace& ws = workspace(s);
  StreamKArgs sa{SkinnyArgs{W, A, lda, M, grouped, gather_a, r, epi}, ws.partial, ws.counters};
  switch (W.fmt) {
    case WeightMat::kFragMXFP4:
      if (a_f16) launch_fmt<WeightMat::kFragMXFP4, true>(sa, ws.max_warps, s);
      else launch_fmt<WeightMat::kFragMXFP4, false>(sa, ws.max_warps, s);
      break;
    case WeightMat::kFragFP8:
      if (a_f16) launch_fmt<WeightMat::kFragFP8, true>(sa, ws.max_warps, s);
      else launch_fmt<WeightMat::kFragFP8, false>(sa, ws.max_warps, s);
      break;
    case WeightMat::kFragBF16: launch_fmt<WeightMat::kFragBF16, false>(sa, ws.max_warps, s); break;
    default: throw Error("streamk_linear: not a fragment format");
  }
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
