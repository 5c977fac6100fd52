#pragma once
// A live server over the engine on a fake backend (real o200k_harmony tokenizer) on a free port,
// and helpers to call it and read its answers (JSON, SSE, OpenAI error objects).
#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sse_events.h"
#include "fake_backend.h"
#include "server/server.h"

namespace httptest {

using json = nlohmann::json;

inline const gptoss::Tokenizer& tok() {
  static const gptoss::Tokenizer t = gptoss::Tokenizer::o200k_harmony();
  return t;
}

struct Fixture {
  gptoss::testing::FakeBackend backend{201088, 16};
  std::unique_ptr<gptoss::Engine> engine;
  std::unique_ptr<gptoss::server::Server> server;
  std::thread th;
  int port = 0;

  explicit Fixture(gptoss::EngineConfig ec = {}, gptoss::server::ServerOptions so = {}, int max_model_len = 512) {
    ec.max_num_seqs = ec.max_num_seqs > 0 ? ec.max_num_seqs : 4;
    ec.max_model_len = max_model_len;
    ec.kv_cache_tokens = 16384;
    ec.stop_token_ids = gptoss::server::default_stop_tokens(tok(), backend.config());
    ec.token_text = gptoss::server::token_text_fn(tok());
    engine = std::make_unique<gptoss::Engine>(backend, ec);
    engine->start();
    so.port = 0;
    so.served_model_name = "test-model";
    server = std::make_unique<gptoss::server::Server>(*engine, tok(), so);
    server->bind();
    port = server->port();
    th = std::thread([this] { server->run(); });
  }
  ~Fixture() {
    server->shutdown();
    th.join();
    engine->stop();
  }
  // POSTs `body` and returns the parsed answer; `status` receives the HTTP status.
  json post(const std::string& path, const json& body, int* status = nullptr, std::string* raw = nullptr) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(r) << "no response from " << path;
    if (!r) return nullptr;
    if (status) *status = r->status;
    if (raw) *raw = r->body;
    try {
      return json::parse(r->body);
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  // POSTs and expects a 200 answer.
  json ok(const std::string& path, const json& body) {
    int status = 0;
    std::string raw;
    json j = post(path, body, &status, &raw);
    EXPECT_EQ(status, 200) << path << ": " << raw;
    return j;
  }
  // POSTs a streaming request; returns its data events ([DONE] sets *done).
  std::vector<json> stream(const std::string& path, json body, bool* done) {
    body["stream"] = true;
    std::string raw;
    int status = 0;
    post(path, body, &status, &raw);
    EXPECT_EQ(status, 200) << raw;
    return ssetest::sse_events(raw, done);
  }
};

// Checks an OpenAI error object: status, type, and (when given) param and code.
inline void expect_error(Fixture& f, const std::string& path, const json& body, int status, const std::string& param,
                         const std::string& code = "") {
  int got = 0;
  std::string raw;
  json j = f.post(path, body, &got, &raw);
  EXPECT_EQ(got, status) << raw;
  ASSERT_TRUE(j.is_object() && j.contains("error")) << raw;
  EXPECT_EQ(j["error"]["type"], "invalid_request_error") << raw;
  EXPECT_EQ(j["error"]["param"], param) << raw;
  if (!code.empty()) {
    EXPECT_EQ(j["error"]["code"], code) << raw;
  }
}

}  // namespace httptest
