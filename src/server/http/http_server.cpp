// The event-driven HTTP/1.1 transport (see http_server.h). Boost.Beast parses requests
// (limits, chunked bodies, keep-alive rules); each connection is a small state machine on its
// own strand: wait for a request (idle timeout) -> read headers, then body (read timeout) ->
// dispatch to a route (inline, or on a worker thread) -> write the response, pulling a
// BodySource while the unsent output is under max_buffered_bytes (write timeout per write).
#include "server/http/http_server.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/error.h"

namespace gptoss::server::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower((unsigned char)a[i]) != std::tolower((unsigned char)b[i])) return false;
  return true;
}

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

std::string percent_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit((unsigned char)s[i + 1]) && std::isxdigit((unsigned char)s[i + 2])) {
      out += char(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Status line and headers of a response. `length` < 0: chunked (or, for HTTP/1.0, until close).
std::string response_head(int status, const std::string& content_type,
                          const std::vector<std::pair<std::string, std::string>>& headers, int64_t length,
                          bool keep_alive, bool http10) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " ";
  h += std::string_view(bhttp::obsolete_reason(bhttp::int_to_status(unsigned(status))));
  h += "\r\n";
  if (!content_type.empty()) h += "Content-Type: " + content_type + "\r\n";
  if (length >= 0) h += "Content-Length: " + std::to_string(length) + "\r\n";
  else if (!http10) h += "Transfer-Encoding: chunked\r\n";
  if (!keep_alive) h += "Connection: close\r\n";
  else if (http10) h += "Connection: keep-alive\r\n";
  for (const auto& [k, v] : headers) h += k + ": " + v + "\r\n";
  h += "\r\n";
  return h;
}

void append_chunk(std::string& out, const std::string& data) {
  char len[20];
  std::snprintf(len, sizeof len, "%zx\r\n", data.size());
  out += len;
  out += data;
  out += "\r\n";
}

}  // namespace

std::string Request::get_header_value(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return {};
}

bool Request::has_header(std::string_view name) const {
  for (const auto& h : headers)
    if (iequals(h.first, name)) return true;
  return false;
}

class Connection;

struct Route {
  std::string method, path;
  bool prefix = false;
  Handler handler;
  bool offload = false;
};

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  HttpOptions opts;
  net::io_context ioc;
  net::executor_work_guard<net::io_context::executor_type> work{ioc.get_executor()};
  tcp::acceptor acceptor{net::make_strand(ioc)};
  net::steady_timer accept_retry{acceptor.get_executor()};
  net::thread_pool workers;
  std::vector<Route> routes;
  std::atomic<int> open{0};
  std::atomic<bool> closing{false};
  std::mutex mu;  // stopped, conns, timers
  bool stopped = false;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> conns;
  struct Periodic {
    net::steady_timer timer;
    std::chrono::milliseconds period;
    std::function<void()> fn;
  };
  std::vector<std::shared_ptr<Periodic>> periodic;

  explicit Impl(HttpOptions o) : opts(std::move(o)), workers(size_t(std::max(1, opts.worker_threads))) {}

  static void arm(std::shared_ptr<Periodic> p) {
    p->timer.expires_after(p->period);
    p->timer.async_wait([p](beast::error_code ec) {
      if (ec) return;  // cancelled by stop()
      p->fn();
      arm(p);
    });
  }

  Response error(int status, const std::string& message) {
    if (opts.error_response) return opts.error_response(status, message);
    Response r;
    r.status = status;
    r.set_content(message + "\n", "text/plain");
    return r;
  }

  // The CORS headers for `origin` ("" when it is not allowed).
  std::string allowed_origin(const std::string& origin) const {
    if (origin.empty()) return {};
    for (const auto& o : opts.allowed_origins)
      if (o == "*") return "*";
      else if (o == origin) return origin;
    return {};
  }

  void do_accept();
  void refuse(tcp::socket s);
};

// ---------------------------------------------------------------------------- connection

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket s, std::shared_ptr<HttpServer::Impl> srv) : srv_(std::move(srv)), stream_(std::move(s)) {
    ++srv_->open;
    beast::error_code ec;
    auto ep = stream_.socket().remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
  }
  ~Connection() {
    --srv_->open;
    std::lock_guard<std::mutex> l(srv_->mu);
    srv_->conns.erase(this);
  }

  net::any_io_executor executor() { return stream_.get_executor(); }

  void start() { read_request(); }

  // From any thread: the source may have more.
  void wake() {
    if (wake_posted_.exchange(true)) return;
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      self->wake_posted_ = false;
      self->pump();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    if (source_) end_source(false);
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

 private:
  const HttpOptions& opts() const { return srv_->opts; }

  // ------------------------------------------------------------------ reading a request
  void read_request() {
    if (closed_) return;
    if (buf_.size() > 0) return read_header();  // a pipelined request is already here
    stream_.expires_after(std::chrono::seconds(opts().idle_timeout_s));
    stream_.async_read_some(buf_.prepare(512), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (self->closed_) return;
      if (ec) return self->close();  // idle timeout or the client closed
      self->buf_.commit(n);
      self->read_header();
    });
  }

  void read_header() {
    parser_.emplace();
    parser_->header_limit(uint32_t(opts().max_header_bytes));
    parser_->body_limit(opts().max_body_bytes);
    stream_.expires_after(std::chrono::seconds(opts().read_timeout_s));
    bhttp::async_read_header(stream_, buf_, *parser_,
                             [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  // A request the transport answers itself, then closes (the rest of it is not read).
  void read_failed(beast::error_code ec) {
    if (ec == bhttp::error::body_limit) reply_and_close(413, "The request body is too large.");
    else if (ec == bhttp::error::header_limit) reply_and_close(431, "The request headers are too large.");
    else if (ec == beast::error::timeout || ec == bhttp::error::end_of_stream || ec == net::error::eof ||
             ec == net::error::operation_aborted || ec == net::error::connection_reset || closed_)
      close();
    else reply_and_close(400, "Malformed HTTP request: " + ec.message() + ".");
  }

  void on_header(beast::error_code ec) {
    if (closed_) return;
    if (ec) return read_failed(ec);
    // Bodies come as they are or chunked, uncompressed: anything else would be read as plain
    // bytes (gzip, chunked) or not at all (gzip alone: no length, so "no body", its bytes then
    // taken for the next request), so it is refused and the connection closed.
    const auto& h = parser_->get();
    if (const std::string te = trim(h[bhttp::field::transfer_encoding]); !te.empty() && !iequals(te, "chunked")) {
      reply_and_close(501, "Transfer-Encoding '" + te + "' is not supported: send the body as it is, or chunked.");
      return;
    }
    if (const std::string ce = trim(h[bhttp::field::content_encoding]); !ce.empty() && !iequals(ce, "identity")) {
      reply_and_close(415, "Content-Encoding '" + ce + "' is not supported: send the body uncompressed.");
      return;
    }
    if (auto cl = parser_->content_length(); cl && *cl > opts().max_body_bytes) {
      reply_and_close(413, "The request body is too large.");
      return;
    }
    if (parser_->is_done()) return dispatch();
    auto body = [self = shared_from_this()] {
      self->stream_.expires_after(std::chrono::seconds(self->opts().read_timeout_s));
      bhttp::async_read(self->stream_, self->buf_, *self->parser_, [self](beast::error_code ec, size_t) {
        if (self->closed_) return;
        if (ec) return self->read_failed(ec);
        self->dispatch();
      });
    };
    if (iequals(parser_->get()[bhttp::field::expect], "100-continue")) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      stream_.expires_after(std::chrono::seconds(opts().write_timeout_s));
      net::async_write(stream_, net::buffer(kContinue), [self = shared_from_this(), body](beast::error_code ec, size_t) {
        if (self->closed_) return;
        if (ec) return self->close();
        body();
      });
      return;
    }
    body();
  }

  // ------------------------------------------------------------------ routing
  void dispatch() {
    stream_.expires_never();
    auto& m = parser_->get();
    req_ = Request{};
    req_.method = std::string(m.method_string());
    req_.target = std::string(m.target());
    // The absolute form (RFC 9112 3.2.2; what a client speaking to a proxy sends, and a server must
    // accept): the path is what follows the authority.
    for (const char* scheme : {"http://", "https://"})
      if (req_.target.size() > std::strlen(scheme) &&
          iequals(std::string_view(req_.target).substr(0, std::strlen(scheme)), scheme)) {
        const size_t slash = req_.target.find_first_of("/?", std::strlen(scheme));
        req_.target = slash == std::string::npos ? "/" : req_.target[slash] == '?' ? "/" + req_.target.substr(slash)
                                                                                     : req_.target.substr(slash);
      }
    req_.path = req_.target.substr(0, req_.target.find('?'));
    req_.remote = remote_;
    for (const auto& f : m) req_.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    req_.body = std::move(m.body());
    keep_alive_ = m.keep_alive();
    http10_ = m.version() < 11;
    parser_.reset();
    t0_ = Clock::now();
    origin_ = srv_->allowed_origin(req_.get_header_value("Origin"));

    std::string allow;
    const Route* route = nullptr;
    // HEAD is answered wherever GET is (RFC 9110): the GET handler runs, its body is left out.
    head_ = req_.method == "HEAD";
    const std::string method = head_ ? "GET" : req_.method;
    for (const auto& r : srv_->routes) {
      bool match = r.prefix ? req_.path.size() > r.path.size() && req_.path.compare(0, r.path.size(), r.path) == 0
                            : req_.path == r.path;
      if (!match) continue;
      if (allow.find(r.method) == std::string::npos) allow += (allow.empty() ? "" : ", ") + r.method;
      if (r.method == "GET" && allow.find("HEAD") == std::string::npos) allow += ", HEAD";
      if (r.method == method && !route) {
        route = &r;
        if (r.prefix) req_.path_param = percent_decode(std::string_view(req_.path).substr(r.path.size()));
      }
    }
    if (!allow.empty()) allow += ", OPTIONS";

    if (req_.method == "OPTIONS" && !allow.empty()) {  // CORS preflight (or a plain OPTIONS)
      Response res;
      res.status = 204;
      res.set_header("Allow", allow);
      if (!origin_.empty()) {
        res.set_header("Access-Control-Allow-Methods", allow);
        std::string h = req_.get_header_value("Access-Control-Request-Headers");
        res.set_header("Access-Control-Allow-Headers", h.empty() ? "Authorization, Content-Type" : h);
        res.set_header("Access-Control-Max-Age", "600");
      }
      return respond(std::move(res));
    }
    if (opts().filter) {
      Response res;
      if (opts().filter(req_, res)) return respond(std::move(res));
    }
    if (allow.empty()) return respond(srv_->error(404, "Not found: " + req_.method + " " + req_.path));
    if (!route) {
      Response res = srv_->error(405, "Method " + req_.method + " is not allowed on " + req_.path + "; allowed: " + allow + ".");
      res.set_header("Allow", allow);
      return respond(std::move(res));
    }
    if (!route->offload) {
      Response res;
      run_handler(*route, res);
      return respond(std::move(res));
    }
    net::post(srv_->workers, [self = shared_from_this(), route] {
      auto res = std::make_shared<Response>();
      self->run_handler(*route, *res);
      net::post(self->stream_.get_executor(), [self, res] { self->respond(std::move(*res)); });
    });
  }

  void run_handler(const Route& r, Response& res) {
    try {
      r.handler(req_, res);
    } catch (const std::exception& e) {
      res = srv_->error(500, std::string("Internal error: ") + e.what());
    }
  }

  // ------------------------------------------------------------------ writing the response
  void respond(Response res) {
    req_.body = std::string();  // the handler is done with it
    if (closed_) {
      if (res.source) res.source->finish(false);
      return;
    }
    status_ = res.status;
    if (!origin_.empty()) {
      res.set_header("Access-Control-Allow-Origin", origin_);
      if (origin_ != "*") res.set_header("Vary", "Origin");
    }
    if (srv_->closing) keep_alive_ = false;
    if (!res.source) {
      out_ += response_head(res.status, res.content_type, res.headers, int64_t(res.body.size()), keep_alive_, http10_);
      if (!head_) out_ += res.body;
      body_done_ = true;
      return flush();
    }
    if (head_) {  // (no GET route streams today; a source's length is unknown, so the head says chunked)
      res.source->finish(false);
      out_ += response_head(res.status, res.content_type, res.headers, -1, keep_alive_ && !http10_, http10_);
      body_done_ = true;
      return flush();
    }
    source_ = std::move(res.source);
    streamed_ = res.streamed;
    if (streamed_) {
      if (http10_) keep_alive_ = false;  // no chunked encoding: the body ends with the connection
      out_ += response_head(res.status, res.content_type, res.headers, -1, keep_alive_, http10_);
    } else {
      deferred_ = std::move(res);  // its head goes out with the body
    }
    source_->start([w = weak_from_this()] {
      if (auto c = w.lock()) c->wake();
    });
    watch();
    pump();
  }

  // Takes what the source has ready while the unsent output is under the bound.
  void pump() {
    if (closed_ || !source_ || body_done_) return;
    if (out_.size() + inflight_.size() < opts().max_buffered_bytes) {
      std::string chunk;
      bool done = source_->pull(chunk);
      if (streamed_) {
        if (!chunk.empty()) {
          if (http10_) out_ += chunk;
          else append_chunk(out_, chunk);
        }
        if (done && !http10_) out_ += "0\r\n\r\n";
      } else {
        body_ += chunk;
        if (done) {
          status_ = source_->status();
          out_ += response_head(status_, deferred_.content_type, deferred_.headers, int64_t(body_.size()), keep_alive_, http10_);
          out_ += body_;
          body_.clear();
        }
      }
      body_done_ = done;
    }
    flush();
  }

  void flush() {
    if (closed_ || writing_ || out_.empty()) return;
    inflight_.swap(out_);
    out_.clear();
    writing_ = true;
    stream_.expires_after(std::chrono::seconds(opts().write_timeout_s));
    net::async_write(stream_, net::buffer(inflight_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->writing_ = false;
      self->inflight_.clear();
      if (self->closed_) return;
      if (ec) return self->close();  // gone, or too slow for too long
      self->stream_.expires_never();
      if (self->body_done_ && self->out_.empty()) return self->end_response();
      self->pump();
      self->flush();
    });
  }

  // Reads while a response is under way, so a client that goes away is noticed (and its
  // request cancelled) even while nothing is written. Pipelined bytes are kept for later.
  void watch() {
    if (watching_ || closed_ || buf_.size() >= (64 << 10)) return;
    watching_ = true;
    stream_.socket().async_read_some(buf_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->watching_ = false;
      if (!ec) self->buf_.commit(n);
      if (self->resume_after_watch_) {  // the response ended meanwhile: next request
        self->resume_after_watch_ = false;
        if (ec && ec != net::error::operation_aborted) return self->close();
        return self->read_request();
      }
      if (self->closed_ || ec == net::error::operation_aborted) return;
      if (ec) return self->close();  // the client went away
      if (self->source_) self->watch();
    });
  }

  void end_source(bool delivered) {
    auto src = std::move(source_);
    source_.reset();
    if (opts().on_complete) {
      Completion c;
      c.request = &req_;
      c.status = status_;
      c.seconds = std::chrono::duration<double>(Clock::now() - t0_).count();
      c.tokens = src->tokens();
      c.delivered = delivered;
      opts().on_complete(c);
    }
    src->finish(delivered);
  }

  void end_response() {
    if (source_) end_source(true);
    else if (opts().on_complete) {
      Completion c;
      c.request = &req_;
      c.status = status_;
      c.seconds = std::chrono::duration<double>(Clock::now() - t0_).count();
      opts().on_complete(c);
    }
    body_done_ = false;
    deferred_ = Response{};
    if (inflight_.capacity() > (64 << 10)) inflight_.shrink_to_fit();
    if (!keep_alive_ || srv_->closing) {
      beast::error_code ec;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
      return close();
    }
    if (watching_) {
      resume_after_watch_ = true;
      beast::error_code ec;
      stream_.socket().cancel(ec);
      return;
    }
    read_request();
  }

  // An error answer the transport gives itself; the connection then closes, after giving the
  // client a moment to read it (closing with unread request bytes would reset it at once).
  void reply_and_close(int status, const std::string& message) {
    stream_.expires_never();
    parser_.reset();
    keep_alive_ = false;
    Response res = srv_->error(status, message);
    status_ = status;
    out_ = response_head(status, res.content_type, res.headers, int64_t(res.body.size()), false, false) + res.body;
    inflight_.swap(out_);
    out_.clear();
    writing_ = true;
    stream_.expires_after(std::chrono::seconds(std::min(opts().write_timeout_s, 5)));
    net::async_write(stream_, net::buffer(inflight_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->writing_ = false;
      if (self->closed_) return;
      if (ec) return self->close();
      beast::error_code e2;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, e2);
      self->drain_then_close();
    });
  }

  void drain_then_close() {
    stream_.expires_after(std::chrono::seconds(2));
    buf_.clear();
    stream_.async_read_some(buf_.prepare(16 << 10), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (self->closed_) return;
      if (ec) return self->close();
      self->drain_then_close();
    });
  }

  std::shared_ptr<HttpServer::Impl> srv_;
  beast::tcp_stream stream_;
  beast::flat_buffer buf_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::string remote_;
  Request req_;
  Clock::time_point t0_;
  std::string origin_;  // the Access-Control-Allow-Origin for this request ("" none)
  bool keep_alive_ = true, http10_ = false;
  bool head_ = false;  // the request in hand is a HEAD: its GET answer goes out without the body
  int status_ = 0;
  // the response under way
  std::shared_ptr<BodySource> source_;
  bool streamed_ = false;
  Response deferred_;   // a buffered source's content type and headers
  std::string body_;    // a buffered source's body so far
  std::string out_;     // queued, not yet written
  std::string inflight_;  // being written
  bool writing_ = false, body_done_ = false, watching_ = false, resume_after_watch_ = false, closed_ = false;
  std::atomic<bool> wake_posted_{false};
};

// ---------------------------------------------------------------------------- listener

void HttpServer::Impl::do_accept() {
  acceptor.async_accept(net::make_strand(ioc), [self = shared_from_this()](beast::error_code ec, tcp::socket s) {
    if (ec == net::error::operation_aborted || !self->acceptor.is_open()) return;
    if (ec) {
      // Out of file descriptors (or another transient failure): wait a little, not spin.
      self->accept_retry.expires_after(std::chrono::milliseconds(50));
      self->accept_retry.async_wait([self](beast::error_code e) {
        if (!e) self->do_accept();
      });
      return;
    }
    s.set_option(tcp::no_delay(true), ec);
    if (self->open.load() >= self->opts.max_connections) {
      self->refuse(std::move(s));
    } else {
      auto c = std::make_shared<Connection>(std::move(s), self);
      bool ok;
      {
        std::lock_guard<std::mutex> l(self->mu);
        ok = !self->stopped;
        if (ok) self->conns.emplace(c.get(), c);
      }
      if (ok) net::post(c->executor(), [c] { c->start(); });
    }
    self->do_accept();
  });
}

// Past the connection cap: a 503 written at once (it fits an empty send buffer), then the
// socket is half-closed and drained for up to a second so the client can read the answer.
void HttpServer::Impl::refuse(tcp::socket s) {
  Response r = error(503, "The server has too many open connections; try again later.");
  r.set_header("Retry-After", "1");
  std::string msg = response_head(503, r.content_type, r.headers, int64_t(r.body.size()), false, false) + r.body;
  ::send(s.native_handle(), msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  beast::error_code ec;
  s.shutdown(tcp::socket::shutdown_send, ec);
  struct Refused {
    beast::tcp_stream stream;
    char buf[4096];
  };
  auto st = std::make_shared<Refused>(Refused{beast::tcp_stream(std::move(s)), {}});
  st->stream.expires_after(std::chrono::seconds(1));
  auto drain = std::make_shared<std::function<void()>>();
  *drain = [st, drain] {
    st->stream.async_read_some(net::buffer(st->buf), [st, drain](beast::error_code ec, size_t) {
      if (ec) {
        st->stream.close();
        *drain = nullptr;  // breaks the cycle
        return;
      }
      (*drain)();
    });
  };
  (*drain)();
}

// ---------------------------------------------------------------------------- HttpServer

HttpServer::HttpServer(HttpOptions opts) : impl_(std::make_shared<Impl>(std::move(opts))) {}

HttpServer::~HttpServer() {
  stop();
  impl_->workers.join();
  // Run what stop() posted (closes, cancellations) so that no handler is left holding impl_.
  impl_->ioc.restart();
  for (int i = 0; i < 1000 && impl_->ioc.poll() > 0; ++i) {
  }
}

void HttpServer::route(const std::string& method, const std::string& path, Handler h, bool offload) {
  Route r;
  r.method = method;
  r.prefix = !path.empty() && path.back() == '*';
  r.path = r.prefix ? path.substr(0, path.size() - 1) : path;
  r.handler = std::move(h);
  r.offload = offload;
  impl_->routes.push_back(std::move(r));
}

void HttpServer::every(std::chrono::milliseconds period, std::function<void()> fn) {
  auto p = std::make_shared<Impl::Periodic>(Impl::Periodic{net::steady_timer(impl_->ioc), period, std::move(fn)});
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->periodic.push_back(p);
  }
  Impl::arm(p);
}

int HttpServer::bind() {
  Impl& s = *impl_;
  // Each connection is a file descriptor: take the hard limit, and keep the cap below it.
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    if (rl.rlim_cur < rl.rlim_max) {
      rlimit up = rl;
      up.rlim_cur = rl.rlim_max;
      if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
    }
    if (rl.rlim_cur != RLIM_INFINITY) s.opts.max_connections = int(std::min<rlim_t>(rlim_t(s.opts.max_connections),
                                                                                   rl.rlim_cur > 128 ? rl.rlim_cur - 128 : 1));
  }
  beast::error_code ec;
  tcp::resolver resolver(s.ioc);
  auto results = resolver.resolve(s.opts.host, std::to_string(s.opts.port), tcp::resolver::passive, ec);
  std::string where = s.opts.host + ":" + std::to_string(s.opts.port);
  if (ec || results.empty()) throw Error("cannot bind " + where + ": " + ec.message());
  tcp::endpoint ep = results.begin()->endpoint();
  s.acceptor.open(ep.protocol(), ec);
  if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(ep, ec);
  if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) throw Error("cannot bind " + where + ": " + ec.message());
  s.do_accept();
  return s.acceptor.local_endpoint().port();
}

void HttpServer::run() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (s.stopped) return;
  }
  auto loop = [&s] {
    for (;;) {
      try {
        s.ioc.run();
        return;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "http: %s\n", e.what());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < s.opts.io_threads; ++i) threads.emplace_back(loop);
  loop();
  for (auto& t : threads) t.join();
  // Handlers still on a worker post their answers to connections that are closed by now:
  // let those run so their sources are finished.
  s.workers.wait();
  s.ioc.restart();
  s.ioc.poll();
}

void HttpServer::set_closing() { impl_->closing = true; }

void HttpServer::stop() {
  Impl& s = *impl_;
  std::vector<std::shared_ptr<Connection>> cs;
  std::vector<std::shared_ptr<Impl::Periodic>> timers;
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (s.stopped) return;
    s.stopped = true;
    for (auto& [p, w] : s.conns)
      if (auto c = w.lock()) cs.push_back(std::move(c));
    timers = s.periodic;
  }
  auto self = impl_;
  net::post(s.acceptor.get_executor(), [self] {
    beast::error_code ec;
    self->acceptor.close(ec);
    self->accept_retry.cancel();
  });
  for (auto& t : timers) net::post(s.ioc, [t] { t->timer.cancel(); });
  for (auto& c : cs) net::post(c->executor(), [c] { c->close(); });
  s.work.reset();
}

int HttpServer::open_connections() const { return impl_->open.load(); }

}  // namespace gptoss::server::http
