#include "server/bench_depth.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "common/error.h"

namespace gptoss::server {

using json = nlohmann::json;

std::vector<int> parse_int_list(const std::string& spec, const std::string& what, int min) {
  std::vector<int> out;
  auto bad = [&]() -> Error {
    return Error(what + " takes integers >= " + std::to_string(min) + " separated by commas (got \"" + spec + "\")");
  };
  size_t at = 0;
  while (at <= spec.size()) {
    size_t end = spec.find(',', at);
    if (end == std::string::npos) end = spec.size();
    std::string t = spec.substr(at, end - at);
    if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string::npos) throw bad();
    int v = std::stoi(t);
    if (v < min) throw bad();
    out.push_back(v);
    at = end + 1;
  }
  return out;
}

MeanStd mean_std(const std::vector<double>& v) {
  MeanStd m;
  m.n = int(v.size());
  if (v.empty()) return m;
  m.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  double ss = 0;
  for (double x : v) ss += (x - m.mean) * (x - m.mean);
  m.std = std::sqrt(ss / double(v.size()));
  return m;
}

std::string DepthTest::pp_name() const {
  return "pp" + std::to_string(pp) + (depth > 0 ? " @ d" + std::to_string(depth) : "");
}
std::string DepthTest::tg_name() const {
  return "tg" + std::to_string(tg) + (depth > 0 ? " @ d" + std::to_string(depth) : "");
}

void summarize_depth_test(DepthTest& t, double latency_s) {
  std::vector<double> pp, tg, ttfr, ppt, e2e;
  t.ok = 0;
  for (const auto& r : t.runs) {
    if (!r.ok) continue;
    ++t.ok;
    ttfr.push_back(r.ttfr_s * 1e3);
    e2e.push_back(r.e2e_ttft_s * 1e3);
    const double est = r.ttfr_s - latency_s;
    ppt.push_back(est * 1e3);
    // The server's count of prompt tokens when it reports one: exactly what it prefilled.
    const int prompt = r.prompt_tokens > 0 ? r.prompt_tokens : t.depth + t.pp;
    if (est > 0) pp.push_back(double(prompt) / est);
    if (r.tg_tok_s > 0) tg.push_back(r.tg_tok_s);
  }
  t.pp_tok_s = mean_std(pp);
  t.tg_tok_s = mean_std(tg);
  t.ttfr_ms = mean_std(ttfr);
  t.est_ppt_ms = mean_std(ppt);
  t.e2e_ttft_ms = mean_std(e2e);
}

namespace {

DepthRun measure(const BenchOptions& o, const std::vector<int32_t>& prompt, int max_tokens) {
  BenchRequestResult r = send_completion(o, prompt, max_tokens);
  DepthRun d;
  d.ok = r.ok;
  d.error = r.error;
  d.prompt_tokens = r.prompt_tokens;
  d.completion_tokens = r.completion_tokens;
  d.ttfr_s = r.ttfr_s;
  d.e2e_ttft_s = r.ttft_s;
  d.tg_tok_s = r.decode_tok_s;
  return d;
}

// llama-benchy's latency estimate: the mean of three measurements.
double estimate_latency(const BenchOptions& o, const std::string& mode, std::mt19937_64& rng) {
  if (mode == "none") return 0;
  double sum = 0;
  for (int i = 0; i < 3; ++i) {
    if (mode == "api") {
      sum += time_models_request(o);
    } else {
      DepthRun r = measure(o, random_prompt_tokens(1, rng), 1);
      if (!r.ok) throw Error("latency measurement (a 1-token request) failed: " + r.error);
      sum += r.ttfr_s;
    }
  }
  return sum / 3;
}

json mean_std_json(const MeanStd& m) { return {{"mean", m.mean}, {"std", m.std}, {"n", m.n}}; }

std::string cell(const MeanStd& m) {
  if (m.n == 0) return "";
  char b[64];
  std::snprintf(b, sizeof b, "%.2f ± %.2f", m.mean, m.std);
  return b;
}

}  // namespace

DepthReport run_depth_bench(const BenchOptions& o_in, const DepthBenchOptions& d) {
  if (d.depths.empty() || d.pp.empty() || d.tg.empty()) throw Error("--depth, --pp and --tg need at least one value");
  if (d.runs < 1) throw Error("--runs must be at least 1");
  if (d.latency_mode != "api" && d.latency_mode != "generation" && d.latency_mode != "none")
    throw Error("--latency-mode must be api, generation or none (got \"" + d.latency_mode + "\")");
  BenchOptions o = o_in;
  o.ignore_eos = true;  // exactly tg tokens, whatever the model writes
  check_server_reachable(o);
  std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull + 7);
  DepthReport rep;
  rep.latency_mode = d.latency_mode;
  std::string served;
  time_models_request(o, &served);
  rep.model = !o.model.empty() ? o.model : !served.empty() ? served : "-";
  if (d.warmup) (void)measure(o, random_prompt_tokens(16, rng), 4);
  rep.latency_s = estimate_latency(o, d.latency_mode, rng);
  // llama-benchy's order: depth, then pp, then tg.
  for (int depth : d.depths)
    for (int pp : d.pp)
      for (int tg : d.tg) {
        DepthTest t;
        t.depth = depth;
        t.pp = pp;
        t.tg = tg;
        for (int i = 0; i < d.runs; ++i) {
          // A fresh random prompt each run: no prefix of it is in the server's cache.
          DepthRun r = measure(o, random_prompt_tokens(depth + pp, rng), tg);
          r.ok ? ++rep.ok : ++rep.failed;
          t.runs.push_back(std::move(r));
        }
        summarize_depth_test(t, rep.latency_s);
        rep.tests.push_back(std::move(t));
      }
  return rep;
}

json DepthReport::to_json() const {
  json tests_j = json::array();
  for (const auto& t : tests) {
    json errs = json::array();
    for (const auto& r : t.runs)
      if (!r.ok && errs.size() < 3) errs.push_back(r.error);
    tests_j.push_back({{"depth", t.depth},
                       {"pp", t.pp},
                       {"tg", t.tg},
                       {"runs", int(t.runs.size())},
                       {"ok", t.ok},
                       {"pp_test", t.pp_name()},
                       {"tg_test", t.tg_name()},
                       {"pp_tok_s", mean_std_json(t.pp_tok_s)},
                       {"tg_tok_s", mean_std_json(t.tg_tok_s)},
                       {"ttfr_ms", mean_std_json(t.ttfr_ms)},
                       {"est_ppt_ms", mean_std_json(t.est_ppt_ms)},
                       {"e2e_ttft_ms", mean_std_json(t.e2e_ttft_ms)},
                       {"errors", errs}});
  }
  return {{"model", model},   {"latency_mode", latency_mode}, {"latency_ms", latency_s * 1e3},
          {"ok", ok},         {"failed", failed},             {"tests", tests_j}};
}

std::string DepthReport::to_markdown() const {
  std::vector<std::vector<std::string>> rows = {
      {"model", "test", "t/s", "ttfr (ms)", "est_ppt (ms)", "e2e_ttft (ms)"}};
  for (const auto& t : tests) {
    rows.push_back({model, t.pp_name(), cell(t.pp_tok_s), cell(t.ttfr_ms), cell(t.est_ppt_ms), cell(t.e2e_ttft_ms)});
    rows.push_back({model, t.tg_name(), cell(t.tg_tok_s), "", "", ""});
  }
  std::vector<size_t> w(rows[0].size(), 0);
  // "±" is two bytes and one column: count code points, not bytes.
  auto width = [](const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], width(r[i]));
  std::string out;
  auto line = [&](const std::vector<std::string>& r) {
    out += "|";
    for (size_t i = 0; i < r.size(); ++i) {
      const std::string pad(w[i] - width(r[i]), ' ');
      out += ' ';  // the model left, figures right
      out += i == 0 ? r[i] : pad;
      out += i == 0 ? pad : r[i];
      out += " |";
    }
    out += "\n";
  };
  line(rows[0]);
  out += "|:" + std::string(w[0], '-') + "-|";
  for (size_t i = 1; i < w.size(); ++i) out += std::string(w[i] + 1, '-') + ":|";
  out += "\n";
  for (size_t i = 1; i < rows.size(); ++i) line(rows[i]);
  char b[160];
  std::snprintf(b, sizeof b, "\ngptoss bench-serve (llama-benchy's pp/tg at depth) | latency mode: %s (%.2f ms)\n",
                latency_mode.c_str(), latency_s * 1e3);
  out += b;
  for (const auto& t : tests)
    for (const auto& r : t.runs)
      if (!r.ok) {
        out += "first error: " + r.error + "\n";
        return out;
      }
  return out;
}

}  // namespace gptoss::server
