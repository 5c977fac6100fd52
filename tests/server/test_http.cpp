// The HTTP server over the engine on a fake backend (real tokenizer): endpoints, errors, SSE,
// auth, disconnects, drain.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "sse_events.h"
#include "http_fixture.h"
#include "json_schema_oracle.h"
#include "server/chat_format.h"
#include "server/server.h"

using namespace gptoss;
using namespace gptoss::server;
using json = nlohmann::json;

namespace {

const Tokenizer& tok() {
  static const Tokenizer t = Tokenizer::o200k_harmony();
  return t;
}

// httptest::Fixture with a 1 MB request-body cap (the size tests need a small one).
struct Fixture : httptest::Fixture {
  explicit Fixture(ServerOptions so = {}, int max_model_len = 512, int max_num_seqs = 4)
      : httptest::Fixture(engine_config(max_num_seqs), capped(so), max_model_len) {}
  static EngineConfig engine_config(int max_num_seqs) {
    EngineConfig ec;
    ec.max_num_seqs = max_num_seqs;
    return ec;
  }
  static ServerOptions capped(ServerOptions so) {
    so.max_body_bytes = 1 << 20;
    return so;
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const std::string& body, httplib::Headers h = {}) {
    auto c = client();
    return c.Post(path.c_str(), h, body, "application/json");
  }
};

json chat_body(int max_tokens = 5, bool stream = false) {
  return {{"model", "test-model"},
          {"messages", json::array({{{"role", "user"}, {"content", "Hello!"}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"stream", stream}};
}

void expect_error(const httplib::Result& r, int status, const std::string& param = "") {
  ASSERT_TRUE(r) << "no response";
  EXPECT_EQ(r->status, status) << r->body;
  json j = json::parse(r->body);
  ASSERT_TRUE(j.contains("error")) << r->body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"]["type"].is_string());
  EXPECT_TRUE(j["error"].contains("param"));
  EXPECT_TRUE(j["error"].contains("code"));
  if (!param.empty()) {
    EXPECT_EQ(j["error"]["param"], param) << r->body;
  }
}

using ssetest::sse_events;

}  // namespace

TEST(Http, HealthModelsNotFound) {
  Fixture f;
  auto c = f.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  json j = json::parse(m->body);
  EXPECT_EQ(j["data"][0]["id"], "test-model");
  expect_error(c.Get("/v1/nothing"), 404);
  expect_error(c.Get("/v1/models/other"), 404);
}

TEST(Http, ChatCompletion) {
  Fixture f;
  auto r = f.post("/v1/chat/completions", chat_body(6).dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(j["choices"][0]["finish_reason"] == "length" || j["choices"][0]["finish_reason"] == "stop");
  auto tk = f.post("/tokenize", json{{"messages", chat_body()["messages"]}}.dump());
  ASSERT_TRUE(tk);
  EXPECT_EQ(j["usage"]["prompt_tokens"], json::parse(tk->body)["count"]);
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 6);
  EXPECT_EQ(j["usage"]["total_tokens"].get<int>(),
            j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());
}

TEST(Http, StreamedChatMatchesPlain) {
  Fixture f;
  json b = chat_body(8);
  auto plain = f.post("/v1/chat/completions", b.dump());
  ASSERT_TRUE(plain);
  json pj = json::parse(plain->body);
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  auto r = f.post("/v1/chat/completions", b.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  bool done;
  auto evs = sse_events(r->body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(evs.size(), 3u);
  EXPECT_EQ(evs[0]["choices"][0]["delta"]["role"], "assistant");
  std::string content, reasoning;
  std::string finish;
  for (auto& e : evs) {
    if (e["choices"].empty()) continue;
    auto& d = e["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(finish, pj["choices"][0]["finish_reason"]);
  auto& msg = pj["choices"][0]["message"];
  EXPECT_EQ(content, msg["content"].is_null() ? "" : msg["content"].get<std::string>());
  EXPECT_EQ(reasoning, msg.value("reasoning_content", ""));
  json last = evs.back();
  EXPECT_TRUE(last["choices"].empty());
  // The streamed run came second: the prefix cache served whole pages of its prompt.
  json su = last["usage"], pu = pj["usage"];
  EXPECT_GT(su["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
  su.erase("prompt_tokens_details");
  pu.erase("prompt_tokens_details");
  EXPECT_EQ(su, pu);
}

TEST(Http, ChatStopStrings) {
  Fixture f;
  json b = chat_body(90);
  auto plain = f.post("/v1/chat/completions", b.dump());
  ASSERT_TRUE(plain);
  std::string content = json::parse(plain->body)["choices"][0]["message"]["content"];
  ASSERT_GT(content.size(), 20u) << content;
  std::string stop = content.substr(12, 3);
  std::string want = content.substr(0, content.find(stop));
  b["stop"] = {stop};
  auto r = f.post("/v1/chat/completions", b.dump());
  json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], want);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  b["stream"] = true;
  auto s = f.post("/v1/chat/completions", b.dump());
  bool done;
  std::string streamed, finish;
  for (auto& e : sse_events(s->body, &done)) {
    if (e["choices"].empty()) continue;
    auto& d = e["choices"][0]["delta"];
    if (d.contains("content")) streamed += d["content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(streamed, want);
  EXPECT_EQ(finish, "stop");
  for (int i = 0; i < 1000 && f.engine->num_active() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(f.engine->num_active(), 0);
}

TEST(Http, Completions) {
  Fixture f;
  auto r = f.post("/v1/completions", json{{"prompt", "Hello world"}, {"max_tokens", 4}, {"temperature", 0}, {"logprobs", 2}}.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 2);  // "Hello", " world"
  int n = j["usage"]["completion_tokens"];
  EXPECT_EQ(int(j["choices"][0]["logprobs"]["tokens"].size()), n);
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);
  // Each top_logprobs object lists its tokens best first, as vLLM and OpenAI write them (the
  // response keeps the order it was built in).
  const auto oj = nlohmann::ordered_json::parse(r->body);
  for (const auto& top : oj["choices"][0]["logprobs"]["top_logprobs"]) {
    double prev = 1.0;
    for (const auto& [tok, lp] : top.items()) {
      EXPECT_LE(lp.get<double>(), prev) << tok << " in " << top.dump();
      prev = lp.get<double>();
    }
  }
  EXPECT_EQ(oj.begin().key(), "id");  // OpenAI's key order, not the alphabet's
  auto t = f.post("/v1/completions", json{{"prompt", {1, 2, 3}}, {"max_tokens", 3}, {"stream", true},
                                          {"stream_options", {{"include_usage", true}}}}.dump());
  ASSERT_TRUE(t);
  bool done;
  auto evs = sse_events(t->body, &done);
  EXPECT_TRUE(done);
  EXPECT_EQ(evs.back()["usage"]["prompt_tokens"], 3);
}

TEST(Http, BadInputs) {
  Fixture f({}, 256);
  expect_error(f.post("/v1/chat/completions", "{\"messages\": [}"), 400);
  expect_error(f.post("/v1/chat/completions", "[]"), 400);
  expect_error(f.post("/v1/chat/completions", "{\"messages\": 5}"), 400, "messages");
  expect_error(f.post("/v1/chat/completions", "{\"messages\": []}"), 400, "messages");
  json b = chat_body();
  b["model"] = "no-such-model";
  expect_error(f.post("/v1/chat/completions", b.dump()), 404, "model");
  b = chat_body(0);
  expect_error(f.post("/v1/chat/completions", b.dump()), 400, "max_tokens");
  b = chat_body();
  b["messages"][0]["content"] = std::string(3000, 'x') + " end";
  auto r = f.post("/v1/chat/completions", b.dump());
  expect_error(r, 400, "messages");
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "context_length_exceeded");
  b = chat_body(250);
  expect_error(f.post("/v1/chat/completions", b.dump()), 400, "max_tokens");
  expect_error(f.post("/v1/completions", json{{"prompt", {1, 300000}}}.dump()), 400, "prompt");
  expect_error(f.post("/v1/completions", json{{"prompt", 5}}.dump()), 400, "prompt");
  // a body over the limit (1 MiB here)
  b = chat_body();
  b["messages"][0]["content"] = std::string(2 << 20, 'a');
  auto big = f.post("/v1/chat/completions", b.dump());
  if (big) expect_error(big, 413);  // or the connection is closed
  // the server still serves
  auto ok = f.post("/v1/chat/completions", chat_body(2).dump());
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST(Http, ApiKey) {
  ServerOptions so;
  so.api_key = "sekret";
  Fixture f(so);
  expect_error(f.post("/v1/chat/completions", chat_body(2).dump()), 401);
  expect_error(f.post("/v1/chat/completions", chat_body(2).dump(), {{"Authorization", "Bearer wrong"}}), 401);
  auto c = f.client();
  expect_error(c.Get("/v1/models"), 401);
  auto ok = f.post("/v1/chat/completions", chat_body(2).dump(), {{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  auto h = c.Get("/health");
  EXPECT_EQ(h->status, 200);
}

TEST(Http, DisconnectFreesSlot) {
  Fixture f({}, 4096, 1);
  f.backend.delay_us = 2000;
  json b = {{"prompt", "Once upon a time"}, {"max_tokens", 3000}, {"stream", true}, {"ignore_eos", true}};
  std::string body = b.dump();
  std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(f.port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, (sockaddr*)&a, sizeof a), 0);
  ASSERT_EQ(write(fd, req.data(), req.size()), ssize_t(req.size()));
  char buf[4096];
  size_t got = 0;
  for (int i = 0; i < 1000 && got < 1000; ++i) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    got += n;
  }
  EXPECT_GE(got, 1000u);
  EXPECT_EQ(f.engine->num_active(), 1);
  close(fd);
  for (int i = 0; i < 2000 && f.engine->num_active() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(f.engine->num_active(), 0);
  EXPECT_GT(f.engine->metrics().requests_aborted.load(), 0) << f.engine->metrics().generation_tokens.load() << " " << f.engine->metrics().requests_finished.load();
  // the single slot serves the next client
  auto ok = f.post("/v1/chat/completions", chat_body(2).dump());
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);

  // A non-streamed request whose client vanishes is cancelled too.
  int64_t aborted = f.engine->metrics().requests_aborted.load();
  b["stream"] = false;
  body = b.dump();
  req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
  fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(fd, (sockaddr*)&a, sizeof a), 0);
  ASSERT_EQ(write(fd, req.data(), req.size()), ssize_t(req.size()));
  int64_t gen0 = f.engine->metrics().generation_tokens.load();
  for (int i = 0; i < 2000 && f.engine->metrics().generation_tokens.load() < gen0 + 20; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(f.engine->num_active(), 1);
  close(fd);
  for (int i = 0; i < 2000 && f.engine->num_active() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(f.engine->num_active(), 0);
  EXPECT_EQ(f.engine->metrics().requests_aborted.load(), aborted + 1);
  EXPECT_LT(f.engine->metrics().generation_tokens.load(), gen0 + 2000);
}

TEST(Http, MetricsAndDrain) {
  auto f = std::make_unique<Fixture>();
  ASSERT_TRUE(f->post("/v1/chat/completions", chat_body(3).dump()));
  auto c = f->client();
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  for (const char* k : {"gptoss:num_requests_running", "gptoss:num_requests_waiting", "gptoss:kv_cache_usage_perc",
                        "gptoss:prompt_tokens_total", "gptoss:generation_tokens_total",
                        "gptoss:time_to_first_token_seconds_bucket", "gptoss:time_per_output_token_seconds_count"})
    EXPECT_NE(m->body.find(k), std::string::npos) << k;
  // A stream in flight when shutdown starts still completes.
  json b = chat_body(40, true);
  b["ignore_eos"] = true;
  int status = 0;
  std::string sbody;
  std::thread t([&] {
    auto r = f->post("/v1/chat/completions", b.dump());
    if (r) {
      status = r->status;
      sbody = r->body;
    }
  });
  int64_t gen0 = f->engine->metrics().generation_tokens.load();
  for (int i = 0; i < 2000 && f->engine->metrics().generation_tokens.load() < gen0 + 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread sd([&] { f->server->shutdown(); });
  t.join();
  sd.join();
  EXPECT_EQ(status, 200);
  bool done;
  sse_events(sbody, &done);
  EXPECT_TRUE(done);
  f.reset();
}

// ---------------------------------------------------------------------------- the transport

namespace {

// A raw client connection, for what an HTTP client library will not do: send slowly, stall,
// never read, pipeline.
struct RawConn {
  int fd = -1;
  explicit RawConn(int port, int rcvbuf = 0) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (sockaddr*)&a, sizeof a) != 0) {
      close(fd);
      fd = -1;
    }
  }
  ~RawConn() {
    if (fd >= 0) close(fd);
  }
  bool send(const std::string& s) { return fd >= 0 && ::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == ssize_t(s.size()); }
  // Reads until `until` appears, the peer closes (*closed), or `timeout_ms` passes.
  std::string read(int timeout_ms, bool* closed = nullptr, const std::string& until = "") {
    std::string out;
    if (closed) *closed = false;
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < end && (until.empty() || out.find(until) == std::string::npos)) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) {
        if (closed) *closed = true;
        break;
      }
      out.append(buf, size_t(n));
    }
    return out;
  }
};

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

template <class F>
bool eventually(F f, int timeout_ms = 10000) {
  for (int i = 0; i < timeout_ms / 5; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return f();
}

}  // namespace

TEST(HttpTransport, PostWithoutBodyAnsweredAtOnce) {
  Fixture f;
  // curl -X POST URL: no Content-Length, no body. The answer must not wait for a read timeout.
  RawConn c(f.port);
  ASSERT_TRUE(c.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string r = c.read(10000, nullptr, "}}");
  EXPECT_EQ(r.rfind("HTTP/1.1 400", 0), 0u) << r;
  EXPECT_NE(r.find("\"missing_body\""), std::string::npos) << r;
  expect_error(f.post("/v1/completions", ""), 400);
}

TEST(HttpTransport, WrongMethodIs405WithAllow) {
  Fixture f;
  auto c = f.client();
  auto r = c.Get("/v1/chat/completions");
  expect_error(r, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST, OPTIONS");
  auto h = c.Post("/health", "", "application/json");
  expect_error(h, 405);
  EXPECT_EQ(h->get_header_value("Allow"), "GET, HEAD, OPTIONS");
  expect_error(c.Delete("/v1/models/test-model"), 405);
  expect_error(c.Get("/nothing/here"), 404);
}

TEST(HttpTransport, MissingAndWrongApiKey) {
  ServerOptions so;
  so.api_key = "sekret";
  Fixture f(so);
  auto none = f.post("/v1/completions", "{}");
  expect_error(none, 401);
  EXPECT_NE(json::parse(none->body)["error"]["message"].get<std::string>().find("You didn't provide an API key"),
            std::string::npos);
  EXPECT_EQ(json::parse(none->body)["error"]["code"], "invalid_api_key");  // as before; clients test it
  auto wrong = f.post("/v1/completions", "{}", {{"Authorization", "Bearer nope"}});
  expect_error(wrong, 401);
  EXPECT_EQ(json::parse(wrong->body)["error"]["message"], "Incorrect API key provided.");
  EXPECT_EQ(json::parse(wrong->body)["error"]["code"], "invalid_api_key");
}

// Every /v1 route needs the key: no key and a wrong key are 401, the right key passes the check.
TEST(HttpTransport, ApiKeyCoversEveryV1Route) {
  ServerOptions so;
  so.api_key = "sekret";
  Fixture f(so);
  struct Route {
    const char* method;
    const char* path;
  };
  const Route routes[] = {{"GET", "/v1/models"},          {"GET", "/v1/models/test-model"},
                          {"POST", "/v1/chat/completions"}, {"POST", "/v1/completions"},
                          {"POST", "/v1/responses"},      {"GET", "/v1/responses/resp_x"},
                          {"DELETE", "/v1/responses/resp_x"}};
  auto c = f.client();
  for (const Route& r : routes) {
    for (const char* auth : {"", "Bearer nope", "Bearer sekret"}) {
      httplib::Headers h;
      if (*auth) h.emplace("Authorization", auth);
      const std::string m = r.method;
      httplib::Result res = m == "GET"      ? c.Get(r.path, h)
                            : m == "DELETE" ? c.Delete(r.path, h)
                                            : c.Post(r.path, h, "{}", "application/json");
      ASSERT_TRUE(res) << r.method << " " << r.path;
      if (std::string(auth) == "Bearer sekret") EXPECT_NE(res->status, 401) << r.method << " " << r.path;
      else EXPECT_EQ(res->status, 401) << r.method << " " << r.path << " auth '" << auth << "'";
    }
  }
}

TEST(HttpTransport, CorsOnlyForAllowedOrigins) {
  {
    Fixture f;  // default: no CORS headers at all
    auto r = f.client().Get("/v1/models", {{"Origin", "http://ui.example"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin"));
  }
  {
    ServerOptions so;
    so.allowed_origins = {"http://ui.example"};
    so.api_key = "k";
    Fixture f(so);
    auto c = f.client();
    auto r = c.Get("/v1/models", {{"Origin", "http://ui.example"}, {"Authorization", "Bearer k"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://ui.example");
    EXPECT_EQ(r->get_header_value("Vary"), "Origin");
    auto other = c.Get("/v1/models", {{"Origin", "http://evil.example"}, {"Authorization", "Bearer k"}});
    EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
    // The preflight carries no API key and is answered anyway.
    auto pre = c.Options("/v1/chat/completions", {{"Origin", "http://ui.example"},
                                                  {"Access-Control-Request-Method", "POST"},
                                                  {"Access-Control-Request-Headers", "authorization, content-type"}});
    ASSERT_TRUE(pre);
    EXPECT_EQ(pre->status, 204);
    EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "http://ui.example");
    EXPECT_NE(pre->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
    EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Headers"), "authorization, content-type");
    // Errors carry the header too, so the browser lets the page read them.
    auto err = c.Get("/v1/models", {{"Origin", "http://ui.example"}});
    EXPECT_EQ(err->status, 401);
    EXPECT_EQ(err->get_header_value("Access-Control-Allow-Origin"), "http://ui.example");
  }
  {
    ServerOptions so;
    so.allowed_origins = {"*"};
    Fixture f(so);
    auto r = f.client().Get("/health", {{"Origin", "http://anything.example"}});
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "*");
  }
}

TEST(HttpTransport, KeepAliveAndPipelining) {
  Fixture f;
  RawConn c(f.port);
  // Two requests in one write: two answers, in order, on the same connection.
  ASSERT_TRUE(c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string r = c.read(10000, nullptr, "test-model");
  EXPECT_EQ(count(r, "HTTP/1.1 200"), 2) << r;
  EXPECT_LT(r.find("\"ok\""), r.find("test-model"));
  // A completion on the same connection, then another request.
  std::string body = json{{"prompt", "Hi"}, {"max_tokens", 3}}.dump();
  ASSERT_TRUE(c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
                     "\r\n\r\n" + body + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  r = c.read(10000, nullptr, "{\"status\":\"ok\"}");
  EXPECT_EQ(count(r, "HTTP/1.1 200"), 2) << r;
  EXPECT_NE(r.find("text_completion"), std::string::npos) << r;
  EXPECT_EQ(f.server->open_connections(), 1);
}

TEST(HttpTransport, IdleAndSlowClientsAreClosed) {
  ServerOptions so;
  so.idle_timeout_s = 1;
  so.read_timeout_s = 1;
  Fixture f(so);
  RawConn idle(f.port), slow(f.port);
  // slowloris: a header byte every 100 ms never completes a request within the read timeout
  ASSERT_TRUE(slow.send("GET /health HTTP/1.1\r\n"));
  bool slow_closed = false;
  std::string got;
  for (int i = 0; i < 300 && !slow_closed; ++i) {
    if (!slow.send("X")) slow_closed = true;
    got += slow.read(100, &slow_closed);
  }
  EXPECT_TRUE(slow_closed);
  EXPECT_EQ(got, "");  // closed, not answered
  bool idle_closed = false;
  idle.read(10000, &idle_closed);
  EXPECT_TRUE(idle_closed);
  EXPECT_TRUE(eventually([&] { return f.server->open_connections() == 0; }));
  auto h = f.client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST(HttpTransport, ConnectionCapRefusesCleanly) {
  ServerOptions so;
  so.max_connections = 4;
  Fixture f(so);
  std::vector<std::unique_ptr<RawConn>> held;
  for (int i = 0; i < 4; ++i) held.push_back(std::make_unique<RawConn>(f.port));
  ASSERT_TRUE(eventually([&] { return f.server->open_connections() == 4; }));
  RawConn extra(f.port);
  extra.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  bool closed = false;
  std::string r = extra.read(10000, &closed);
  EXPECT_EQ(r.rfind("HTTP/1.1 503", 0), 0u) << r;
  EXPECT_NE(r.find("too_many_connections"), std::string::npos) << r;
  EXPECT_TRUE(closed);
  held.clear();
  ASSERT_TRUE(eventually([&] { return f.server->open_connections() == 0; }));
  auto h = f.client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST(HttpTransport, BodyOverLimitIs413) {
  Fixture f;  // 1 MiB limit
  RawConn c(f.port);
  // Refused from its Content-Length alone, before the body is sent.
  ASSERT_TRUE(c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\nExpect: 100-continue\r\n\r\n"));
  bool closed = false;
  std::string r = c.read(10000, &closed);
  EXPECT_EQ(r.rfind("HTTP/1.1 413", 0), 0u) << r;
  EXPECT_NE(r.find("request_too_large"), std::string::npos);
  EXPECT_TRUE(closed);
}

TEST(HttpTransport, OversizedHeadersAndChunkedBodies) {
  Fixture f;  // 1 MiB body limit, 64 KiB of headers
  {
    RawConn c(f.port);
    c.send("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(70000, 'a') + "\r\n\r\n");
    std::string r = c.read(10000, nullptr, "}}");
    EXPECT_EQ(r.rfind("HTTP/1.1 431", 0), 0u) << r.substr(0, 200);
  }
  {
    // A chunked body with no length up front: refused once it passes the limit.
    RawConn c(f.port);
    c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    std::string chunk(64 << 10, 'a');
    char len[16];
    std::snprintf(len, sizeof len, "%zx\r\n", chunk.size());
    for (int i = 0; i < 20 && c.send(len + chunk + "\r\n"); ++i) {
    }
    std::string r = c.read(10000, nullptr, "}}");
    EXPECT_EQ(r.rfind("HTTP/1.1 413", 0), 0u) << r.substr(0, 200);
  }
  {
    // A small chunked body is read whole.
    RawConn c(f.port);
    std::string body = json{{"prompt", "Hi"}, {"max_tokens", 2}}.dump();
    char len[16];
    std::snprintf(len, sizeof len, "%zx\r\n", body.size());
    c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + std::string(len) + body +
           "\r\n0\r\n\r\n");
    std::string r = c.read(10000, nullptr, "total_tokens");
    EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  }
  {
    // HTTP/1.0 has no chunked encoding: the stream ends with the connection.
    RawConn c(f.port);
    std::string body = json{{"prompt", "Hi"}, {"max_tokens", 3}, {"stream", true}}.dump();
    c.send("POST /v1/completions HTTP/1.0\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
    bool closed = false;
    std::string r = c.read(10000, &closed);
    EXPECT_TRUE(closed);
    EXPECT_EQ(r.find("Transfer-Encoding"), std::string::npos) << r;
    EXPECT_NE(r.find("data: [DONE]\n\n"), std::string::npos) << r;
  }
}

// Codings the server does not decode are refused, not read as plain bytes (gzip, chunked) or left
// on the connection for the next request (gzip alone); HEAD is answered wherever GET is, and a
// target in absolute form is served.
TEST(HttpTransport, UnsupportedCodingsAndHead) {
  Fixture f;
  const std::string body = json{{"prompt", "Hi"}, {"max_tokens", 1}}.dump();
  auto send = [&](const std::string& head, const std::string& until) {
    RawConn c(f.port);
    c.send(head + body);
    return c.read(10000, nullptr, until);
  };
  std::string r = send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "}}");
  EXPECT_EQ(r.rfind("HTTP/1.1 501", 0), 0u) << r.substr(0, 300);
  EXPECT_NE(r.find("Transfer-Encoding 'gzip, chunked'"), std::string::npos) << r;
  r = send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", "}}");
  EXPECT_EQ(r.rfind("HTTP/1.1 501", 0), 0u) << r.substr(0, 300);
  r = send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n",
           "}}");
  EXPECT_EQ(r.rfind("HTTP/1.1 415", 0), 0u) << r.substr(0, 300);
  // identity is no coding at all
  r = send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Encoding: identity\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n",
           "total_tokens");
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r.substr(0, 300);

  auto c = f.client();
  auto get = c.Get("/health");
  ASSERT_TRUE(get);
  auto head = c.Head("/health");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_TRUE(head->body.empty());
  EXPECT_EQ(head->get_header_value("Content-Length"), std::to_string(get->body.size()));
  // On one keep-alive connection: nothing of the left-out body is read as the next answer.
  RawConn k(f.port);
  k.send("HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string both = k.read(10000, nullptr, "}");
  EXPECT_EQ(both.rfind("HTTP/1.1 200", 0), 0u) << both;
  const size_t second = both.find("HTTP/1.1 200", 1);
  ASSERT_NE(second, std::string::npos) << both;
  EXPECT_EQ(both.substr(0, second).find("\"data\""), std::string::npos) << both;  // the models list stayed out
  // The absolute form of a request target (what a client talking to a proxy sends) is served too.
  RawConn a(f.port);
  a.send("GET http://localhost:1234/health HTTP/1.1\r\nHost: localhost\r\n\r\n");
  std::string abs = a.read(10000, nullptr, "}");
  EXPECT_EQ(abs.rfind("HTTP/1.1 200", 0), 0u) << abs;
  auto h404 = c.Head("/nothing/here");
  ASSERT_TRUE(h404);
  EXPECT_EQ(h404->status, 404);
  EXPECT_TRUE(h404->body.empty());
}

TEST(HttpTransport, SlowReaderIsDroppedWithoutStallingOthers) {
  ServerOptions so;
  so.write_timeout_s = 1;
  Fixture f(so, 4096, 4);
  // A stream whose client never reads (a tiny receive window): once the kernel's buffers are
  // full the server's write stalls; after write_timeout_s the client is dropped and its
  // request cancelled, while other clients are served meanwhile.
  RawConn stuck(f.port, 2048);
  // (About 2 KB a token with 20 top logprobs: more than the kernel's buffers hold.)
  json b = chat_body(4000, true);
  b["ignore_eos"] = true;
  b["logprobs"] = true;
  b["top_logprobs"] = 20;
  std::string body = b.dump();
  ASSERT_TRUE(stuck.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
                         "\r\n\r\n" + body));
  ASSERT_TRUE(eventually([&] { return f.engine->num_active() == 1; }));
  auto ok = f.post("/v1/chat/completions", chat_body(3).dump());
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_TRUE(eventually([&] { return f.engine->metrics().requests_aborted.load() == 1; }, 60000))
      << "generated " << f.engine->metrics().generation_tokens.load();
  EXPECT_TRUE(eventually([&] { return f.engine->num_active() == 0; }));
  EXPECT_LT(f.engine->metrics().generation_tokens.load(), 4000 + 3);
}

TEST(HttpTransport, RequestLog) {
  ServerOptions so;
  so.log_requests = true;
  Fixture f(so);
  ::testing::internal::CaptureStderr();
  auto r = f.post("/v1/completions", json{{"prompt", "Hello world"}, {"max_tokens", 3}, {"temperature", 0}}.dump());
  ASSERT_TRUE(r);
  int out = json::parse(r->body)["usage"]["completion_tokens"];
  // the line is written when the response has gone out, which the client may see first
  eventually([] { return false; }, 100);
  std::string log = ::testing::internal::GetCapturedStderr();
  // 2026-11-30T15:03:30.123Z 127.0.0.1:51234 "POST /v1/completions" 200 0.012s in=2 out=3
  EXPECT_NE(log.find("Z 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("\"POST /v1/completions\" 200 "), std::string::npos) << log;
  EXPECT_NE(log.find("s in=2 out=" + std::to_string(out)), std::string::npos) << log;
  EXPECT_EQ(log.find("-> -1"), std::string::npos);
}

TEST(HttpTransport, ThroughputLine) {
  ServerOptions so;
  so.log_stats_interval_s = 1;
  Fixture f(so);
  ::testing::internal::CaptureStderr();
  auto r = f.post("/v1/completions", json{{"prompt", "Hello world"}, {"max_tokens", 8}}.dump());
  ASSERT_TRUE(r);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // two or three periods
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("Avg prompt throughput: "), std::string::npos) << log;
  EXPECT_NE(log.find("Avg generation throughput: "), std::string::npos) << log;
  EXPECT_NE(log.find("Running: 0 reqs, Waiting: 0 reqs"), std::string::npos) << log;
  // idle periods print nothing: one line for the one busy period
  EXPECT_EQ(count(log, "Avg prompt throughput"), 1) << log;
}

// ---------------------------------------------------------------------------- structured output

namespace {

json structured_body(const json& response_format, uint64_t seed, int max_tokens, bool stream = false) {
  return {{"model", "test-model"},
          {"messages", json::array({{{"role", "user"}, {"content", "Answer in JSON."}}})},
          {"max_tokens", max_tokens},
          {"seed", seed},
          {"stream", stream},
          {"response_format", response_format}};
}

json schema_format(const json& schema, bool strict = true) {
  return {{"type", "json_schema"}, {"json_schema", {{"name", "answer"}, {"strict", strict}, {"schema", schema}}}};
}

// The content of a chat answer, streamed or not, and its finish reason.
std::pair<std::string, std::string> chat_content(Fixture& f, const json& body) {
  auto r = f.post("/v1/chat/completions", body.dump());
  if (!r || r->status != 200) {
    ADD_FAILURE() << (r ? r->body : "no response");
    return {};
  }
  if (!body.value("stream", false)) {
    json j = json::parse(r->body);
    return {j["choices"][0]["message"]["content"].get<std::string>(), j["choices"][0]["finish_reason"]};
  }
  bool done;
  std::string content, finish;
  for (auto& e : sse_events(r->body, &done)) {
    if (e["choices"].empty()) continue;
    auto& d = e["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(done);
  return {content, finish};
}

}  // namespace

// A model that does not write harmony (the fake's random tokens, like random weights): the
// whole answer is constrained, and must be JSON valid under the schema for every seed.
TEST(Http, StructuredOutputIsValidJsonForEverySeed) {
  ServerOptions so;
  so.harmony_output = false;
  Fixture f(so, 2048);
  const std::vector<json> schemas = {
      json::parse(R"({"type":"object","properties":{"kind":{"enum":["cat","dog"]},"legs":{"type":"integer"},
                     "ok":{"type":"boolean"},"born":{"type":"string","format":"date"}},
                     "required":["kind","legs","ok","born"],"additionalProperties":false})"),
      json::parse(R"({"type":"array","items":{"type":"object","properties":{"x":{"type":"number"},
                     "y":{"type":["integer","null"]}},"required":["x","y"],"additionalProperties":false},
                     "minItems":1,"maxItems":3})"),
      json::parse(R"({"type":"object","properties":{"id":{"type":"string","format":"uuid"},
                     "at":{"type":"string","format":"date-time"},"n":{"const":42}},"required":["id","at","n"],
                     "additionalProperties":false})"),
  };
  // (Free strings are left out: a random model closes one with odds of about 1 in 4000 a token.)
  for (size_t i = 0; i < schemas.size(); ++i) {
    for (uint64_t seed = 1; seed <= 8; ++seed) {
      bool stream = seed % 2 == 0;
      auto [content, finish] = chat_content(f, structured_body(schema_format(schemas[i]), seed, 400, stream));
      ASSERT_EQ(finish, "stop") << "schema " << i << " seed " << seed << ": " << content;
      json v;
      ASSERT_NO_THROW(v = json::parse(content)) << "schema " << i << " seed " << seed << ": " << content;
      EXPECT_TRUE(gptoss::testing::schema_valid(schemas[i], v)) << "schema " << i << " seed " << seed << ": " << content;
    }
  }
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    // Any object: its keys are free strings, so a random model rarely finishes one; it starts one.
    auto [content, finish] = chat_content(f, structured_body({{"type", "json_object"}}, seed, 24));
    ASSERT_FALSE(content.empty());
    EXPECT_EQ(content[0], '{') << content;
    if (finish == "stop") { EXPECT_TRUE(json::parse(content).is_object()) << content; }
  }
  // "text" leaves the output alone.
  auto [text, finish] = chat_content(f, structured_body({{"type", "text"}}, 1, 8));
  EXPECT_EQ(finish, "length");
  EXPECT_FALSE(json::accept(text)) << text;
}

// A text completion's response_format (vLLM's): the whole completion is the JSON, valid under
// the schema for every seed, streamed or not, then it stops; an invalid schema is a 400 naming
// response_format; "text" leaves the text alone. Any model: a completion is raw text.
TEST(Http, CompletionResponseFormatConstrainsTheWholeText) {
  Fixture f(ServerOptions{}, 2048);
  const json schema = json::parse(R"({"type":"object","properties":{"kind":{"enum":["cat","dog"]},
                                     "legs":{"type":"integer"},"ok":{"type":"boolean"}},
                                     "required":["kind","legs","ok"],"additionalProperties":false})");
  auto body = [&](const json& rf, uint64_t seed, bool stream) {
    return json{{"prompt", "The answer, in JSON:"}, {"max_tokens", 300}, {"seed", seed}, {"stream", stream},
                {"response_format", rf}};
  };
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const bool stream = seed % 2 == 0;
    auto r = f.post("/v1/completions", body(schema_format(schema), seed, stream).dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    std::string text, finish;
    if (!stream) {
      json j = json::parse(r->body);
      text = j["choices"][0]["text"];
      finish = j["choices"][0]["finish_reason"];
    } else {
      bool done;
      for (auto& e : sse_events(r->body, &done)) {
        if (e["choices"].empty()) continue;
        text += e["choices"][0]["text"].get<std::string>();
        if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
      }
      EXPECT_TRUE(done);
    }
    ASSERT_EQ(finish, "stop") << "seed " << seed << ": " << text;
    json v;
    ASSERT_NO_THROW(v = json::parse(text)) << "seed " << seed << ": " << text;
    EXPECT_TRUE(gptoss::testing::schema_valid(schema, v)) << "seed " << seed << ": " << text;
  }
  expect_error(f.post("/v1/completions", body(schema_format(json::parse(R"({"type":"strin"})")), 1, false).dump()),
               400, "response_format");
  expect_error(f.post("/v1/completions", body({{"type", "xml"}}, 1, false).dump()), 400, "response_format");
  auto plain = f.post("/v1/completions", body({{"type", "text"}}, 1, false).dump());
  ASSERT_TRUE(plain);
  ASSERT_EQ(plain->status, 200) << plain->body;
  const std::string text = json::parse(plain->body)["choices"][0]["text"];
  EXPECT_FALSE(json::accept(text)) << text;
}

TEST(Http, StructuredOutputRefusesBadSchemas) {
  Fixture f;
  auto post = [&](const json& rf) { return f.post("/v1/chat/completions", structured_body(rf, 1, 4).dump()); };
  expect_error(post(schema_format(json::parse(R"({"type":"strin"})"))), 400, "response_format");
  expect_error(post(schema_format(json::parse(R"({"type":"string","pattern":"^a"})"))), 400, "response_format");
  auto r = post(schema_format(json::parse(R"({"type":"object","properties":{"a":{"type":"integer","minimum":1}}})")));
  expect_error(r, 400, "response_format");
  EXPECT_NE(r->body.find("minimum at /properties/a"), std::string::npos) << r->body;
  // Not strict: unsupported keywords are ignored (the output is looser), malformed ones are not.
  auto ok = post(schema_format(json::parse(R"({"type":"string","pattern":"^a"})"), false));
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  expect_error(post(schema_format(json::parse(R"({"type":"array","minItems":-1})"), false)), 400, "response_format");
  expect_error(post({{"type", "yaml"}}), 400, "response_format");
  // A tool's parameters are compiled too.
  json b = chat_body(4);
  b["tools"] = json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
                             "properties":{"a":{"type":"nope"}}}}}])");
  expect_error(f.post("/v1/chat/completions", b.dump()), 400, "tools");
}

// A scripted model that writes harmony: its first output tokens are forced (a big logit) to
// `script`, after which it is the fake's random model. With a response format, its analysis
// stays free (non-JSON reasoning comes back as is) while the final channel, where the script
// says "Sure", is constrained: the answer is valid JSON and ends the turn. A tool call's
// arguments follow the tool's parameters the same way.
TEST(Http, StructuredOutputOnlyInTheFinalChannelAndToolArguments) {
  const json schema = json::parse(R"({"type":"object","properties":{"kind":{"enum":["cat","dog"]},
      "n":{"type":"integer"},"ok":{"type":"boolean"}},"required":["kind","n","ok"],"additionalProperties":false})");
  const json params = json::parse(R"({"type":"object","properties":{"unit":{"enum":["c","f"]},
      "days":{"type":"integer"}},"required":["unit","days"],"additionalProperties":false})");
  Fixture f;  // harmony_output: true
  for (int tool = 0; tool < 2; ++tool) {
    json body = structured_body(schema_format(schema), 1, 300);
    body["temperature"] = 1.0;
    body["tools"] = json::array({{{"type", "function"},
                                  {"function", {{"name", "get_weather"}, {"parameters", params}}}}});
    harmony::Renderer ren(tok());
    const size_t prompt_len = render_chat_prompt(ren, parse_chat_request(parse_body(body.dump()))).size();
    const std::string script_text =
        tool ? "<|channel|>analysis<|message|>Need {weather} first.<|end|><|start|>assistant to=functions.get_weather"
               "<|channel|>commentary <|constrain|>json<|message|>Sure"
             : "<|channel|>analysis<|message|>I think {not json} here.<|end|><|start|>assistant<|channel|>final"
               "<|message|>Sure";
    const std::vector<int32_t> script = tok().encode(script_text, true);
    f.backend.shape_logits = gptoss::testing::FakeBackend::scripted(script, prompt_len);
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      body["seed"] = seed;
      auto r = f.post("/v1/chat/completions", body.dump());
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      json msg = json::parse(r->body)["choices"][0]["message"];
      std::string finish = json::parse(r->body)["choices"][0]["finish_reason"];
      if (tool) {
        EXPECT_EQ(msg["reasoning_content"], "Need {weather} first.") << r->body;
        ASSERT_EQ(finish, "tool_calls") << r->body;
        ASSERT_EQ(msg["tool_calls"].size(), 1u) << r->body;
        EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
        json args;
        ASSERT_NO_THROW(args = json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>())) << r->body;
        EXPECT_TRUE(gptoss::testing::schema_valid(params, args)) << r->body;
      } else {
        EXPECT_EQ(msg["reasoning_content"], "I think {not json} here.") << r->body;
        ASSERT_EQ(finish, "stop") << r->body;
        json v;
        ASSERT_NO_THROW(v = json::parse(msg["content"].get<std::string>())) << r->body;
        EXPECT_TRUE(gptoss::testing::schema_valid(schema, v)) << r->body;
      }
    }
  }
}

namespace {
// A scripted model that misbehaves: at generated step g it favours steps[g][0] by 100 and any
// alternatives after it by 80, 60, ... (what a masked draw falls back to).
struct Script {
  std::vector<std::vector<int32_t>> steps;
  Script& text(const std::string& t) {
    for (int32_t id : tok().encode(t, true)) steps.push_back({id});
    return *this;
  }
  Script& either(const std::string& first, const std::string& second) {
    auto a = tok().encode(first, true), b = tok().encode(second, true);
    EXPECT_EQ(a.size() + b.size(), 2u) << first << " / " << second << ": one token each";
    steps.push_back({a[0], b[0]});
    return *this;
  }
  std::function<void(const std::vector<int32_t>&, float*)> shape(size_t prompt_len) const {
    return [steps = steps, prompt_len](const std::vector<int32_t>& ctx, float* logits) {
      const size_t g = ctx.size() - prompt_len;
      if (ctx.size() < prompt_len || g >= steps.size()) return;
      for (size_t k = 0; k < steps[g].size(); ++k) logits[steps[g][k]] += 100.0f - 20.0f * float(k);
    };
  }
};
json tool_fn(const std::string& name, const json& params) {
  return {{"type", "function"}, {"function", {{"name", name}, {"parameters", params}}}};
}
}  // namespace

// The headers a harmony model writes are constrained too: it calls only declared functions,
// tool_choice required and named end the turn in a call (to the named function), none in no
// call, and a format's final message comes even when the model would end its analysis with
// <|return|> (refused unmasked, drawn again masked). The scripted model tries each mistake.
TEST(Http, StructuredOutputHeadersFollowToolChoice) {
  const json params = json::parse(R"({"type":"object","properties":{"unit":{"enum":["c","f"]},
      "days":{"type":"integer"}},"required":["unit","days"],"additionalProperties":false})");
  const json schema = json::parse(R"({"type":"object","properties":{"kind":{"enum":["cat","dog"]},
      "n":{"type":"integer"}},"required":["kind","n"],"additionalProperties":false})");
  struct Case {
    const char* what;
    json tools, tool_choice, response_format;
    Script script;
    const char* called;  // the function the answer must call; null: no call, a final answer
    bool redraws = false;  // the script's mistakes are tokens drawn unmasked and refused
  };
  const json weather = tool_fn("get_weather", params), time = tool_fn("get_time", params);
  std::vector<Case> cases;
  cases.push_back({"an undeclared function", json::array({weather}), "auto", nullptr,
                   Script().text("<|channel|>analysis<|message|>Mail it.<|end|><|start|>assistant<|channel|>commentary "
                                 "to=functions.send_email <|constrain|>json<|message|>{\"to\":\"a\"}<|call|>"),
                   "get_weather"});
  cases.push_back({"required, the model answering instead", json::array({weather}), "required", nullptr,
                   Script()
                       .text("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>")
                       .either("final", "comment")
                       .text("<|message|>It is sunny.<|return|>"),
                   "get_weather"});
  cases.push_back({"named, the model calling another", json::array({weather, time}),
                   {{"type", "function"}, {"function", {{"name", "get_time"}}}}, nullptr,
                   Script().text("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{}<|call|>"),
                   "get_time"});
  cases.push_back({"a format, analysis ending with <|return|>", json::array({weather}), "auto", schema_format(schema),
                   Script()
                       .text("<|channel|>analysis<|message|>Thinking")
                       .either("<|return|>", "<|end|>")
                       .text("<|start|>assistant<|channel|>final<|message|>{\"kind\""),
                   nullptr, true});
  // A preamble's text would land in content before the JSON: with a format there is none (the
  // model's commentary header turns into the final channel's).
  cases.push_back({"a format, the model writing a preamble first", json::array({weather}), "none",
                   schema_format(schema),
                   Script()
                       .text("<|channel|>analysis<|message|>Thinking<|end|><|start|>assistant<|channel|>")
                       .either("comment", "final")
                       .text("ary<|message|>Let me see.<|end|>"),
                   nullptr});
  Fixture f;  // harmony_output: true
  for (const Case& c : cases) {
    json body = structured_body(c.response_format.is_null() ? json{{"type", "text"}} : c.response_format, 1, 300);
    body["temperature"] = 1.0;
    body["tools"] = c.tools;
    body["tool_choice"] = c.tool_choice;
    harmony::Renderer ren(tok());
    const size_t prompt_len = render_chat_prompt(ren, parse_chat_request(parse_body(body.dump()))).size();
    f.backend.shape_logits = c.script.shape(prompt_len);
    const int64_t redraws = f.engine->metrics().constraint_redraws.load();
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      body["seed"] = seed;
      auto r = f.post("/v1/chat/completions", body.dump());
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << c.what << ": " << r->body;
      const json choice = json::parse(r->body)["choices"][0];
      const json& msg = choice["message"];
      EXPECT_EQ(r->body.find("send_email"), std::string::npos) << c.what << ": " << r->body;
      if (c.called) {
        ASSERT_EQ(choice["finish_reason"], "tool_calls") << c.what << ": " << r->body;
        ASSERT_EQ(msg["tool_calls"].size(), 1u) << r->body;
        EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], c.called) << c.what << ": " << r->body;
        json args;
        ASSERT_NO_THROW(args = json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>())) << r->body;
        EXPECT_TRUE(gptoss::testing::schema_valid(params, args)) << r->body;
        EXPECT_TRUE(msg["content"].is_null() || msg["content"] == "") << c.what << ": " << r->body;
      } else {
        ASSERT_EQ(choice["finish_reason"], "stop") << c.what << ": " << r->body;
        EXPECT_FALSE(msg.contains("tool_calls") && !msg["tool_calls"].empty()) << r->body;
        EXPECT_EQ(msg["reasoning_content"], "Thinking") << r->body;
        json v;
        ASSERT_NO_THROW(v = json::parse(msg["content"].get<std::string>())) << r->body;
        EXPECT_TRUE(gptoss::testing::schema_valid(schema, v)) << r->body;
      }
    }
    if (c.redraws) {
      EXPECT_GE(f.engine->metrics().constraint_redraws.load(), redraws + 4) << "each <|return|> drawn again";
    }
  }
  // tool_choice none: no call, whatever the model writes (its header text cannot name one).
  json body = chat_body(40);
  body["temperature"] = 1.0;
  body["tools"] = json::array({weather});
  body["tool_choice"] = "none";
  harmony::Renderer ren(tok());
  const size_t prompt_len = render_chat_prompt(ren, parse_chat_request(parse_body(body.dump()))).size();
  f.backend.shape_logits =
      Script().text("<|channel|>commentary to=functions.get_weather<|message|>{}<|call|>").shape(prompt_len);
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    body["seed"] = seed;
    auto r = f.post("/v1/chat/completions", body.dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json choice = json::parse(r->body)["choices"][0];
    EXPECT_NE(choice["finish_reason"], "tool_calls") << r->body;
    EXPECT_FALSE(choice["message"].contains("tool_calls") && !choice["message"]["tool_calls"].empty()) << r->body;
    EXPECT_EQ(choice["message"].value("content", json()).dump().find("<|"), std::string::npos) << r->body;
  }
  f.backend.shape_logits = nullptr;
}

// A plain chat request (no tools, no format) still never shows harmony's special tokens in its
// text: the model's <|message|> and <|start|> inside its answer are refused and drawn again.
TEST(Http, ChatTextHoldsNoSpecialTokens) {
  Fixture f;
  json body = chat_body(24);
  body["temperature"] = 1.0;
  harmony::Renderer ren(tok());
  const size_t prompt_len = render_chat_prompt(ren, parse_chat_request(parse_body(body.dump()))).size();
  f.backend.shape_logits = Script()
                               .text("<|channel|>final<|message|>Hello")
                               .either("<|message|>", " there")
                               .text(" friend")
                               .either("<|start|>", ".")
                               .shape(prompt_len);
  const int64_t redraws = f.engine->metrics().constraint_redraws.load();
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    body["seed"] = seed;
    auto r = f.post("/v1/chat/completions", body.dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const std::string content = json::parse(r->body)["choices"][0]["message"]["content"];
    EXPECT_EQ(content.rfind("Hello there friend.", 0), 0u) << content;
    EXPECT_EQ(content.find("<|"), std::string::npos) << content;
  }
  EXPECT_GE(f.engine->metrics().constraint_redraws.load(), redraws + 6);
  f.backend.shape_logits = nullptr;
}
