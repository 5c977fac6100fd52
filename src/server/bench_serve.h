#pragma once
// A load generator over streaming completions (`gptoss bench-serve`): fixed concurrency or
// Poisson arrivals at a request rate, chat prompts or random-token prompts of exact lengths,
// TTFT / TPOT / ITL / latency percentiles, goodput under an SLO, a JSON result.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace gptoss::server {

struct BenchOptions {
  std::string base_url = "http://127.0.0.1:8000";  // with or without a trailing /v1
  std::string model;
  std::string api_key;
  int requests = 32;
  // Requests in flight at most. 0: 8 with fixed concurrency; unlimited with request_rate.
  int concurrency = 0;
  // Requests a second, arriving as a Poisson process (exponential gaps, seeded by `seed`);
  // 0: every request is ready at once and `concurrency` paces them.
  double request_rate = 0;
  uint64_t seed = 0;
  int max_tokens = 64;
  // Output lengths, "N" or "A:B" (uniform in [A, B]): each request's max_tokens ("" = max_tokens).
  std::string output_len;
  // Prompt lengths, "N" or "A:B": random-token prompts of exactly that many tokens, sent as token
  // ids to /v1/completions, so the prefill size is exact. "": chat prompts (prompts_file or
  // built-in questions) to /v1/chat/completions.
  std::string input_len;
  std::string prompts_file;  // one prompt a line: plain text, or {"prompt": "text"} or {"prompt": [token ids]}
  double temperature = 0.0;
  bool ignore_eos = false;
  int timeout_s = 600;       // per request
  // Chat only: ask for logprobs so every sampled token arrives as a chunk of its own: TTFT
  // counts tokens also before a model writes visible text (harmony headers, reasoning-less
  // random models). The server draws such rows on the device all the same. Random-token prompts count
  // tokens from per-chunk usage (continuous_usage_stats) and never ask for logprobs.
  bool token_timing = true;
  // Service-level objective for goodput, "ttft:300,tpot:50,e2e:5000" (milliseconds; any subset).
  std::string goodput;
  // A JSON object whose fields are added to the body of every `extra_body_every`-th request (the
  // first, then every N-th): mixed traffic, e.g. some requests with presence_penalty. "": none.
  std::string extra_body;
  int extra_body_every = 1;
};

// "N" or "A:B" with 1 <= A <= B; throws gptoss::Error naming `what` otherwise.
struct LengthRange {
  int lo = 0, hi = 0;
  bool fixed() const { return lo == hi; }
};
LengthRange parse_length_range(const std::string& spec, const std::string& what);

// Limits in seconds; 0 = no limit on that metric.
struct Slo {
  double ttft_s = 0, tpot_s = 0, e2e_s = 0;
  bool any() const { return ttft_s > 0 || tpot_s > 0 || e2e_s > 0; }
};
Slo parse_slo(const std::string& spec);  // "ttft:300,tpot:50" (ms); throws gptoss::Error

// Send times (seconds from the start) of n requests arriving as a Poisson process at `rate`
// requests a second (the first at 0); all zeros when rate <= 0.
std::vector<double> poisson_arrivals(int n, double rate, uint64_t seed);

struct Percentiles {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
  nlohmann::json to_json_ms() const;  // {"mean_ms", "p50_ms", "p90_ms", "p99_ms"}
};
Percentiles percentiles(const std::vector<double>& v);  // linear interpolation; zeros when empty

struct BenchRequestResult {
  bool ok = false;
  std::string error;
  double ttft_s = 0;        // request sent -> first streamed token
  double ttfr_s = 0;        // request sent -> first streamed bytes of any kind (llama-benchy's TTFR)
  double decode_tok_s = 0;  // (tokens - 1) / (last token - first token); 0 when < 2 tokens
  double tpot_s = 0;        // (last token - first token) / (tokens - 1); 0 when < 2 tokens
  std::vector<double> itl_s;  // gaps between successive chunks that carried tokens
  int completion_tokens = 0;
  int prompt_tokens = 0;
  int max_tokens = 0;       // asked for
  std::string text;         // the streamed text (content, or the completion's text)
  double latency_s = 0;
  double sent_s = 0;        // send time, seconds from the start of the run
};

struct BenchReport {
  std::vector<BenchRequestResult> results;
  int ok = 0, failed = 0;
  double ttft_median_s = 0, ttft_p99_s = 0;
  double decode_tok_s_median = 0;
  double aggregate_tok_s = 0;   // all completion tokens / total time
  double total_s = 0;           // first request sent -> last one done
  int64_t completion_tokens = 0, prompt_tokens = 0;
  double request_rate = 0;      // asked for (0: all at once)
  int concurrency = 0;          // in flight at most (0: unlimited)
  double request_throughput = 0;  // ok requests / total time
  double input_tok_s = 0;       // prompt tokens / total time
  Percentiles ttft, tpot, itl, e2e;
  Slo slo;
  int good = 0;                 // ok requests within every SLO limit
  double goodput_req_s = 0;     // good / total time
  // Speculative decoding, from the server's /metrics before and after the run (-1: the server
  // does not report them or could not be asked).
  int64_t spec_draft_tokens = -1, spec_accepted_tokens = -1;
  int64_t spec_gated_tokens = -1;  // drafts the server's cost gate did not verify (-1: unknown)
  double spec_draft_s = -1;  // the drafter's time over the run (gptoss:spec_decode_draft_seconds_total), -1: unknown
  nlohmann::json to_json() const;
  std::string to_text() const;
};

// One JSON line per request, in request order: {"request", "ok", "completion_tokens", "text"}
// (`--outputs FILE`: two runs with the same --seed and options can be compared with cmp).
std::string outputs_jsonl(const BenchReport& rep);

// Fills the aggregate fields of `rep` from rep.results and rep.total_s.
void summarize(BenchReport& rep);

BenchReport run_bench(const BenchOptions& o);

// Building blocks shared with the depth report (bench_depth.h).
// Throws gptoss::Error saying why when no TCP connection to the server opens.
void check_server_reachable(const BenchOptions& o);
// One streamed /v1/completions request of these token ids (o's model, key, temperature,
// ignore_eos, timeout); failures are in the result, not thrown.
BenchRequestResult send_completion(const BenchOptions& o, const std::vector<int32_t>& prompt, int max_tokens);
// Seconds a GET /v1/models takes (llama-benchy's "api" latency); the first model's id into
// `first_model` when given. Throws gptoss::Error on failure.
double time_models_request(const BenchOptions& o, std::string* first_model = nullptr);
// n random ordinary BPE token ids (no specials), as --input-len prompts use.
std::vector<int32_t> random_prompt_tokens(int n, std::mt19937_64& rng);

}  // namespace gptoss::server
