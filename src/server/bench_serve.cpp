#include "server/bench_serve.h"

#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <variant>

#include "common/error.h"

namespace gptoss::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Url {
  std::string scheme_host_port;
  std::string prefix;  // e.g. "/v1"
  std::string host;    // for messages and the connection probe
  int port = 80;
  std::string host_port() const { return host + ":" + std::to_string(port); }
};

// Empty when a TCP connection to host:port opens, else why not ("connection refused", ...).
std::string tcp_connect_error(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    return std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
  std::string err = "cannot connect";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    int e = errno;
    ::close(fd);
    if (rc == 0) {
      err.clear();
      break;
    }
    err = e == ECONNREFUSED ? "connection refused" : std::strerror(e);
  }
  freeaddrinfo(res);
  return err;
}

// The server's message from an OpenAI-style error body ({"error": {"message": ...}}), else the
// start of the body.
std::string error_body_message(const std::string& body) {
  try {
    json j = json::parse(body);
    if (j.is_object() && j.contains("error")) {
      const json& e = j["error"];
      if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
      if (e.is_string()) return e.get<std::string>();
    }
  } catch (const std::exception&) {
  }
  return body.substr(0, 300);
}

Url parse_url(const std::string& u) {
  auto p = u.find("://");
  if (p == std::string::npos) throw Error("--base-url must look like http://HOST:PORT[/v1], got " + u);
  auto slash = u.find('/', p + 3);
  Url r;
  r.scheme_host_port = u.substr(0, slash);
  r.prefix = slash == std::string::npos ? "" : u.substr(slash);
  std::string scheme = u.substr(0, p), hp = r.scheme_host_port.substr(p + 3);
  r.port = scheme == "https" ? 443 : 80;
  size_t colon = hp.rfind(':');
  if (colon != std::string::npos && hp.find(']', colon) == std::string::npos) {
    try {
      r.port = std::stoi(hp.substr(colon + 1));
    } catch (const std::exception&) {
      throw Error("--base-url: bad port in " + u);
    }
    hp = hp.substr(0, colon);
  }
  if (hp.size() > 2 && hp.front() == '[' && hp.back() == ']') hp = hp.substr(1, hp.size() - 2);
  r.host = hp;
  while (!r.prefix.empty() && r.prefix.back() == '/') r.prefix.pop_back();
  if (r.prefix.size() < 3 || r.prefix.compare(r.prefix.size() - 3, 3, "/v1") != 0) r.prefix += "/v1";
  return r;
}

// A prompts file's line: text (a chat prompt), or {"prompt": "text"}, or {"prompt": [token ids]}
// (sent to /v1/completions as they are: exact token prompts such as a loop model's cycle).
using PromptText = std::variant<std::string, std::vector<int32_t>>;

std::vector<PromptText> load_prompts(const std::string& path) {
  std::vector<PromptText> out;
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
      json j;
      try {
        j = json::parse(line);
      } catch (const std::exception&) {
        j = nullptr;  // not JSON: the line is the prompt's text
      }
      if (j.is_object() && j.contains("prompt")) {
        const json& p = j["prompt"];
        if (p.is_string()) {
          out.push_back(p.get<std::string>());
          continue;
        }
        if (p.is_array() && !p.empty()) {
          std::vector<int32_t> ids;
          for (const auto& v : p) {
            if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
              throw Error("prompts file " + path + ": a token-id prompt holds integers from 0 to 2^31 - 1: " + line);
            ids.push_back(int32_t(v.get<int64_t>()));
          }
          out.push_back(std::move(ids));
          continue;
        }
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

// What one request sends: a chat prompt, or token ids for /v1/completions.
struct RequestSpec {
  std::variant<std::string, std::vector<int32_t>> prompt;
  int max_tokens = 0;
  json extra;  // fields added to the body (BenchOptions::extra_body), or null
};

BenchRequestResult one_request(const BenchOptions& o, const Url& url, const RequestSpec& spec) {
  BenchRequestResult r;
  r.max_tokens = spec.max_tokens;
  httplib::Client cli(url.scheme_host_port);
  cli.set_connection_timeout(30, 0);
  cli.set_read_timeout(o.timeout_s, 0);
  cli.set_write_timeout(30, 0);
  const bool chat = std::holds_alternative<std::string>(spec.prompt);
  // Per-chunk usage counts the tokens each chunk carries, whatever text they decode to.
  json body = {{"max_tokens", spec.max_tokens},
               {"temperature", o.temperature},
               {"stream", true},
               {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}};
  if (chat) {
    body["messages"] = json::array({{{"role", "user"}, {"content", std::get<std::string>(spec.prompt)}}});
    if (o.token_timing) body["logprobs"] = true;
  } else {
    body["prompt"] = std::get<std::vector<int32_t>>(spec.prompt);
  }
  if (!o.model.empty()) body["model"] = o.model;
  if (o.ignore_eos) body["ignore_eos"] = true;
  if (spec.extra.is_object()) body.update(spec.extra);
  httplib::Request req;
  req.method = "POST";
  req.path = url.prefix + (chat ? "/chat/completions" : "/completions");
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  if (!o.api_key.empty()) req.set_header("Authorization", "Bearer " + o.api_key);
  std::string buf;
  std::string err_body;
  bool got_first = false, got_chunk = false, done = false;
  int tokens_seen = 0;
  Clock::time_point t0 = Clock::now(), first, last, first_chunk;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (!got_chunk) {
      got_chunk = true;
      first_chunk = Clock::now();
    }
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
      bool has_tok = false;
      if (j.contains("usage") && j["usage"].is_object()) {
        r.completion_tokens = j["usage"].value("completion_tokens", 0);
        r.prompt_tokens = j["usage"].value("prompt_tokens", 0);
        if (r.completion_tokens > tokens_seen) has_tok = true;
        tokens_seen = std::max(tokens_seen, r.completion_tokens);
      }
      if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
        const json& c = j["choices"][0];
        const json& d = c.value("delta", json::object());
        for (const char* k : {"content", "reasoning_content"})
          if (d.contains(k) && d[k].is_string() && !d[k].get<std::string>().empty()) has_tok = true;
        if (d.contains("content") && d["content"].is_string()) r.text += d["content"].get<std::string>();
        if (d.contains("tool_calls")) has_tok = true;
        if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty()) {
          has_tok = true;
          r.text += c["text"].get<std::string>();
        }
        const json& lp = c.value("logprobs", json());
        if (lp.is_object() && lp.contains("content") && lp["content"].is_array() && !lp["content"].empty()) has_tok = true;
      }
      if (has_tok) {
        auto now = Clock::now();
        if (!got_first) {
          got_first = true;
          first = now;
        } else {
          r.itl_s.push_back(std::chrono::duration<double>(now - last).count());
        }
        last = now;
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
    if (e == httplib::Error::Connection) {
      std::string why = tcp_connect_error(url.host, url.port);
      r.error = (why.empty() ? std::string("connection failed") : why) + " to " + url.host_port();
    } else {
      r.error = "HTTP error: " + httplib::to_string(e) + " (" + url.host_port() + ")";
    }
    return r;
  }
  if (res.status != 200) {
    // The streamed body went to content_receiver: an error body is there, in `buf`.
    std::string body = res.body.empty() ? buf : res.body;
    r.error = "HTTP " + std::to_string(res.status) + ": " + error_body_message(body);
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
  r.ttfr_s = got_chunk ? std::chrono::duration<double>(first_chunk - t0).count() : r.ttft_s;
  double span = std::chrono::duration<double>(last - first).count();
  if (r.completion_tokens >= 2 && span > 0) {
    r.decode_tok_s = (r.completion_tokens - 1) / span;
    r.tpot_s = span / (r.completion_tokens - 1);
  }
  return r;
}

// Random token ids for exact-length prompts: ordinary BPE tokens of any gpt-oss vocabulary.
constexpr int32_t kRandomTokenLo = 1000, kRandomTokenHi = 50000;

std::vector<RequestSpec> make_specs(const BenchOptions& o) {
  std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull + 1);
  auto draw = [&](const LengthRange& r) { return r.fixed() ? r.lo : std::uniform_int_distribution<int>(r.lo, r.hi)(rng); };
  LengthRange out = o.output_len.empty() ? LengthRange{o.max_tokens, o.max_tokens} : parse_length_range(o.output_len, "--output-len");
  std::vector<RequestSpec> specs(o.requests);
  if (o.input_len.empty()) {
    std::vector<PromptText> prompts = load_prompts(o.prompts_file);
    for (int i = 0; i < o.requests; ++i) specs[i].prompt = prompts[i % prompts.size()];
  } else {
    LengthRange in = parse_length_range(o.input_len, "--input-len");
    std::uniform_int_distribution<int32_t> id(kRandomTokenLo, kRandomTokenHi - 1);
    for (int i = 0; i < o.requests; ++i) {
      std::vector<int32_t> ids(draw(in));
      for (auto& t : ids) t = id(rng);
      specs[i].prompt = std::move(ids);
    }
  }
  for (auto& s : specs) s.max_tokens = draw(out);
  if (!o.extra_body.empty()) {
    json extra = json::parse(o.extra_body, nullptr, false);
    if (!extra.is_object()) throw Error("--extra-body: not a JSON object: " + o.extra_body);
    if (o.extra_body_every < 1) throw Error("--extra-body-every: must be at least 1");
    for (int i = 0; i < o.requests; i += o.extra_body_every) specs[size_t(i)].extra = extra;
  }
  return specs;
}

}  // namespace

void check_server_reachable(const BenchOptions& o) {
  Url url = parse_url(o.base_url);
  // A server that is not there is one clear error, not N failed requests.
  if (std::string why = tcp_connect_error(url.host, url.port); !why.empty())
    throw Error(why + " to " + url.host_port() + " (is the server running?)");
}

BenchRequestResult send_completion(const BenchOptions& o, const std::vector<int32_t>& prompt, int max_tokens) {
  RequestSpec spec;
  spec.prompt = prompt;
  spec.max_tokens = max_tokens;
  return one_request(o, parse_url(o.base_url), spec);
}

double time_models_request(const BenchOptions& o, std::string* first_model) {
  Url url = parse_url(o.base_url);
  httplib::Client cli(url.scheme_host_port);
  cli.set_connection_timeout(30, 0);
  cli.set_read_timeout(o.timeout_s, 0);
  httplib::Headers h;
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  auto t0 = Clock::now();
  auto res = cli.Get(url.prefix + "/models", h);
  double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!res) throw Error("GET " + url.prefix + "/models failed: " + httplib::to_string(res.error()));
  if (res->status != 200)
    throw Error("GET " + url.prefix + "/models: HTTP " + std::to_string(res->status) + ": " + error_body_message(res->body));
  if (first_model) {
    try {
      json j = json::parse(res->body);
      if (j.contains("data") && j["data"].is_array() && !j["data"].empty() && j["data"][0].contains("id"))
        *first_model = j["data"][0]["id"].get<std::string>();
    } catch (const std::exception&) {
    }
  }
  return dt;
}

std::vector<int32_t> random_prompt_tokens(int n, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> id(kRandomTokenLo, kRandomTokenHi - 1);
  std::vector<int32_t> ids(std::max(0, n));
  for (auto& t : ids) t = id(rng);
  return ids;
}

LengthRange parse_length_range(const std::string& spec, const std::string& what) {
  auto bad = [&]() -> Error {
    return Error(what + " must be N or A:B with 1 <= A <= B (got \"" + spec + "\")");
  };
  auto num = [&](const std::string& t) {
    if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string::npos) throw bad();
    return std::stoi(t);
  };
  LengthRange r;
  size_t colon = spec.find(':');
  if (colon == std::string::npos) {
    r.lo = r.hi = num(spec);
  } else {
    r.lo = num(spec.substr(0, colon));
    r.hi = num(spec.substr(colon + 1));
  }
  if (r.lo < 1 || r.hi < r.lo) throw bad();
  return r;
}

Slo parse_slo(const std::string& spec) {
  Slo s;
  if (spec.empty()) return s;
  size_t at = 0;
  while (at <= spec.size()) {
    size_t end = spec.find(',', at);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(at, end - at);
    size_t colon = item.find(':');
    std::string key = item.substr(0, colon);
    double ms = 0;
    bool ok = colon != std::string::npos;
    if (ok) {
      try {
        size_t used = 0;
        ms = std::stod(item.substr(colon + 1), &used);
        ok = used == item.size() - colon - 1 && ms > 0;
      } catch (const std::exception&) {
        ok = false;
      }
    }
    double* slot = key == "ttft" ? &s.ttft_s : key == "tpot" ? &s.tpot_s : key == "e2e" ? &s.e2e_s : nullptr;
    if (!ok || !slot)
      throw Error("--goodput takes METRIC:MS pairs separated by commas, METRIC one of ttft, tpot, e2e and MS > 0 (got \"" +
                  item + "\")");
    *slot = ms / 1e3;
    at = end + 1;
  }
  return s;
}

std::vector<double> poisson_arrivals(int n, double rate, uint64_t seed) {
  std::vector<double> t(std::max(0, n), 0.0);
  if (rate <= 0) return t;
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  for (int i = 1; i < n; ++i) t[i] = t[i - 1] + gap(rng);
  return t;
}

Percentiles percentiles(const std::vector<double>& v) {
  Percentiles p;
  if (v.empty()) return p;
  p.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  p.p50 = quantile(v, 0.5);
  p.p90 = quantile(v, 0.9);
  p.p99 = quantile(v, 0.99);
  return p;
}

json Percentiles::to_json_ms() const {
  return {{"mean_ms", mean * 1e3}, {"p50_ms", p50 * 1e3}, {"p90_ms", p90 * 1e3}, {"p99_ms", p99 * 1e3}};
}

void summarize(BenchReport& rep) {
  rep.ok = rep.failed = rep.good = 0;
  rep.completion_tokens = rep.prompt_tokens = 0;
  std::vector<double> ttft, tpot, itl, e2e, dec;
  for (const auto& r : rep.results) {
    if (!r.ok) {
      ++rep.failed;
      continue;
    }
    ++rep.ok;
    ttft.push_back(r.ttft_s);
    if (r.tpot_s > 0) tpot.push_back(r.tpot_s);
    if (r.decode_tok_s > 0) dec.push_back(r.decode_tok_s);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    e2e.push_back(r.latency_s);
    rep.completion_tokens += r.completion_tokens;
    rep.prompt_tokens += r.prompt_tokens;
    const Slo& s = rep.slo;
    if ((s.ttft_s <= 0 || r.ttft_s <= s.ttft_s) && (s.tpot_s <= 0 || r.tpot_s <= s.tpot_s) &&
        (s.e2e_s <= 0 || r.latency_s <= s.e2e_s))
      ++rep.good;
  }
  rep.ttft = percentiles(ttft);
  rep.tpot = percentiles(tpot);
  rep.itl = percentiles(itl);
  rep.e2e = percentiles(e2e);
  rep.ttft_median_s = rep.ttft.p50;
  rep.ttft_p99_s = rep.ttft.p99;
  rep.decode_tok_s_median = quantile(dec, 0.5);
  const double t = rep.total_s;
  rep.aggregate_tok_s = t > 0 ? double(rep.completion_tokens) / t : 0;
  rep.input_tok_s = t > 0 ? double(rep.prompt_tokens) / t : 0;
  rep.request_throughput = t > 0 ? rep.ok / t : 0;
  rep.goodput_req_s = t > 0 ? rep.good / t : 0;
}

BenchReport run_bench(const BenchOptions& o) {
  if (o.requests < 1 || o.concurrency < 0 || o.max_tokens < 1)
    throw Error("--requests and --max-tokens must be at least 1, --concurrency at least 0");
  if (!(o.request_rate >= 0)) throw Error("--request-rate must be positive (or 0: all at once)");
  if (!o.input_len.empty() && !o.prompts_file.empty())
    throw Error("--input-len makes random-token prompts; it cannot be combined with --prompts");
  Url url = parse_url(o.base_url);
  check_server_reachable(o);
  BenchReport rep;
  rep.slo = parse_slo(o.goodput);
  const std::vector<RequestSpec> specs = make_specs(o);
  const std::vector<double> arrivals = poisson_arrivals(o.requests, o.request_rate, o.seed);
  rep.request_rate = o.request_rate;
  rep.concurrency = o.concurrency > 0 ? o.concurrency : o.request_rate > 0 ? 0 : 8;
  rep.results.resize(o.requests);
  // Requests start at their arrival time once fewer than `concurrency` are in flight.
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  // The server's speculative-decoding counters around the run: the acceptance rate.
  auto spec_counters = [&](double out[4]) {
    out[0] = out[1] = out[2] = out[3] = -1;
    httplib::Client cli(url.scheme_host_port);
    cli.set_connection_timeout(5, 0);
    cli.set_read_timeout(10, 0);
    httplib::Headers h;
    if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
    auto res = cli.Get("/metrics", h);
    if (!res || res->status != 200) return;
    // "NAME{labels} VALUE" or "NAME VALUE" on a line of its own
    const char* names[4] = {"gptoss:spec_decode_num_draft_tokens_total", "gptoss:spec_decode_num_accepted_tokens_total",
                            "gptoss:spec_decode_draft_seconds_total", "gptoss:spec_decode_num_gated_tokens_total"};
    for (int k = 0; k < 4; ++k) {
      const std::string key = std::string("\n") + names[k];
      for (size_t at = res->body.find(key); at != std::string::npos; at = res->body.find(key, at + 1)) {
        const char c = res->body[at + key.size()];
        if (c != ' ' && c != '{') continue;
        const size_t sp = res->body.find(' ', at + key.size());
        if (sp != std::string::npos) out[k] = std::atof(res->body.c_str() + sp + 1);
        break;
      }
    }
  };
  double spec_before[4];
  spec_counters(spec_before);
  auto t0 = Clock::now();
  std::vector<std::thread> th;
  th.reserve(o.requests);
  for (int i = 0; i < o.requests; ++i) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrivals[i])));
    {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return rep.concurrency == 0 || in_flight < rep.concurrency; });
      ++in_flight;
    }
    th.emplace_back([&, i] {
      double sent = std::chrono::duration<double>(Clock::now() - t0).count();
      BenchRequestResult r = one_request(o, url, specs[i]);
      r.sent_s = sent;
      rep.results[i] = std::move(r);
      {
        std::lock_guard<std::mutex> l(mu);
        --in_flight;
      }
      cv.notify_all();
    });
  }
  for (auto& t : th) t.join();
  rep.total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  double spec_after[4];
  spec_counters(spec_after);
  if (spec_before[0] >= 0 && spec_after[0] >= 0 && spec_before[1] >= 0 && spec_after[1] >= 0) {
    rep.spec_draft_tokens = int64_t(spec_after[0] - spec_before[0]);
    rep.spec_accepted_tokens = int64_t(spec_after[1] - spec_before[1]);
  }
  if (spec_before[2] >= 0 && spec_after[2] >= 0) rep.spec_draft_s = spec_after[2] - spec_before[2];
  if (spec_before[3] >= 0 && spec_after[3] >= 0) rep.spec_gated_tokens = int64_t(spec_after[3] - spec_before[3]);
  summarize(rep);
  return rep;
}

std::string outputs_jsonl(const BenchReport& rep) {
  std::string out;
  for (size_t i = 0; i < rep.results.size(); ++i) {
    const auto& r = rep.results[i];
    out += json{{"request", i}, {"ok", r.ok}, {"completion_tokens", r.completion_tokens}, {"text", r.text}}.dump(
               -1, ' ', false, json::error_handler_t::replace) +
           "\n";
  }
  return out;
}

json BenchReport::to_json() const {
  json errs = json::array();
  for (const auto& r : results)
    if (!r.ok && errs.size() < 10) errs.push_back(r.error);
  json j = {{"requests", int(results.size())},
            {"ok", ok},
            {"failed", failed},
            {"request_rate", request_rate},
            {"concurrency", concurrency},
            {"ttft_median_ms", ttft_median_s * 1e3},
            {"ttft_p99_ms", ttft_p99_s * 1e3},
            {"decode_tok_s_per_stream_median", decode_tok_s_median},
            {"aggregate_tok_s", aggregate_tok_s},
            {"input_tok_s", input_tok_s},
            {"request_throughput", request_throughput},
            {"total_s", total_s},
            {"completion_tokens", completion_tokens},
            {"prompt_tokens", prompt_tokens},
            {"ttft", ttft.to_json_ms()},
            {"tpot", tpot.to_json_ms()},
            {"itl", itl.to_json_ms()},
            {"e2e_latency", e2e.to_json_ms()},
            {"errors", errs}};
  if (spec_draft_tokens > 0)
    j["spec_decode"] = {{"draft_tokens", spec_draft_tokens},
                        {"accepted_tokens", spec_accepted_tokens},
                        {"acceptance_rate", double(spec_accepted_tokens) / double(spec_draft_tokens)}};
  if (spec_gated_tokens > 0) j["spec_decode"]["gated_tokens"] = spec_gated_tokens;
  if (spec_draft_tokens > 0 && spec_draft_s >= 0) {
    j["spec_decode"]["draft_seconds"] = spec_draft_s;
    j["spec_decode"]["draft_ms_per_draft_token"] = spec_draft_s * 1e3 / double(spec_draft_tokens);
  }
  if (slo.any()) {
    json s = json::object();
    if (slo.ttft_s > 0) s["ttft_ms"] = slo.ttft_s * 1e3;
    if (slo.tpot_s > 0) s["tpot_ms"] = slo.tpot_s * 1e3;
    if (slo.e2e_s > 0) s["e2e_ms"] = slo.e2e_s * 1e3;
    j["slo"] = s;
    j["good_requests"] = good;
    j["goodput_req_s"] = goodput_req_s;
  }
  return j;
}

namespace {
std::string rate_text(double rate) {
  char b[64];
  std::snprintf(b, sizeof b, "Poisson arrivals at %g req/s", rate);
  return b;
}
}  // namespace

std::string BenchReport::to_text() const {
  char buf[1024];
  std::string s;
  std::snprintf(buf, sizeof buf, "requests: %d ok, %d failed (%s, %s)\n", ok, failed,
                request_rate > 0 ? rate_text(request_rate).c_str() : "all at once",
                concurrency > 0 ? ("at most " + std::to_string(concurrency) + " in flight").c_str() : "no concurrency limit");
  s += buf;
  auto line = [&](const char* name, const Percentiles& p) {
    std::snprintf(buf, sizeof buf, "%-5s ms   mean %8.1f   p50 %8.1f   p90 %8.1f   p99 %8.1f\n", name, p.mean * 1e3,
                  p.p50 * 1e3, p.p90 * 1e3, p.p99 * 1e3);
    s += buf;
  };
  line("TTFT", ttft);
  line("TPOT", tpot);
  line("ITL", itl);
  line("E2E", e2e);
  std::snprintf(buf, sizeof buf,
                "decode per stream (median): %.1f tok/s\n"
                "aggregate: %.1f tok/s output, %.1f tok/s prompt, %.2f req/s (%lld completion tokens, %lld prompt tokens)\n"
                "total time: %.2f s\n",
                decode_tok_s_median, aggregate_tok_s, input_tok_s, request_throughput, (long long)completion_tokens,
                (long long)prompt_tokens, total_s);
  s += buf;
  if (spec_draft_tokens > 0) {
    std::snprintf(buf, sizeof buf, "speculative decoding: %lld draft tokens, %lld accepted (acceptance rate %.1f%%)",
                  (long long)spec_draft_tokens, (long long)spec_accepted_tokens,
                  100.0 * double(spec_accepted_tokens) / double(spec_draft_tokens));
    s += buf;
    if (spec_gated_tokens > 0) {
      std::snprintf(buf, sizeof buf, "; %lld more proposed but not verified (the cost gate)", (long long)spec_gated_tokens);
      s += buf;
    }
    s += "\n";
    if (spec_draft_s >= 0) {
      std::snprintf(buf, sizeof buf, "draft step: %.3f s in the drafter, %.3f ms per draft token, %.3f ms per output token\n",
                    spec_draft_s, spec_draft_s * 1e3 / double(spec_draft_tokens),
                    completion_tokens > 0 ? spec_draft_s * 1e3 / double(completion_tokens) : 0.0);
      s += buf;
    }
  }
  if (slo.any()) {
    std::snprintf(buf, sizeof buf, "goodput: %.2f req/s (%d of %d requests within the SLO)\n", goodput_req_s, good,
                  int(results.size()));
    s += buf;
  }
  for (const auto& r : results)
    if (!r.ok) {
      s += "first error: " + r.error + "\n";
      break;
    }
  return s;
}

}  // namespace gptoss::server
