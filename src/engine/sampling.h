#pragma once
#include "backend/backend.h"
// Host-side sampling from one row of logits: penalties, temperature, top-k, top-p, min-p, and
// log-probabilities of the raw distribution.
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "structured/token_constraint.h"

namespace gptoss {

struct SamplingParams {
  float temperature = 1.0f;  // < 1e-5: greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // <= 0: off
  float min_p = 0.0f;        // [0, 1]
  std::optional<uint64_t> seed;
  float presence_penalty = 0.0f;   // OpenAI semantics, on generated tokens
  float frequency_penalty = 0.0f;
  std::vector<std::string> stop;         // stop strings (on the detokenized output)
  std::vector<int32_t> stop_token_ids;   // in addition to the engine's end tokens
  int max_tokens = 16;                   // >= 1
  int logprobs = -1;                     // -1 none; 0 the chosen token's; n: and the top n
  int prompt_logprobs = -1;              // as logprobs, for each prompt token after the first
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> added to its logit before sampling
  bool ignore_eos = false;               // do not stop at the engine's end tokens
  // Structured output: while active, the tokens it does not allow are masked before sampling
  // (the row is then sampled on the host); every generated token advances it. One per request.
  std::shared_ptr<structured::TokenConstraint> constraint;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // best first
};

// One uniform double in [0, 1) from the generator (53 bits; the same on every platform).
inline double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

// The backend's sampling rule (RowSampling) for these parameters and uniform draw `u`.
RowSampling row_sampling(const SamplingParams& sp, double u);

// The logit changes sampling makes for these parameters given `counts`: logit_bias plus, for each
// token generated c > 0 times, -(frequency_penalty x c + presence_penalty); one entry per token in
// [0, vocab) (a token named by both has the sum of its deltas), in id order, no zero deltas.
// Appends to `out`. A backend draws the row with them (RowSampling::adds_begin) as sample_token
// does on the host.
void logit_adds(const SamplingParams& sp, const std::unordered_map<int32_t, int>& counts, int vocab,
                std::vector<LogitAdd>& out);
// Whether logit_adds can give any entry (the row is not the plain rule's).
inline bool changes_logits(const SamplingParams& sp) {
  return !sp.logit_bias.empty() || sp.presence_penalty != 0.0f || sp.frequency_penalty != 0.0f;
}

// Samples one token id in [0, vocab): logit_bias and penalties on the host, then the backend's rule
// (sample_row), so host and device sampling agree. `counts`: occurrences of each generated token so far.
// Draws exactly one number from rng per call (also when greedy), so a seeded request's output
// does not depend on its parameters' code paths. The row is changed while it draws and given
// back as it was.
int32_t sample_token(float* logits, int vocab, const SamplingParams& sp, const std::unordered_map<int32_t, int>& counts,
                     std::mt19937_64& rng);

// log-softmax of the raw logits: the chosen token's logprob and the top_n best.
TokenLogprob compute_logprobs(const float* logits, int vocab, int32_t chosen, int top_n);

}  // namespace gptoss
