#pragma once
// Speculative decoding, the drafter side: the `--speculative-config` settings, the n-gram
// (prompt lookup) drafter, and the per-sequence adaptive draft length. The engine verifies the
// drafts (engine.cpp: a decoding sequence contributes 1 + K rows to the varlen batch and asks
// for K + 1 logit rows) and rolls back the KV of rejected positions (KvManager::truncate).
//
// Why verification is lossless, for greedy and sampled requests alike. Row j of a verify step
// (j = 0..K) gives the target distribution p_j of the token after the context plus the drafts
// d_1..d_j. The engine draws token t_j from p_j exactly as plain decoding would (same sampler,
// one uniform from the request's generator per position), accepts d_{j+1} when t_j == d_{j+1}
// and goes on, else emits t_j and stops; after K accepted drafts t_K is the bonus token.
// This is the speculative-sampling rule (Leviathan et al. 2023, Chen et al. 2023) for a drafter
// whose proposal q is a point mass on d: accept d with probability min(1, p(d)/q(d)) = p(d), and
// on rejection sample from the residual norm(max(0, p - q)), which is p with d removed,
// renormalized. Drawing t ~ p and accepting iff t == d does exactly that: P(accept) = p(d), and
// t given t != d is distributed as p(x) / (1 - p(d)) for x != d, the residual. Each emitted token
// consumes one uniform, drawn in position order, and draws for positions after a rejection are
// never taken, so the generator's state after n tokens is the same as in plain decoding: a seeded
// request produces the same tokens with or without speculation whenever the logits are the same
// (the CPU backend computes each row exactly as it would in a plain decode step).
#include <cstdint>
#include <string>
#include <vector>

namespace gptoss {

struct SpeculativeConfig {
  std::string method;               // "" (off), "ngram" or "eagle3"
  std::string model;                // eagle3: the draft head's directory (engine/eagle3_drafter.h)
  // eagle3: the target's checkpoint directory, whose embedding a head without embed_tokens
  // shares. Set by the command line from --model, not part of the JSON.
  std::string target_model;
  int num_speculative_tokens = 0;   // K, the most drafts verified per step (1..16)
  int prompt_lookup_max = 4;        // longest suffix n-gram looked up
  int prompt_lookup_min = 1;        // shortest
  // AdaptiveDraftLength per sequence, and only the drafts worth their pass's cost verified
  // (drafts_worth_verifying); tests turn it off to verify every draft.
  bool adaptive = true;
  bool enabled() const { return !method.empty() && num_speculative_tokens > 0; }
};

// Parses vLLM's --speculative-config JSON, e.g.
// {"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":1} or
// {"method":"eagle3","model":DIR,"num_speculative_tokens":1}.
// Throws gptoss::Error naming the problem: not JSON, unknown keys, values out of range, a
// method other than ngram or eagle3, eagle3 without "model". (The head itself is loaded by the
// engine.)
SpeculativeConfig parse_speculative_config(const std::string& json_text);

// Prompt lookup: for n from prompt_lookup_max down to prompt_lookup_min, finds the latest
// earlier occurrence of the context's last n tokens and returns up to `k` tokens that followed
// it (fewer when the context ends sooner); empty when no suffix n-gram recurs.
std::vector<int32_t> ngram_propose(const std::vector<int32_t>& context, int k, int lookup_min, int lookup_max);

// Per-sequence draft length that backs off when drafts keep missing, so a text where nothing
// matches costs about nothing: every miss of a whole draft halves K; at 0, drafting pauses for a
// number of steps that doubles with each consecutive failure (8, 16, ... 256) before one draft
// token is tried again. Drafts fully accepted grow K by one, up to the configured maximum.
class AdaptiveDraftLength {
 public:
  explicit AdaptiveDraftLength(int k_max = 0) : k_max_(k_max), k_(k_max) {}
  // Drafts to ask for this step (0: plain decode); counts a paused step.
  int next();
  // After verification: `proposed` drafts, `accepted` of them matched.
  void update(int proposed, int accepted);
  int current() const { return k_; }
  // Steps still paused after the one just planned (0: not paused, or the next step probes).
  int pause_left() const { return k_ > 0 ? 0 : pause_left_; }

 private:
  int k_max_ = 0, k_ = 0;
  int pause_left_ = 0, pause_len_ = 0;
};

// What decode and verify passes cost by their token count, measured: an exponential average of
// the pass's wall time per count (passes with prefill tokens are not recorded). Why: a verify
// pass pays for every row its drafts add, and not in proportion: on the GPU a pass that crosses
// a CUDA-graph bucket runs the next bucket's kernels (H200, 120b, 8 streams: 5.6 ms a pass of 8
// tokens, 8.2 ms of 9), so one draft among 8 sequences costs more than it can return.
class PassCostModel {
 public:
  void record(int tokens, double seconds);
  // Seconds a pass of `tokens` takes: the average at that count, else at the nearest smaller
  // count measured (an optimistic guess, so unmeasured sizes get tried once and measured), else
  // < 0 (unknown).
  double estimate(int tokens) const;
  // The average at exactly `tokens`, 0 when not measured.
  double measured(int tokens) const {
    return tokens > 0 && size_t(tokens) < avg_.size() ? avg_[size_t(tokens)] : 0.0;
  }

 private:
  std::vector<double> avg_;  // by token count; 0 = not measured
};

// Speculative decoding's cost gate: of the drafts a step could verify, which are worth it.
// base_tokens: the step's tokens without drafts (one a decoding sequence); drafts[i]: drafts
// granted to decoding sequence i, whose drafts are each accepted with probability accept[i]
// (so its j-th draft yields a token with probability accept[i]^j). Returns the drafts to keep a
// sequence: the first m of all drafts by that value (each sequence's kept drafts a prefix of its
// own) for the m that maximizes expected tokens per second, (base + sum of the values) /
// cost.estimate(base + m). Keeps everything when the cost of the base pass is unknown.
std::vector<int> drafts_worth_verifying(int base_tokens, const std::vector<int>& drafts,
                                        const std::vector<double>& accept, const PassCostModel& cost);

}  // namespace gptoss
