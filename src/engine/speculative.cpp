#include "engine/speculative.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace gptoss {

SpeculativeConfig parse_speculative_config(const std::string& json_text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const std::exception& e) {
    throw Error(std::string("--speculative-config: not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw Error("--speculative-config: expected a JSON object");
  SpeculativeConfig c;
  if (!j.contains("method") || !j["method"].is_string())
    throw Error("--speculative-config: \"method\" (a string, \"ngram\" or \"eagle3\") is required");
  c.method = j["method"].get<std::string>();
  if (c.method == "eagle" || c.method == "medusa" || c.method == "mtp")
    throw Error("--speculative-config: method \"" + c.method +
                "\" is not implemented; \"ngram\" (prompt lookup) and \"eagle3\" are available");
  if (c.method != "ngram" && c.method != "eagle3")
    throw Error("--speculative-config: unknown method \"" + c.method + "\" (expected \"ngram\" or \"eagle3\")");
  if (c.method == "eagle3") {
    if (!j.contains("model") || !j["model"].is_string() || j["model"].get<std::string>().empty())
      throw Error("--speculative-config: method \"eagle3\" needs \"model\", the draft head's directory");
    c.model = j["model"].get<std::string>();
    for (const char* key : {"prompt_lookup_max", "prompt_lookup_min"})
      if (j.contains(key)) throw Error(std::string("--speculative-config: \"") + key + "\" is only for method \"ngram\"");
  } else if (j.contains("model")) {
    throw Error("--speculative-config: \"model\" is only for method \"eagle3\"");
  }
  auto get_int = [&](const char* key, int& out, int lo, int hi) {
    if (!j.contains(key)) return;
    if (!j[key].is_number_integer()) throw Error(std::string("--speculative-config: \"") + key + "\" must be an integer");
    long long v = j[key].get<long long>();
    if (v < lo || v > hi)
      throw Error(std::string("--speculative-config: \"") + key + "\" must be in [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "], got " + std::to_string(v));
    out = int(v);
  };
  if (!j.contains("num_speculative_tokens")) throw Error("--speculative-config: \"num_speculative_tokens\" is required");
  get_int("num_speculative_tokens", c.num_speculative_tokens, 1, 16);
  get_int("prompt_lookup_max", c.prompt_lookup_max, 1, 64);
  get_int("prompt_lookup_min", c.prompt_lookup_min, 1, 64);
  if (c.prompt_lookup_min > c.prompt_lookup_max)
    throw Error("--speculative-config: prompt_lookup_min (" + std::to_string(c.prompt_lookup_min) +
                ") is larger than prompt_lookup_max (" + std::to_string(c.prompt_lookup_max) + ")");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "method" && it.key() != "num_speculative_tokens" && it.key() != "prompt_lookup_max" &&
        it.key() != "prompt_lookup_min" && it.key() != "model")
      throw Error("--speculative-config: unknown key \"" + it.key() +
                  "\" (known: method, model, num_speculative_tokens, prompt_lookup_max, prompt_lookup_min)");
  return c;
}

std::vector<int32_t> ngram_propose(const std::vector<int32_t>& ctx, int k, int lookup_min, int lookup_max) {
  const int L = int(ctx.size());
  if (k <= 0) return {};
  for (int n = std::min(lookup_max, L - 1); n >= lookup_min; --n) {
    const int32_t* suffix = ctx.data() + (L - n);
    // Latest occurrence starting at i < L - n (the suffix itself excluded), scanning backwards.
    for (int i = L - n - 1; i >= 0; --i) {
      if (!std::equal(suffix, suffix + n, ctx.data() + i)) continue;
      const int from = i + n, to = std::min(L, from + k);
      return std::vector<int32_t>(ctx.begin() + from, ctx.begin() + to);
    }
  }
  return {};
}

int AdaptiveDraftLength::next() {
  if (k_ > 0) return k_;
  if (pause_left_ > 0) {
    --pause_left_;
    return 0;
  }
  return 1;  // the pause is over: try one draft token
}

void AdaptiveDraftLength::update(int proposed, int accepted) {
  if (proposed <= 0) return;
  if (accepted == 0) {
    k_ /= 2;
    if (k_ == 0) {
      pause_len_ = pause_len_ == 0 ? 8 : std::min(256, pause_len_ * 2);
      pause_left_ = pause_len_;
    }
    return;
  }
  pause_len_ = 0;
  if (accepted == proposed)
    k_ = std::min(k_max_, std::max(k_, proposed) + 1);
  else
    k_ = std::max(k_, std::min(k_max_, accepted + 1));
}

void PassCostModel::record(int tokens, double seconds) {
  if (tokens <= 0 || !(seconds > 0)) return;
  if (size_t(tokens) >= avg_.size()) avg_.resize(size_t(tokens) + 1, 0.0);
  double& a = avg_[size_t(tokens)];
  // Mostly the recent passes: the context (attention) and the GPU's clocks drift.
  a = a > 0 ? 0.8 * a + 0.2 * seconds : seconds;
}

double PassCostModel::estimate(int tokens) const {
  for (int n = std::min(tokens, int(avg_.size()) - 1); n > 0; --n)
    if (measured(n) > 0) return measured(n);
  return -1.0;
}

std::vector<int> drafts_worth_verifying(int base_tokens, const std::vector<int>& drafts,
                                        const std::vector<double>& accept, const PassCostModel& cost) {
  std::vector<int> keep(drafts.size(), 0);
  const double base_cost = cost.estimate(base_tokens);
  if (base_cost <= 0) return drafts;
  // Every draft with its value (the chance it yields a token), best first; within a sequence the
  // values fall with j (ties at accept 1 broken by j), so any prefix of this order keeps a prefix
  // of each sequence's drafts.
  struct Draft {
    double value;
    int seq, j;
  };
  std::vector<Draft> all;
  for (size_t i = 0; i < drafts.size(); ++i) {
    const double a = std::clamp(accept[i], 0.0, 1.0);
    double v = 1.0;
    for (int j = 1; j <= drafts[i]; ++j) all.push_back({v *= a, int(i), j});
  }
  std::stable_sort(all.begin(), all.end(), [](const Draft& x, const Draft& y) {
    return x.value > y.value || (x.value == y.value && x.j < y.j);
  });
  double best_rate = double(base_tokens) / base_cost, expected = double(base_tokens);
  size_t best_m = 0;
  double c = base_cost;  // estimate(base + m), kept as m grows (no rescan of smaller counts)
  for (size_t m = 1; m <= all.size(); ++m) {
    expected += all[m - 1].value;
    if (const double at = cost.measured(base_tokens + int(m)); at > 0) c = at;
    if (expected / c > best_rate) {
      best_rate = expected / c;
      best_m = m;
    }
  }
  for (size_t m = 0; m < best_m; ++m) keep[size_t(all[m].seq)] = std::max(keep[size_t(all[m].seq)], all[m].j);
  return keep;
}

}  // namespace gptoss
