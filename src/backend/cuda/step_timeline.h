#pragma once
// GPTOSS_CUDA_TIMELINE=1: how long the GPU sits idle between forward passes (issue 14's "no GPU
// idle gap between steps"). Each backend call records three events: when the call arrives, just
// before its first GPU work (the metadata upload), and after its last. An event recorded on an
// idle stream completes at once, so work(i + 1) - end(i) is the time the GPU waited for the host
// between two passes, split into the engine's part (end(i) -> arrival(i + 1): sampling
// bookkeeping, detokenization, planning, the hand-off between threads) and the backend's own
// staging (arrival -> work). The summary prints when the backend goes away, with the GPU time
// by kind of pass (decode: one token a sequence; short: at most 16 a sequence, e.g. speculative
// verify; prefill: longer runs), which says how a serving run's time splits.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace gptoss::cuda {

class StepTimeline {
 public:
  StepTimeline() : on_(std::getenv("GPTOSS_CUDA_TIMELINE") != nullptr) {}
  StepTimeline(const StepTimeline&) = delete;
  StepTimeline& operator=(const StepTimeline&) = delete;
  ~StepTimeline() {
    report();
    for (auto& s : steps_) {
      cudaEventDestroy(s.arrive);
      cudaEventDestroy(s.work);
      cudaEventDestroy(s.end);
    }
  }
  bool on() const { return on_; }
  // tokens: the pass's tokens; max_seq_tokens: the most a sequence brings.
  void begin(cudaStream_t s, int tokens, int max_seq_tokens) {
    if (!on_) return;
    Step st{};
    st.tokens = tokens;
    st.kind = max_seq_tokens <= 1 ? 0 : max_seq_tokens <= 16 ? 1 : 2;
    cudaEventCreate(&st.arrive);
    cudaEventCreate(&st.work);
    cudaEventCreate(&st.end);
    cudaEventRecord(st.arrive, s);
    steps_.push_back(st);
    work_marked_ = false;
  }
  // Just before the pass's first GPU work (called once or more per pass; the first counts).
  void work(cudaStream_t s) {
    if (!on_ || steps_.empty() || work_marked_) return;
    cudaEventRecord(steps_.back().work, s);
    work_marked_ = true;
  }
  void end(cudaStream_t s) {
    if (!on_ || steps_.empty()) return;
    if (!work_marked_) work(s);
    cudaEventRecord(steps_.back().end, s);
  }

 private:
  struct Step {
    cudaEvent_t arrive, work, end;
    int tokens, kind;  // kind: 0 decode, 1 short, 2 prefill
  };
  void report() {
    if (!on_ || steps_.size() < 2) return;
    cudaEventSynchronize(steps_.back().end);
    auto ms = [](cudaEvent_t a, cudaEvent_t b) {
      float v = -1;
      return cudaEventElapsedTime(&v, a, b) == cudaSuccess ? v : -1.f;
    };
    std::vector<float> gaps, engine_part, staging_part, pass_ms(steps_.size());
    double busy = 0;
    size_t long_gaps = 0, first_wait = 0;  // first_wait: the first pass after a gap over 50 ms
    double kind_ms[3] = {0, 0, 0}, kind_tokens[3] = {0, 0, 0};
    size_t kind_n[3] = {0, 0, 0};
    for (size_t i = 0; i < steps_.size(); ++i) {
      const float b = pass_ms[i] = std::max(0.f, ms(steps_[i].work, steps_[i].end));
      busy += b;
      kind_ms[steps_[i].kind] += b;
      kind_tokens[steps_[i].kind] += steps_[i].tokens;
      ++kind_n[steps_[i].kind];
      if (i == 0) continue;
      const float gap = ms(steps_[i - 1].end, steps_[i].work);
      if (gap < 0) continue;
      // Gaps longer than 50 ms are the server waiting for requests, not host overhead.
      if (gap >= 50.f) {
        if (long_gaps++ == 0) first_wait = i;
        continue;
      }
      gaps.push_back(gap);
      engine_part.push_back(std::max(0.f, ms(steps_[i - 1].end, steps_[i].arrive)));
      staging_part.push_back(std::max(0.f, ms(steps_[i].arrive, steps_[i].work)));
    }
    if (gaps.empty()) return;
    auto sum = [](const std::vector<float>& v) { double t = 0; for (float x : v) t += x; return t; };
    auto median_us = [](std::vector<float> v) { std::sort(v.begin(), v.end()); return 1000.0 * v[v.size() / 2]; };
    auto p90_us = [](std::vector<float> v) { std::sort(v.begin(), v.end()); return 1000.0 * v[v.size() * 9 / 10]; };
    const double idle = sum(gaps);
    std::fprintf(stderr,
                 "cuda timeline: %zu passes; GPU busy %.1f ms, idle between passes %.1f ms = %.2f%% "
                 "(per gap: median %.1f us, p90 %.1f us; of which engine median %.1f us, backend staging "
                 "median %.1f us; %zu gaps over 50 ms left out as waiting for requests)\n",
                 steps_.size(), busy, idle, 100.0 * idle / std::max(1e-9, busy + idle), median_us(gaps), p90_us(gaps),
                 median_us(engine_part), median_us(staging_part), long_gaps);
    const char* names[3] = {"decode", "short (<= 16 a sequence)", "prefill"};
    for (int k = 0; k < 3; ++k)
      if (kind_n[k])
        std::fprintf(stderr, "cuda timeline: %s passes %zu, GPU %.1f ms (%.1f%%), mean %.1f tokens %.3f ms a pass\n",
                     names[k], kind_n[k], kind_ms[k], 100.0 * kind_ms[k] / std::max(1e-9, busy),
                     kind_tokens[k] / kind_n[k], kind_ms[k] / kind_n[k]);
    // The prefill passes one by one, in order: a pass's cost a token falls with its size (the
    // expert GEMM reads every expert's weights once a pass), so what sizes a server's arrivals
    // make says what batching them differently could buy. A server's warm-up passes (every batch
    // size, prompts of 32-2048 tokens) come before its first wait for requests: the prefill passes
    // are summed again without them.
    std::string sizes;
    size_t listed = 0, after_n = 0;
    double after_ms = 0, after_tokens = 0;
    for (size_t i = 0; i < steps_.size(); ++i) {
      if (steps_[i].kind != 2) continue;
      if (first_wait > 0 && i >= first_wait) {
        after_ms += pass_ms[i];
        after_tokens += steps_[i].tokens;
        ++after_n;
      }
      if (++listed == 65) sizes += " ...";
      if (listed > 64) continue;
      char one[48];
      std::snprintf(one, sizeof one, " %d/%.1f", steps_[i].tokens, pass_ms[i]);
      sizes += one;
    }
    if (after_n)
      std::fprintf(stderr,
                   "cuda timeline: prefill passes after the first wait for requests %zu, GPU %.1f ms, mean %.1f "
                   "tokens %.3f ms a pass (%.2f us a token)\n",
                   after_n, after_ms, after_tokens / after_n, after_ms / after_n,
                   1000.0 * after_ms / std::max(1.0, after_tokens));
    if (listed) std::fprintf(stderr, "cuda timeline: prefill passes, tokens/ms in order:%s\n", sizes.c_str());
  }
  bool on_;
  bool work_marked_ = false;
  std::vector<Step> steps_;
};

}  // namespace gptoss::cuda
