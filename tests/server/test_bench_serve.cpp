// bench-serve's parts (length ranges, SLO, Poisson arrivals, percentiles, goodput) and a run
// against the server over the fake backend: exact prompt lengths, output lengths in range.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>

#include "common/error.h"
#include "http_fixture.h"
#include "server/bench_depth.h"
#include "server/bench_serve.h"
#include "server/server.h"

using namespace gptoss;
using namespace gptoss::server;

TEST(BenchServe, LengthRanges) {
  auto r = parse_length_range("128", "--input-len");
  EXPECT_EQ(r.lo, 128);
  EXPECT_EQ(r.hi, 128);
  EXPECT_TRUE(r.fixed());
  r = parse_length_range("16:512", "--input-len");
  EXPECT_EQ(r.lo, 16);
  EXPECT_EQ(r.hi, 512);
  for (const char* bad : {"", "0", "8:4", "a", "1:", ":3", "-2", "3:x", "1.5", "1:2:3", "9999999999"}) {
    try {
      parse_length_range(bad, "--output-len");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--output-len"), std::string::npos) << e.what();
    }
  }
}

TEST(BenchServe, SloSpec) {
  Slo s = parse_slo("ttft:300,tpot:50");
  EXPECT_DOUBLE_EQ(s.ttft_s, 0.3);
  EXPECT_DOUBLE_EQ(s.tpot_s, 0.05);
  EXPECT_EQ(s.e2e_s, 0);
  EXPECT_DOUBLE_EQ(parse_slo("e2e:1500.5").e2e_s, 1.5005);
  EXPECT_FALSE(parse_slo("").any());
  for (const char* bad : {"ttft", "ttft:", "ttft:-1", "ttft:0", "latency:5", "ttft:5ms", "ttft:5,"})
    EXPECT_THROW(parse_slo(bad), Error) << bad;
}

TEST(BenchServe, PoissonArrivals) {
  auto none = poisson_arrivals(5, 0, 1);
  EXPECT_EQ(none, std::vector<double>(5, 0.0));
  const int n = 20000;
  auto t = poisson_arrivals(n, 50.0, 7);
  EXPECT_EQ(t, poisson_arrivals(n, 50.0, 7));  // seeded
  EXPECT_NE(t, poisson_arrivals(n, 50.0, 8));
  EXPECT_EQ(t[0], 0.0);
  double mean = 0, var = 0;
  for (int i = 1; i < n; ++i) {
    ASSERT_GE(t[i], t[i - 1]);
    mean += t[i] - t[i - 1];
  }
  mean /= n - 1;
  for (int i = 1; i < n; ++i) var += (t[i] - t[i - 1] - mean) * (t[i] - t[i - 1] - mean);
  var /= n - 2;
  // exponential gaps: mean 1/rate, standard deviation 1/rate (5 sigma of the estimate ~ 3.5%)
  EXPECT_NEAR(mean, 0.02, 0.02 * 0.04);
  EXPECT_NEAR(std::sqrt(var), 0.02, 0.02 * 0.06);
}

TEST(BenchServe, PercentilesAndGoodput) {
  Percentiles p = percentiles({0.4, 0.1, 0.3, 0.2, 0.5});
  EXPECT_DOUBLE_EQ(p.mean, 0.3);
  EXPECT_DOUBLE_EQ(p.p50, 0.3);
  EXPECT_NEAR(p.p90, 0.46, 1e-12);
  EXPECT_NEAR(p.p99, 0.496, 1e-12);
  EXPECT_EQ(percentiles({}).p99, 0);

  BenchReport rep;
  auto req = [](double ttft, double tpot, double lat, int toks) {
    BenchRequestResult r;
    r.ok = true;
    r.ttft_s = ttft;
    r.tpot_s = tpot;
    r.latency_s = lat;
    r.completion_tokens = toks;
    r.itl_s.assign(toks - 1, tpot);
    return r;
  };
  rep.results = {req(0.1, 0.02, 1.0, 10), req(0.5, 0.02, 1.2, 10), req(0.2, 0.08, 2.0, 10), BenchRequestResult{}};
  rep.results[3].error = "HTTP 500";
  rep.total_s = 4.0;
  rep.slo = parse_slo("ttft:300,tpot:50");
  summarize(rep);
  EXPECT_EQ(rep.ok, 3);
  EXPECT_EQ(rep.failed, 1);
  EXPECT_EQ(rep.good, 1);  // only the first meets both limits
  EXPECT_DOUBLE_EQ(rep.goodput_req_s, 0.25);
  EXPECT_DOUBLE_EQ(rep.request_throughput, 0.75);
  EXPECT_DOUBLE_EQ(rep.aggregate_tok_s, 7.5);
  EXPECT_EQ(rep.completion_tokens, 30);
  EXPECT_NEAR(rep.ttft.p50, 0.2, 1e-12);
  EXPECT_NEAR(rep.itl.mean, 0.04, 1e-12);
  auto j = rep.to_json();
  EXPECT_EQ(j["good_requests"], 1);
  EXPECT_NEAR(j["ttft"]["p50_ms"].get<double>(), 200, 1e-9);
  EXPECT_NEAR(j["slo"]["tpot_ms"].get<double>(), 50, 1e-9);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_NE(rep.to_text().find("goodput: 0.25 req/s (1 of 4"), std::string::npos) << rep.to_text();
}

// A run against the HTTP server on the fake backend: random-token prompts of exact lengths and
// output lengths from a range (ignore_eos), at a Poisson rate.
TEST(BenchServe, RandomPromptsAgainstTheServer) {
  EngineConfig ec;
  ec.max_num_seqs = 8;
  auto live = std::make_unique<httptest::Fixture>(ec);

  BenchOptions o;
  o.base_url = "http://127.0.0.1:" + std::to_string(live->port);
  o.model = "test-model";
  o.requests = 12;
  o.request_rate = 200;
  o.seed = 3;
  o.input_len = "20:40";
  o.output_len = "3:9";
  o.ignore_eos = true;
  o.goodput = "e2e:600000";
  BenchReport rep = run_bench(o);
  // the same requests one at a time give the same texts (the fake model is batch-invariant)
  BenchOptions one = o;
  one.request_rate = 0;
  one.concurrency = 1;
  BenchReport rep1 = run_bench(one);
  live.reset();  // server and engine stopped before the checks

  ASSERT_EQ(rep.ok, 12) << rep.to_text();
  EXPECT_EQ(rep.good, 12);
  EXPECT_EQ(rep.concurrency, 0);
  int64_t prompt = 0, out = 0;
  std::vector<int> lens;
  for (const auto& r : rep.results) {
    EXPECT_GE(r.prompt_tokens, 20);
    EXPECT_LE(r.prompt_tokens, 40);
    EXPECT_GE(r.max_tokens, 3);
    EXPECT_LE(r.max_tokens, 9);
    EXPECT_EQ(r.completion_tokens, r.max_tokens);  // ignore_eos: exactly what was asked
    EXPECT_LE(r.itl_s.size() + 1, size_t(r.completion_tokens));
    EXPECT_GT(r.tpot_s, 0);
    prompt += r.prompt_tokens;
    out += r.completion_tokens;
    lens.push_back(r.prompt_tokens);
  }
  EXPECT_EQ(rep.prompt_tokens, prompt);
  EXPECT_EQ(rep.completion_tokens, out);
  EXPECT_NE(*std::min_element(lens.begin(), lens.end()), *std::max_element(lens.begin(), lens.end()));
  EXPECT_GT(rep.itl.p50, 0);
  EXPECT_GE(rep.ttft.p99, rep.ttft.p50);
  // the sends follow the arrival schedule (after it, never before)
  auto arrivals = poisson_arrivals(12, 200, 3);
  for (int i = 0; i < 12; ++i) EXPECT_GE(rep.results[i].sent_s + 1e-6, arrivals[i]) << i;

  std::string outs = outputs_jsonl(rep);
  EXPECT_EQ(outs, outputs_jsonl(rep1));
  EXPECT_EQ(rep1.concurrency, 1);
  EXPECT_EQ(std::count(outs.begin(), outs.end(), '\n'), 12);
  EXPECT_NE(outs.find("\"request\":11"), std::string::npos);
  size_t with_text = 0;
  for (const auto& r : rep.results) with_text += !r.text.empty();
  EXPECT_GT(with_text, 6u);

  o.input_len = "0";
  EXPECT_THROW(run_bench(o), Error);
}

// A prompts file mixes text lines and token-id prompts ({"prompt": [ids]}, sent to
// /v1/completions as they are: a loop model's cycle, say); a bad id is an error, not text.
TEST(BenchServe, PromptsFileTakesTokenIds) {
  EngineConfig ec;
  ec.max_num_seqs = 4;
  auto live = std::make_unique<httptest::Fixture>(ec);
  const auto dir = std::filesystem::temp_directory_path() / ("gptoss-bench-prompts-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "prompts.jsonl").string();
  std::ofstream(file) << "{\"prompt\": [1000, 1001, 1002, 1003, 1000, 1001, 1002]}\n";
  BenchOptions o;
  o.base_url = "http://127.0.0.1:" + std::to_string(live->port);
  o.model = "test-model";
  o.requests = 3;
  o.concurrency = 1;
  o.prompts_file = file;
  o.output_len = "4";
  o.ignore_eos = true;
  BenchReport rep = run_bench(o);
  ASSERT_EQ(rep.ok, 3) << rep.to_text();
  for (const auto& r : rep.results) EXPECT_EQ(r.prompt_tokens, 7);
  std::ofstream(file) << "{\"prompt\": [1000, -1]}\n";
  EXPECT_THROW(run_bench(o), Error);
  live.reset();
  std::filesystem::remove_all(dir);
}

// --extra-body reaches the first request and every N-th after it (here it overrides max_tokens,
// which the response shows); anything but a JSON object is an error.
TEST(BenchServe, ExtraBodyEveryNthRequest) {
  EngineConfig ec;
  ec.max_num_seqs = 4;
  auto live = std::make_unique<httptest::Fixture>(ec);
  BenchOptions o;
  o.base_url = "http://127.0.0.1:" + std::to_string(live->port);
  o.model = "test-model";
  o.requests = 7;
  o.concurrency = 4;
  o.input_len = "12";
  o.output_len = "6";
  o.ignore_eos = true;
  o.extra_body = R"({"max_tokens": 2, "presence_penalty": 0.5})";
  o.extra_body_every = 3;
  BenchReport rep = run_bench(o);
  ASSERT_EQ(rep.ok, 7) << rep.to_text();
  for (int i = 0; i < 7; ++i) EXPECT_EQ(rep.results[size_t(i)].completion_tokens, i % 3 == 0 ? 2 : 6) << i;
  o.extra_body = "[1]";
  EXPECT_THROW(run_bench(o), Error);
  o.extra_body = "{";
  EXPECT_THROW(run_bench(o), Error);
  live.reset();
}

// ---------------------------------------------------------------------------- --depth report

TEST(BenchServeDepth, IntListsAndMeanStd) {
  EXPECT_EQ(parse_int_list("0,4096,16384", "--depth", 0), (std::vector<int>{0, 4096, 16384}));
  EXPECT_EQ(parse_int_list("32", "--tg", 1), (std::vector<int>{32}));
  for (const char* bad : {"", "1,", ",1", "a", "1;2", "-1", "1.5", "9999999999"})
    EXPECT_THROW(parse_int_list(bad, "--depth", 0), Error) << bad;
  EXPECT_THROW(parse_int_list("0", "--pp", 1), Error);
  MeanStd m = mean_std({2, 4, 4, 4, 5, 5, 7, 9});
  EXPECT_DOUBLE_EQ(m.mean, 5);
  EXPECT_DOUBLE_EQ(m.std, 2);  // population standard deviation
  EXPECT_EQ(m.n, 8);
}

// llama-benchy's arithmetic on known runs: pp t/s = prompt tokens / (ttfr - latency), tg t/s
// as measured, names "ppN @ dD"; a failed run counts in none of the means.
TEST(BenchServeDepth, RowsFromRuns) {
  DepthTest t;
  t.depth = 4096;
  t.pp = 2048;
  t.tg = 32;
  auto run = [](double ttfr, double tg, int prompt) {
    DepthRun r;
    r.ok = true;
    r.ttfr_s = ttfr;
    r.e2e_ttft_s = ttfr + 0.001;
    r.tg_tok_s = tg;
    r.prompt_tokens = prompt;
    r.completion_tokens = 32;
    return r;
  };
  t.runs = {run(0.50, 70, 6144), run(0.70, 90, 0)};  // the second: no usage, so depth + pp
  DepthRun failed;
  failed.error = "HTTP 400: too long";
  t.runs.push_back(failed);
  summarize_depth_test(t, 0.1);
  EXPECT_EQ(t.ok, 2);
  EXPECT_EQ(t.pp_name(), "pp2048 @ d4096");
  EXPECT_EQ(t.tg_name(), "tg32 @ d4096");
  EXPECT_DOUBLE_EQ(t.pp_tok_s.mean, (6144 / 0.4 + 6144 / 0.6) / 2);
  EXPECT_DOUBLE_EQ(t.tg_tok_s.mean, 80);
  EXPECT_DOUBLE_EQ(t.tg_tok_s.std, 10);
  EXPECT_NEAR(t.ttfr_ms.mean, 600, 1e-9);
  EXPECT_NEAR(t.est_ppt_ms.mean, 500, 1e-9);
  EXPECT_NEAR(t.e2e_ttft_ms.mean, 601, 1e-9);
  // a latency above the TTFR leaves no prompt time to divide by: no pp speed, not a negative one
  DepthTest u = t;
  summarize_depth_test(u, 0.6);
  EXPECT_EQ(u.pp_tok_s.n, 1);
  DepthTest z;
  z.pp = 512;
  z.tg = 8;
  EXPECT_EQ(z.pp_name(), "pp512");
  EXPECT_EQ(z.tg_name(), "tg8");

  DepthReport rep;
  rep.model = "gpt-oss-20b";
  rep.latency_mode = "api";
  rep.latency_s = 0.1;
  rep.tests = {z, t};
  rep.ok = 2;
  rep.failed = 1;
  std::string md = rep.to_markdown();
  EXPECT_NE(md.find("| model       |           test |"), std::string::npos) << md;
  EXPECT_NE(md.find("| gpt-oss-20b | pp2048 @ d4096 | 12800.00 ± 2560.00 |"), std::string::npos) << md;
  EXPECT_NE(md.find("|   tg32 @ d4096 |      80.00 ± 10.00 |"), std::string::npos) << md;
  EXPECT_NE(md.find("latency mode: api (100.00 ms)"), std::string::npos) << md;
  EXPECT_NE(md.find("first error: HTTP 400: too long"), std::string::npos) << md;
  nlohmann::json j = rep.to_json();
  EXPECT_EQ(j["tests"][1]["pp_test"], "pp2048 @ d4096");
  EXPECT_DOUBLE_EQ(j["tests"][1]["tg_tok_s"]["mean"].get<double>(), 80);
  EXPECT_EQ(j["tests"][1]["errors"][0], "HTTP 400: too long");
}

// Against the HTTP server on the fake backend: each (depth, pp, tg) runs `runs` requests whose
// prompts are exactly depth + pp tokens and whose outputs are exactly tg tokens, in
// llama-benchy's order (depth, then pp, then tg); every latency mode works.
TEST(BenchServeDepth, AgainstTheServer) {
  auto live = std::make_unique<httptest::Fixture>();  // four sequences at once

  BenchOptions o;
  o.base_url = "http://127.0.0.1:" + std::to_string(live->port);
  DepthBenchOptions d;
  d.depths = {0, 64, 200};
  d.pp = {16, 32};
  d.tg = {8};
  d.runs = 2;
  std::vector<DepthReport> reps;
  for (const char* mode : {"api", "generation", "none"}) {
    d.latency_mode = mode;
    reps.push_back(run_depth_bench(o, d));
  }
  // a test past the context: its runs fail with the server's message, the others still run
  DepthBenchOptions too_long = d;
  too_long.depths = {0, 600};
  too_long.pp = {16};
  too_long.runs = 1;
  DepthReport partial = run_depth_bench(o, too_long);
  d.latency_mode = "ping";
  EXPECT_THROW(run_depth_bench(o, d), Error);
  live.reset();  // server and engine stopped before the checks

  for (const auto& rep : reps) {
    SCOPED_TRACE(rep.latency_mode);
    EXPECT_EQ(rep.model, "test-model");  // asked of /v1/models when --model is not given
    EXPECT_EQ(rep.ok, 12);
    EXPECT_EQ(rep.failed, 0);
    if (rep.latency_mode == "none") {
      EXPECT_EQ(rep.latency_s, 0);
    } else {
      EXPECT_GT(rep.latency_s, 0);
    }
    ASSERT_EQ(rep.tests.size(), 6u);
    std::vector<std::string> names;
    for (const auto& t : rep.tests) {
      names.push_back(t.pp_name());
      ASSERT_EQ(t.runs.size(), 2u);
      EXPECT_EQ(t.ok, 2);
      for (const auto& r : t.runs) {
        EXPECT_EQ(r.prompt_tokens, t.depth + t.pp);
        EXPECT_EQ(r.completion_tokens, 8);  // ignore_eos: exactly tg
        EXPECT_GT(r.ttfr_s, 0);
        EXPECT_GE(r.e2e_ttft_s, r.ttfr_s);
        EXPECT_GT(r.tg_tok_s, 0);
      }
      EXPECT_EQ(t.tg_tok_s.n, 2);
      EXPECT_GT(t.tg_tok_s.mean, 0);
      EXPECT_EQ(t.ttfr_ms.n, 2);
    }
    EXPECT_EQ(names, (std::vector<std::string>{"pp16", "pp32", "pp16 @ d64", "pp32 @ d64", "pp16 @ d200", "pp32 @ d200"}));
    std::string md = rep.to_markdown();
    EXPECT_NE(md.find(" tg8 @ d200 |"), std::string::npos) << md;
    EXPECT_NE(md.find("| model      |"), std::string::npos) << md;  // the column as wide as its widest cell
    EXPECT_NE(md.find("\n| test-model | "), std::string::npos) << md;
    EXPECT_NE(md.find("latency mode: " + rep.latency_mode), std::string::npos) << md;
  }
  const DepthReport& none = reps[2];
  for (const auto& t : none.tests) EXPECT_EQ(t.pp_tok_s.n, 2);  // est_ppt = ttfr > 0
  EXPECT_EQ(partial.ok, 1);
  EXPECT_EQ(partial.failed, 1);
  ASSERT_EQ(partial.tests.size(), 2u);
  EXPECT_NE(partial.tests[1].runs[0].error.find("HTTP 400"), std::string::npos) << partial.tests[1].runs[0].error;
}
