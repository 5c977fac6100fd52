#include "server/bench_serve.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/error.h"

namespace gptoss::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Url {
  std::string scheme_host_port;
  std::string prefix;  // e.g. "/v1"
};

Url parse_url(const std::string& u) {
  auto p = u.find("://");
  if (p == std::string::npos) throw Error("--base-url must look like http://HOST:PORT[/v1], got " + u);
  auto slash = u.find('/', p + 3);
  Url r;
  r.scheme_host_port = u.substr(0, slash);
  r.prefix = slash == std::string::npos ? "" : u.substr(slash);
  while (!r.prefix.empty() && r.prefix.back() == '/') r.prefix.pop_back();
  if (r.prefix.size() < 3 || r.prefix.compare(r.prefix.size() - 3, 3, "/v1") != 0) r.prefix += "/v1";
  return r;
}

std::vector<std::string> load_prompts(const std::string& path) {
  std::vector<std::string> out;
  if (path.empty()) {
    out = {"Explain how a transformer language model generates text, step by step.",
           "Write a short poem about the sea at night.",
           "What are the main differences between TCP and UDP?",
           "Give me three ideas for a weekend trip near the mountains.",
           "Summarize the plot of a detective story in five sentences.",
           "How do I reverse a linked list in C++? Show code.",
           "List five fruits and one fact about each.",
           "Why is the sky blue?"};
    return out;
  }
  std::ifstream f(path);
  if (!f) throw Error("cannot read prompts file " + path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    if (line[0] == '{') {
      try {
        json j = json::parse(line);
        if (j.contains("prompt") && j["prompt"].is_string()) {
          out.push_back(j["prompt"].get<std::string>());
          continue;
        }
      } catch (const std::exception&) {
      }
    }
    out.push_back(line);
  }
  if (out.empty()) throw Error("no prompts in " + path);
  return out;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double pos = q * double(v.size() - 1);
  size_t lo = size_t(pos);
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

BenchRequestResult one_request(const BenchOptions& o, const Url& url, const std::string& prompt) {
  BenchRequestResult r;
  httplib::Client cli(url.scheme_host_port);
  cli.set_connection_timeout(30, 0);
  cli.set_read_timeout(o.timeout_s, 0);
  cli.set_write_timeout(30, 0);
  json body = {{"messages", json::array({{{"role", "user"}, {"content", prompt}}})},
               {"max_tokens", o.max_tokens},
               {"temperature", o.temperature},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (!o.model.empty()) body["model"] = o.model;
  if (o.ignore_eos) body["ignore_eos"] = true;
  if (o.token_timing) body["logprobs"] = true;
  httplib::Request req;
  req.method = "POST";
  req.path = url.prefix + "/chat/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  if (!o.api_key.empty()) req.set_header("Authorization", "Bearer " + o.api_key);
  std::string buf;
  std::string err_body;
  bool got_first = false, done = false;
  Clock::time_point t0 = Clock::now(), first, last;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    size_t pos;
    while ((pos = buf.find("\n\n")) != std::string::npos) {
      std::string ev = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      std::string payload = ev.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      json j;
      try {
        j = json::parse(payload);
      } catch (const std::exception&) {
        err_body = "unparsable event: " + payload.substr(0, 200);
        continue;
      }
      if (j.contains("error")) {
        err_body = j["error"].value("message", "error");
        continue;
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        r.completion_tokens = j["usage"].value("completion_tokens", 0);
        r.prompt_tokens = j["usage"].value("prompt_tokens", 0);
      }
      if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
        const json& d = j["choices"][0].value("delta", json::object());
        bool has_tok = false;
        for (const char* k : {"content", "reasoning_content"})
          if (d.contains(k) && d[k].is_string() && !d[k].get<std::string>().empty()) has_tok = true;
        if (d.contains("tool_calls")) has_tok = true;
        const json& lp = j["choices"][0].value("logprobs", json());
        if (lp.is_object() && lp.contains("content") && lp["content"].is_array() && !lp["content"].empty()) has_tok = true;
        if (has_tok) {
          auto now = Clock::now();
          if (!got_first) {
            got_first = true;
            first = now;
          }
          last = now;
        }
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error e = httplib::Error::Success;
  bool ok = cli.send(req, res, e);
  auto t1 = Clock::now();
  r.latency_s = std::chrono::duration<double>(t1 - t0).count();
  if (!ok) {
    r.error = "HTTP error: " + httplib::to_string(e);
    return r;
  }
  if (res.status != 200) {
    r.error = "HTTP " + std::to_string(res.status) + " " + res.body.substr(0, 300);
    return r;
  }
  if (!err_body.empty()) {
    r.error = err_body;
    return r;
  }
  if (!done) {
    r.error = "stream ended without [DONE]";
    return r;
  }
  r.ok = true;
  if (!got_first) first = last = t1;
  r.ttft_s = std::chrono::duration<double>(first - t0).count();
  double span = std::chrono::duration<double>(last - first).count();
  if (r.completion_tokens >= 2 && span > 0) r.decode_tok_s = (r.completion_tokens - 1) / span;
  return r;
}

}  // namespace

BenchReport run_bench(const BenchOptions& o) {
  if (o.requests < 1 || o.concurrency < 1 || o.max_tokens < 1)
    throw Error("--requests, --concurrency and --max-tokens must be at least 1");
  Url url = parse_url(o.base_url);
  std::vector<std::string> prompts = load_prompts(o.prompts_file);
  BenchReport rep;
  rep.results.resize(o.requests);
  std::atomic<int> next{0};
  auto t0 = Clock::now();
  std::vector<std::thread> th;
  for (int c = 0; c < std::min(o.concurrency, o.requests); ++c)
    th.emplace_back([&] {
      for (int i; (i = next++) < o.requests;) rep.results[i] = one_request(o, url, prompts[i % prompts.size()]);
    });
  for (auto& t : th) t.join();
  rep.total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> ttft, dec;
  for (const auto& r : rep.results) {
    if (!r.ok) {
      ++rep.failed;
      continue;
    }
    ++rep.ok;
    ttft.push_back(r.ttft_s);
    if (r.decode_tok_s > 0) dec.push_back(r.decode_tok_s);
    rep.completion_tokens += r.completion_tokens;
    rep.prompt_tokens += r.prompt_tokens;
  }
  rep.ttft_median_s = quantile(ttft, 0.5);
  rep.ttft_p99_s = quantile(ttft, 0.99);
  rep.decode_tok_s_median = quantile(dec, 0.5);
  rep.aggregate_tok_s = rep.total_s > 0 ? double(rep.completion_tokens) / rep.total_s : 0;
  return rep;
}

json BenchReport::to_json() const {
  json errs = json::array();
  for (const auto& r : results)
    if (!r.ok && errs.size() < 10) errs.push_back(r.error);
  return {{"requests", int(results.size())},
          {"ok", ok},
          {"failed", failed},
          {"ttft_median_ms", ttft_median_s * 1e3},
          {"ttft_p99_ms", ttft_p99_s * 1e3},
          {"decode_tok_s_per_stream_median", decode_tok_s_median},
          {"aggregate_tok_s", aggregate_tok_s},
          {"total_s", total_s},
          {"completion_tokens", completion_tokens},
          {"prompt_tokens", prompt_tokens},
          {"errors", errs}};
}

std::string BenchReport::to_text() const {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "requests: %d ok, %d failed\n"
                "TTFT median: %.1f ms   p99: %.1f ms\n"
                "decode per stream (median): %.1f tok/s\n"
                "aggregate: %.1f tok/s (%lld completion tokens, %lld prompt tokens)\n"
                "total time: %.2f s\n",
                ok, failed, ttft_median_s * 1e3, ttft_p99_s * 1e3, decode_tok_s_median, aggregate_tok_s,
                (long long)completion_tokens, (long long)prompt_tokens, total_s);
  std::string s = buf;
  for (const auto& r : results)
    if (!r.ok) {
      s += "first error: " + r.error + "\n";
      break;
    }
  return s;
}

}  // namespace gptoss::server
