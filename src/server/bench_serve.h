#pragma once
// A load generator over streaming chat completions (`gptoss bench-serve`).
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace gptoss::server {

struct BenchOptions {
  std::string base_url = "http://127.0.0.1:8000";  // with or without a trailing /v1
  std::string model;
  std::string api_key;
  int requests = 32;
  int concurrency = 8;
  int max_tokens = 64;
  std::string prompts_file;  // one prompt a line (plain text, or JSON objects with "prompt")
  double temperature = 0.0;
  bool ignore_eos = false;
  int timeout_s = 600;       // per request
  // Ask for logprobs so every sampled token arrives as a chunk of its own: TTFT and decode
  // times then count tokens, also before a model writes visible text (harmony headers,
  // reasoning-less random models).
  bool token_timing = true;
};

struct BenchRequestResult {
  bool ok = false;
  std::string error;
  double ttft_s = 0;        // request sent -> first streamed token
  double decode_tok_s = 0;  // (tokens - 1) / (last token - first token); 0 when < 2 tokens
  int completion_tokens = 0;
  int prompt_tokens = 0;
  double latency_s = 0;
};

struct BenchReport {
  std::vector<BenchRequestResult> results;
  int ok = 0, failed = 0;
  double ttft_median_s = 0, ttft_p99_s = 0;
  double decode_tok_s_median = 0;
  double aggregate_tok_s = 0;   // all completion tokens / total time
  double total_s = 0;           // first request sent -> last one done
  int64_t completion_tokens = 0, prompt_tokens = 0;
  nlohmann::json to_json() const;
  std::string to_text() const;
};

BenchReport run_bench(const BenchOptions& o);

}  // namespace gptoss::server
