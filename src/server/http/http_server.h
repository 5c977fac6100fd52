#pragma once
// A small event-driven HTTP/1.1 server (Boost.Beast on Boost.Asio): a fixed number of I/O
// threads serve every connection; no thread per connection or per stream.
//
// Routes are handlers that receive a parsed request and fill a Response: either a whole body,
// or a BodySource that produces the body over time (an SSE stream, or a JSON answer that waits
// for the engine). A source is pulled on the connection's I/O thread when it says it has more
// and while the connection's unsent output is under a bound, so a slow reader never blocks
// whoever produces the data; a reader that takes longer than write_timeout to accept a write
// is dropped, and its source is told (it cancels the request).
//
// The transport itself answers what is not the application's business: 404 for an unknown
// path, 405 with Allow for a wrong method, OPTIONS (CORS preflight), 413 for a body over the
// limit, 431 for headers too large, 503 past the connection cap; idle keep-alive connections
// and slow header/body senders are closed after their timeouts.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gptoss::server::http {

struct Request {
  std::string method;       // "GET", "POST", ...
  std::string target;       // as sent, query included
  std::string path;         // target without the query
  std::string path_param;   // the part of the path matched by a route's trailing '*', decoded
  std::string body;
  std::string remote;       // client address "ip:port"
  std::vector<std::pair<std::string, std::string>> headers;
  // The first value of a header (case-insensitive name), "" when absent.
  std::string get_header_value(std::string_view name) const;
  bool has_header(std::string_view name) const;
};

// A response body produced over time; driven on the connection's I/O thread, never blocking.
class BodySource {
 public:
  virtual ~BodySource() = default;
  // Starts the source: `wake` may then be called from any thread whenever pull() may have more.
  virtual void start(std::function<void()> wake) = 0;
  // Appends what is ready to `out` (without waiting); true once the body is complete.
  virtual bool pull(std::string& out) = 0;
  // Called exactly once when the response ends: `delivered` false when the client went away,
  // was too slow, or the server stopped before the whole body was written.
  virtual void finish(bool delivered) = 0;
  // For the request log: prompt and completion tokens (-1: unknown).
  virtual std::pair<int, int> tokens() const { return {-1, -1}; }
  // A buffered (non-streamed) body's status, read once pull() returned true.
  virtual int status() const { return 200; }
};

struct Response {
  int status = 200;
  std::string content_type;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // A body from a source instead of `body`: streamed (chunked, headers sent at once) or
  // buffered (sent with its length when complete; the client is watched meanwhile).
  std::shared_ptr<BodySource> source;
  bool streamed = false;

  void set_content(std::string b, std::string type) {
    body = std::move(b);
    content_type = std::move(type);
  }
  void set_header(std::string name, std::string value) { headers.emplace_back(std::move(name), std::move(value)); }
  void stream(std::string type, std::shared_ptr<BodySource> src) {
    content_type = std::move(type);
    source = std::move(src);
    streamed = true;
  }
  void defer(std::string type, std::shared_ptr<BodySource> src) {
    content_type = std::move(type);
    source = std::move(src);
    streamed = false;
  }
};

using Handler = std::function<void(const Request&, Response&)>;

// What the log sees when a response ends.
struct Completion {
  const Request* request = nullptr;  // method, path, remote (body already released)
  int status = 0;
  double seconds = 0;                // from the request's last byte to the response's last
  std::pair<int, int> tokens{-1, -1};
  bool delivered = true;
};

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                   // 0: any free port
  int io_threads = 2;                // event loops
  int worker_threads = 2;            // run handlers registered with `offload`
  size_t max_body_bytes = size_t(8) << 20;
  size_t max_header_bytes = 64 << 10;
  int max_connections = 10000;       // past it: 503 and close (lowered to the fd limit)
  int idle_timeout_s = 5;            // keep-alive: a connection silent this long is closed
  int read_timeout_s = 30;           // a request's headers, then its body, must arrive within this
  int write_timeout_s = 30;          // a write the client does not take within this drops it
  size_t max_buffered_bytes = 256 << 10;  // a connection's unsent output before pulling pauses
  std::vector<std::string> allowed_origins;  // CORS; "*" allows any
  // Builds the body of an error the transport answers itself (404, 405, 413, ...).
  std::function<Response(int status, const std::string& message)> error_response;
  // Runs before routing (not for CORS preflights); true: `res` is the answer (e.g. 401).
  std::function<bool(const Request&, Response&)> filter;
  // Told when each response ends (request log).
  std::function<void(const Completion&)> on_complete;
};

class HttpServer {
 public:
  explicit HttpServer(HttpOptions opts);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // `path` may end in '*' (a prefix; the rest is Request::path_param). `offload` runs the
  // handler on a worker thread (parsing, tokenizing) so the event loops stay free.
  void route(const std::string& method, const std::string& path, Handler h, bool offload = false);
  // Calls `fn` on an I/O thread every `period` while the server runs.
  void every(std::chrono::milliseconds period, std::function<void()> fn);

  // Binds and listens (throws gptoss::Error when it cannot); returns the port.
  int bind();
  // Serves on io_threads threads (the caller's included) until stop().
  void run();
  // Answers with "Connection: close" from now on (draining).
  void set_closing();
  // Closes the listener and every connection (unfinished sources get finish(false)); run()
  // returns. Thread-safe, idempotent, may precede run().
  void stop();

  int open_connections() const;

  struct Impl;  // in http_server.cpp (its connections use it too)

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace gptoss::server::http
