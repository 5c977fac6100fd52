#pragma once
// Prometheus-style counters and histograms the engine fills and the server renders.
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace gptoss {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  void reset();  // no observations
  // Appends the Prometheus text of this histogram (name_bucket/_sum/_count) to `out`. `labels`
  // (e.g. `model_name="m"`, no braces) go on every series, before `le`.
  void render(const std::string& name, const std::string& help, std::string& out, const std::string& labels = "") const;
  uint64_t count() const;
  double sum() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket, non-cumulative; last = +Inf
  double sum_ = 0;
  uint64_t n_ = 0;
};

struct EngineMetrics {
  std::atomic<int64_t> prompt_tokens{0};
  std::atomic<int64_t> generation_tokens{0};
  std::atomic<int64_t> requests_finished{0};
  std::atomic<int64_t> requests_aborted{0};
  std::atomic<int64_t> preemptions{0};
  // Prefix cache, in tokens: looked up at each admission, and found cached (vLLM's names).
  std::atomic<int64_t> prefix_cache_queries{0};
  std::atomic<int64_t> prefix_cache_hits{0};
  std::atomic<int64_t> steps{0};
  // Async scheduling: steps launched from the previous step's drawn ids before its bookkeeping
  // (Engine::take_tokens_early).
  std::atomic<int64_t> early_launches{0};
  // Speculative decoding: draft tokens verified, and those of them the target model accepted.
  std::atomic<int64_t> spec_draft_tokens{0};
  std::atomic<int64_t> spec_accepted_tokens{0};
  // Drafts proposed but not verified because the rows would cost more than they return
  // (the cost gate, drafts_worth_verifying).
  std::atomic<int64_t> spec_gated_tokens{0};
  // Time the drafter took (proposals, and the Eagle3 head's commits), in microseconds: the
  // draft step's cost, which bench-serve reports per draft token.
  std::atomic<int64_t> spec_draft_us{0};
  // Structured output: tokens drawn without the mask that the constraint refused, each drawn
  // again masked (a step's row more for its sequence).
  std::atomic<int64_t> constraint_redraws{0};
  Histogram ttft_s{{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0}};
  Histogram itl_s{{0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}};
  // Per forward pass: the backend call, and the host time before it since the previous pass
  // ended (scheduling, sampling, streaming): the gap the device idles without overlap.
  Histogram step_forward_s{{0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5}};
  Histogram step_host_s{{0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1}};
  Histogram e2e_s{{0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0}};

  // Every counter and histogram back to zero (after the start-up warm-up, which is not traffic).
  void reset();
};

}  // namespace gptoss
