#pragma once
// A test double for Backend: a "model" whose logits are a hash of everything a real model's
// attention could see (all earlier tokens through the full-attention page table, the last
// `window` through the sliding one). It stores each token and its position in the pages the
// engine hands it and checks them back, so wrong page tables, a released page still in use or
// a page shared by two sequences change outputs or throw.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <cstdint>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace gptoss::testing {

class FakeBackend : public Backend {
 public:
  explicit FakeBackend(int vocab = 64, int window = 8, int max_pos = 4096) {
    cfg_ = GptOssConfig::preset("tiny");
    cfg_.vocab = vocab;
    cfg_.sliding_window = window;
    cfg_.num_layers = 2;
    cfg_.layer_sliding = {true, false};
    cfg_.max_position_embeddings = max_pos;
    cfg_.eos_token_id = vocab - 1;
  }
  std::string name() const override { return "fake"; }
  const GptOssConfig& config() const override { return cfg_; }
  void init_kv_cache(const KvCacheConfig& kv) override {
    kv_ = kv;
    for (int g = 0; g < 2; ++g) slots_[g].assign(size_t(kv.num_pages[g]) * kv.page_size, Slot{});
  }
  const KvCacheConfig& kv_config() const override { return kv_; }
  int default_budget = 0;  // > 0: what default_max_num_batched_tokens says (0: the base class's)
  int default_max_num_batched_tokens() const override {
    return default_budget > 0 ? default_budget : Backend::default_max_num_batched_tokens();
  }

  // Counts the passes that asked for sampled ids only (the default draws them from forward()).
  int sample_calls = 0;
  bool sampled_logprobs = true;  // false: as a backend that gives no logprobs from forward_sample
  bool samples_logprobs() const override { return sampled_logprobs; }
  bool keeps_rows = true;  // false: as a backend that cannot keep chosen rows' logits
  bool keeps_logits() const override { return keeps_rows; }
  int kept_rows = 0;  // rows whose logits forward_sample kept for the host
  bool applies_adds = true;  // false: as a backend that applies no logit changes or masks
  bool applies_logit_changes() const override { return applies_adds; }
  int adjusted_rows = 0;  // rows forward_sample drew with logit changes
  int masked_rows = 0;    // rows forward_sample drew with an allowed-token mask
  bool samples_top = true;  // false: as a backend that gives no top logprobs (those rows on the host)
  bool samples_top_logprobs() const override { return samples_top && sampled_logprobs; }
  int top_rows = 0;  // rows forward_sample drew with a top list
  void forward_sample(const ForwardBatch& b, const RowSampling* rows, int32_t* out, float* lp = nullptr,
                      float* kept = nullptr, const LogitChanges& changes = {}, TopLogprobs* top = nullptr) override {
    ++sample_calls;
    for (size_t r = 0; r < b.logit_rows.size(); ++r) {
      kept_rows += rows[r].keep_logits != 0;
      adjusted_rows += rows[r].adds_count > 0;
      masked_rows += rows[r].allowed_row >= 0;
      top_rows += rows[r].top_logprobs > 0;
    }
    if (!applies_adds && (changes.adds || changes.allowed))
      throw std::logic_error("logit changes handed to a backend that does not apply them");
    if (!samples_top && top) throw std::logic_error("top_out handed to a backend that gives no top lists");
    Backend::forward_sample(b, rows, out, lp, kept, changes, top);
  }
  void forward(const ForwardBatch& b, float* logits) override {
    ++forward_calls;
    forwarded_tokens += int64_t(b.tokens.size());
    if (delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    max_batch_tokens = std::max<int>(max_batch_tokens, int(b.tokens.size()));
    max_batch_seqs = std::max<int>(max_batch_seqs, int(b.seqs.size()));
    if (std::all_of(b.seqs.begin(), b.seqs.end(), [](const SeqBatchInfo& s) { return s.n_tokens == 1; }))
      decode_batch_sizes.insert(int(b.seqs.size()));
    std::vector<uint64_t> row_hash(b.tokens.size(), 0);
    std::vector<std::pair<const SeqBatchInfo*, int32_t>> row_at(b.tokens.size(), {nullptr, 0});
    const int P = kv_.page_size;
    for (const auto& s : b.seqs) {
      for (int i = 0; i < s.n_tokens; ++i) {
        int32_t pos = s.start_pos + i, tok = b.tokens[s.first_token + i];
        for (int g = 0; g < 2; ++g) {
          if (g == kKvSliding && kv_.num_pages[1] == 0) continue;
          Slot& sl = slot(s, g, pos);
          sl.token = tok;
          sl.pos = pos;
        }
      }
      for (int i = 0; i < s.n_tokens; ++i) {
        int32_t pos = s.start_pos + i;
        uint64_t h = 1469598103934665603ull;
        for (int32_t q = 0; q <= pos; ++q) h = mix(h, read(s, kKvFull, q));
        uint64_t h2 = 7;
        for (int32_t q = std::max(0, pos - cfg_.sliding_window + 1); q <= pos; ++q) h2 = mix(h2, read(s, kKvSliding, q));
        row_hash[s.first_token + i] = mix(h, h2);
        row_at[s.first_token + i] = {&s, pos};
      }
      (void)P;
    }
    for (size_t r = 0; r < b.logit_rows.size(); ++r) {
      uint64_t h = row_hash[b.logit_rows[r]];
      float* out = logits + r * size_t(cfg_.vocab);
      for (int v = 0; v < cfg_.vocab; ++v) {
        uint64_t x = mix(h, uint64_t(v) + 0x9e37);
        out[v] = float(double(x >> 11) * 0x1.0p-53 * 8.0 - 4.0);
      }
      if (shape_logits) {
        auto [seq, pos] = row_at[b.logit_rows[r]];
        std::vector<int32_t> context;
        for (int32_t q = 0; q <= pos; ++q) context.push_back(slot(*seq, kKvFull, q).token);
        shape_logits(context, out);
      }
    }
  }

  // Optional: changes a row's logits given every token of its sequence so far (a scripted model).
  std::function<void(const std::vector<int32_t>& context, float* logits)> shape_logits;
  // A shape_logits that makes the output follow `script` once the context is past `prompt_len`
  // tokens (the script's g-th token wins step g by a margin no hash reaches).
  static std::function<void(const std::vector<int32_t>&, float*)> scripted(std::vector<int32_t> script,
                                                                            size_t prompt_len) {
    return [script = std::move(script), prompt_len](const std::vector<int32_t>& ctx, float* logits) {
      const size_t g = ctx.size() - prompt_len;  // tokens generated so far
      if (ctx.size() >= prompt_len && g < script.size()) logits[script[g]] += 100.0f;
    };
  }
  int forward_calls = 0;
  int64_t forwarded_tokens = 0;  // tokens of every forward pass (prefill rows computed, decodes)
  int delay_us = 0;  // per forward: makes streams slow enough to interrupt
  int max_batch_tokens = 0;
  int max_batch_seqs = 0;
  std::set<int> decode_batch_sizes;  // sequences of each pass whose every sequence brought one token

 private:
  struct Slot {
    int32_t token = -1;
    int32_t pos = -1;
  };
  static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
  }
  Slot& slot(const SeqBatchInfo& s, int g, int32_t pos) {
    const int P = kv_.page_size;
    int32_t pi = pos / P;
    if (pi >= s.n_pages[g]) throw std::runtime_error("page table too short for position " + std::to_string(pos));
    int32_t page = s.pages[g][pi];
    if (page < 0 || page >= kv_.num_pages[g])
      throw std::runtime_error("bad page " + std::to_string(page) + " for position " + std::to_string(pos) +
                               " group " + std::to_string(g));
    return slots_[g][size_t(page) * P + pos % P];
  }
  uint64_t read(const SeqBatchInfo& s, int g, int32_t pos) {
    if (g == kKvSliding && kv_.num_pages[1] == 0) g = kKvFull;
    Slot& sl = slot(s, g, pos);
    if (sl.pos != pos) throw std::runtime_error("page holds position " + std::to_string(sl.pos) + ", wanted " + std::to_string(pos));
    return uint64_t(sl.token) * 1000003ull + uint64_t(pos);
  }
  GptOssConfig cfg_;
  KvCacheConfig kv_;
  std::vector<Slot> slots_[2];
};

}  // namespace gptoss::testing
