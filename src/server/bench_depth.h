#pragma once
// `gptoss bench-serve --depth 0,4096,16384`: llama-benchy's report (llama-bench's pp/tg at
// context depths, measured over the OpenAI API) so our figures can be set beside the seeds'.
// For each depth, prompt length (pp) and generation length (tg), `runs` requests one at a time,
// each a fresh random-token prompt of depth + pp tokens (no prefix-cache hits) asking for
// exactly tg tokens (ignore_eos). Per request, as llama-benchy measures it:
//   ttfr      request sent -> first streamed bytes
//   est_ppt   ttfr - the estimated latency (latency mode: api = a GET /v1/models, generation =
//             a 1-token prompt asking for 1 token, none = 0)
//   e2e_ttft  request sent -> first generated token
//   pp t/s    (depth + pp) / est_ppt      tg t/s  (tg - 1) / (last token - first token)
// Each row is mean ± standard deviation over the runs. Not reported: llama-benchy's peak t/s
// and its --enable-prefix-caching two-step mode.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "server/bench_serve.h"

namespace gptoss::server {

struct DepthBenchOptions {
  std::vector<int> depths = {0};
  std::vector<int> pp = {2048};
  std::vector<int> tg = {32};
  int runs = 3;
  std::string latency_mode = "api";  // api, generation, none
  bool warmup = true;                // one small request first (not counted)
};

// "0,4096,16384": integers >= `min`, at least one; throws gptoss::Error naming `what`.
std::vector<int> parse_int_list(const std::string& spec, const std::string& what, int min);

struct MeanStd {
  double mean = 0, std = 0;  // population standard deviation, as llama-benchy's numpy.std
  int n = 0;
};
MeanStd mean_std(const std::vector<double>& v);

// One measured request of a test.
struct DepthRun {
  bool ok = false;
  std::string error;
  int prompt_tokens = 0, completion_tokens = 0;
  double ttfr_s = 0, e2e_ttft_s = 0, tg_tok_s = 0;
};

// One (depth, pp, tg) test: its runs, then the pp and tg rows computed from them.
struct DepthTest {
  int depth = 0, pp = 0, tg = 0;
  std::vector<DepthRun> runs;
  MeanStd pp_tok_s, tg_tok_s, ttfr_ms, est_ppt_ms, e2e_ttft_ms;
  int ok = 0;
  std::string pp_name() const;  // "pp2048" or "pp2048 @ d4096"
  std::string tg_name() const;  // "tg32" or "tg32 @ d4096"
};

struct DepthReport {
  std::string model;
  std::string latency_mode;
  double latency_s = 0;
  std::vector<DepthTest> tests;
  int ok = 0, failed = 0;
  nlohmann::json to_json() const;
  std::string to_markdown() const;  // llama-benchy's table, then a footer line
};

// Fills a test's rows from its runs: pp t/s from (prompt tokens the server counted, else
// depth + pp) / (ttfr - latency); a run whose est_ppt is not positive counts no pp speed.
void summarize_depth_test(DepthTest& t, double latency_s);

DepthReport run_depth_bench(const BenchOptions& o, const DepthBenchOptions& d);

}  // namespace gptoss::server
