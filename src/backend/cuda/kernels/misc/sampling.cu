// Token sampling on the device: the RowSampling rule of backend.h, one block per logit row.
// Thresholds (top-k, top-p) are found by bisection on the float bit patterns of the
// probabilities, so no sort of the 201088-entry row is needed; the draw walks the kept
// probabilities in id order, as sample_row() does on the host.
#include "backend/backend.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace gptoss::cuda {

namespace {

constexpr int kThreads = 1024;

// Sum / max of one value per thread over the block; every thread gets the result.
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int w = threadIdx.x / 32, lane = threadIdx.x & 31;
  __syncthreads();  // red may still be read by the previous reduction
  if (lane == 0) red[w] = v;
  __syncthreads();
  float t = lane < kThreads / 32 ? red[lane] : 0.0f;
  return warp_sum(t);
}
__device__ double block_sum_d(double v, double* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int w = threadIdx.x / 32, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  double t = lane < kThreads / 32 ? red[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}
__device__ float block_max(float v, float* red) {
  v = warp_max(v);
  const int w = threadIdx.x / 32, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float t = lane < kThreads / 32 ? red[lane] : -INFINITY;
  return warp_max(t);
}

// lp_out (optional): the drawn token's logprob under the row's logits, logit - (max + log sum
// exp(logit - max)) with the sum in double over the numbers (NaNs left out), as the host's
// row_logsumexp, clamped at -9999 (NaN -> -9999). A sampled row's logits are overwritten by
// their weights, so its token's logit is taken back from its weight (max + T log p: float
// rounding of exp and log, ~1e-6 absolute).
__device__ __forceinline__ float clamp_lp(double v) { return isnan(v) ? -9999.0f : float(fmax(v, -9999.0)); }

// The raw logit of `id` in a row whose logits were changed by the n entries `a` (distinct ids in
// increasing order; raw[k] saved entry k's): the saved one, or `unchanged` when id has no entry.
__device__ double raw_logit(int32_t id, const LogitAdd* a, const float* raw, int n, double unchanged) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (a[mid].token < id) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && a[lo].token == id ? double(raw[lo]) : unchanged;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(float* __restrict__ logits, int V,
                                                          const RowSampling* __restrict__ how,
                                                          int32_t* __restrict__ out, float* __restrict__ lp_out,
                                                          const LogitAdd* __restrict__ adds, float* __restrict__ add_raw,
                                                          const uint64_t* __restrict__ allowed) {
  __shared__ float red[32];
  __shared__ double redd[32];
  __shared__ double prefix[kThreads];
  __shared__ double total;
  __shared__ int32_t chosen;
  float* p = logits + size_t(blockIdx.x) * V;
  const RowSampling s = how[blockIdx.x];
  const int tid = threadIdx.x;
  if (s.keep_logits) {  // the host draws this row from its logits, which stay as they are
    if (tid == 0) {
      out[blockIdx.x] = -1;
      if (lp_out) lp_out[blockIdx.x] = 0.0f;
    }
    return;
  }

  // A structured-output mask (s.allowed_row): the refused logits -inf, in place, as the host's
  // mask_row does; the row so masked is the one the logprob is of.
  if (s.allowed_row >= 0 && allowed) {
    const uint64_t* w = allowed + size_t(s.allowed_row) * ((size_t(V) + 63) / 64);
    for (int i = tid; i < V; i += kThreads)
      if (!((w[i >> 6] >> (i & 63)) & 1)) p[i] = -INFINITY;
    __syncthreads();
  }

  // logit_bias and penalties (s.adds_count entries): added in place before the rule, as the host's
  // sample_row_adjusted does. The logprob is the raw row's: its max (mx0) and sum (se0) come first,
  // and each changed logit's raw value is saved (add_raw) for the drawn token's.
  const bool adjusted = s.adds_count > 0 && adds;
  const LogitAdd* a = adjusted ? adds + s.adds_begin : nullptr;
  float* raw = adjusted ? add_raw + s.adds_begin : nullptr;
  float mx0 = 0.0f;
  double se0 = 0.0;
  if (adjusted) {
    if (lp_out) {
      float m = -INFINITY;
      for (int i = tid; i < V; i += kThreads) m = fmaxf(m, p[i]);  // fmaxf leaves NaNs out
      mx0 = block_max(m, red);
      double e = 0;
      for (int i = tid; i < V; i += kThreads) {
        const float v = p[i];
        if (!isnan(v)) e += exp(double(v) - double(mx0));
      }
      se0 = block_sum_d(e, redd);  // its barriers also end every read of the raw row
    }
    for (int k = tid; k < s.adds_count; k += kThreads) {
      const int32_t t = a[k].token;
      const float v = p[t];
      raw[k] = v;
      p[t] = v + a[k].delta;
    }
    __syncthreads();
  }

  // Greedy, and the maximum for the softmax: (value, lowest id) per thread, then the block.
  float best = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = tid; i < V; i += kThreads) {
    float v = p[i];
    if (v > best) { best = v; bi = i; }
  }
  const float mx = block_max(best, red);
  if (s.temperature < 1e-5f || !isfinite(mx)) {
    if (best != mx) bi = 0x7fffffff;
    // lowest id holding the maximum
    float fbi = float(bi);  // ids < 2^24 are exact in float
    float lowest = -block_max(-fbi, red);
    const int32_t id = lowest >= float(V) ? 0 : int32_t(lowest);
    if (lp_out && adjusted) {
      if (tid == 0) lp_out[blockIdx.x] = clamp_lp(raw_logit(id, a, raw, s.adds_count, double(p[id])) - (double(mx0) + log(se0)));
    } else if (lp_out) {
      double se = 0;
      for (int i = tid; i < V; i += kThreads) {
        const float v = p[i];
        if (!isnan(v)) se += exp(double(v) - double(mx));
      }
      se = block_sum_d(se, redd);
      if (tid == 0) lp_out[blockIdx.x] = clamp_lp(double(p[id]) - (double(mx) + log(se)));
    }
    if (tid == 0) out[blockIdx.x] = id;
    return;
  }
  const float inv_t = 1.0f / s.temperature;
  double se = 0;  // lp_out: sum exp(logit - max) at temperature 1
  for (int i = tid; i < V; i += kThreads) {
    float v = p[i];
    if (lp_out && !adjusted && !isnan(v)) se += exp(double(v) - double(mx));
    p[i] = isnan(v) ? 0.0f : expf((v - mx) * inv_t);  // accurate exp: the host rule uses std::exp
  }
  if (lp_out && !adjusted) se = block_sum_d(se, redd);
  __syncthreads();

  auto count = [&](float t) {
    float c = 0;
    for (int i = tid; i < V; i += kThreads) c += p[i] >= t ? 1.0f : 0.0f;
    return block_sum(c, red);
  };
  // Masses in double, as on the host: float sums over 201088 terms drift by more than a
  // token's share.
  auto mass = [&](float t) {
    double m = 0;
    for (int i = tid; i < V; i += kThreads)
      if (p[i] >= t) m += p[i];
    return block_sum_d(m, redd);
  };
  // Largest t in [lo, 1] with keep(t): bisection on bit patterns (non-negative floats order as
  // their bits), about 30 block-wide passes.
  auto largest = [&](float lo, auto keep) {
    uint32_t a = __float_as_uint(lo), b = __float_as_uint(1.0f) + 1;
    while (b - a > 1) {
      uint32_t mid = a + (b - a) / 2;
      if (keep(__uint_as_float(mid))) a = mid;
      else b = mid;
    }
    return __uint_as_float(a);
  };
  float thr = fmaxf(s.min_p, __uint_as_float(1u));  // p = 0 is never kept
  if (s.top_k > 0 && count(thr) > float(s.top_k))
    thr = largest(thr, [&](float t) { return count(t) >= float(s.top_k); });
  if (s.top_p < 1.0f) {
    const double limit = double(s.top_p) * mass(thr);
    thr = largest(thr, [&](float t) { return mass(t) >= limit; });
  }

  // Draw in id order: each thread owns a contiguous range; an exclusive scan of the ranges'
  // kept mass finds the range holding the target.
  const int chunk = (V + kThreads - 1) / kThreads;
  const int lo = min(V, tid * chunk), hi = min(V, lo + chunk);
  double local = 0;
  int last_kept = -1;
  for (int i = lo; i < hi; ++i)
    if (p[i] >= thr) { local += p[i]; last_kept = i; }
  prefix[tid] = local;
  float last = block_max(float(last_kept), red);  // the fallback: the highest kept id
  __syncthreads();
  if (tid == 0) {
    double acc = 0;
    for (int i = 0; i < kThreads; ++i) {
      double v = prefix[i];
      prefix[i] = acc;
      acc += v;
    }
    total = acc;
    chosen = last < 0 ? 0 : int32_t(last);
  }
  __syncthreads();
  const double target = double(s.u) * total;
  const double start = prefix[tid];
  if (local > 0 && start <= target && target < start + local) {
    double acc = start;
    int pick = last_kept;
    for (int i = lo; i < hi; ++i)
      if (p[i] >= thr) {
        acc += p[i];
        if (acc > target) { pick = i; break; }
      }
    chosen = pick;  // one range holds the target (ranges are disjoint in [start, start + local))
  }
  __syncthreads();
  if (tid == 0) {
    out[blockIdx.x] = chosen;
    if (lp_out && adjusted) {
      // An unchanged token's logit is max + T log p (float rounding of exp and log, as below).
      const double logit = double(logf(p[chosen])) * double(s.temperature) + double(mx);
      lp_out[blockIdx.x] =
          clamp_lp(raw_logit(chosen, a, raw, s.adds_count, logit) - (double(mx0) + log(se0)));
    } else if (lp_out) {
      lp_out[blockIdx.x] = clamp_lp(double(logf(p[chosen])) * double(s.temperature) - log(se));
    }
  }
}

}  // namespace

void sample_rows(float* logits, int n, int V, const RowSampling* how, int32_t* out, cudaStream_t s, float* lp_out,
                 const LogitAdd* adds, float* add_raw, const uint64_t* allowed) {
  if (n <= 0) return;
  if ((adds == nullptr) != (add_raw == nullptr)) throw Error("sample_rows: logit adds need add_raw beside them");
  sample_kernel<<<n, kThreads, 0, s>>>(logits, V, how, out, lp_out, adds, add_raw, allowed);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
