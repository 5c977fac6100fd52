#include "server/server.h"

#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <thread>

#include "common/error.h"
#include "server/http/http_server.h"
#include "server/response_store.h"
#include "server/route_handlers.h"
#include "server/structured_output.h"

namespace gptoss::server {

using namespace std::chrono_literals;

std::vector<int32_t> default_stop_tokens(const Tokenizer& tok, const GptOssConfig& c) {
  std::vector<int32_t> ids;
  for (const char* name : {"<|return|>", "<|call|>"})
    if (auto id = tok.token_id(name); id && *id < c.vocab) ids.push_back(*id);
  if (c.eos_token_id >= 0 && c.eos_token_id < c.vocab &&
      std::find(ids.begin(), ids.end(), c.eos_token_id) == ids.end())
    ids.push_back(c.eos_token_id);
  return ids;
}

std::function<std::string(int32_t)> token_text_fn(const Tokenizer& tok) {
  return [tok](int32_t id) -> std::string {
    if (id < 0 || size_t(id) >= tok.vocab_size()) return {};
    try {
      if (tok.is_special(id)) return {};
      return std::string(tok.token_bytes(id));
    } catch (const std::exception&) {
      return {};
    }
  };
}

// ---------------------------------------------------------------- small endpoints

json Server::Handlers::model_card() {
  return {{"id", s.opts_.served_model_name}, {"object", "model"},     {"created", s.created_},
          {"owned_by", "gptoss"},            {"root", s.opts_.served_model_name},
          {"max_model_len", s.engine_.max_model_len()}};
}

// vLLM's /tokenize: {"prompt"} or {"messages", ...} -> {"count", "max_model_len", "tokens",
// "token_strs"}; token_strs (with return_token_strs) spells tokens as convert_ids_to_tokens does.
void Server::Handlers::tokenize(const http::Request& req, http::Response& res) {
  ojson body = parse_body(req.body);
  TokenizeRequest r = parse_tokenize_request(body);
  if (const auto m = body.find("model"); m != body.end() && m->is_string()) check_model(m->get<std::string>());
  std::vector<int32_t> ids;
  if (r.chat) {
    harmony::Conversation c = build_conversation(*r.chat);
    ids = r.add_generation_prompt ? s.renderer_.render_for_completion(c, harmony::Role::Assistant)
                                  : s.renderer_.render_conversation(c);
  } else {
    ids = s.tok_.encode(*r.prompt, true);  // special tokens spelled in the text, as /v1/completions reads them
  }
  json out = {{"count", ids.size()}, {"max_model_len", s.engine_.max_model_len()}, {"tokens", ids}};
  if (r.return_token_strs) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(s.tok_.token_piece(id));
    out["token_strs"] = strs;
  } else {
    out["token_strs"] = nullptr;
  }
  set_json(res, 200, out);
}

// vLLM's /detokenize: {"tokens"} -> {"prompt"}.
void Server::Handlers::detokenize(const http::Request& req, http::Response& res) {
  ojson body = parse_body(req.body);
  DetokenizeRequest r = parse_detokenize_request(body);
  if (const auto m = body.find("model"); m != body.end() && m->is_string()) check_model(m->get<std::string>());
  for (int32_t id : r.tokens)
    if (!s.tok_.has_token(id))
      bad_request("Token id " + std::to_string(id) + " is not in the vocabulary.", "tokens", "invalid_value");
  set_json(res, 200, {{"prompt", s.tok_.decode(r.tokens)}});
}

Server::Server(Engine& engine, const Tokenizer& tok, ServerOptions opts)
    : engine_(engine), tok_(tok), renderer_(tok), opts_(std::move(opts)) {
  structured_ = std::make_unique<StructuredOutput>(tok_, opts_.harmony_output);
  created_ = now_s();
  store_ = std::make_unique<ResponseStore>(opts_.response_store);
  setup_routes();
}

Server::~Server() = default;

namespace {

// "2026-11-30T15:03:30.123Z"
std::string utc_timestamp() {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  tm t{};
  gmtime_r(&tv.tv_sec, &t);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", t.tm_year + 1900, t.tm_mon + 1, t.tm_mday,
                t.tm_hour, t.tm_min, t.tm_sec, int(tv.tv_usec / 1000));
  return buf;
}

// An error the transport answers itself (404, 405, 413, 503 past the connection cap, ...).
http::Response transport_error(int status, const std::string& message) {
  ApiError e;
  e.status = status;
  e.message = message;
  switch (status) {
    case 404: e.code = "not_found"; break;
    case 405: e.code = "method_not_allowed"; break;
    case 408: e.code = "request_timeout"; break;
    case 413: e.code = "request_too_large"; break;
    case 431: e.code = "request_header_fields_too_large"; break;
    case 503: e.type = "service_unavailable"; e.code = "too_many_connections"; break;
    default: break;
  }
  if (status >= 500 && e.type == "invalid_request_error") e.type = "server_error";
  http::Response res;
  set_error(res, e);
  return res;
}

}  // namespace

void Server::setup_routes() {
  auto h = std::make_shared<Handlers>(Handlers{*this});
  http::HttpOptions ho;
  ho.host = opts_.host;
  ho.port = opts_.port;
  ho.io_threads = opts_.http_threads > 0 ? opts_.http_threads : 2;
  ho.worker_threads = ho.io_threads;
  ho.max_body_bytes = opts_.max_body_bytes;
  ho.max_connections = opts_.max_connections;
  ho.idle_timeout_s = opts_.idle_timeout_s;
  ho.read_timeout_s = opts_.read_timeout_s;
  ho.write_timeout_s = opts_.write_timeout_s;
  ho.allowed_origins = opts_.allowed_origins;
  ho.error_response = transport_error;

  // /v1/* needs the API key when one is set (CORS preflights excepted: browsers send none).
  ho.filter = [this](const http::Request& req, http::Response& res) {
    if (opts_.api_key.empty() || req.path.rfind("/v1", 0) != 0) return false;
    std::string auth = req.get_header_value("Authorization");
    if (auth == "Bearer " + opts_.api_key) return false;
    if (auth.empty())
      set_error(res, ApiError{401,
                              "You didn't provide an API key. You need to provide your API key in an Authorization "
                              "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                              "invalid_request_error", "", "invalid_api_key"});
    else
      set_error(res, ApiError{401, "Incorrect API key provided.", "invalid_request_error", "", "invalid_api_key"});
    return true;
  };

  // Counts every answer, and with --log-requests logs it: time, client, request, status,
  // latency (request received -> last byte written), tokens in/out.
  ho.on_complete = [this](const http::Completion& c) {
    ++http_requests_;
    if (c.status >= 400) ++http_errors_;
    if (!opts_.log_requests) return;
    std::string tokens;
    if (c.tokens.first >= 0)
      tokens = " in=" + std::to_string(c.tokens.first) + " out=" + std::to_string(std::max(0, c.tokens.second));
    std::fprintf(stderr, "%s %s \"%s %s\" %d %.3fs%s%s\n", utc_timestamp().c_str(), c.request->remote.c_str(),
                 c.request->method.c_str(), c.request->target.c_str(), c.status, c.seconds, tokens.c_str(),
                 c.delivered ? "" : " (client gone: request cancelled)");
  };
  http_ = std::make_unique<http::HttpServer>(ho);

  // Wraps a handler: OpenAI error objects for ApiError and anything else.
  auto wrap = [](std::function<void(const http::Request&, http::Response&)> f) {
    return [f](const http::Request& req, http::Response& res) {
      try {
        f(req, res);
      } catch (const ApiError& e) {
        set_error(res, e);
      } catch (const Error& e) {
        set_error(res, ApiError{400, e.what(), "invalid_request_error", "", ""});
      } catch (const std::exception& e) {
        set_error(res, ApiError{500, std::string("Internal error: ") + e.what(), "server_error", "", ""});
      }
    };
  };
  // Handlers that parse bodies and tokenize run on worker threads, the rest on the event loop.
  const bool offload = true;
  // Every route is registered through here, so routes() lists them all (tests walk it).
  auto add_route = [this](const std::string& method, const std::string& path, http::Handler handler,
                          bool off = false) {
    routes_.push_back({method, path});
    http_->route(method, path, std::move(handler), off);
  };

  add_route("GET", "/health", wrap([this](const http::Request&, http::Response& res) {
    if (draining_) set_json(res, 503, {{"status", "draining"}});
    else set_json(res, 200, {{"status", "ok"}});
  }));
  add_route("GET", "/v1/models", wrap([h](const http::Request&, http::Response& res) {
    set_json(res, 200, {{"object", "list"}, {"data", json::array({h->model_card()})}});
  }));
  add_route("GET", "/v1/models/*", wrap([h, this](const http::Request& req, http::Response& res) {
    if (req.path_param != opts_.served_model_name)
      throw ApiError{404, "The model `" + req.path_param + "` does not exist.", "invalid_request_error", "model",
                     "model_not_found"};
    set_json(res, 200, h->model_card());
  }));
  add_route("POST", "/v1/chat/completions", wrap([h](const http::Request& q, http::Response& r) { h->chat(q, r); }), offload);
  add_route("POST", "/v1/completions", wrap([h](const http::Request& q, http::Response& r) { h->completions(q, r); }), offload);
  add_route("POST", "/v1/responses", wrap([h](const http::Request& q, http::Response& r) { h->responses(q, r); }), offload);
  // Stored responses: SQLite reads and deletes, off the event loop.
  add_route("GET", "/v1/responses/*", wrap([h](const http::Request& q, http::Response& r) { h->get_response(q, r); }), offload);
  add_route("DELETE", "/v1/responses/*", wrap([h](const http::Request& q, http::Response& r) { h->delete_response(q, r); }), offload);
  add_route("POST", "/tokenize", wrap([h](const http::Request& q, http::Response& r) { h->tokenize(q, r); }), offload);
  add_route("POST", "/detokenize", wrap([h](const http::Request& q, http::Response& r) { h->detokenize(q, r); }), offload);
  add_route("GET", "/metrics", [this](const http::Request&, http::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });

  // A throughput line every log_stats_interval_s while there is something to report (vLLM's).
  if (opts_.log_stats_interval_s > 0) {
    struct Last {
      int64_t prompt = 0, gen = 0;
      std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
    };
    auto last = std::make_shared<Last>();
    http_->every(std::chrono::seconds(opts_.log_stats_interval_s), [this, last] {
      EngineMetrics& m = engine_.metrics();
      EngineStats st = engine_.stats();
      int64_t prompt = m.prompt_tokens, gen = m.generation_tokens;
      auto now = std::chrono::steady_clock::now();
      double dt = std::chrono::duration<double>(now - last->t).count();
      bool idle = prompt == last->prompt && gen == last->gen && st.running == 0 && st.waiting == 0;
      if (!idle && dt > 0)
        std::fprintf(stderr,
                     "%s Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d "
                     "reqs, Waiting: %d reqs, KV cache usage: %.1f%%, Open streams: %lld\n",
                     utc_timestamp().c_str(), double(prompt - last->prompt) / dt, double(gen - last->gen) / dt,
                     st.running, st.waiting, 100.0 * st.kv_usage, (long long)streams_open_.load());
      last->prompt = prompt;
      last->gen = gen;
      last->t = now;
    });
  }
}

std::string Server::metrics_text() const {
  EngineStats st = engine_.stats();
  EngineMetrics& m = engine_.metrics();
  std::string out;
  // Label values escape \\, " and newlines (Prometheus text format).
  std::string model_label = "model_name=\"";
  for (char c : opts_.served_model_name)
    model_label += c == '\\' ? std::string("\\\\") : c == '"' ? std::string("\\\"") : c == '\n' ? std::string("\\n") : std::string(1, c);
  model_label += "\"";
  const std::string lbl = "{" + model_label + "}";
  auto gauge = [&](const std::string& name, const std::string& help, double v, const char* type = "gauge") {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.10g", v);
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + lbl + " " + buf + "\n";
  };
  gauge("gptoss:num_requests_running", "Requests in the running batch.", st.running);
  gauge("gptoss:num_requests_waiting", "Requests waiting for a slot or KV memory.", st.waiting);
  gauge("gptoss:kv_cache_usage_perc", "Fraction of KV-cache pages in use (the fuller pool).", st.kv_usage);
  gauge("gptoss:kv_cache_pages_used_full", "KV pages in use, full-attention pool.", st.kv_pages_used[0]);
  gauge("gptoss:kv_cache_pages_total_full", "KV pages, full-attention pool.", st.kv_pages_total[0]);
  gauge("gptoss:kv_cache_pages_used_sliding", "KV pages in use, sliding-window pool.", st.kv_pages_used[1]);
  gauge("gptoss:kv_cache_pages_total_sliding", "KV pages, sliding-window pool.", st.kv_pages_total[1]);
  gauge("gptoss:prompt_tokens_total", "Prompt tokens of requests (each counted once; recomputes after preemption not again).", double(m.prompt_tokens), "counter");
  gauge("gptoss:generation_tokens_total", "Tokens generated.", double(m.generation_tokens), "counter");
  gauge("gptoss:request_finished_total", "Requests finished (any reason).", double(m.requests_finished), "counter");
  gauge("gptoss:request_aborted_total", "Requests cancelled (client gone or shutdown).", double(m.requests_aborted), "counter");
  gauge("gptoss:num_preemptions_total", "Sequences preempted for KV memory.", double(m.preemptions), "counter");
  gauge("gptoss:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache at admission.",
        double(m.prefix_cache_queries), "counter");
  gauge("gptoss:prefix_cache_hits_total", "Prompt tokens found in the prefix cache (their prefill skipped).",
        double(m.prefix_cache_hits), "counter");
  gauge("gptoss:engine_steps_total", "Forward passes run.", double(m.steps), "counter");
  gauge("gptoss:spec_decode_num_draft_tokens_total", "Speculative draft tokens verified.", double(m.spec_draft_tokens),
        "counter");
  gauge("gptoss:spec_decode_num_accepted_tokens_total", "Speculative draft tokens accepted.",
        double(m.spec_accepted_tokens), "counter");
  gauge("gptoss:spec_decode_num_gated_tokens_total",
        "Speculative draft tokens proposed but not verified: their rows would cost the pass more than they return.",
        double(m.spec_gated_tokens), "counter");
  gauge("gptoss:spec_decode_draft_seconds_total", "Time the drafter took (proposals and Eagle3 head commits).",
        double(m.spec_draft_us) * 1e-6, "counter");
  gauge("gptoss:structured_output_redraws_total",
        "Tokens drawn without the structured-output mask that the constraint refused (each drawn again, masked).",
        double(m.constraint_redraws), "counter");
  gauge("gptoss:http_requests_total", "HTTP API requests.", double(http_requests_), "counter");
  gauge("gptoss:http_errors_total", "HTTP API requests answered with an error.", double(http_errors_), "counter");
  gauge("gptoss:client_disconnects_total", "Streams whose client went away.", double(client_disconnects_), "counter");
  gauge("gptoss:streams_open", "Open SSE streams.", double(streams_open_));
  m.ttft_s.render("gptoss:time_to_first_token_seconds", "Time to first token.", out, model_label);
  m.itl_s.render("gptoss:time_per_output_token_seconds", "Time between output tokens.", out, model_label);
  m.e2e_s.render("gptoss:e2e_request_latency_seconds", "Request latency in the engine.", out, model_label);
  m.step_forward_s.render("gptoss:step_forward_seconds", "Time in the backend's forward pass, per engine step.", out,
                          model_label);
  m.step_host_s.render("gptoss:step_host_seconds",
                       "Host time between consecutive forward passes (scheduling, sampling, streaming).", out,
                       model_label);
  return out;
}

void Server::bind() { port_ = http_->bind(); }

void Server::run() {
  run_called_ = true;
  if (!shutdown_started_) http_->run();
}

void Server::shutdown() {
  if (shutdown_started_.exchange(true)) return;
  draining_ = true;
  http_->set_closing();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(opts_.drain_timeout_s);
  while (std::chrono::steady_clock::now() < deadline && (engine_.num_active() > 0 || streams_open_ > 0))
    std::this_thread::sleep_for(20ms);
  http_->stop();
}

int Server::open_connections() const { return http_->open_connections(); }

}  // namespace gptoss::server
