#pragma once
// What the route handlers share (server/ only). Server::Handlers answers the routes: its members
// are defined by route family (chat_route.cpp, completions_route.cpp, responses_route.cpp; the
// small endpoints beside the route table in server.cpp), and the plumbing every generating route
// uses is here: request checks, the body that follows one engine request (EngineBody) and the SSE
// stream of chat and text completions. The response JSON pieces they share are defined in
// route_handlers.cpp.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/chat_format.h"
#include "server/http/http_server.h"
#include "server/openai_api.h"
#include "server/server.h"

namespace gptoss::server {

// Responses keep the order they are built in: OpenAI's key order, and completions' top_logprobs
// objects best first (a sorted map would list those tokens alphabetically).
using json = nlohmann::ordered_json;

std::string dumps(const json& j);
void set_json(http::Response& res, int status, const json& j);
void set_error(http::Response& res, const ApiError& e);
int64_t now_s();
// A token's bytes as text; "<|unk_ID|>" for an id outside the vocabulary.
std::string token_str(const Tokenizer& tok, int32_t id);
// One chat logprobs "content" entry: the token, its logprob and bytes, and its top alternatives.
json chat_logprob_entry(const Tokenizer& tok, const TokenLogprob& lp);
// `cached`: prompt tokens whose KV came from the prefix cache (as OpenAI reports them).
json usage_json(int prompt, int completion, int cached);
// A streamed chat delta: content, reasoning (as reasoning_content and reasoning), tool calls.
json delta_json(const ChatDelta& d);
// One server-sent event carrying j.
std::string sse(const json& j);
const char* chat_finish_reason(FinishReason r, bool tool_calls);
// The error object of a generation that failed (500): a whole answer's body or a stream's last event.
json generation_failed(const EngineEvent& ev);
// A stream chunk as one event, with the usage so far when the client asked for it in every chunk
// (stream_options.continuous_usage_stats).
std::string sse_chunk(json chunk, bool continuous_usage, const EngineEvent& ev);

struct Server::Handlers {
  Server& s;

  void check_model(const std::string& model) {
    if (!model.empty() && model != s.opts_.served_model_name)
      throw ApiError{404, "The model `" + model + "` does not exist.", "invalid_request_error", "model",
                     "model_not_found"};
  }

  void check_draining() {
    if (s.draining_) throw ApiError{503, "The server is shutting down.", "service_unavailable", "", "shutting_down"};
  }

  // Fills max_tokens and checks the context length.
  void finalize(CommonRequest& r, size_t prompt_len, const char* param, const char* max_param = "max_tokens");
  std::shared_ptr<RequestStream> submit(const std::vector<int32_t>& prompt, const SamplingParams& sp);
  // The conversation in harmony tokens; a conversation that cannot be rendered is a 400 naming `param`.
  std::vector<int32_t> render_prompt(const ChatRequest& r, const char* param);

  // A response body that follows one engine request. The connection pulls it on its I/O
  // thread whenever the engine has queued events (the engine only posts a wake-up, it never
  // waits on a socket); `fill` turns the queued events into bytes without waiting. A client
  // that goes away, is too slow for too long, or a server that stops, cancels the request.
  struct EngineBody : http::BodySource {
    Server& srv;
    std::shared_ptr<RequestStream> rs;
    std::function<bool(std::string&, EngineBody&)> fill;  // true once the body is complete
    bool done = false, finished = false;
    int status_code = 200;
    std::pair<int, int> token_counts{-1, -1};

    EngineBody(Server& s, std::shared_ptr<RequestStream> r, std::function<bool(std::string&, EngineBody&)> f)
        : srv(s), rs(std::move(r)), fill(std::move(f)) {
      ++srv.streams_open_;
    }
    ~EngineBody() override {
      if (!finished) finish(false);
    }
    void start(std::function<void()> wake) override { rs->set_listener(std::move(wake)); }
    bool pull(std::string& out) override {
      if (!done) done = fill(out, *this);
      return done;
    }
    void finish(bool delivered) override {
      if (finished) return;
      finished = true;
      rs->set_listener(nullptr);
      if (!delivered || !done) {
        rs->cancel();
        ++srv.client_disconnects_;
      }
      --srv.streams_open_;
    }
    std::pair<int, int> tokens() const override { return token_counts; }
    int status() const override { return status_code; }
  };

  // Answers a non-streamed request once `step` returns the body. Meanwhile the connection
  // watches its client, and one that goes away cancels the request.
  void respond_when_done(http::Response& res, std::shared_ptr<RequestStream> rs,
                         std::function<std::optional<json>(EngineEvent&)> step);

  // The SSE plumbing shared by chat and text streams. `fill(out)` appends this round's chunks
  // (from the events queued so far, without waiting) and, once the request has finished, its
  // finishing chunk, returning the finishing event; this adds the usage chunk and [DONE].
  template <class Stream, class Fill>
  void stream_sse(http::Response& res, std::shared_ptr<Stream> st, const char* object, Fill fill) {
    res.set_header("Cache-Control", "no-cache");
    res.stream("text/event-stream",
               std::make_shared<EngineBody>(s, st->rs, [st, object, fill](std::string& out, EngineBody& body) {
                 if (std::optional<EngineEvent> last = fill(out)) {
                   body.token_counts = {last->prompt_tokens, last->completion_tokens};
                   if (st->include_usage) {
                     json u = {{"id", st->id},       {"object", object}, {"created", st->created},
                               {"model", st->model}, {"choices", json::array()},
                               {"usage", usage_json(last->prompt_tokens, last->completion_tokens, last->cached_tokens)}};
                     out += sse(u);
                   }
                   out += "data: [DONE]\n\n";
                   st->done = true;
                 }
                 return st->done;
               }));
  }

  // One streamed chunk of a chat or text stream (both carry id, created, model, include_usage):
  // a single choice, plus "usage": null while a usage chunk is still to come.
  template <typename Stream>
  static json stream_chunk(const Stream& st, const char* object, json choice, const char* finish) {
    choice["finish_reason"] = finish ? json(finish) : json(nullptr);
    json j = {{"id", st.id}, {"object", object}, {"created", st.created}, {"model", st.model},
              {"choices", json::array({choice})}};
    if (st.include_usage) j["usage"] = nullptr;
    return j;
  }

  // chat_route.cpp: /v1/chat/completions.
  struct ChatStream;
  json chat_chunk(const ChatStream& st, const json& delta, const json& logprobs, const char* finish);
  void chat(const http::Request& req, http::Response& res);

  // completions_route.cpp: /v1/completions.
  struct TextStream;
  static size_t count_chars(std::string_view b);
  json text_logprobs(const std::vector<TokenLogprob>& lps, size_t& offset, int32_t first_token = -1);
  json text_chunk(const TextStream& st, const std::string& text, const json& lp, const char* finish);
  static const char* text_finish(FinishReason r);
  void completions(const http::Request& req, http::Response& res);

  // responses_route.cpp: /v1/responses and the stored responses.
  struct ResponsesStream;
  bool responses_step(ResponsesStream& st, const EngineEvent& ev);
  void responses(const http::Request& req, http::Response& res);
  ApiError response_not_found(const std::string& id);
  void get_response(const http::Request& req, http::Response& res);
  void delete_response(const http::Request& req, http::Response& res);

  // server.cpp: the small endpoints.
  json model_card();
  void tokenize(const http::Request& req, http::Response& res);
  void detokenize(const http::Request& req, http::Response& res);
};

}  // namespace gptoss::server
