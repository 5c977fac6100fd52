// The HTTP server over the engine on a fake backend (real tokenizer): endpoints, errors, SSE,
// auth, disconnects, drain.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "fake_backend.h"
#include "server/server.h"

using namespace gptoss;
using namespace gptoss::server;
using json = nlohmann::json;

namespace {

const Tokenizer& tok() {
  static const Tokenizer t = Tokenizer::o200k_harmony();
  return t;
}

struct Fixture {
  gptoss::testing::FakeBackend backend{201088, 16};
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Server> server;
  std::thread th;
  int port = 0;

  explicit Fixture(ServerOptions so = {}, int max_model_len = 512, int max_num_seqs = 4) {
    EngineConfig ec;
    ec.max_num_seqs = max_num_seqs;
    ec.max_model_len = max_model_len;
    ec.kv_cache_tokens = 16384;
    ec.stop_token_ids = default_stop_tokens(tok(), backend.config());
    ec.token_text = token_text_fn(tok());
    engine = std::make_unique<Engine>(backend, ec);
    engine->start();
    so.port = 0;
    so.served_model_name = "test-model";
    so.max_body_bytes = 1 << 20;
    server = std::make_unique<Server>(*engine, tok(), so);
    server->bind();
    port = server->port();
    th = std::thread([this] { server->run(); });
  }
  ~Fixture() {
    server->shutdown();
    th.join();
    engine->stop();
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

std::vector<json> sse_events(const std::string& body, bool* done) {
  std::vector<json> out;
  *done = false;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t e = body.find("\n\n", pos);
    if (e == std::string::npos) break;
    std::string ev = body.substr(pos, e - pos);
    pos = e + 2;
    if (ev.rfind("data: ", 0) != 0) continue;
    if (ev == "data: [DONE]") {
      *done = true;
      continue;
    }
    out.push_back(json::parse(ev.substr(6)));
  }
  return out;
}

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
  EXPECT_EQ(last["usage"], pj["usage"]);
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
