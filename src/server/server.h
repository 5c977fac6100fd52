#pragma once
// The OpenAI-compatible HTTP server over an Engine: /health, /v1/models, /v1/chat/completions,
// /v1/completions, /v1/responses (SSE streams; stored responses in SQLite), /metrics (Prometheus text), /tokenize, /detokenize.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tokenizer/harmony.h"
#include "tokenizer/tokenizer.h"

namespace gptoss::server {

namespace http {
class HttpServer;
}
class ResponseStore;

class StructuredOutput;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                      // 0: any free port (see Server::port())
  std::string api_key;                  // non-empty: /v1/* needs "Authorization: Bearer KEY"
  std::string served_model_name = "gpt-oss";
  size_t max_body_bytes = size_t(8) << 20;
  int http_threads = 0;                 // event-loop threads (and as many handler workers); 0: 2
  int max_connections = 10000;          // open connections; past it 503 + close (kept under the fd limit)
  int idle_timeout_s = 5;               // keep-alive: a silent connection is closed after this
  int read_timeout_s = 30;              // a request's headers, then its body, must arrive within this
  int write_timeout_s = 30;             // a client that does not take a write within this is dropped
  int drain_timeout_s = 120;            // SIGTERM: how long to let running requests finish
  std::vector<std::string> allowed_origins;  // CORS: origins browsers may call from; "*": any
  bool log_requests = false;            // a line per request (time, client, request, status, latency, tokens)
  int log_stats_interval_s = 10;        // a throughput line this often while busy; 0: never
  // The model writes harmony: structured output constrains its final channel and tool calls.
  // false (random weights): a response_format constrains the whole output.
  bool harmony_output = true;
  std::string response_store;           // SQLite file of stored /v1/responses; "" or ":memory:": in memory
};

class Server {
 public:
  // `engine` must be started by the caller and outlive the server.
  Server(Engine& engine, const Tokenizer& tok, ServerOptions opts);
  ~Server();
  // Binds the listening socket (throws gptoss::Error when it cannot).
  void bind();
  int port() const { return port_; }
  // Serves until shutdown().
  void run();
  // Stops taking requests (503), waits for the running ones (up to drain_timeout_s), then stops
  // the listener so run() returns. Thread-safe; returns at once when called again.
  void shutdown();
  bool draining() const { return draining_.load(); }
  int open_connections() const;

  // Prometheus text of the metrics.
  std::string metrics_text() const;

  // A route the server answers: method and path (a regex where the path has a parameter).
  struct Route {
    std::string method, path;
  };
  // Every route, as registered: tests walk it (API key on every /v1/* route) so a new route
  // cannot be forgotten.
  const std::vector<Route>& routes() const { return routes_; }

 private:
  void setup_routes();
  Engine& engine_;
  Tokenizer tok_;
  harmony::Renderer renderer_;
  ServerOptions opts_;
  std::unique_ptr<ResponseStore> store_;
  std::unique_ptr<http::HttpServer> http_;
  std::unique_ptr<StructuredOutput> structured_;
  int port_ = 0;
  std::vector<Route> routes_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> shutdown_started_{false};
  std::atomic<bool> run_called_{false};
  std::atomic<int64_t> http_requests_{0}, http_errors_{0}, streams_open_{0}, client_disconnects_{0};
  int64_t created_ = 0;
  struct Handlers;
  friend struct Handlers;
};

// The engine's end tokens for a tokenizer: <|return|>, <|call|> (looked up by name) and eos.
std::vector<int32_t> default_stop_tokens(const Tokenizer& tok, const GptOssConfig& c);
// The engine's token_text for a tokenizer: a token's bytes, "" for specials and unknown ids.
std::function<std::string(int32_t)> token_text_fn(const Tokenizer& tok);

}  // namespace gptoss::server
