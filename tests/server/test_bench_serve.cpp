// bench-serve's parts (length ranges, SLO, Poisson arrivals, percentiles, goodput) and a run
// against the server over the fake backend: exact prompt lengths, output lengths in range.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "common/error.h"
#include "fake_backend.h"
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
  static const Tokenizer tok = Tokenizer::o200k_harmony();
  gptoss::testing::FakeBackend backend{201088, 16};
  EngineConfig ec;
  ec.max_num_seqs = 8;
  ec.max_model_len = 512;
  ec.kv_cache_tokens = 16384;
  ec.stop_token_ids = default_stop_tokens(tok, backend.config());
  ec.token_text = token_text_fn(tok);
  Engine engine(backend, ec);
  engine.start();
  ServerOptions so;
  so.port = 0;
  so.served_model_name = "m";
  Server server(engine, tok, so);
  server.bind();
  std::thread th([&] { server.run(); });

  BenchOptions o;
  o.base_url = "http://127.0.0.1:" + std::to_string(server.port());
  o.model = "m";
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
  server.shutdown();
  th.join();
  engine.stop();

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
