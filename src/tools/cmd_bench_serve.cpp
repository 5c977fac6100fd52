// `gptoss bench-serve`: a load generator over streaming chat completions; with --depth,
// llama-benchy's pp/tg-at-depth report instead (server/bench_depth.h).
#include <cstdio>
#include <fstream>

#include "common/error.h"
#include "server/bench_depth.h"
#include "server/bench_serve.h"
#include "tools/command.h"
#include "tools/options.h"

namespace {
struct Args {
  gptoss::server::BenchOptions o;
  std::string json_out;
  std::string outputs_out;
  // the depth report
  gptoss::server::DepthBenchOptions d;
  std::string depth, pp = "2048", tg = "32";
};

// A CLI check from parse_int_list's own message.
CLI::Validator int_list(const std::string& what, int min) {
  return CLI::Validator(
      [what, min](std::string& s) {
        try {
          gptoss::server::parse_int_list(s, what, min);
          return std::string();
        } catch (const std::exception& e) {
          return std::string(e.what());
        }
      },
      "LIST");
}

gptoss::tools::RegisterCommand reg({"bench-serve", "Load-test an OpenAI-compatible server with streaming chat completions",
                                    [](CLI::App* app) {
  using namespace gptoss::tools;
  auto a = std::make_shared<Args>();
  app->add_option("--base-url", a->o.base_url, "Server URL, e.g. http://127.0.0.1:8000 (or .../v1)")->capture_default_str();
  app->add_option("--model", a->o.model, "Model name to request (default: none sent; the server's model)");
  app->add_option("--api-key", a->o.api_key, "Bearer token to send");
  auto* requests = app->add_option("--requests", a->o.requests, "Number of requests")->capture_default_str()->check(int_range(1));
  auto* concurrency = app->add_option("--concurrency", a->o.concurrency,
                                      "Requests in flight at most (default: 8; no limit with --request-rate)")
                          ->check(int_range(0));
  auto* rate = app->add_option("--request-rate", a->o.request_rate, "Requests a second, Poisson arrivals (default: all at once)")
                   ->check(positive_number(false));
  app->add_option("--seed", a->o.seed, "Seed of arrivals, lengths and random prompts")->capture_default_str()->check(seed_value());
  auto* max_tokens = add_max_tokens_option(app, a->o.max_tokens);
  auto* output_len = app->add_option("--output-len", a->o.output_len, "max_tokens per request: N or A:B (uniform; overrides --max-tokens)");
  auto* input_len = app->add_option("--input-len", a->o.input_len,
                                    "Random-token prompts of N or A:B (uniform) tokens, sent as ids to /v1/completions");
  auto* goodput = app->add_option("--goodput", a->o.goodput, "SLO for goodput in ms, e.g. ttft:300,tpot:50,e2e:5000");
  auto* extra_body = app->add_option("--extra-body", a->o.extra_body,
                                     "A JSON object whose fields are added to each request's body, e.g. '{\"presence_penalty\": 0.5}'");
  auto* extra_every = app->add_option("--extra-body-every", a->o.extra_body_every,
                                      "With --extra-body: only the first request and every N-th after it (mixed traffic)")
                          ->capture_default_str()
                          ->check(int_range(1))
                          ->needs(extra_body);
  auto* outputs = app->add_option("--outputs", a->outputs_out, "Write each request's text to this file (JSON lines, request order)");
  auto* prompts = app->add_option("--prompts", a->o.prompts_file, "File with one prompt a line: text, {\"prompt\": \"text\"} or {\"prompt\": [token ids]} (sent to /v1/completions as they are)");
  // llama-benchy's report: one request at a time, random-token prompts of depth + pp tokens.
  auto* depth = app->add_option("--depth", a->depth,
                                "llama-benchy's pp/tg report at these context depths, comma-separated (e.g. 0,4096,16384): "
                                "random-token prompts of depth + pp tokens, one request at a time")
                    ->check(int_list("--depth", 0));
  app->add_option("--pp", a->pp, "With --depth: prompt tokens after the depth, comma-separated")
      ->capture_default_str()
      ->check(int_list("--pp", 1))
      ->needs(depth);
  app->add_option("--tg", a->tg, "With --depth: generated tokens per request, comma-separated")
      ->capture_default_str()
      ->check(int_list("--tg", 1))
      ->needs(depth);
  app->add_option("--runs", a->d.runs, "Timed runs per test (after one warm-up)")
      ->capture_default_str()
      ->check(int_range(1))
      ->needs(depth);
  app->add_option("--latency-mode", a->d.latency_mode,
                  "With --depth: latency subtracted from TTFR for est_ppt: api (GET /v1/models), generation "
                  "(a 1-token request) or none")
      ->capture_default_str()
      ->check(one_of({"api", "generation", "none"}))
      ->needs(depth);
  app->add_flag("!--no-warmup", a->d.warmup, "With --depth: no warm-up request first")->needs(depth);
  for (CLI::Option* o : {requests, concurrency, rate, max_tokens, output_len, input_len, goodput, outputs, prompts,
                         extra_body, extra_every})
    depth->excludes(o);
  add_temperature_option(app, a->o.temperature);
  add_ignore_eos_option(app, a->o.ignore_eos);
  app->add_flag("!--no-token-timing", a->o.token_timing,
                "Do not request logprobs (then TTFT and decode rate count visible text chunks only)");
  app->add_option("--timeout", a->o.timeout_s, "Per-request timeout in seconds")->capture_default_str()->check(int_range(1));
  auto* json = add_json_option(app, a->json_out);
  return [a, json]() {
    const bool to_file = json->count() > 0 && !a->json_out.empty() && a->json_out != "-";
    const bool to_stdout = json->count() > 0 && !to_file;
    auto emit_json = [&](const std::string& j) {
      if (to_stdout) {
        std::fputs(j.c_str(), stdout);
      } else if (to_file) {
        std::ofstream f(a->json_out);
        f << j;
        if (!f) throw gptoss::Error("cannot write " + a->json_out);
      }
    };
    if (!a->depth.empty()) {
      a->d.depths = gptoss::server::parse_int_list(a->depth, "--depth", 0);
      a->d.pp = gptoss::server::parse_int_list(a->pp, "--pp", 1);
      a->d.tg = gptoss::server::parse_int_list(a->tg, "--tg", 1);
      auto rep = gptoss::server::run_depth_bench(a->o, a->d);
      std::fputs(rep.to_markdown().c_str(), to_stdout ? stderr : stdout);
      emit_json(rep.to_json().dump(2) + "\n");
      return rep.ok > 0 ? 0 : 1;
    }
    auto rep = gptoss::server::run_bench(a->o);
    if (!a->outputs_out.empty()) {
      std::ofstream f(a->outputs_out);
      if (!f) throw gptoss::Error("cannot write " + a->outputs_out);
      f << gptoss::server::outputs_jsonl(rep);
    }
    // With the JSON on stdout, the text report goes to stderr so stdout parses as JSON.
    std::fputs(rep.to_text().c_str(), to_stdout ? stderr : stdout);
    emit_json(rep.to_json().dump(2) + "\n");
    return rep.ok > 0 ? 0 : 1;
  };
}});
}  // namespace
