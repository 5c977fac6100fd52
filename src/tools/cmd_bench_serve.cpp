// `gptoss bench-serve`: a load generator over streaming chat completions.
#include <cstdio>
#include <fstream>

#include "common/error.h"
#include "server/bench_serve.h"
#include "tools/command.h"

namespace {
struct Args {
  gptoss::server::BenchOptions o;
  std::string json_out;
};

gptoss::tools::RegisterCommand reg({"bench-serve", "Load-test an OpenAI-compatible server with streaming chat completions",
                                    [](CLI::App* app) {
  auto a = std::make_shared<Args>();
  app->add_option("--base-url", a->o.base_url, "Server URL, e.g. http://127.0.0.1:8000 (or .../v1)")->capture_default_str();
  app->add_option("--model", a->o.model, "Model name to request");
  app->add_option("--api-key", a->o.api_key, "Bearer token");
  app->add_option("--requests", a->o.requests, "Number of requests")->capture_default_str();
  app->add_option("--concurrency", a->o.concurrency, "Requests in flight at once")->capture_default_str();
  app->add_option("--max-tokens", a->o.max_tokens, "max_tokens of each request")->capture_default_str();
  app->add_option("--prompts", a->o.prompts_file, "File with one prompt a line (text or {\"prompt\": ...})");
  app->add_option("--temperature", a->o.temperature, "Sampling temperature")->capture_default_str();
  app->add_flag("--ignore-eos", a->o.ignore_eos, "Ask the server to generate max_tokens tokens");
  app->add_flag("!--no-token-timing", a->o.token_timing,
                "Do not request logprobs (then TTFT and decode rate count visible text chunks only)");
  app->add_option("--timeout", a->o.timeout_s, "Per-request timeout in seconds")->capture_default_str();
  app->add_option("--json", a->json_out, "Also write the report as JSON to this file ('-' for stdout)");
  return [a]() {
    auto rep = gptoss::server::run_bench(a->o);
    std::fputs(rep.to_text().c_str(), stdout);
    if (!a->json_out.empty()) {
      std::string j = rep.to_json().dump(2) + "\n";
      if (a->json_out == "-") {
        std::fputs(j.c_str(), stdout);
      } else {
        std::ofstream f(a->json_out);
        if (!f) throw gptoss::Error("cannot write " + a->json_out);
        f << j;
      }
    }
    return rep.ok > 0 ? 0 : 1;
  };
}});
}  // namespace
