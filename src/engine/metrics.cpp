#include "engine/metrics.h"

#include <algorithm>
#include <cstdio>

namespace gptoss {

Histogram::Histogram(std::vector<double> b) : bounds_(std::move(b)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> l(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++n_;
}

void Histogram::reset() {
  std::lock_guard<std::mutex> l(mu_);
  std::fill(counts_.begin(), counts_.end(), 0);
  sum_ = 0;
  n_ = 0;
}

double Histogram::sum() const {
  std::lock_guard<std::mutex> l(mu_);
  return sum_;
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> l(mu_);
  return n_;
}

void Histogram::render(const std::string& name, const std::string& help, std::string& out,
                       const std::string& labels) const {
  std::lock_guard<std::mutex> l(mu_);
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  const std::string pre = labels.empty() ? "" : labels + ",";               // before le=
  const std::string own = labels.empty() ? "" : "{" + labels + "}";          // _sum, _count
  // Prometheus buckets are cumulative: le="x" counts every observation <= x, +Inf all of them.
  uint64_t cum = 0;
  char buf[64];
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    std::snprintf(buf, sizeof buf, "%g", bounds_[i]);
    out += name + "_bucket{" + pre + "le=\"" + buf + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  out += name + "_bucket{" + pre + "le=\"+Inf\"} " + std::to_string(cum) + "\n";
  std::snprintf(buf, sizeof buf, "%.9g", sum_);
  out += name + "_sum" + own + " " + buf + "\n";
  out += name + "_count" + own + " " + std::to_string(n_) + "\n";
}

void EngineMetrics::reset() {
  for (std::atomic<int64_t>* c : {&prompt_tokens, &generation_tokens, &requests_finished, &requests_aborted, &preemptions,
                                  &prefix_cache_queries, &prefix_cache_hits, &steps, &early_launches, &spec_draft_tokens,
                                  &spec_accepted_tokens, &spec_gated_tokens, &spec_draft_us, &constraint_redraws})
    c->store(0);
  for (Histogram* h : {&ttft_s, &itl_s, &step_forward_s, &step_host_s, &e2e_s}) h->reset();
}

}  // namespace gptoss
