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

// Float order as unsigned order (NaN as -inf, the host's order for top lists).
__device__ __forceinline__ uint32_t order_key(float v) {
  if (isnan(v)) v = -INFINITY;
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The n (1..kMaxTopLogprobs, <= V) best ids of row p, ties to the lower id, with their logprobs
// logit - lse (the host's row_top_logprobs): the n-th best key by a radix select (four passes of
// 8-bit digits, a 256-bin histogram each), then the keys above it (fewer than n) and the lowest
// ids of its ties, in id order through each thread's contiguous range. Every thread calls it.
__device__ void top_logprobs_of_row(const float* p, int V, int n, double lse, TopLogprobs* out, int* hist,
                                    int* counts, int* cand, int* n_cand, int* sel) {
  const int tid = threadIdx.x;
  uint32_t prefix = 0, mask = 0;
  int want = n;  // of the best n, those with the prefix so far still to place
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kThreads) hist[i] = 0;
    __syncthreads();
    for (int i = tid; i < V; i += kThreads) {
      const uint32_t k = order_key(p[i]);
      if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255], 1);
    }
    __syncthreads();
    if (tid == 0) {
      int above = 0, d = 255;
      for (; d > 0 && above + hist[d] < want; --d) above += hist[d];
      sel[0] = d;
      sel[1] = want - above;
    }
    __syncthreads();
    prefix |= uint32_t(sel[0]) << shift;
    mask |= 255u << shift;
    want = sel[1];
    __syncthreads();  // sel is read by every thread before thread 0 writes it again
  }
  // prefix is the n-th best key: n - want keys above it, and `want` of its ties to take.
  if (tid == 0) *n_cand = 0;
  __syncthreads();
  for (int i = tid; i < V; i += kThreads)
    if (order_key(p[i]) > prefix) cand[atomicAdd(n_cand, 1)] = i;
  const int chunk = (V + kThreads - 1) / kThreads;
  const int lo = min(V, tid * chunk), hi = min(V, lo + chunk);
  int ties = 0;
  for (int i = lo; i < hi; ++i) ties += order_key(p[i]) == prefix;
  counts[tid] = ties;
  __syncthreads();
  if (tid == 0) {
    int acc = 0;
    for (int t = 0; t < kThreads; ++t) {
      const int c = counts[t];
      counts[t] = acc;
      acc += c;
    }
  }
  __syncthreads();
  for (int i = lo, at = counts[tid]; i < hi && at < want; ++i)
    if (order_key(p[i]) == prefix) cand[n - want + at++] = i;
  __syncthreads();
  if (tid == 0) {
    for (int i = 1; i < n; ++i) {  // best first, ties to the lower id
      const int c = cand[i];
      const uint32_t kc = order_key(p[c]);
      int j = i - 1;
      for (; j >= 0 && (order_key(p[cand[j]]) < kc || (order_key(p[cand[j]]) == kc && cand[j] > c)); --j)
        cand[j + 1] = cand[j];
      cand[j + 1] = c;
    }
    for (int k = 0; k < n; ++k) {
      out->ids[k] = cand[k];
      out->logprobs[k] = clamp_lp(double(p[cand[k]]) - lse);
    }
  }
  __syncthreads();
}

// kChanges: the launch holds rows with masks, logit changes or top lists. Without them the
// kernel is the plain rule's (32 registers a thread against 64: two blocks an SM, not one).
template <bool kChanges>
__global__ void __launch_bounds__(kThreads) sample_kernel(float* __restrict__ logits, int V,
                                                          const RowSampling* __restrict__ how,
                                                          int32_t* __restrict__ out, float* __restrict__ lp_out,
                                                          const LogitAdd* __restrict__ adds, float* __restrict__ add_raw,
                                                          const uint64_t* __restrict__ allowed,
                                                          TopLogprobs* __restrict__ top_out) {
  __shared__ float red[32];
  __shared__ int top_hist[256], top_counts[kThreads], top_cand[kMaxTopLogprobs], top_misc[3];
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
  // apply_mask does; the row so masked is the one the logprob is of.
  if (kChanges && s.allowed_row >= 0 && allowed) {
    const uint64_t* w = allowed + size_t(s.allowed_row) * ((size_t(V) + 63) / 64);
    for (int i = tid; i < V; i += kThreads)
      if (!((w[i >> 6] >> (i & 63)) & 1)) p[i] = -INFINITY;
    __syncthreads();
  }

  // logit_bias and penalties (s.adds_count entries): added in place before the rule, as the host's
  // sample_row_adjusted does. The logprobs are the row's before them: its max (mx0) and sum (se0)
  // come first (raw_lse; also for a top list, which is found then), and each changed logit's
  // value is saved (add_raw) for the drawn token's.
  const bool adjusted = kChanges && s.adds_count > 0 && adds;
  const LogitAdd* a = adjusted ? adds + s.adds_begin : nullptr;
  float* raw = adjusted ? add_raw + s.adds_begin : nullptr;
  const int top_n = kChanges && lp_out && top_out ? min(min(s.top_logprobs, kMaxTopLogprobs), V) : 0;
  const bool raw_lse = lp_out && (adjusted || top_n > 0);
  const int n_adds = adjusted ? s.adds_count : 0;
  float mx0 = 0.0f;
  double se0 = 0.0;
  if (raw_lse) {
    float m = -INFINITY;
    for (int i = tid; i < V; i += kThreads) m = fmaxf(m, p[i]);  // fmaxf leaves NaNs out
    mx0 = block_max<kThreads>(m, red);
    double e = 0;
    for (int i = tid; i < V; i += kThreads) {
      const float v = p[i];
      if (!isnan(v)) e += exp(double(v) - double(mx0));
    }
    se0 = block_sum_d<kThreads>(e, redd);  // its barriers also end every read of the row
    if (top_n > 0)
      top_logprobs_of_row(p, V, top_n, double(mx0) + log(se0), top_out + blockIdx.x, top_hist, top_counts, top_cand,
                          &top_misc[0], &top_misc[1]);
  }
  if (adjusted) {
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
  const float mx = block_max<kThreads>(best, red);
  if (s.temperature < 1e-5f || !isfinite(mx)) {
    if (best != mx) bi = 0x7fffffff;
    // lowest id holding the maximum
    float fbi = float(bi);  // ids < 2^24 are exact in float
    float lowest = -block_max<kThreads>(-fbi, red);
    const int32_t id = lowest >= float(V) ? 0 : int32_t(lowest);
    if (raw_lse) {
      if (tid == 0) lp_out[blockIdx.x] = clamp_lp(raw_logit(id, a, raw, n_adds, double(p[id])) - (double(mx0) + log(se0)));
    } else if (lp_out) {
      double se = 0;
      for (int i = tid; i < V; i += kThreads) {
        const float v = p[i];
        if (!isnan(v)) se += exp(double(v) - double(mx));
      }
      se = block_sum_d<kThreads>(se, redd);
      if (tid == 0) lp_out[blockIdx.x] = clamp_lp(double(p[id]) - (double(mx) + log(se)));
    }
    if (tid == 0) out[blockIdx.x] = id;
    return;
  }
  const float inv_t = 1.0f / s.temperature;
  double se = 0;  // lp_out: sum exp(logit - max) at temperature 1
  for (int i = tid; i < V; i += kThreads) {
    float v = p[i];
    if (lp_out && !raw_lse && !isnan(v)) se += exp(double(v) - double(mx));
    p[i] = isnan(v) ? 0.0f : expf((v - mx) * inv_t);  // accurate exp: the host rule uses std::exp
  }
  if (lp_out && !raw_lse) se = block_sum_d<kThreads>(se, redd);
  __syncthreads();

  auto count = [&](float t) {
    float c = 0;
    for (int i = tid; i < V; i += kThreads) c += p[i] >= t ? 1.0f : 0.0f;
    return block_sum<kThreads>(c, red);
  };
  // Masses in double, as on the host: float sums over 201088 terms drift by more than a
  // token's share.
  auto mass = [&](float t) {
    double m = 0;
    for (int i = tid; i < V; i += kThreads)
      if (p[i] >= t) m += p[i];
    return block_sum_d<kThreads>(m, redd);
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
  float last = block_max<kThreads>(float(last_kept), red);  // the fallback: the highest kept id
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
    if (raw_lse) {
      // An unchanged token's logit is max + T log p (float rounding of exp and log, as below).
      const double logit = double(logf(p[chosen])) * double(s.temperature) + double(mx);
      lp_out[blockIdx.x] = clamp_lp(raw_logit(chosen, a, raw, n_adds, logit) - (double(mx0) + log(se0)));
    } else if (lp_out) {
      lp_out[blockIdx.x] = clamp_lp(double(logf(p[chosen])) * double(s.temperature) - log(se));
    }
  }
}

}  // namespace

void sample_rows(float* logits, int n, int V, const RowSampling* how, int32_t* out, cudaStream_t s, float* lp_out,
                 const LogitAdd* adds, float* add_raw, const uint64_t* allowed, TopLogprobs* top_out) {
  if (n <= 0) return;
  if ((adds == nullptr) != (add_raw == nullptr)) throw Error("sample_rows: logit adds need add_raw beside them");
  if (top_out && !lp_out) throw Error("sample_rows: top logprobs come with lp_out");
  if (adds || allowed || top_out)
    sample_kernel<true><<<n, kThreads, 0, s>>>(logits, V, how, out, lp_out, adds, add_raw, allowed, top_out);
  else
    sample_kernel<false><<<n, kThreads, 0, s>>>(logits, V, how, out, lp_out, nullptr, nullptr, nullptr, nullptr);
  GPTOSS_CUDA_LAUNCH_CHECK();
}

}  // namespace gptoss::cuda
