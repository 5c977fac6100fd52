// The server's contract as a client sees it, over HTTP only (a real client, no server
// internals beyond its route list), on the engine with the fake backend: the API key on every
// /v1 route, stop strings on both completion routes, /metrics values and histogram semantics,
// a generation that fails midway (SSE error event, HTTP 500), echo, continuous usage stats,
// /detokenize.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "prometheus_text.h"
#include "sse_events.h"
#include "http_fixture.h"
#include "server/server.h"

using namespace gptoss;
using namespace gptoss::server;
using json = nlohmann::json;

namespace {

const char* kModel = "test-model";

// httptest::Fixture, optionally failing the generation at an output token.
struct Served : httptest::Fixture {
  explicit Served(ServerOptions so = {}, int fail_at_output_token = 0)
      : httptest::Fixture(engine_config(fail_at_output_token), so) {}
  static EngineConfig engine_config(int fail_at_output_token) {
    EngineConfig ec;
    ec.test_fail_at_output_token = fail_at_output_token;
    return ec;
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const json& body, httplib::Headers h = {}) {
    return client().Post(path.c_str(), h, body.dump(), "application/json");
  }
  httplib::Result get(const std::string& path, httplib::Headers h = {}) { return client().Get(path.c_str(), h); }
};

using ssetest::sse_events;

json user_chat(int max_tokens, bool stream = false) {
  return {{"model", kModel},
          {"messages", json::array({{{"role", "user"}, {"content", "Hello!"}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"stream", stream}};
}

// A request body each POST route accepts; "{}" for a route not listed (its answer may be a 400,
// which is fine: only the key check is under test, and it comes first).
json valid_body(const std::string& path) {
  if (path == "/v1/chat/completions") return user_chat(1);
  if (path == "/v1/completions") return {{"model", kModel}, {"prompt", "Hi"}, {"max_tokens", 1}};
  if (path == "/tokenize") return {{"prompt", "Hi"}};
  if (path == "/detokenize") return {{"tokens", {12194}}};
  if (path == "/v1/responses") return {{"model", kModel}, {"input", "Hi"}, {"max_output_tokens", 1}};
  return json::object();
}

// A concrete path for a route: path parameters become the served model's name.
// A route's pattern ("(.+)" or the HTTP layer's trailing "*") made concrete with the model's name.
std::string concrete(const std::string& route) { return std::regex_replace(route, std::regex(R"(\(\.\+\)|\*)"), kModel); }

}  // namespace

// Every /v1 route the server registers refuses a request without the key or with a wrong one,
// and serves it with the right one; the other routes are open. The list comes from the server,
// so a route added later is covered without touching this test.
TEST(HttpContract, ApiKeyOnEveryV1Route) {
  ServerOptions so;
  so.api_key = "sekret";
  Served f(so);
  const auto& routes = f.server->routes();
  std::set<std::string> seen;
  for (const auto& r : routes) seen.insert(r.method + " " + r.path);
  for (const char* must : {"GET /v1/models", "POST /v1/chat/completions", "POST /v1/completions", "GET /health",
                           "GET /metrics"})
    EXPECT_TRUE(seen.count(must)) << must << " missing from the route list";
  int v1 = 0;
  for (const auto& r : routes) {
    const std::string path = concrete(r.path);
    auto send = [&](httplib::Headers h) {
      httplib::Request q;
      q.method = r.method;
      q.path = path;
      q.headers = h;
      if (r.method == "POST") {
        q.body = valid_body(path).dump();
        q.set_header("Content-Type", "application/json");
      }
      return f.client().send(q);
    };
    const std::string what = r.method + " " + path;
    if (r.path.rfind("/v1/", 0) == 0) {
      ++v1;
      for (httplib::Headers h : {httplib::Headers{}, httplib::Headers{{"Authorization", "Bearer wrong"}},
                                 httplib::Headers{{"Authorization", "sekret"}}}) {
        auto res = send(h);
        ASSERT_TRUE(res) << what;
        EXPECT_EQ(res->status, 401) << what << ": " << res->body;
        json j = json::parse(res->body, nullptr, false);
        ASSERT_TRUE(j.is_object() && j.contains("error")) << what << ": " << res->body;
        EXPECT_EQ(j["error"]["code"], "invalid_api_key") << what;
      }
      auto ok = send({{"Authorization", "Bearer sekret"}});
      ASSERT_TRUE(ok) << what;
      EXPECT_NE(ok->status, 401) << what << ": " << ok->body;
      EXPECT_LT(ok->status, 500) << what << ": " << ok->body;
      // A wildcard other than the model's name (a stored response's id) answers 404 for the name.
      const bool wildcard_id = r.path.find('*') != std::string::npos && r.path.rfind("/v1/models/", 0) != 0;
      if ((r.method == "GET" || r.method == "POST") && !wildcard_id) {
        EXPECT_EQ(ok->status, 200) << what << ": " << ok->body;
      }
    } else {
      auto res = send({});
      ASSERT_TRUE(res) << what;
      EXPECT_NE(res->status, 401) << what << " needs no key: " << res->body;
      EXPECT_LT(res->status, 500) << what << ": " << res->body;
    }
  }
  EXPECT_GE(v1, 4);
}

// `stop` on /v1/completions, plain and streamed: the text ends before the first match, the
// finish reason is "stop", and generation really stopped there.
TEST(HttpContract, CompletionStopStrings) {
  Served f;
  json b = {{"model", kModel}, {"prompt", "Once upon a time"}, {"max_tokens", 80}, {"temperature", 0},
            {"ignore_eos", true}};
  auto full = f.post("/v1/completions", b);
  ASSERT_TRUE(full);
  ASSERT_EQ(full->status, 200) << full->body;
  json fj = json::parse(full->body);
  const std::string text = fj["choices"][0]["text"];
  // Three printable ASCII bytes from the middle of the text (the text is made of random
  // tokens, so it has multi-byte characters too).
  size_t at = std::string::npos;
  for (size_t i = 10; i + 3 <= text.size() && at == std::string::npos; ++i)
    if (std::all_of(text.begin() + i, text.begin() + i + 3, [](char c) { return c > ' ' && c < 127; })) at = i;
  ASSERT_NE(at, std::string::npos) << text;
  const std::string stop = text.substr(at, 3);
  const std::string want = text.substr(0, text.find(stop));
  b["stop"] = {stop, "a stop string that never occurs"};
  auto r = f.post("/v1/completions", b);
  ASSERT_TRUE(r);
  json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["text"], want);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_LT(j["usage"]["completion_tokens"].get<int>(), fj["usage"]["completion_tokens"].get<int>());
  b["stream"] = true;
  auto s = f.post("/v1/completions", b);
  ASSERT_TRUE(s);
  bool done;
  std::string streamed, finish;
  for (auto& e : sse_events(s->body, &done)) {
    if (e["choices"].empty()) continue;
    streamed += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(streamed, want);
  EXPECT_EQ(finish, "stop");
}

namespace {

// The samples of one /metrics text: "name{labels}" -> value.
std::map<std::string, double> parse_metrics(const std::string& text) { return promtest::parse_samples(text); }

// Checks one histogram's Prometheus semantics and returns its _count.
double check_histogram(const std::map<std::string, double>& m, const std::string& name) {
  const std::string lbl = "model_name=\"" + std::string(kModel) + "\"";
  std::vector<std::pair<double, double>> buckets;  // (le, count)
  double inf = -1;
  for (const auto& [k, v] : m) {
    if (k.rfind(name + "_bucket{", 0) != 0) continue;
    EXPECT_NE(k.find(lbl), std::string::npos) << k << " lacks the model_name label";
    std::smatch le;
    EXPECT_TRUE(std::regex_search(k, le, std::regex(R"re(le="([^"]+)")re"))) << k;
    if (le[1] == "+Inf") inf = v;
    else buckets.push_back({std::stod(le[1]), v});
  }
  EXPECT_GE(buckets.size(), 5u) << name;
  std::sort(buckets.begin(), buckets.end());
  for (size_t i = 1; i < buckets.size(); ++i)
    EXPECT_LE(buckets[i - 1].second, buckets[i].second) << name << ": buckets must be cumulative";
  const double count = m.at(name + "_count{" + lbl + "}");
  EXPECT_EQ(inf, count) << name << ": le=\"+Inf\" must equal _count";
  EXPECT_LE(buckets.back().second, inf) << name;
  const double sum = m.at(name + "_sum{" + lbl + "}");
  EXPECT_GE(sum, 0) << name;
  if (count > 0) {
    EXPECT_GT(sum, 0) << name;
    // Every observation <= the smallest bucket holding all of them: sum <= count * that bound.
    for (auto& [le, c] : buckets)
      if (c == count) {
        EXPECT_LE(sum, count * le * (1 + 1e-6)) << name;
        break;
      }
  }
  return count;
}

}  // namespace

// After a known sequence of requests every counter has the value it must have, and the
// histograms follow Prometheus' rules (cumulative buckets, +Inf == _count, _sum).
TEST(HttpContract, MetricsValuesAfterKnownRequests) {
  Served f;
  auto m0 = parse_metrics(f.get("/metrics")->body);
  const std::string lbl = "{model_name=\"test-model\"}";
  EXPECT_EQ(m0.at("gptoss:prompt_tokens_total" + lbl), 0);
  EXPECT_EQ(check_histogram(m0, "gptoss:time_to_first_token_seconds"), 0);
  int prompt = 0, gen = 0, itl = 0;
  const std::vector<std::pair<std::vector<int>, int>> reqs = {{{1, 2, 3}, 4}, {{5, 6, 7, 8, 9, 10, 11}, 6}, {{42}, 1}};
  for (auto& [ids, n] : reqs) {
    auto r = f.post("/v1/completions", {{"prompt", ids}, {"max_tokens", n}, {"ignore_eos", true}, {"temperature", 0}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json u = json::parse(r->body)["usage"];
    EXPECT_EQ(u["prompt_tokens"], ids.size());
    EXPECT_EQ(u["completion_tokens"], n);
    prompt += int(ids.size());
    gen += n;
    itl += n - 1;
  }
  auto chat = f.post("/v1/chat/completions", user_chat(3, true));  // streamed this time
  ASSERT_TRUE(chat);
  bool done;
  auto evs = sse_events(chat->body, &done);
  ASSERT_TRUE(done);
  auto tk = f.post("/tokenize", {{"messages", user_chat(3)["messages"]}});
  const int chat_prompt = json::parse(tk->body)["count"];
  std::string finish;
  for (auto& e : evs)
    if (!e["choices"].empty() && !e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  auto plain = f.post("/v1/chat/completions", user_chat(3));  // the same request, for its usage
  json pu = json::parse(plain->body)["usage"];
  EXPECT_EQ(pu["prompt_tokens"], chat_prompt);
  prompt += 2 * chat_prompt;
  gen += 2 * pu["completion_tokens"].get<int>();
  itl += 2 * (pu["completion_tokens"].get<int>() - 1);
  // The gauges are published at the end of the engine step that answered the last request.
  auto m = parse_metrics(f.get("/metrics")->body);
  for (int i = 0; i < 200 && m.at("gptoss:num_requests_running" + lbl) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    m = parse_metrics(f.get("/metrics")->body);
  }
  EXPECT_EQ(m.at("gptoss:prompt_tokens_total" + lbl), prompt);
  EXPECT_EQ(m.at("gptoss:generation_tokens_total" + lbl), gen);
  EXPECT_EQ(m.at("gptoss:request_finished_total" + lbl), 5);
  EXPECT_EQ(m.at("gptoss:request_aborted_total" + lbl), 0);
  EXPECT_EQ(m.at("gptoss:num_requests_running" + lbl), 0);
  EXPECT_EQ(m.at("gptoss:num_requests_waiting" + lbl), 0);
  EXPECT_EQ(check_histogram(m, "gptoss:time_to_first_token_seconds"), 5);
  EXPECT_EQ(check_histogram(m, "gptoss:e2e_request_latency_seconds"), 5);
  EXPECT_EQ(check_histogram(m, "gptoss:time_per_output_token_seconds"), itl);
  EXPECT_GT(m.at("gptoss:http_requests_total" + lbl), 5);
  EXPECT_EQ(m.at("gptoss:http_errors_total" + lbl), 0);
}

// A generation that fails midway: a streamed request gets its tokens so far, then an OpenAI
// error event and [DONE]; a non-streamed one gets HTTP 500 with an error object. The server
// goes on serving. (The failure is the engine's test-only fault injection: the step that
// would sample a request's third token throws, as a failing backend would.)
TEST(HttpContract, GenerationErrorMidway) {
  Served f({}, /*fail_at_output_token=*/3);
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    json b = std::string(path) == "/v1/completions"
                 ? json{{"model", kModel}, {"prompt", "Once upon a time"}, {"max_tokens", 10}, {"ignore_eos", true}}
                 : user_chat(10);
    b["ignore_eos"] = true;
    auto r = f.post(path, b);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 500) << path << ": " << r->body;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << path << ": " << r->body;
    EXPECT_EQ(j["error"]["type"], "server_error");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("injected fault"), std::string::npos) << r->body;

    b["stream"] = true;
    b["stream_options"] = {{"include_usage", true}};
    auto s = f.post(path, b);
    ASSERT_TRUE(s) << path;
    EXPECT_EQ(s->status, 200);  // the stream had started
    bool done;
    auto evs = sse_events(s->body, &done);
    EXPECT_TRUE(done) << path;
    int err_at = -1;
    for (size_t i = 0; i < evs.size(); ++i)
      if (evs[i].contains("error")) err_at = int(i);
    ASSERT_GE(err_at, 1) << path << ": no error event after the first chunk:\n" << s->body;
    EXPECT_EQ(evs[err_at]["error"]["type"], "server_error");
    for (int i = 0; i < err_at; ++i)
      if (!evs[i]["choices"].empty()) { EXPECT_TRUE(evs[i]["choices"][0]["finish_reason"].is_null()) << path; }
  }
  // Short requests (under the fault) are still served.
  auto ok = f.post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}, {"ignore_eos", true}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(json::parse(ok->body)["usage"]["completion_tokens"], 2);
}

// echo puts the prompt before the completion, plain and streamed.
TEST(HttpContract, CompletionEcho) {
  Served f;
  json b = {{"prompt", "Once upon a time"}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}};
  const std::string gen = json::parse(f.post("/v1/completions", b)->body)["choices"][0]["text"];
  b["echo"] = true;
  auto r = f.post("/v1/completions", b);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], "Once upon a time" + gen);
  b["stream"] = true;
  bool done;
  std::string streamed;
  for (auto& e : sse_events(f.post("/v1/completions", b)->body, &done))
    if (!e["choices"].empty()) streamed += e["choices"][0]["text"].get<std::string>();
  EXPECT_TRUE(done);
  EXPECT_EQ(streamed, "Once upon a time" + gen);
  // token-id prompts echo their decoded text
  auto ids = json::parse(f.post("/tokenize", {{"prompt", "Once upon a time"}})->body)["tokens"];
  json bi = {{"prompt", ids}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}, {"echo", true}};
  EXPECT_EQ(json::parse(f.post("/v1/completions", bi)->body)["choices"][0]["text"], "Once upon a time" + gen);
}

// stream_options.continuous_usage_stats: usage on every chunk, counting up to the final usage.
TEST(HttpContract, ContinuousUsageStats) {
  Served f;
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    json b = std::string(path) == "/v1/completions" ? json{{"prompt", "Once upon a time"}, {"max_tokens", 12}} : user_chat(12);
    b["stream"] = true;
    b["ignore_eos"] = true;
    b["temperature"] = 0;
    b["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
    bool done;
    auto evs = sse_events(f.post(path, b)->body, &done);
    ASSERT_TRUE(done);
    ASSERT_TRUE(evs.back()["choices"].empty()) << path << ": the last chunk is the usage chunk";
    const json final_usage = evs.back()["usage"];
    EXPECT_EQ(final_usage["completion_tokens"], 12) << path;
    int last = -1, with_usage = 0, finishing = 0;
    for (size_t i = 0; i + 1 < evs.size(); ++i) {
      const json& e = evs[i];
      if (!e["choices"].empty() && !e["choices"][0]["finish_reason"].is_null()) {
        ++finishing;  // the finishing chunk carries the final usage too
        EXPECT_TRUE(e.contains("usage") && e["usage"] == final_usage) << path << ": " << e.dump();
      }
      if (!e.contains("usage") || e["usage"].is_null()) continue;
      ++with_usage;
      int c = e["usage"]["completion_tokens"];
      EXPECT_GE(c, last) << path;
      EXPECT_EQ(e["usage"]["prompt_tokens"], final_usage["prompt_tokens"]) << path;
      EXPECT_EQ(e["usage"]["total_tokens"].get<int>(), e["usage"]["prompt_tokens"].get<int>() + c) << path;
      last = c;
    }
    EXPECT_GE(with_usage, 2) << path << ": chunks carry usage";
    EXPECT_EQ(last, 12) << path << ": the finishing chunk's usage is the final one";
    EXPECT_EQ(finishing, 1) << path;
  }
}

// /detokenize inverts /tokenize; bad ids are a 400.
TEST(HttpContract, Detokenize) {
  Served f;
  const std::string text = "Hello, world! Ünïcödé 你好 <|start|>";
  auto ids = json::parse(f.post("/tokenize", {{"prompt", text}})->body)["tokens"];
  ASSERT_GE(ids.size(), 5u);
  auto r = f.post("/detokenize", {{"tokens", ids}});
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["prompt"], text);
  for (json bad : {json{{"tokens", {1, -1}}}, json{{"tokens", {999999999}}}, json{{"tokens", "12"}}, json::object()}) {
    auto e = f.post("/detokenize", bad);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->status, 400) << bad.dump() << " -> " << e->body;
    EXPECT_TRUE(json::parse(e->body).contains("error"));
  }
}
